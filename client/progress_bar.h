// A one-line upload progress bar, "[#####     ]  45% 12.3/27.0 MiB", redrawn in place with "\r".
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

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

}  // namespace trainerd::client
