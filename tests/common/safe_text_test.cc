// Tests for EscapeControls (common/safe_text.h): what a worker, a module or a daemon could put in
// a text to take over a terminal or break a protobuf string comes out as visible escapes.
#include "common/safe_text.h"

#include <string>

#include "gtest/gtest.h"

namespace trainerd {
namespace {

TEST(EscapeControlsTest, PrintableTextAndUtf8AreUnchanged) {
  EXPECT_EQ(EscapeControls("loss became NaN at epoch 3"), "loss became NaN at epoch 3");
  EXPECT_EQ(EscapeControls("Daten für Ärzte: 10 µs → 1 ms, 日本"),
            "Daten für Ärzte: 10 µs → 1 ms, 日本");
  EXPECT_EQ(EscapeControls(""), "");
}

TEST(EscapeControlsTest, TerminalSequencesBecomeVisible) {
  // A title change, a cleared screen, a carriage return and a forged line.
  const std::string forged = "\x1b]0;pwned\x07\x1b[2J\r\nstate: SUCCEEDED";
  EXPECT_EQ(EscapeControls(forged),
            "\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x0astate: SUCCEEDED");
  EXPECT_EQ(EscapeControls(forged, LineBreaks::kSpace),
            "\\x1b]0;pwned\\x07\\x1b[2J  state: SUCCEEDED");
  EXPECT_EQ(EscapeControls(forged, LineBreaks::kKeep),
            "\\x1b]0;pwned\\x07\\x1b[2J\r\nstate: SUCCEEDED");
  EXPECT_EQ(EscapeControls(std::string("a\0b\x7f", 4)), "a\\x00b\\x7f");
  EXPECT_EQ(EscapeControls("a\tb"), "a\\x09b");
}

TEST(EscapeControlsTest, C1ControlsAndReorderingCodePointsAreEscaped) {
  // U+009B (CSI in C1) as UTF-8, and a right-to-left override that would show "txt.exe" as
  // "exe.txt".
  EXPECT_EQ(EscapeControls("\xc2\x9b" "31m"), "\\u009b31m");
  EXPECT_EQ(EscapeControls("report\xe2\x80\xaetxt.exe"), "report\\u202etxt.exe");
  EXPECT_EQ(EscapeControls("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
}

TEST(EscapeControlsTest, BytesThatAreNotUtf8AreEscapedOneByOne) {
  EXPECT_EQ(EscapeControls("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(EscapeControls("\xc3"), "\\xc3");              // cut short
  EXPECT_EQ(EscapeControls("\xc0\xaf"), "\\xc0\\xaf");     // overlong '/'
  EXPECT_EQ(EscapeControls("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(EscapeControls("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(EscapeControls("ok\xe2\x82"), "ok\\xe2\\x82");
}

TEST(EscapeControlsTest, EscapingTwiceChangesNothing) {
  const std::string once = EscapeControls("\x1b[31mred\xff\xe2\x80\xae");
  EXPECT_EQ(EscapeControls(once), once);
}

}  // namespace
}  // namespace trainerd
