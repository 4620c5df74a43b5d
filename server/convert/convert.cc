// Datasets, jobs and epochs both ways, as the services answer and the job store records them; a
// job's spec is convert_spec.cc's, the devices' and the diagnosis' convert_devices.cc's
// (convert.h).
#include "server/convert/convert.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/job_limits.h"
#include "common/safe_text.h"
#include "common/status_macros.h"
#include "common/table.h"

namespace trainerd::convert {

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t nanos = absl::ToUnixNanos(t);
  out->set_seconds(nanos / 1000000000);
  out->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

namespace {

absl::Time FromTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(t.seconds() * 1000000000 + t.nanos());
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
  switch (meta.location) {
    case engine::DatasetLocation::kDevice:
      out.set_location(v1::DATASET_LOCATION_DEVICE);
      break;
    case engine::DatasetLocation::kHost:
      out.set_location(v1::DATASET_LOCATION_HOST);
      break;
    case engine::DatasetLocation::kDisk:
      out.set_location(v1::DATASET_LOCATION_DISK);
      break;
  }
  SetTimestamp(meta.create_time, out.mutable_create_time());
  if (meta.last_used != absl::InfinitePast()) {
    SetTimestamp(meta.last_used, out.mutable_last_use_time());
  }
  out.set_target_min(meta.target_min);
  out.set_target_max(meta.target_max);
  out.set_owner(meta.owner);
  out.set_shared(meta.shared);
  out.set_peer_copy(meta.peer_copy);
  return out;
}

v1::EpochResult ToProto(const engine::EpochResult& epoch) {
  v1::EpochResult out;
  out.set_epoch(epoch.epoch);
  out.set_loss(epoch.loss);
  out.set_elapsed_seconds(epoch.elapsed_seconds);
  out.set_learning_rate(epoch.learning_rate);
  if (epoch.validation_loss.has_value()) out.set_validation_loss(*epoch.validation_loss);
  if (epoch.validation_accuracy.has_value()) {
    out.set_validation_accuracy(*epoch.validation_accuracy);
  }
  if (epoch.loss_scale.has_value()) {
    out.set_loss_scale(*epoch.loss_scale);
    out.set_skipped_steps(epoch.skipped_steps);
  }
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

v1::Dataset ToProtoFor(const engine::DatasetMeta& meta, const std::string& viewer) {
  v1::Dataset out = ToProto(meta);
  out.set_name(engine::DatasetNameFor(engine::DatasetKeyOf(meta), viewer));
  return out;
}

v1::Job ToProtoFor(const engine::JobSnapshot& job, const std::string& viewer) {
  v1::Job out = ToProto(job);
  v1::JobSpec& spec = *out.mutable_spec();
  if (!spec.dataset().empty()) spec.set_dataset(engine::DatasetNameFor(spec.dataset(), viewer));
  if (!spec.validation_dataset().empty()) {
    spec.set_validation_dataset(engine::DatasetNameFor(spec.validation_dataset(), viewer));
  }
  return out;
}

v1::Job ToProto(const engine::JobSnapshot& job) {
  v1::Job out;
  out.set_id(job.id);
  out.set_owner(job.owner);
  *out.mutable_spec() = ToProto(job.spec);
  out.set_state(ToProto(job.state));
  // An error may quote a worker or a module: shown as text, never as terminal controls.
  out.set_error(EscapeControls(job.error, LineBreaks::kSpace));
  for (const auto& epoch : job.epochs) *out.add_epochs() = ToProto(epoch);
  out.set_epochs_completed(
      std::max<int32_t>(job.epochs_completed, static_cast<int32_t>(job.epochs.size())));
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
  out.set_stopped_early(job.stopped_early);
  out.set_stop_reason(job.stop_reason);
  out.set_model_epoch(job.model_epoch);
  out.set_best_epoch(job.best_epoch);
  out.set_cancel_requested(job.cancel_requested);
  out.set_record_damaged(job.record_damaged);
  out.set_checkpoint_error(EscapeControls(job.checkpoint_error, LineBreaks::kSpace));
  out.set_model_sha256(job.model_sha256);
  for (const engine::RankPlacement& r : job.ranks) {
    v1::RankPlacement* rank = out.add_ranks();
    rank->set_rank(r.rank);
    rank->set_device(r.device);
    rank->set_node(r.node);
    if (job.spec.runs_on_peer()) {  // a member on a peer: its one rank, there
      rank->set_job_id(job.there.job_id);
      rank->set_request_id(job.there.request_id);
      rank->set_sweep_member(job.there.sweep_member);
    }
  }
  out.set_global_batch_size(job.spec.batch_size * std::max<int32_t>(1, job.spec.replicas));
  out.set_estimated_memory_bytes(job.estimated_memory_bytes);
  out.set_sweep_id(job.sweep_id);
  out.set_request_id(job.request_id);
  out.set_sweep_member(job.sweep_member);
  for (const engine::DeviceCostEstimate& e : job.device_estimates) {
    v1::DeviceEstimate* estimate = out.add_device_estimates();
    estimate->set_device(e.device);
    estimate->set_step_seconds(e.step_seconds);
    estimate->set_job_seconds(e.job_seconds);
  }
  *out.mutable_report() = ToProto(job.report);
  for (const auto& c : job.checkpoints) {
    v1::Checkpoint* checkpoint = out.add_checkpoints();
    checkpoint->set_epoch(c.epoch);
    checkpoint->set_path(c.path);
    checkpoint->set_size_bytes(c.size_bytes);
    checkpoint->set_sha256(c.sha256);
    if (c.create_time != absl::InfinitePast()) {
      SetTimestamp(c.create_time, checkpoint->mutable_create_time());
    }
  }
  for (const auto& r : job.restarts) {
    v1::JobRestart* restart = out.add_restarts();
    if (r.time != absl::InfinitePast()) SetTimestamp(r.time, restart->mutable_time());
    restart->set_from_epoch(r.from_epoch);
    restart->set_previous_state(ToProto(r.previous_state));
  }
  if (job.create_time != absl::InfinitePast())
    SetTimestamp(job.create_time, out.mutable_create_time());
  if (job.start_time != absl::InfinitePast())
    SetTimestamp(job.start_time, out.mutable_start_time());
  if (job.end_time != absl::InfinitePast()) SetTimestamp(job.end_time, out.mutable_end_time());
  return out;
}

absl::StatusOr<engine::JobState> FromProto(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return engine::JobState::kQueued;
    case v1::JOB_STATE_RUNNING:
      return engine::JobState::kRunning;
    case v1::JOB_STATE_SUCCEEDED:
      return engine::JobState::kSucceeded;
    case v1::JOB_STATE_FAILED:
      return engine::JobState::kFailed;
    case v1::JOB_STATE_CANCELLED:
      return engine::JobState::kCancelled;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown job state ", static_cast<int>(state)));
  }
}

engine::EpochResult FromProto(const v1::EpochResult& epoch) {
  engine::EpochResult out;
  out.epoch = epoch.epoch();
  out.loss = epoch.loss();
  out.elapsed_seconds = epoch.elapsed_seconds();
  out.learning_rate = epoch.learning_rate();
  if (epoch.has_validation_loss()) out.validation_loss = epoch.validation_loss();
  if (epoch.has_validation_accuracy()) out.validation_accuracy = epoch.validation_accuracy();
  if (epoch.has_loss_scale()) {
    out.loss_scale = epoch.loss_scale();
    out.skipped_steps = epoch.skipped_steps();
  }
  return out;
}

absl::StatusOr<engine::JobSnapshot> FromProto(const v1::Job& job) {
  engine::JobSnapshot out;
  out.id = job.id();
  out.owner = job.owner();
  absl::StatusOr<engine::JobSpec> spec = FromProto(job.spec());
  if (!spec.ok()) return spec.status();
  out.spec = *std::move(spec);
  absl::StatusOr<engine::JobState> state = FromProto(job.state());
  if (!state.ok()) return state.status();
  out.state = *state;
  out.error = job.error();
  for (const v1::EpochResult& epoch : job.epochs()) out.epochs.push_back(FromProto(epoch));
  out.epochs_completed = job.epochs_completed();
  out.final_loss = job.final_loss();
  out.wall_seconds = job.wall_seconds();
  out.steps = job.steps();
  out.samples_per_second = job.samples_per_second();
  out.device = job.device();
  out.host_syncs = job.host_syncs();
  for (const v1::Parameter& p : job.parameters()) {
    engine::ParameterValues values;
    values.name = p.name();
    values.shape.assign(p.shape().begin(), p.shape().end());
    values.values.assign(p.values().begin(), p.values().end());
    out.parameters.push_back(std::move(values));
  }
  out.parameter_count = job.parameter_count();
  out.stopped_early = job.stopped_early();
  out.stop_reason = job.stop_reason();
  out.model_epoch = job.model_epoch();
  out.best_epoch = job.best_epoch();
  out.cancel_requested = job.cancel_requested();
  out.record_damaged = job.record_damaged();
  out.checkpoint_error = job.checkpoint_error();
  out.model_sha256 = job.model_sha256();
  for (const v1::RankPlacement& r : job.ranks()) {
    out.ranks.push_back(engine::RankPlacement{r.rank(), r.device(), r.node()});
  }
  // A sweep's member dealt to a peer: one node and one replica, recorded as the spec's nodes and
  // its job there as its one rank's.
  if (out.spec.replicas <= 1 && out.spec.nodes.size() == 1) {
    out.spec.peer = std::move(out.spec.nodes.front());
    out.spec.nodes.clear();
    if (job.ranks_size() > 0) {
      out.there = engine::JobOnPeer{job.ranks(0).job_id(), job.ranks(0).request_id(),
                                    job.ranks(0).sweep_member()};
    }
  }
  out.estimated_memory_bytes = job.estimated_memory_bytes();
  out.sweep_id = job.sweep_id();
  out.request_id = job.request_id();
  out.sweep_member = job.sweep_member();
  for (const v1::DeviceEstimate& e : job.device_estimates()) {
    out.device_estimates.push_back({e.device(), e.step_seconds(), e.job_seconds()});
  }
  out.report = FromProto(job.report());
  for (const v1::Checkpoint& c : job.checkpoints()) {
    engine::CheckpointInfo checkpoint;
    checkpoint.epoch = c.epoch();
    checkpoint.path = c.path();
    checkpoint.size_bytes = c.size_bytes();
    checkpoint.sha256 = c.sha256();
    if (c.has_create_time()) checkpoint.create_time = FromTimestamp(c.create_time());
    out.checkpoints.push_back(std::move(checkpoint));
  }
  for (const v1::JobRestart& r : job.restarts()) {
    engine::JobRestart restart;
    if (r.has_time()) restart.time = FromTimestamp(r.time());
    restart.from_epoch = r.from_epoch();
    absl::StatusOr<engine::JobState> previous = FromProto(r.previous_state());
    restart.previous_state = previous.ok() ? *previous : engine::JobState::kQueued;
    out.restarts.push_back(restart);
  }
  if (job.has_create_time()) out.create_time = FromTimestamp(job.create_time());
  if (job.has_start_time()) out.start_time = FromTimestamp(job.start_time());
  if (job.has_end_time()) out.end_time = FromTimestamp(job.end_time());
  return out;
}

}  // namespace trainerd::convert
