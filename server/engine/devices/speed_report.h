// What bounded a job's speed: the DeviceReport's derived figures (proto/trainerd/v1/jobs.proto)
// and its one-line verdict, from the job's recorded times and the device's Diagnose figures.
// Pure arithmetic: no LibTorch, no clocks, so the verdicts are tested on recorded figures.
//
// The estimate:
//   step time            t = compute_seconds / steps
//   steps_per_second     = steps / compute_seconds
//   achieved FLOP/s      = flops_per_step * steps_per_second
//   peak_fraction        = achieved / peak_flops_per_second (capped at 1), when both are known
//   kernels per step     k = kKernelsPerLayer * layers + kKernelsPerStepFixed (6 * layers + 10):
//                        forward ~2 kernels per layer, backward ~3, gradient zeroing ~1; the
//                        fixed part is the batch gather, the loss and its backward and the
//                        optimizer's foreach updates. An unknown layer count (TorchScript) counts
//                        as one layer, so the estimate stays a lower bound.
//   fixed overhead       o = k * launch_seconds (Diagnose's cost of one launch / dispatch)
//   overhead_fraction    = min(1, o / t), when launch_seconds is known
// The verdict, first match wins (thresholds are the k* constants below):
//   data-bound      data preparation > 30% of data + compute + host transfer time;
//   transfer-bound  host transfers > 30% of it;
//   communication-bound  a data-parallel job whose collectives take >= 40% of its compute time
//                   (collective_fraction): "communication-bound: 62% of step time in
//                   collectives across 2 ranks — a per-rank batch of 1024 or fewer ranks will
//                   be faster" (the batch: twice the current one, within the rows a rank
//                   trains per epoch);
//   launch-bound    overhead_fraction >= 0.5 and peak_fraction (when known) < 0.5;
//   compute-bound   peak_fraction >= 0.5: "compute-bound: 71% of measured peak";
//   balanced        otherwise, with the figures that are known;
//   unspecified     no timed step, or none of the Diagnose figures the last three need.
// Queue time is not the job's own speed (it waited for other jobs) and plays no part.
//
// A launch-bound verdict recommends a batch at which the per-step work would match the fixed
// overhead: work per row w = flops_per_step / batch / peak (or, without FLOPs or a peak, the
// measured (t - o) / batch), batch* = o / w, rounded up to a power of two, at least twice the
// current batch, and no more than the training rows (the largest power of two within them, or
// the rows themselves when that is not above the current batch). On a GPU it also says "or the cpu
// device will be faster" when the CPU's Diagnose figures predict a shorter step:
// k * cpu_launch_seconds + flops_per_step / cpu_peak_flops_per_second < t (only with known FLOPs,
// since the CPU's share of the work cannot be estimated otherwise).
//
// Caveat: on a GPU, host_transfer_seconds includes waiting for the kernels queued before each
// copy (see DeviceReport), so a job whose epochs are short next to the launch queue's depth shows
// part of its compute as transfer time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trainerd::engine {

enum class SpeedBound {
  kUnspecified,
  kLaunchBound,
  kComputeBound,
  kTransferBound,
  kDataBound,
  kBalanced,
  kCommunicationBound,
};

// "unspecified", "launch-bound", "compute-bound", "transfer-bound", "data-bound", "balanced",
// "communication-bound".
const char* SpeedBoundName(SpeedBound bound);

// Share of data + compute + host transfer time above which data preparation, or host transfers,
// are said to bound the job.
inline constexpr double kDataBoundShare = 0.30;
inline constexpr double kTransferBoundShare = 0.30;
// Share of a data-parallel job's compute time spent in collectives (rank 0's time inside the
// gradients' all-reduce, waiting for the slowest rank included) from which it is
// communication-bound: more ranks would make it slower, not faster.
inline constexpr double kCommunicationBoundShare = 0.40;
// Share of the step time that is fixed per-step overhead from which a job is launch-bound.
inline constexpr double kLaunchBoundOverheadFraction = 0.5;
// A step that does almost no arithmetic (under 2% of the measured peak): its overhead is the step
// time less its work at peak, not just the kernel estimate (6 per layer + 10 launches, a lower
// bound that misses dispatch, the allocator and the loop itself), so such a step is launch-bound.
inline constexpr double kTinyWorkPeakFraction = 0.02;
// Fraction of the device's measured peak from which a job is compute-bound.
inline constexpr double kComputeBoundPeakFraction = 0.5;
// Kernels per training step: kKernelsPerLayer * layers + kKernelsPerStepFixed.
inline constexpr int64_t kKernelsPerLayer = 6;
inline constexpr int64_t kKernelsPerStepFixed = 10;
// Largest batch recommended when the training rows are unknown.
inline constexpr int64_t kMaxSuggestedBatch = int64_t{1} << 20;

// A finished (or stopped) job's figures. Times are in seconds; negative values count as 0.
struct SpeedFigures {
  std::string device;  // "cpu" or "cuda:N"
  double queue_seconds = 0.0;
  double data_seconds = 0.0;
  double compute_seconds = 0.0;
  double host_transfer_seconds = 0.0;
  int64_t steps = 0;  // optimizer steps taken
  int64_t batch_size = 0;
  int64_t training_rows = 0;  // rows per epoch (0 = unknown)
  int32_t epochs_done = 0;
  double flops_per_step = 0.0;  // common::TrainingFlopsPerStep; 0 = unknown (TorchScript)
  int64_t layers = 0;           // layers of the model spec; 0 = unknown
  // This device's Diagnose figures (DeviceDiagnosis.matmul_flops_per_second, .launch_seconds).
  std::optional<double> peak_flops_per_second;
  std::optional<double> launch_seconds;
  // The CPU's Diagnose figures, to tell whether the cpu device would run a GPU job faster.
  std::optional<double> cpu_peak_flops_per_second;
  std::optional<double> cpu_launch_seconds;
  // A data-parallel job: its ranks, and rank 0's seconds inside collectives (part of
  // compute_seconds). ranks <= 1: a one-rank job.
  int32_t ranks = 1;
  double collective_seconds = 0.0;
};

struct SpeedVerdict {
  SpeedBound bound = SpeedBound::kUnspecified;
  std::string line;  // the DeviceReport's verdict
  double steps_per_second = 0.0;
  double achieved_flops_per_second = 0.0;
  std::optional<double> peak_fraction;        // 0..1
  std::optional<double> overhead_fraction;    // 0..1
  std::optional<double> collective_fraction;  // 0..1, a data-parallel job's
};

// Never divides by zero: missing figures leave the derived ones unset (or 0) and, when nothing
// can be said, give kUnspecified with "not enough figures: ...".
SpeedVerdict JudgeSpeed(const SpeedFigures& figures);

}  // namespace trainerd::engine
