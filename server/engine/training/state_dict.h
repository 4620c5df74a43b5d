// A trained model's weights as a safetensors file (common/safetensors.h): the state_dict that
// PyTorch's load_state_dict takes, with the names of the module the user builds or owns.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "server/engine/training/exported_program.h"
#include "server/engine/training/torchscript_export.h"

namespace trainerd::engine {

// The safetensors dtype of a tensor's scalar type ("F32", "I64", ...); empty for one the format
// does not have (complex, quantized).
std::string SafetensorsDtypeOf(torch::ScalarType type);

// The safetensors of a spec-built model's state (CopyModelStateToHost): exactly the entries of
// nn.Sequential(...).state_dict() for the same spec, in its order (each layer's parameters, then
// its buffers: "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
// "1.num_batches_tracked" as int64). Metadata: "format" "pt", "trainerd.model" the spec's
// canonical text, "trainerd.feature_shape" one row's shape as a JSON list ("[1, 28, 28]").
// INTERNAL when a tensor cannot be written (never for a model BuildModel made).
absl::StatusOr<std::string> SequentialSafetensors(const HostModelState& state,
                                                  const ModelSpec& spec,
                                                  const std::vector<int64_t>& feature_shape);

// The safetensors of a TorchScript module's state_dict() as Python's nn.Module.state_dict()
// orders it (a module's own parameters, then its own buffers, then each submodule's in turn,
// named by their path: "encoder.0.weight"), the module on the CPU. Metadata: "format" "pt",
// "trainerd.model" "torchscript", "trainerd.feature_shape". INTERNAL when a tensor's dtype has no
// safetensors name; never throws.
absl::StatusOr<std::string> ModuleSafetensors(const torch::jit::Module& module,
                                              const std::vector<int64_t>& feature_shape);

// The safetensors of an exported program's trained state (ExportedProgram): its parameters, then
// its buffers, under the module's own names ("fc.weight", "bn.running_mean"), the keys the user's
// module's load_state_dict takes. Metadata as ModuleSafetensors's, "trainerd.model" "exported".
// INTERNAL as there; never throws.
absl::StatusOr<std::string> ExportedSafetensors(const ExportedProgram& program,
                                                const std::vector<int64_t>& feature_shape);

}  // namespace trainerd::engine
