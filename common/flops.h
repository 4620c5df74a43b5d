// Model FLOPs of a text model spec (common/model_spec.h), for the job's DeviceReport: how much
// arithmetic one training step asks of the device, to compare with the device's measured peak.
//
// Conventions (the usual ones for model FLOPs, so the figures compare with published ones):
//   - a multiply-add counts as 2 FLOPs;
//   - linear:N on a last dimension of F: 2 * F * N per output vector (leading per-row dimensions
//     multiply it); conv2d:C:K: 2 * C_in * K * K * C * H_out * W_out. Bias additions are left out:
//     they are one FLOP per output value, at most 1 / (2 * F) of the product, and leaving them out
//     keeps "linear:1 on one feature = 2 FLOPs per row";
//   - element-wise layers cost a few FLOPs per element (the k*FlopsPerElement constants in
//     flops.cc, e.g. relu 1, gelu 8, batchnorm 6); pools 1 FLOP per window element (a compare or
//     an add); dropout and flatten 0 (a mask multiply and a view: memory traffic, not arithmetic);
//   - one training step is forward + backward ~= 3 x forward (the backward pass computes the
//     gradients with respect to both the inputs and the weights, each about as costly as the
//     forward). The loss and the optimizer's update are left out: they scale with the outputs and
//     the parameters, not with the per-row arithmetic, and are small beside it.
// These are model FLOPs, not hardware FLOPs: they do not depend on how LibTorch runs the layers.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_spec.h"

namespace trainerd::common {

// Forward FLOPs for one row whose per-row shape (batch dimension excluded) is `feature_shape`.
// 0 when the shapes cannot be inferred (InferLayerShapes fails): the figure is then unknown,
// as it is for TorchScript modules.
double ForwardFlopsPerRow(const ModelSpec& spec, const std::vector<int64_t>& feature_shape);

// Model FLOPs of one training step (forward and backward, 3 x forward) at `batch` rows. 0 when
// unknown (shapes that cannot be inferred) or when batch <= 0.
double TrainingFlopsPerStep(const ModelSpec& spec, const std::vector<int64_t>& feature_shape,
                            int64_t batch);

}  // namespace trainerd::common
