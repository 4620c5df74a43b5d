// Tests for common/sha256.h against the FIPS 180-2 test vectors.
#include "common/sha256.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace trainerd {
namespace {

constexpr char kEmptyDigest[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAbcDigest[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr char kTwoBlockMessage[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
constexpr char kTwoBlockDigest[] =
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr char kMillionADigest[] =
    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

TEST(Sha256HexTest, EmptyInputMatchesKnownDigest) { EXPECT_EQ(Sha256Hex(""), kEmptyDigest); }

TEST(Sha256HexTest, AbcMatchesKnownDigest) { EXPECT_EQ(Sha256Hex("abc"), kAbcDigest); }

TEST(Sha256HexTest, TwoBlockMessageMatchesKnownDigest) {
  EXPECT_EQ(Sha256Hex(kTwoBlockMessage), kTwoBlockDigest);
}

TEST(Sha256HexTest, MillionAsMatchesKnownDigest) {
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), kMillionADigest);
}

TEST(Sha256HexTest, HashesEmbeddedNulBytes) {
  EXPECT_NE(Sha256Hex(std::string("a\0b", 3)), Sha256Hex("ab"));
}

TEST(Sha256Test, NoUpdateGivesEmptyDigest) {
  Sha256 sha;
  EXPECT_EQ(sha.HexDigest(), kEmptyDigest);
}

TEST(Sha256Test, IncrementalUpdatesEqualOneShot) {
  const std::string message = kTwoBlockMessage;
  Sha256 sha;
  for (char c : message) sha.Update(std::string_view(&c, 1));
  EXPECT_EQ(sha.HexDigest(), Sha256Hex(message));
}

TEST(Sha256Test, UnevenChunksAcrossBlockBoundariesEqualOneShot) {
  std::string message;
  for (int i = 0; i < 1000; ++i) message += static_cast<char>(i * 7);
  Sha256 sha;
  size_t offset = 0;
  for (size_t chunk = 1; offset < message.size(); chunk = chunk * 3 + 1) {
    const size_t n = std::min(chunk, message.size() - offset);
    sha.Update(message.data() + offset, n);
    offset += n;
  }
  EXPECT_EQ(sha.HexDigest(), Sha256Hex(message));
}

TEST(Sha256Test, PointerAndStringViewOverloadsAgree) {
  Sha256 sha;
  sha.Update("ab", 2);
  sha.Update(std::string_view("c"));
  sha.Update(nullptr, 0);
  EXPECT_EQ(sha.HexDigest(), kAbcDigest);
}

TEST(Sha256Test, DigestIsLowerCaseHexOf64Characters) {
  const std::string digest = Sha256Hex("trainerd");
  ASSERT_EQ(digest.size(), 64u);
  for (char c : digest) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << digest;
}

TEST(Sha256Test, SecondHexDigestReturnsTheSameDigest) {
  Sha256 sha;
  sha.Update("abc");
  EXPECT_EQ(sha.HexDigest(), kAbcDigest);
  EXPECT_EQ(sha.HexDigest(), kAbcDigest);
}

// --- BackgroundSha256 ---

// 12 MiB of bytes that are not periodic at any block size.
std::string LargeMessage() {
  std::string bytes(size_t{12} << 20, '\0');
  uint32_t x = 12345;
  for (char& c : bytes) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return bytes;
}

TEST(BackgroundSha256Test, NothingGivesTheEmptyDigest) {
  BackgroundSha256 sha;
  EXPECT_EQ(sha.HexDigest(), kEmptyDigest);
}

TEST(BackgroundSha256Test, SmallPiecesHashedInlineEqualOneShot) {
  BackgroundSha256 sha;
  sha.Update("ab", 2);
  sha.Update("c", 1);
  EXPECT_EQ(sha.HexDigest(), kAbcDigest);
  EXPECT_EQ(sha.HexDigest(), kAbcDigest);  // again, as Sha256's
}

TEST(BackgroundSha256Test, ContiguousPiecesPastTheInlinePartEqualOneShot) {
  // Pieces of an upload's buffer, in order and touching: the first 4 MiB on the caller's thread,
  // the rest on the hashing thread, merged while they wait.
  const std::string bytes = LargeMessage();
  BackgroundSha256 sha;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, 65536 + at % 977);
    sha.Update(bytes.data() + at, n);
    at += n;
  }
  EXPECT_EQ(sha.HexDigest(), Sha256Hex(bytes));
}

TEST(BackgroundSha256Test, PiecesFromSeparateBuffersEqualOneShot) {
  // Not contiguous: each piece is its own string, kept alive until the digest.
  const std::string bytes = LargeMessage();
  std::vector<std::string> pieces;
  for (size_t at = 0; at < bytes.size(); at += 3 << 20) pieces.push_back(bytes.substr(at, 3 << 20));
  BackgroundSha256 sha;
  for (const std::string& piece : pieces) sha.Update(piece.data(), piece.size());
  EXPECT_EQ(sha.HexDigest(), Sha256Hex(bytes));
}

TEST(BackgroundSha256Test, StopAbandonsWhatIsLeftAndLaterUpdatesAreIgnored) {
  const std::string bytes = LargeMessage();
  auto sha = std::make_unique<BackgroundSha256>();
  sha->Update(bytes.data(), bytes.size());
  sha->Stop();  // returns having joined: the buffer may go now
  sha->Stop();
  sha->Update(bytes.data(), 10);
  sha.reset();  // and a destroyed one, never asked for its digest, joins too
  BackgroundSha256 dropped;
  dropped.Update(bytes.data(), bytes.size());
}

}  // namespace
}  // namespace trainerd
