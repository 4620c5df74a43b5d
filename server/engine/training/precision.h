// Mixed precision (JobSpec::precision): autocast around a job's forward passes and, for fp16,
// dynamic loss scaling whose overflow check and skip decision stay on the device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "server/engine/types.h"

namespace trainerd::engine {

// The dtype autocast runs eligible ops in (matmuls, convolutions): kBFloat16 or kHalf; kFloat for
// fp32 (autocast off).
torch::ScalarType AutocastDtype(Precision precision);

// Turns autocast on for `device`'s type on the calling thread for its lifetime (nothing for fp32)
// and restores what was there before. Scope it around the forward pass only, as PyTorch's
// `with torch.autocast(...)` is used: leaving the outermost guard clears autocast's cache of
// lower-precision weight copies, which would otherwise go stale when the optimizer updates the
// weights in place. Not copyable; one thread.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat;
};

// Dynamic loss scaling for fp16, equal to PyTorch's GradScaler with the same optimizer, but
// without its host synchronisation: GradScaler reads `found_inf` on the host (`.item()`) to decide
// whether to call optimizer.step(); here the step always runs and is then undone on the device
// when the gradients overflowed, so the training loop never waits for the device.
//
// Per step: Scale(loss).backward(); Unscale(); [clip]; Step(optimizer). Step():
//  - snapshots the parameters and the optimizer's state tensors (momentum buffers, Adam moments,
//    and the step count of a DeviceStepOptimizer, which keeps it on the device),
//  - runs optimizer.step(),
//  - restores parameters and state where found_inf (torch::where, exact even when the step
//    produced NaN; state created by this step is reset to zeros, its value before a first step),
//  - updates the scale on the device (_amp_update_scale_: halve on overflow, double after
//    growth_interval clean steps) and counts the skipped step.
// A skipped step thus leaves everything as GradScaler's skip does, for every optimizer whose
// update depends on its step count (adam, adamw, nadam, radam, adagrad: MakeOptimizer gives them
// a DeviceStepOptimizer under fp16). SGD keeps no step count; LibTorch's RMSprop counts steps on
// the host without using the count, and the trainer winds it back at each epoch's one transfer
// (CorrectStepCounters), so that a checkpoint holds the true count.
// Not thread-safe (one job's worker thread).
class LossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, PyTorch's default
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };

  LossScaler(const torch::Device& device, const Options& options);

  // loss * scale, for backward().
  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Divides the gradients of `parameters` by the scale in place and records on the device whether
  // any of them is inf or NaN. Call once per step, after backward() and before clipping.
  void Unscale(const std::vector<torch::Tensor>& parameters);
  // optimizer.step(), undone on the device if Unscale() found a non-finite gradient; then updates
  // the scale. Nothing is read back to the host.
  void Step(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& parameters);

  // 0-d float32 on the device: the current scale.
  const torch::Tensor& scale() const { return scale_; }
  // 0-d float64 on the device: steps skipped since the last ResetSkippedSteps().
  const torch::Tensor& skipped_steps() const { return skipped_; }
  void ResetSkippedSteps() { skipped_.zero_(); }
  // Winds the host-side step counters of `optimizer`'s RMSprop state back by `skipped` steps
  // (never below 0); the other optimizers keep none on the host under fp16. Host arithmetic only.
  static void CorrectStepCounters(torch::optim::Optimizer& optimizer, int64_t skipped);

  // The scale and the growth tracker ("scale", "growth_tracker"), as GradScaler's state_dict keeps
  // them; Load puts saved values back (on this scaler's device). Load throws c10::Error when the
  // archive lacks them.
  void Save(torch::serialize::OutputArchive& archive) const;
  void Load(torch::serialize::InputArchive& archive);

 private:
  Options options_;
  torch::Tensor scale_;           // float32 []
  torch::Tensor growth_tracker_;  // int32 []: clean steps since the last change of scale
  torch::Tensor found_inf_;       // float32 []: 1 when this step's gradients overflowed
  torch::Tensor skipped_;         // float64 []
};

}  // namespace trainerd::engine
