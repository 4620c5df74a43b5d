#include "server/engine/types.h"

namespace trainerd::engine {

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

}  // namespace trainerd::engine
