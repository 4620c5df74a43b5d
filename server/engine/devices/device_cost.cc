#include "server/engine/devices/device_cost.h"

#include "server/engine/devices/speed_report.h"

namespace trainerd::engine {

std::vector<DeviceCostEstimate> EstimateJobCost(const JobCostInput& job,
                                                const std::vector<DeviceCostFigures>& devices) {
  std::vector<DeviceCostEstimate> out;
  const double flops = job.flops_per_step > 0 ? job.flops_per_step : 0.0;
  const int64_t layers = job.layers > 0 ? job.layers : 1;
  const double kernels = static_cast<double>(kKernelsPerLayer * layers + kKernelsPerStepFixed);
  for (const DeviceCostFigures& d : devices) {
    if (!(d.peak_flops_per_second > 0)) continue;  // not measured: no estimate
    DeviceCostEstimate e;
    e.device = d.device;
    if (d.device == "cpu" && job.fused_on_cpu) {
      e.step_seconds = kFusedStepSeconds + flops / (d.peak_flops_per_second * kFusedEfficiency);
    } else {
      e.step_seconds = kernels * d.launch_seconds + flops / d.peak_flops_per_second;
    }
    const double epoch_seconds =
        static_cast<double>(job.steps_per_epoch) * e.step_seconds + d.sync_seconds;
    e.job_seconds = static_cast<double>(job.epochs) * epoch_seconds;
    if (!d.holds_dataset && d.host_to_device_bytes_per_second > 0) {
      e.job_seconds += static_cast<double>(job.dataset_bytes) / d.host_to_device_bytes_per_second;
    }
    out.push_back(e);
  }
  return out;
}

std::optional<size_t> Cheapest(const std::vector<DeviceCostEstimate>& estimates) {
  std::optional<size_t> best;
  for (size_t i = 0; i < estimates.size(); ++i) {
    if (!best || estimates[i].job_seconds < estimates[*best].job_seconds) best = i;
  }
  return best;
}

}  // namespace trainerd::engine
