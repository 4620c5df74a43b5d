// The limits every job submission is held to, in one place so that trainctl (before it sends) and
// trainerd (at Submit) apply the same ones, and the memory estimate of a text model spec that two
// of them bound. Everything is computed with common/checked_size.h's checked arithmetic.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_spec.h"

namespace trainerd {

// What a job gets for the settings its request leaves unset (proto3's zero, OPTIMIZER_KIND_
// UNSPECIFIED): the daemon fills them in (server/convert), so that every client, trainctl, Python
// or any gRPC caller, gets the same job without a copy of these values; trainctl shows them in
// its help. SGD is the optimizer.
inline constexpr double kDefaultLearningRate = 0.01;
inline constexpr int64_t kDefaultBatchSize = 32;
inline constexpr int32_t kDefaultEpochs = 10;

// Epochs per job.
inline constexpr int64_t kMaxEpochs = 1000000;
// Checkpoints one job may write (epochs / checkpoint_every): each is a file the size of the
// model and its optimizer state.
inline constexpr int64_t kMaxCheckpointsPerJob = 1000;
// Trainable values in one model (2^31: 8 GiB of float32 weights, before gradients and optimizer
// state).
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 31;
// The largest model archive a client downloads unless told otherwise (trainctl job model
// --max-size, the Python client's max_bytes): kMaxModelParameters float32 values and 64 MiB for
// the archive's code and records. A daemon that declares more, or sends more than it declared,
// is refused and the download stops.
inline constexpr int64_t kMaxModelDownloadBytes = kMaxModelParameters * 4 + (int64_t{64} << 20);
// Values in one loss weight list (JobSpec.class_weights, JobSpec.pos_weight): a list must also
// match the model's output width, checked against the dataset at Submit; longer than this is
// refused before it is copied.
inline constexpr int64_t kMaxLossWeights = int64_t{1} << 20;
// A job's estimated working set (EstimateTrainingMemory): 1 TiB, more than any one device holds.
inline constexpr int64_t kMaxJobMemoryBytes = int64_t{1} << 40;
// The largest gRPC message trainerd accepts (and trainctl sends): one SubmitJobRequest with a
// TorchScript module.
// The longest model spec text accepted (64 layers of canonical text take about 1.3 KB; the rest
// is room for whitespace). Longer is INVALID_ARGUMENT before it is parsed or stored.
inline constexpr int64_t kMaxModelSpecBytes = 4096;
// The longest job or sweep id a request may carry ("job-" and 12 hex digits are 16); longer ids
// are refused without being echoed.
inline constexpr int64_t kMaxJobIdLength = 64;
// The most bytes a page of ListJobs carries: a page ends early (with its next page token) rather
// than pass it, so that a listing fits gRPC's default receive limit (4 MiB) in every client. One
// job larger than this alone (the full view of a job with very many epochs) still goes, alone.
inline constexpr int64_t kMaxListReplyBytes = int64_t{4} << 20;
inline constexpr int64_t kMaxRequestMessageBytes = int64_t{64} << 20;
// A TorchScript module sent with a job: the message limit less room for the spec.
inline constexpr int64_t kMaxTorchScriptBytes = kMaxRequestMessageBytes - (int64_t{64} << 10);

// INVALID_ARGUMENT unless 1 <= epochs <= kMaxEpochs, checkpoint_every is 0 (off) or in
// [1, epochs], and the job writes at most kMaxCheckpointsPerJob checkpoints.
absl::Status CheckEpochsAndCheckpoints(int64_t epochs, int64_t checkpoint_every);

// What a job built from a text spec holds on its device while it trains, in bytes (float32).
struct MemoryEstimate {
  int64_t parameters = 0;        // trainable values
  int64_t parameter_bytes = 0;   // the weights
  int64_t gradient_bytes = 0;    // one gradient per weight
  int64_t optimizer_bytes = 0;   // optimizer_slots values per weight
  int64_t activation_bytes = 0;  // one batch: its gathered features, every layer's output kept
                                 // for the backward pass, and the largest output's gradient
  int64_t total_bytes = 0;
};

// Estimates a spec-built model's working set for `batch` rows shaped `feature_shape`.
// `optimizer_slots` is the optimizer's float32 state per parameter (sgd 0, or 1 with momentum;
// rmsprop 1, or 2 with momentum; adam and adamw 2). INVALID_ARGUMENT when the spec does not fit
// the shape or a size overflows.
absl::StatusOr<MemoryEstimate> EstimateTrainingMemory(const ModelSpec& spec,
                                                      const std::vector<int64_t>& feature_shape,
                                                      int64_t batch, int64_t optimizer_slots);

// RESOURCE_EXHAUSTED naming the figures when the model has more than kMaxModelParameters values
// or its estimate exceeds kMaxJobMemoryBytes; `model` names it in the sentence.
absl::Status CheckModelSize(const MemoryEstimate& estimate, absl::string_view model);

}  // namespace trainerd
