// The text model spec ("conv2d:8:3,relu,maxpool2d:2,flatten,linear:10"): parsing and per-row shape
// inference. Shared by trainctl (fast local feedback) and the engine (which builds the LibTorch
// module from it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd {

enum class LayerKind {
  kLinear,
  kConv2d,
  kMaxPool2d,
  kAvgPool2d,
  kFlatten,
  kDropout,
  kBatchNorm,
  kLayerNorm,
  kRelu,
  kGelu,
  kTanh,
  kSigmoid,
  kSoftmax,
  kLogSoftmax,
};

struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  // Integer arguments: linear:N has {N}; conv2d has {C, K, stride, padding} (the parser fills in
  // stride 1 and padding 0 when they are left out); maxpool2d:K and avgpool2d:K have {K}; the
  // others have none.
  std::vector<int64_t> args;
  // dropout:P's drop probability, in [0, 1); 0 for every other layer.
  double rate = 0.0;

  // Canonical text, e.g. "linear:64", "conv2d:8:3" (stride 1 and padding 0 left out),
  // "conv2d:8:3:2:1", "dropout:0.5" (the shortest text that reads back as the same double) or
  // "relu".
  std::string ToString() const;
};

struct ModelSpec {
  std::vector<LayerSpec> layers;

  // Canonical text, e.g. "linear:64,relu,linear:1".
  std::string ToString() const;
};

// "linear", "conv2d", "relu", ...
const char* LayerKindName(LayerKind kind);

// Parses the spec. Whitespace around layers and arguments is ignored; names are case-insensitive.
// Errors are INVALID_ARGUMENT sentences naming the 1-based layer, e.g. "layer 2: unknown layer
// 'relux' (known: linear, conv2d, ...)", "layer 1 (linear) needs a positive output width, as in
// linear:64", "layer 1 (conv2d) output channels must be between 1 and 65536; got '0'", "the
// model spec is empty". At most 64 layers; linear widths at most 1,048,576; conv2d channels at
// most 65,536; kernel sizes, strides and paddings at most 1,048,576; dropout 0 <= P < 1.
absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view text);

// The per-row shapes through the model for a per-row input shape (batch dimension excluded):
// element i is layer i's input, the last element the model's output (layers + 1 elements).
//   linear:N        acts on the last dimension, as torch.nn.Linear does ([..., F] -> [..., N]);
//   conv2d:C:K:s:p  [C_in, H, W] -> [C, (H + 2p - K) / s + 1, (W + 2p - K) / s + 1];
//   max/avgpool2d:K [C, H, W] -> [C, H / K, W / K] (kernel and stride K, floored);
//   flatten         [d1, ..., dn] -> [d1 * ... * dn] (at least one dimension);
//   batchnorm       [F] (BatchNorm1d) or [C, H, W] (BatchNorm2d), shape kept;
//   layernorm       normalises over the whole per-row shape (at least one dimension), kept;
//   softmax, logsoftmax over the classes: a per-row vector [N], kept;
//   dropout, relu, gelu, tanh, sigmoid: any shape, kept.
// Errors name the layer and the shapes, e.g. "layer 1 (conv2d:8:3) needs a per-row input of shape
// CxHxW; the input is 784", "layer 3 (maxpool2d:4) would shrink 8x2x2 below 1x1".
absl::StatusOr<std::vector<std::vector<int64_t>>> InferLayerShapes(
    const ModelSpec& spec, const std::vector<int64_t>& input_shape);

// The per-row output shape of the model: the last of InferLayerShapes.
absl::StatusOr<std::vector<int64_t>> InferOutputShape(const ModelSpec& spec,
                                                      const std::vector<int64_t>& input_shape);

// Number of trainable parameter values for that input shape: linear in*N + N, conv2d
// C_in*C*K*K + C, batchnorm 2*C (running statistics are buffers, not parameters), layernorm
// 2 * the per-row size; the other layers have none.
absl::StatusOr<int64_t> CountParameters(const ModelSpec& spec,
                                        const std::vector<int64_t>& input_shape);

}  // namespace trainerd
