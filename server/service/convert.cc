#include "server/service/convert.h"

#include "absl/time/time.h"

namespace trainerd::service {
namespace {

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t nanos = absl::ToUnixNanos(t);
  out->set_seconds(nanos / 1000000000);
  out->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

template <typename Repeated>
std::vector<int64_t> ToVector(const Repeated& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

}  // namespace

absl::StatusOr<engine::DatasetHeader> FromProto(const v1::DatasetHeader& header) {
  engine::DatasetHeader out;
  out.name = header.name();
  out.feature_shape = ToVector(header.feature_shape());
  out.target_shape = ToVector(header.target_shape());
  switch (header.target_dtype()) {
    case v1::DTYPE_FLOAT32:
      out.target_dtype = TargetDType::kFloat32;
      break;
    case v1::DTYPE_INT64:
      out.target_dtype = TargetDType::kInt64;
      break;
    default:
      return absl::InvalidArgumentError("target_dtype must be DTYPE_FLOAT32 or DTYPE_INT64");
  }
  out.rows = header.row_count();
  out.sha256 = header.sha256();
  return out;
}

v1::Dataset ToProto(const engine::DatasetMeta& meta) {
  v1::Dataset out;
  out.set_name(meta.name);
  for (int64_t d : meta.feature_shape) out.add_feature_shape(d);
  for (int64_t d : meta.target_shape) out.add_target_shape(d);
  out.set_target_dtype(meta.target_dtype == TargetDType::kInt64 ? v1::DTYPE_INT64
                                                                : v1::DTYPE_FLOAT32);
  out.set_row_count(meta.rows);
  out.set_size_bytes(meta.size_bytes);
  out.set_sha256(meta.sha256);
  out.set_device(meta.device);
  SetTimestamp(meta.create_time, out.mutable_create_time());
  out.set_target_min(meta.target_min);
  out.set_target_max(meta.target_max);
  return out;
}

absl::StatusOr<engine::JobSpec> FromProto(const v1::JobSpec& spec) {
  engine::JobSpec out;
  out.dataset = spec.dataset();
  out.model = spec.model();
  switch (spec.loss()) {
    case v1::LOSS_MSE:
      out.loss = engine::LossKind::kMse;
      break;
    case v1::LOSS_CROSS_ENTROPY:
      out.loss = engine::LossKind::kCrossEntropy;
      break;
    default:
      return absl::InvalidArgumentError("loss must be set: LOSS_MSE or LOSS_CROSS_ENTROPY");
  }
  switch (spec.optimizer().kind()) {
    case v1::OPTIMIZER_KIND_SGD:
      out.optimizer = engine::OptimizerKind::kSgd;
      break;
    case v1::OPTIMIZER_KIND_ADAM:
      out.optimizer = engine::OptimizerKind::kAdam;
      break;
    default:
      return absl::InvalidArgumentError(
          "optimizer.kind must be set: OPTIMIZER_KIND_SGD or OPTIMIZER_KIND_ADAM");
  }
  out.learning_rate = spec.optimizer().learning_rate();
  out.momentum = spec.optimizer().momentum();
  out.batch_size = spec.batch_size();
  out.epochs = spec.epochs();
  out.shuffle = spec.has_shuffle() ? spec.shuffle() : true;
  if (spec.has_seed()) out.seed = spec.seed();
  out.device = spec.device();
  return out;
}

v1::JobSpec ToProto(const engine::JobSpec& spec) {
  v1::JobSpec out;
  out.set_dataset(spec.dataset);
  out.set_model(spec.model);
  out.set_loss(spec.loss == engine::LossKind::kCrossEntropy ? v1::LOSS_CROSS_ENTROPY
                                                            : v1::LOSS_MSE);
  v1::Optimizer* opt = out.mutable_optimizer();
  opt->set_kind(spec.optimizer == engine::OptimizerKind::kAdam ? v1::OPTIMIZER_KIND_ADAM
                                                               : v1::OPTIMIZER_KIND_SGD);
  opt->set_learning_rate(spec.learning_rate);
  opt->set_momentum(spec.momentum);
  out.set_batch_size(spec.batch_size);
  out.set_epochs(spec.epochs);
  out.set_shuffle(spec.shuffle);
  if (spec.seed.has_value()) out.set_seed(*spec.seed);
  out.set_device(spec.device);
  return out;
}

v1::EpochResult ToProto(const engine::EpochResult& epoch) {
  v1::EpochResult out;
  out.set_epoch(epoch.epoch);
  out.set_loss(epoch.loss);
  out.set_elapsed_seconds(epoch.elapsed_seconds);
  return out;
}

v1::JobState ToProto(engine::JobState state) {
  switch (state) {
    case engine::JobState::kQueued:
      return v1::JOB_STATE_QUEUED;
    case engine::JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case engine::JobState::kSucceeded:
      return v1::JOB_STATE_SUCCEEDED;
    case engine::JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case engine::JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

v1::Job ToProto(const engine::JobSnapshot& job) {
  v1::Job out;
  out.set_id(job.id);
  *out.mutable_spec() = ToProto(job.spec);
  out.set_state(ToProto(job.state));
  out.set_error(job.error);
  for (const auto& epoch : job.epochs) *out.add_epochs() = ToProto(epoch);
  out.set_final_loss(job.final_loss);
  out.set_wall_seconds(job.wall_seconds);
  out.set_steps(job.steps);
  out.set_samples_per_second(job.samples_per_second);
  out.set_device(job.device);
  out.set_host_syncs(job.host_syncs);
  for (const auto& p : job.parameters) {
    v1::Parameter* param = out.add_parameters();
    param->set_name(p.name);
    for (int64_t d : p.shape) param->add_shape(d);
    for (float v : p.values) param->add_values(v);
  }
  out.set_parameter_count(job.parameter_count);
  if (job.create_time != absl::InfinitePast()) SetTimestamp(job.create_time, out.mutable_create_time());
  if (job.start_time != absl::InfinitePast()) SetTimestamp(job.start_time, out.mutable_start_time());
  if (job.end_time != absl::InfinitePast()) SetTimestamp(job.end_time, out.mutable_end_time());
  return out;
}

}  // namespace trainerd::service
