// "Bring your own model": a TorchScript module uploaded with a job (JobSpec::torchscript, the bytes
// torch.jit.save writes) is loaded and checked against the dataset at Submit, so that a module
// that cannot train on the dataset fails there with INVALID_ARGUMENT rather than at epoch 1.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// The JobSpec::model text a TorchScript job may give instead of an empty one.
inline constexpr char kTorchScriptModelName[] = "torchscript";

// A module that passed LoadTorchScriptModule, owned by its job (the job trains it in place).
struct LoadedTorchScript {
  std::shared_ptr<torch::jit::Module> module;
  std::vector<int64_t> output_shape;  // per row, from a forward on a batch of 2 rows
  int64_t parameter_count = 0;        // values in all parameters
};

// Loads spec.torchscript (torch::jit::load from memory, on the CPU) and checks it against the
// dataset: at least one parameter; its forward, in eval mode under NoGradGuard on a copy of the
// module, takes a float32 batch of 2 rows shaped like the dataset's features and returns one
// tensor with the batch dimension first; the loss fits that per-row output (CheckLoss).
// INVALID_ARGUMENT with a sentence otherwise. Never throws.
//
// It runs on the Submit call: quick for the small modules a 64 MiB request can carry. Large
// modules (a streaming upload is a later issue) would move the load and the check to the engine's
// I/O thread, as dataset commits do.
absl::StatusOr<LoadedTorchScript> LoadTorchScriptModule(const JobSpec& spec,
                                                        const DatasetMeta& dataset);

}  // namespace trainerd::engine
