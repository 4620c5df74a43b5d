// The upload progress bar of `trainctl dataset upload` and the redrawn table of `sweep --watch`.
#include "client/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/output.h"

namespace trainerd::client {
namespace {

constexpr int kBarWidth = 30;

}  // namespace

ProgressBar::ProgressBar(int64_t total_bytes, bool enabled, FILE* out)
    : total_bytes_(total_bytes), enabled_(enabled), out_(out) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(int64_t done_bytes) {
  if (!enabled_) return;
  std::string text = Render(done_bytes, total_bytes_);
  if (text == last_) return;
  std::fprintf(out_, "\r%s", text.c_str());
  std::fflush(out_);
  last_ = std::move(text);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (enabled_ && drawn_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  enabled_ = false;
}

std::string ProgressBar::Render(int64_t done_bytes, int64_t total_bytes) {
  const double fraction =
      total_bytes <= 0 ? 1.0 : std::clamp(static_cast<double>(done_bytes) / total_bytes, 0.0, 1.0);
  const std::string bar = absl::StrCat(Bar(fraction, kBarWidth), " ");
  // One unit for both numbers, picked by the total.
  if (total_bytes < 1024) return absl::StrCat(bar, done_bytes, "/", total_bytes, " B");
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double scale = 1024;
  int unit = 0;
  while (unit < 3 && total_bytes >= scale * 1024) {
    scale *= 1024;
    ++unit;
  }
  return absl::StrCat(
      bar, absl::StrFormat("%.1f/%.1f %s", done_bytes / scale, total_bytes / scale, kUnits[unit]));
}

std::string ProgressBar::Bar(double fraction, int width) {
  fraction = std::isnan(fraction) ? 0.0 : std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * width);
  return absl::StrFormat("[%s%s] %3d%%", std::string(filled, '#'), std::string(width - filled, ' '),
                         static_cast<int>(fraction * 100));
}

void LiveBlock::Show(const std::string& text) {
  if (shown_ && text == last_) return;
  std::string out;
  // The cursor sits at the start of the line below the previous block.
  if (rows_ > 0) out = absl::StrCat("\x1b[", rows_, "A\r\x1b[J");
  absl::StrAppend(&out, text);
  out_ << out << std::flush;
  rows_ = Rows(text, columns_);
  last_ = text;
  shown_ = true;
}

int LiveBlock::Rows(absl::string_view text, int columns) {
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // A line that fills the width exactly still takes one row: the terminal wraps only when the
    // next character comes, and the newline comes first.
    const int width = static_cast<int>(DisplayWidth(line));
    rows += columns > 0 && width > columns ? (width + columns - 1) / columns : 1;
  }
  // The piece after the last newline is the line the cursor is on, not a row of the block.
  return text.empty() || text.back() == '\n' ? rows - 1 : rows;
}

}  // namespace trainerd::client
