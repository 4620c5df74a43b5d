// The stacked LibTorch path for a pack of sweep members (trainer.h, RunPackedTraining): the
// members' parameters stacked on a leading member dimension, each layer one batched product
// (baddbmm) for every member at once, each member's loss on its own batch, one backward for all,
// and the optimizer's update as a handful of operators over the stacked tensors with the members'
// learning rates, momenta, weight decays and step counts held in device tensors. A step of M
// members costs the operators of one step, not M times as many: on a GPU, where a small model's
// step is launch-bound, that is the whole point of packing. docs/ARCHITECTURE.md, "Sweeps".
//
// Each member is seen by the epoch loop as a TrainingPath of its own (MemberPath): its Step records
// the member's batch, and the loop calls StepAll once every member has; its loss sums are slots of
// the pack's. A member keeps its own Sequential (built with its own seed), into which its slot is
// copied when it checkpoints or finishes, so that exports, read-backs and checkpoints are those of
// the same job run alone on the LibTorch path (a checkpoint resumes on either path).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/engine/training/trainer.h"
#include "server/engine/training/training_path.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// Why the job's members cannot train stacked ("" when they can): a spec-built model of flat
// features, linear layers and element-wise activations (relu, tanh, sigmoid, gelu), float32, the
// mse, l1, huber, bce_with_logits or cross_entropy loss; any device.
std::string StackedPathUnsupported(const TrainingRun& run);

// What a stacked member's report says of its values against the same job run alone
// (DeviceReport.packed_numerics). docs/ARCHITECTURE.md ("Sweeps") has the measurements.
inline constexpr char kStackedNumerics[] =
    "not bitwise the job alone: each linear layer ran as one batched product for every member "
    "(baddbmm), which sums in another order than the job alone's addmm; the first epoch agrees "
    "within float32 rounding, and later epochs drift apart as the job alone's do when only the "
    "order of its sums changes (another thread count, another path): at high learning rates by "
    "several percent of the loss";

class StackedPack {
 public:
  // `members` runs share everything but learning rate, momentum, weight decay and seed
  // (PackUnsupported); StackedPathUnsupported(*members.front()) == "".
  explicit StackedPack(const std::vector<const TrainingRun*>& members);
  ~StackedPack();
  StackedPack(const StackedPack&) = delete;
  StackedPack& operator=(const StackedPack&) = delete;

  // Member `i`'s path, its model built with its seed and its generator `gen`. Every member's path
  // is made before the first step; the pack stacks their parameters then.
  std::unique_ptr<TrainingPath> MemberPath(size_t i, at::Generator gen);

  // After every running member's Step (or ValidateBatch) of the round: the stacked step (or
  // validation batch) for the members that gave a batch. Members that ended give none; their
  // slots still compute (on zeros) and are never read again.
  void StepAll();
  void ValidateAll();

  class Impl;  // stacked_path.cc

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainerd::engine
