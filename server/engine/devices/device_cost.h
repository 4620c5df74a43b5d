// `--device auto` for a job: which device runs it fastest, from a cost model calibrated by
// Diagnose's figures (speed_report.h's kernel count, each device's launch and sync cost, FLOP rate
// and host-to-device bandwidth) and the job's model FLOPs per step. Pure arithmetic: no LibTorch,
// no clocks, so the decision is tested on recorded figures (this machine's CPU, an H200).
//
// Per device:
//   step        = k * launch_seconds + flops_per_step / peak        (LibTorch path; k as in
//                                                                    speed_report.h)
//               = kFusedStepSeconds + flops_per_step / (peak * kFusedEfficiency)
//                                                                   (fused path, CPU only)
//   job         = epochs * (steps_per_epoch * step + sync_seconds)   (the epoch's one transfer)
//               + dataset_bytes / host_to_device_bytes_per_second    (when the device does not
//                                                                    hold the data)
// The cheapest job wins; a device without figures is not estimated (and is chosen only when none
// has figures: then the caller's default applies).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainerd::engine {

// A fused CPU step's fixed cost and its share of the CPU's measured matmul peak, from
// docs/PERFORMANCE.md (2.9 us a step for the seed job; mlp3's 0.85 MFLOPs at ~10 GFLOP/s of a
// 118 GFLOP/s peak).
inline constexpr double kFusedStepSeconds = 3e-6;
inline constexpr double kFusedEfficiency = 0.08;

struct JobCostInput {
  double flops_per_step = 0.0;  // 0: unknown (TorchScript): only the fixed costs count
  int64_t layers = 1;           // the model's layers (speed_report.h's kernel count)
  int64_t steps_per_epoch = 0;
  int32_t epochs = 0;
  int64_t dataset_bytes = 0;  // features and targets, training and validation
  bool fused_on_cpu = false;  // the job would take the fused path on the CPU
};

struct DeviceCostFigures {
  std::string device;  // "cpu", "cuda:N"
  double peak_flops_per_second = 0.0;
  double launch_seconds = 0.0;
  double sync_seconds = 0.0;
  double host_to_device_bytes_per_second = 0.0;
  bool holds_dataset = false;  // the job's data is resident there already
};

struct DeviceCostEstimate {
  std::string device;
  double step_seconds = 0.0;
  double job_seconds = 0.0;
};

// The estimate for each device with usable figures (a positive peak; CPU or GPU), in the order
// given.
std::vector<DeviceCostEstimate> EstimateJobCost(const JobCostInput& job,
                                                const std::vector<DeviceCostFigures>& devices);

// The index in `estimates` of the cheapest job (the first of equals); nullopt when empty.
std::optional<size_t> Cheapest(const std::vector<DeviceCostEstimate>& estimates);

}  // namespace trainerd::engine
