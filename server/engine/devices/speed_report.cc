#include "server/engine/devices/speed_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainerd::engine {
namespace {

// A figure that can divide: finite and positive.
bool Usable(double x) { return std::isfinite(x) && x > 0.0; }
bool Usable(const std::optional<double>& x) { return x.has_value() && Usable(*x); }

// Times below zero (clock trouble, unset fields) count as nothing.
double NonNegative(double x) { return std::isfinite(x) && x > 0.0 ? x : 0.0; }

std::string Percent(double fraction) { return absl::StrFormat("%.0f%%", 100.0 * fraction); }

int64_t KernelsPerStep(int64_t layers) {
  return kKernelsPerLayer * std::max<int64_t>(layers, 1) + kKernelsPerStepFixed;
}

// The smallest power of two >= x (saturating at 2^62, far above any batch). A relative tolerance
// keeps a quotient that lands a rounding error above a power of two (64.00000000001) on it.
int64_t PowerOfTwoAtLeast(double x) {
  const double wanted = x * (1.0 - 1e-9);
  int64_t p = 1;
  while (static_cast<double>(p) < wanted && p < (int64_t{1} << 62)) p <<= 1;
  return p;
}

int64_t PowerOfTwoAtMost(int64_t x) {
  int64_t p = 1;
  while (p <= x / 2) p <<= 1;
  return p;
}

// The batch at which the per-step work would match the fixed overhead (see the header), or
// nullopt when no larger batch is possible.
std::optional<int64_t> SuggestBatch(const SpeedFigures& f, double step_seconds,
                                    double overhead_seconds) {
  if (f.batch_size <= 0) return std::nullopt;
  const double batch = static_cast<double>(f.batch_size);
  double work_per_row = 0.0;  // seconds of batch-proportional work per row
  if (Usable(f.flops_per_step) && Usable(f.peak_flops_per_second)) {
    work_per_row = f.flops_per_step / batch / *f.peak_flops_per_second;
  } else {
    work_per_row = std::max(0.0, step_seconds - overhead_seconds) / batch;
  }
  const int64_t limit = f.training_rows > 0 ? f.training_rows : kMaxSuggestedBatch;
  if (limit <= f.batch_size) return std::nullopt;
  // No measurable work per row: any batch up to the limit is better; aim for the limit.
  const double target =
      Usable(work_per_row) ? overhead_seconds / work_per_row : static_cast<double>(limit);
  int64_t suggested = PowerOfTwoAtLeast(std::max(target, 2.0 * batch));
  if (suggested > limit) {
    suggested = PowerOfTwoAtMost(limit);
    if (suggested <= f.batch_size) suggested = limit;
  }
  return suggested;
}

}  // namespace

const char* SpeedBoundName(SpeedBound bound) {
  switch (bound) {
    case SpeedBound::kUnspecified:
      return "unspecified";
    case SpeedBound::kLaunchBound:
      return "launch-bound";
    case SpeedBound::kComputeBound:
      return "compute-bound";
    case SpeedBound::kTransferBound:
      return "transfer-bound";
    case SpeedBound::kDataBound:
      return "data-bound";
    case SpeedBound::kBalanced:
      return "balanced";
    case SpeedBound::kCommunicationBound:
      return "communication-bound";
  }
  return "unspecified";
}

SpeedVerdict JudgeSpeed(const SpeedFigures& f) {
  SpeedVerdict verdict;
  const std::string device = f.device.empty() ? "the device" : f.device;
  const double data = NonNegative(f.data_seconds);
  const double compute = NonNegative(f.compute_seconds);
  const double transfer = NonNegative(f.host_transfer_seconds);
  if (f.steps <= 0 || !Usable(compute)) {
    verdict.line = "not enough figures: no training step was timed";
    return verdict;
  }

  const double steps = static_cast<double>(f.steps);
  const double step_seconds = compute / steps;
  verdict.steps_per_second = steps / compute;
  const bool known_flops = Usable(f.flops_per_step);
  if (known_flops) verdict.achieved_flops_per_second = f.flops_per_step * verdict.steps_per_second;
  if (known_flops && Usable(f.peak_flops_per_second)) {
    verdict.peak_fraction =
        std::min(1.0, verdict.achieved_flops_per_second / *f.peak_flops_per_second);
  }
  const int64_t kernels = KernelsPerStep(f.layers);
  double overhead_seconds = 0.0;
  // launch_seconds == 0 is a real (if unlikely) measurement: no overhead.
  if (f.launch_seconds.has_value() && std::isfinite(*f.launch_seconds) &&
      *f.launch_seconds >= 0.0) {
    overhead_seconds = static_cast<double>(kernels) * *f.launch_seconds;
    // A step that does almost no arithmetic spends the time its work at peak does not explain on
    // per-step costs (launches and dispatch the kernel estimate does not count, the allocator,
    // the loop): that time is the overhead, whatever the estimate says.
    if (verdict.peak_fraction.has_value() && *verdict.peak_fraction < kTinyWorkPeakFraction) {
      overhead_seconds = std::max(overhead_seconds, step_seconds * (1.0 - *verdict.peak_fraction));
    }
    verdict.overhead_fraction = std::min(1.0, overhead_seconds / step_seconds);
  }

  const double total = data + compute + transfer;  // > 0: compute is
  if (data / total > kDataBoundShare) {
    verdict.bound = SpeedBound::kDataBound;
    verdict.line = absl::StrCat("data-bound: ", Percent(data / total),
                                " of the job's time went to data preparation (model build, "
                                "dataset copy, validation split)");
    return verdict;
  }
  if (transfer / total > kTransferBoundShare) {
    verdict.bound = SpeedBound::kTransferBound;
    verdict.line = absl::StrCat("transfer-bound: ", Percent(transfer / total),
                                " of the job's time went to host transfers");
    return verdict;
  }

  if (f.ranks > 1) {
    verdict.collective_fraction = std::min(1.0, NonNegative(f.collective_seconds) / compute);
    if (*verdict.collective_fraction >= kCommunicationBoundShare) {
      verdict.bound = SpeedBound::kCommunicationBound;
      verdict.line = absl::StrCat("communication-bound: ", Percent(*verdict.collective_fraction),
                                  " of step time in collectives across ", f.ranks, " ranks");
      std::vector<std::string> options;
      // Each rank trains its slice of the epoch: a larger per-rank batch is possible while it
      // fits in that slice.
      const int64_t rank_rows = f.training_rows > 0 ? f.training_rows / f.ranks : 0;
      if (f.batch_size > 0 && (rank_rows == 0 || 2 * f.batch_size <= rank_rows)) {
        options.push_back(absl::StrCat("a per-rank batch of ", 2 * f.batch_size));
      }
      options.push_back("fewer ranks");
      absl::StrAppend(&verdict.line, " \xE2\x80\x94 ", absl::StrJoin(options, " or "),
                      " will be faster");
      return verdict;
    }
  }

  const bool below_compute_bound =
      !verdict.peak_fraction.has_value() || *verdict.peak_fraction < kComputeBoundPeakFraction;
  if (verdict.overhead_fraction.has_value() && below_compute_bound &&
      *verdict.overhead_fraction >= kLaunchBoundOverheadFraction) {
    verdict.bound = SpeedBound::kLaunchBound;
    const bool on_cpu = f.device == "cpu";
    const std::optional<int64_t> batch = SuggestBatch(f, step_seconds, overhead_seconds);
    bool cpu_faster = false;
    if (!on_cpu && known_flops && Usable(f.cpu_peak_flops_per_second) &&
        f.cpu_launch_seconds.has_value() && std::isfinite(*f.cpu_launch_seconds) &&
        *f.cpu_launch_seconds >= 0.0) {
      const double cpu_step = static_cast<double>(kernels) * *f.cpu_launch_seconds +
                              f.flops_per_step / *f.cpu_peak_flops_per_second;
      cpu_faster = cpu_step < step_seconds;
    }
    std::vector<std::string> options;
    if (batch.has_value()) options.push_back(absl::StrCat("a batch of ", *batch));
    if (cpu_faster) options.push_back("the cpu device");
    verdict.line = absl::StrCat("launch-bound: ", Percent(*verdict.overhead_fraction),
                                " of step time is fixed per-step overhead; this model is too "
                                "small for ",
                                device);
    if (!options.empty()) {
      // " \xE2\x80\x94 " is an em dash in UTF-8, as in the DeviceReport's example.
      absl::StrAppend(&verdict.line, " \xE2\x80\x94 ", absl::StrJoin(options, " or "),
                      " will be faster");
    }
    return verdict;
  }

  if (verdict.peak_fraction.has_value() && *verdict.peak_fraction >= kComputeBoundPeakFraction) {
    verdict.bound = SpeedBound::kComputeBound;
    verdict.line =
        absl::StrCat("compute-bound: ", Percent(*verdict.peak_fraction), " of measured peak");
    return verdict;
  }

  std::vector<std::string> parts;
  if (verdict.peak_fraction.has_value()) {
    parts.push_back(absl::StrCat(Percent(*verdict.peak_fraction), " of measured peak"));
  }
  if (verdict.overhead_fraction.has_value()) {
    parts.push_back(absl::StrCat(Percent(*verdict.overhead_fraction),
                                 " of step time is fixed per-step overhead"));
  }
  const std::string rate = absl::StrFormat("%.4g steps/s", verdict.steps_per_second);
  if (parts.empty()) {
    // Neither the peak nor the launch cost of this device is known (no Diagnose run yet, or a
    // TorchScript model without FLOPs and no launch figure): nothing to compare the rate with.
    verdict.line = absl::StrCat("not enough figures: ", rate, " on ", device,
                                ", but no Diagnose measurement to compare with");
    return verdict;
  }
  verdict.bound = SpeedBound::kBalanced;
  verdict.line = absl::StrCat("balanced: ", absl::StrJoin(parts, ", "), " (", rate, ")");
  return verdict;
}

}  // namespace trainerd::engine
