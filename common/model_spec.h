// The text model spec ("linear:64,relu,linear:1"): parsing and per-row shape inference. Shared by
// trainctl (fast local feedback) and the engine (which builds the LibTorch module from it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd {

enum class LayerKind { kLinear, kRelu, kTanh, kSigmoid };

struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  // Integer arguments: linear:N has {N}; activations have none.
  std::vector<int64_t> args;

  // Canonical text, e.g. "linear:64" or "relu".
  std::string ToString() const;
};

struct ModelSpec {
  std::vector<LayerSpec> layers;

  // Canonical text, e.g. "linear:64,relu,linear:1".
  std::string ToString() const;
};

// "linear", "relu", ...
const char* LayerKindName(LayerKind kind);

// Parses the spec. Whitespace around layers is ignored; names are case-insensitive. Errors are
// INVALID_ARGUMENT sentences naming the 1-based layer, e.g. "layer 2: unknown layer 'relux'
// (known: linear, relu, tanh, sigmoid)", "layer 1 (linear) needs a positive output width, as in
// linear:64", "the model spec is empty". At most 64 layers; linear widths at most 1,048,576.
absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view text);

// The per-row output shape of the model for a per-row input shape (batch dimension excluded).
// Linear acts on the last dimension, as torch.nn.Linear does. Errors name the layer and the
// shapes, e.g. "layer 1 (linear) needs at least one input dimension; the input is a scalar".
absl::StatusOr<std::vector<int64_t>> InferOutputShape(const ModelSpec& spec,
                                                      const std::vector<int64_t>& input_shape);

// Number of trainable parameter values for that input shape (weights and biases).
absl::StatusOr<int64_t> CountParameters(const ModelSpec& spec,
                                        const std::vector<int64_t>& input_shape);

}  // namespace trainerd
