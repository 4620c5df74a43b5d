#include "server/engine/types.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace trainerd::engine {

std::string DatasetKey(const std::string& owner, const std::string& name) {
  return owner.empty() ? name : owner + "/" + name;
}

DatasetKeyParts SplitDatasetKey(const std::string& key) {
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

absl::StatusOr<std::string> ResolveDatasetReference(const std::string& reference,
                                                    const std::string& caller_owner) {
  absl::StatusOr<DatasetReference> parsed = ParseDatasetReference(reference);
  if (!parsed.ok()) return parsed.status();
  return DatasetKey(parsed->qualified ? parsed->owner : caller_owner, parsed->name);
}

std::string DatasetNameFor(const std::string& key, const std::string& viewer) {
  const DatasetKeyParts parts = SplitDatasetKey(key);
  if (parts.owner == viewer) return parts.name;
  return parts.owner + "/" + parts.name;
}

const char* LossKindName(LossKind loss) {
  switch (loss) {
    case LossKind::kMse:
      return "mse";
    case LossKind::kCrossEntropy:
      return "cross_entropy";
    case LossKind::kL1:
      return "l1";
    case LossKind::kHuber:
      return "huber";
    case LossKind::kBceWithLogits:
      return "bce_with_logits";
    case LossKind::kNll:
      return "nll";
  }
  return "unknown";
}

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kRmsprop:
      return "rmsprop";
    case OptimizerKind::kNAdam:
      return "nadam";
    case OptimizerKind::kRAdam:
      return "radam";
    case OptimizerKind::kAdagrad:
      return "adagrad";
  }
  return "unknown";
}

const char* ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kConstant:
      return "constant";
    case ScheduleKind::kStep:
      return "step";
    case ScheduleKind::kCosine:
      return "cosine";
    case ScheduleKind::kOneCycle:
      return "onecycle";
    case ScheduleKind::kPlateau:
      return "plateau";
    case ScheduleKind::kMultiStep:
      return "multistep";
    case ScheduleKind::kExponential:
      return "exponential";
    case ScheduleKind::kCosineWarmRestarts:
      return "cosine_restarts";
  }
  return "unknown";
}

const char* EarlyStopMetricName(EarlyStopMetric metric) {
  switch (metric) {
    case EarlyStopMetric::kValidationLoss:
      return "loss";
    case EarlyStopMetric::kValidationAccuracy:
      return "accuracy";
  }
  return "loss";
}

const char* ModelFromName(ModelFrom from) {
  switch (from) {
    case ModelFrom::kAuto:
      return "auto";
    case ModelFrom::kLast:
      return "last";
    case ModelFrom::kBest:
      return "best";
  }
  return "auto";
}

const char* EngineKindName(EngineKind engine) {
  switch (engine) {
    case EngineKind::kAuto:
      return "auto";
    case EngineKind::kFused:
      return "fused";
    case EngineKind::kLibTorch:
      return "libtorch";
  }
  return "auto";
}

const char* JobPriorityName(JobPriority priority) {
  switch (priority) {
    case JobPriority::kLow:
      return "low";
    case JobPriority::kNormal:
      return "normal";
    case JobPriority::kHigh:
      return "high";
  }
  return "normal";
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "unknown";
}

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

int64_t HeldOutRows(double validation_fraction, int64_t rows) {
  // NaN and fractions outside [0, 1] are refused by CheckJobSpec; here they are only kept from
  // overflowing (llround of NaN is undefined).
  if (!(validation_fraction > 0)) return 0;
  if (validation_fraction >= 1) return rows;
  return std::llround(validation_fraction * static_cast<double>(rows));
}

int64_t TrainedRowsPerEpoch(const JobSpec& spec, int64_t rows) {
  const int64_t training = rows - HeldOutRows(spec.validation_fraction, rows);
  if (!spec.drop_last || spec.batch_size < 1) return training;
  const int64_t global = spec.batch_size * std::max<int64_t>(1, spec.replicas);
  return training / global * global;
}

void ResolveLossFromTargets(JobSpec& spec, const DatasetMeta& dataset) {
  if (!spec.loss_from_targets) return;
  spec.loss =
      dataset.target_dtype == TargetDType::kInt64 ? LossKind::kCrossEntropy : LossKind::kMse;
  spec.loss_from_targets = false;
}

std::string NodeName(const std::string& configured) {
  if (!configured.empty()) return configured;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

}  // namespace trainerd::engine
