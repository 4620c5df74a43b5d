// Conversions between the API's protos (trainerd.v1) and the engine's domain types.
#pragma once

#include "absl/status/statusor.h"
#include "server/engine/types.h"
#include "trainerd/v1/datasets.pb.h"
#include "server/engine/engine.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::service {

// INVALID_ARGUMENT when the target dtype is unspecified.
absl::StatusOr<engine::DatasetHeader> FromProto(const v1::DatasetHeader& header);
v1::Dataset ToProto(const engine::DatasetMeta& meta);

// INVALID_ARGUMENT when the loss or optimizer is unspecified.
absl::StatusOr<engine::JobSpec> FromProto(const v1::JobSpec& spec);
v1::JobSpec ToProto(const engine::JobSpec& spec);
v1::EpochResult ToProto(const engine::EpochResult& epoch);
v1::Job ToProto(const engine::JobSnapshot& job);
v1::DeviceReport ToProto(const engine::DeviceReport& report);
v1::DeviceStatus ToProto(const engine::DeviceStatusInfo& device);
v1::DiagnoseResponse ToProto(const engine::Diagnosis& diagnosis);
v1::JobState ToProto(engine::JobState state);

}  // namespace trainerd::service
