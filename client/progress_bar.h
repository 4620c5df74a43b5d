// A one-line upload progress bar, "[#####     ]  45% 12.3/27.0 MiB", redrawn in place with "\r",
// and a block of lines redrawn in place with ANSI cursor movement.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace trainerd::client {

// Draws on `out` only when `enabled` (trainctl enables it when stderr is a terminal), and only
// when the text changes. Not thread-safe; owned by the command that sends the bytes.
class ProgressBar {
 public:
  ProgressBar(int64_t total_bytes, bool enabled, FILE* out);
  // Ends the line if anything was drawn.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(int64_t done_bytes);
  // Ends the line (once); later Updates draw nothing.
  void Finish();

  // The bar's text for `done` of `total` bytes, without "\r".
  static std::string Render(int64_t done_bytes, int64_t total_bytes);
  // The bar alone, `width` cells inside the brackets, and the percentage: "[###       ]  30%".
  // `fraction` is clamped to [0, 1]. Also used for the epochs of `trainctl top`.
  static std::string Bar(double fraction, int width);

 private:
  int64_t total_bytes_;
  bool enabled_;
  FILE* out_;
  bool drawn_ = false;
  std::string last_;
};

// A block of lines redrawn in place on a terminal (the table of `sweep --watch`): each Show
// moves the cursor back up over the block shown before (ANSI "ESC[nA"), clears from there to the
// end of the screen ("ESC[J") and writes the new block, so that the block never scrolls. Only
// for a terminal; not thread-safe.
class LiveBlock {
 public:
  // `columns`: the terminal's width, to count the rows a long line wraps onto; 0 when unknown
  // (every line one row).
  LiveBlock(std::ostream& out, int columns) : out_(out), columns_(columns) {}

  // Draws `text` (lines ending in "\n") over the previous block; nothing when it is unchanged.
  void Show(const std::string& text);

  // The terminal rows `text` takes at `columns` wide (0: one per line).
  static int Rows(absl::string_view text, int columns);

 private:
  std::ostream& out_;
  int columns_;
  int rows_ = 0;  // of the block on the screen
  bool shown_ = false;
  std::string last_;
};

}  // namespace trainerd::client
