// The limits of a job submission and the memory estimate of a text model spec.
#include "common/job_limits.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_size.h"
#include "common/status_macros.h"

namespace trainerd {
namespace {

std::string Bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  }
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

absl::Status CheckEpochsAndCheckpoints(int64_t epochs, int64_t checkpoint_every) {
  if (epochs < 1 || epochs > kMaxEpochs) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs must be between 1 and ", kMaxEpochs, "; got ", epochs));
  }
  if (checkpoint_every < 0 || checkpoint_every > epochs) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint every must be 0 (off) or between 1 and the epochs (", epochs,
                     "); got ", checkpoint_every));
  }
  if (checkpoint_every > 0 && epochs / checkpoint_every > kMaxCheckpointsPerJob) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a checkpoint every ", checkpoint_every, " epochs over ", epochs, " epochs writes ",
        epochs / checkpoint_every, " checkpoints; at most ", kMaxCheckpointsPerJob,
        " are allowed (checkpoint every ", (epochs + kMaxCheckpointsPerJob - 1) / kMaxCheckpointsPerJob,
        " epochs or more)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MemoryEstimate> EstimateTrainingMemory(const ModelSpec& spec,
                                                      const std::vector<int64_t>& feature_shape,
                                                      int64_t batch, int64_t optimizer_slots) {
  if (batch < 1 || optimizer_slots < 0) {
    return absl::InvalidArgumentError("the batch must be at least 1 row");
  }
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> shapes,
                            InferLayerShapes(spec, feature_shape));
  const std::string what = absl::StrCat("the memory estimate of '", spec.ToString(), "'");
  MemoryEstimate estimate;
  TRAINERD_ASSIGN_OR_RETURN(estimate.parameters, CountParameters(spec, feature_shape));
  TRAINERD_ASSIGN_OR_RETURN(estimate.parameter_bytes, CheckedMul(estimate.parameters, 4, what));
  estimate.gradient_bytes = estimate.parameter_bytes;
  TRAINERD_ASSIGN_OR_RETURN(estimate.optimizer_bytes,
                            CheckedMul(estimate.parameter_bytes, optimizer_slots, what));
  // shapes[0] is the gathered input batch; shapes[i + 1] layer i's output, kept for backward.
  int64_t kept = 0;
  int64_t largest = 0;
  for (const std::vector<int64_t>& shape : shapes) {
    TRAINERD_ASSIGN_OR_RETURN(const int64_t bytes, CheckedByteSize(batch, shape, 4, what));
    TRAINERD_ASSIGN_OR_RETURN(kept, CheckedAdd(kept, bytes, what));
    largest = std::max(largest, bytes);
  }
  TRAINERD_ASSIGN_OR_RETURN(estimate.activation_bytes, CheckedAdd(kept, largest, what));
  int64_t total = 0;
  for (const int64_t part : {estimate.parameter_bytes, estimate.gradient_bytes,
                             estimate.optimizer_bytes, estimate.activation_bytes}) {
    TRAINERD_ASSIGN_OR_RETURN(total, CheckedAdd(total, part, what));
  }
  estimate.total_bytes = total;
  return estimate;
}

absl::Status CheckModelSize(const MemoryEstimate& estimate, absl::string_view model) {
  if (estimate.parameters > kMaxModelParameters) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model '", model, "' has ", estimate.parameters, " parameters; at most ",
                     kMaxModelParameters, " are allowed"));
  }
  if (estimate.total_bytes > kMaxJobMemoryBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model '", model, "' would need about ", Bytes(estimate.total_bytes),
        " to train (weights ", Bytes(estimate.parameter_bytes), ", gradients ",
        Bytes(estimate.gradient_bytes), ", optimizer state ", Bytes(estimate.optimizer_bytes),
        ", activations of one batch ", Bytes(estimate.activation_bytes), "); at most ",
        Bytes(kMaxJobMemoryBytes), " per job is allowed"));
  }
  return absl::OkStatus();
}

}  // namespace trainerd
