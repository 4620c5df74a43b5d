// The fused CPU path (training_path.h): a hand-written forward, backward and update for small
// sequential MLPs, on Eigen's matrix products over the model's own parameter memory. It builds the
// model and optimizer exactly as the LibTorch path does (same initial weights, same optimizer state
// objects, so checkpoints, exports and resumes are interchangeable between the paths) and keeps
// every buffer for the job's life; a step is a handful of small products and element-wise loops,
// with no operator dispatch and no autograd graph. docs/ARCHITECTURE.md, "Training paths".
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "server/engine/training/training_path.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// The widest layer the fused path takes.
inline constexpr int64_t kFusedMaxWidth = 256;

// Model FLOPs per step above which engine auto leaves a job to LibTorch. The fused path's large
// products are MKL's too (fused_path.cc, kBlasMinProduct); past this its scalar element-wise loops
// and update (compiled for baseline x86-64) cost what LibTorch's vectorised operators and their
// dispatches do. Measured on a 2-core Xeon: fused 4.3x faster at 1.7 MFLOPs a step, 1.9x at 16,
// even at 40 and 130 (docs/PERFORMANCE.md, "The fused CPU path").
inline constexpr double kFusedMaxFlopsPerStep = 30e6;

// Why a job cannot run on the fused path ("" when it can): a sentence naming the first thing in
// the way, e.g. "layer conv2d:8:3 has no fused kernel". The fused path takes flat feature vectors;
// linear, relu, tanh, sigmoid and gelu layers up to kFusedMaxWidth wide; the mse, l1, huber,
// bce_with_logits and cross_entropy losses; sgd (momentum, nesterov, weight decay), adam, adamw
// and rmsprop; schedules; clipping; validation; float32 on the CPU.
std::string FusedPathUnsupported(const JobSpec& spec, const ModelSpec& model,
                                 const std::vector<int64_t>& feature_shape, bool torchscript,
                                 const torch::Device& device);

// For engine auto: why LibTorch is expected to be faster for a job the fused path could take (""
// when the fused path is): its FLOPs per step at `batch` rows above kFusedMaxFlopsPerStep.
std::string FusedPathSlower(const ModelSpec& model, const std::vector<int64_t>& feature_shape,
                            int64_t batch);

// Requires FusedPathUnsupported(...) == "" for the run.
std::unique_ptr<TrainingPath> MakeFusedCpuPath(const TrainingRun& run, at::Generator gen);

}  // namespace trainerd::engine
