// Text that came from someone else (a worker's error, a module's operator name, a daemon's
// message on a client's terminal) made safe to show: every control character (C0, DEL and C1),
// every byte that is not valid UTF-8 and the Unicode controls that reorder text on screen
// (bidirectional overrides and isolates) become visible escapes, "\x1b" or "\u202e", so that the
// text cannot move a terminal's cursor, change its title, clear its screen, start a line that
// passes for another program's output, or break a protobuf string (which must be UTF-8). Printable
// text, UTF-8 included, is unchanged. No LibTorch, no gRPC.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace trainerd {

// What becomes of line breaks and tabs ('\n', '\r', '\t'): escaped like the other controls, kept
// (a view whose lines are its own), or each turned into one space (a message in one line).
enum class LineBreaks { kEscape, kKeep, kSpace };

std::string EscapeControls(absl::string_view text, LineBreaks breaks = LineBreaks::kEscape);

}  // namespace trainerd
