// Exports a trained spec-built model as a TorchScript archive (the ZIP file torch.jit.save writes),
// so that users get back a model that torch.jit.load in Python and torch::jit::load in C++ accept.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_spec.h"

namespace trainerd::engine {

// The TorchScript source of the model's forward for a per-row input shape: one statement per
// layer over the parameters and buffers of submodule "<i>" (layer i's "weight", "bias",
// "running_mean", "running_var"), read as getattr(self, "<i>").weight. Eval semantics: dropout is the identity and batchnorm uses its
// running statistics. INVALID_ARGUMENT when the spec does not fit `input_shape`.
absl::StatusOr<std::string> TorchScriptSource(const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape);

// A trained model's state on the host: CPU tensors keyed as in the Sequential ("0.weight",
// "2.running_mean"), float32 but for batchnorm's num_batches_tracked (int64).
struct HostModelState {
  std::vector<std::pair<std::string, torch::Tensor>> parameters;  // model->named_parameters()
  // model->named_buffers(): batchnorm's running statistics and num_batches_tracked.
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
};

// Copies the model's state to the host. Off the CPU that is ONE device-to-host transfer (the
// tensors are flattened and concatenated on the device, copied once and split on the host), which
// the caller counts as one host sync; on the CPU nothing crosses a device (the tensors are cloned).
// Throws c10::Error like any LibTorch call.
HostModelState CopyModelStateToHost(const torch::nn::Sequential& model);

// Builds a torch::jit::Module "TrainerdModel" from `state` (of a model BuildModel made from `spec`
// and `input_shape`) and returns its saved archive. Each layer with tensors is a submodule named
// by its place, so that the module's state_dict() has nn.Sequential's keys ("0.weight",
// "1.running_mean", "1.num_batches_tracked") and loads into nn.Sequential built from the spec.
// The module's forward takes a float32 CPU batch shaped [rows, *input_shape]; its parameters are
// trainable, so users can fine-tune it. Never
// throws: LibTorch errors become INTERNAL with the error's first line.
absl::StatusOr<std::string> ExportTorchScript(const HostModelState& state, const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape);

// CopyModelStateToHost then ExportTorchScript; never throws.
absl::StatusOr<std::string> ExportTorchScript(const torch::nn::Sequential& model,
                                              const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape);

// Writes `archive` to `path` atomically: a temporary file in the same folder (created if missing),
// fsync, rename, fsync of the folder, so that a reader sees the whole archive or none. INTERNAL
// with the path and the reason on failure.
absl::Status WriteModelArchive(const std::string& path, const std::string& archive);

}  // namespace trainerd::engine
