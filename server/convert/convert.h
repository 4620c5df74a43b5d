// Conversions between the API's protos (trainerd.v1) and the engine's domain types, shared by the
// gRPC services and the job store (which keeps jobs as the API's own messages). LibTorch-free and
// gRPC-free: the generated messages only.
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "server/engine/engine.h"
#include "server/engine/types.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::convert {

// INVALID_ARGUMENT when the target dtype is unspecified.
absl::StatusOr<engine::DatasetHeader> FromProto(const v1::DatasetHeader& header);
v1::Dataset ToProto(const engine::DatasetMeta& meta);

// INVALID_ARGUMENT when the loss or optimizer is unspecified.
absl::StatusOr<engine::JobSpec> FromProto(const v1::JobSpec& spec);
v1::JobSpec ToProto(const engine::JobSpec& spec);
// A sweep member's own spec (SweepPoint.fields): `sweep` with the paths of `point.fields` taken
// from `point.spec`, converted as FromProto converts a job's. INVALID_ARGUMENT for a path that
// names no field of JobSpec, or for more than kMaxSweepPointFields paths.
absl::StatusOr<engine::JobSpec> MemberSpecFromProto(const v1::JobSpec& sweep,
                                                    const v1::SweepPoint& point);
inline constexpr int kMaxSweepPointFields = 64;
// A random search's members (SubmitSweepRequest.search), each a SweepPoint with the drawn values
// in its spec and their paths in its fields; the same space and seed give the same points.
// INVALID_ARGUMENT, before anything is drawn, for trials outside 1 to kMaxSweepMembers, more than
// kMaxSearchParameters parameters, a path that names no single field of JobSpec or is searched
// twice, a distribution that does not fit its field's type, an empty or reversed range, or a
// choice its field cannot take.
absl::StatusOr<std::vector<v1::SweepPoint>> SamplePoints(const v1::SearchSpace& space);
inline constexpr int kMaxSearchParameters = 32;
v1::EpochResult ToProto(const engine::EpochResult& epoch);
v1::Job ToProto(const engine::JobSnapshot& job);
v1::DeviceReport ToProto(const engine::DeviceReport& report);
v1::DeviceStatus ToProto(const engine::DeviceStatusInfo& device);
v1::DiagnoseResponse ToProto(const engine::Diagnosis& diagnosis);
v1::WorkerSandbox ToProto(const SandboxReport& sandbox);
v1::WorkerSandbox ToProto(const engine::WorkerSandboxStatus& sandbox);
SandboxReport FromProto(const v1::WorkerSandbox& sandbox);
v1::JobState ToProto(engine::JobState state);

// What a caller named `viewer` is answered (dataset names are per owner): the dataset and the
// job's datasets named as it names them (engine::DatasetNameFor: its own by the bare name,
// another owner's as "OWNER/NAME"). ToProto's forms keep the keys (the job store's).
v1::Dataset ToProtoFor(const engine::DatasetMeta& meta, const std::string& viewer);
v1::Job ToProtoFor(const engine::JobSnapshot& job, const std::string& viewer);

// The reverse of the job's conversions, for the job store (which keeps jobs as v1 messages).
// INVALID_ARGUMENT when the message is not one ToProto could have written (an unknown state, or
// a spec FromProto(JobSpec) refuses).
absl::StatusOr<engine::JobSnapshot> FromProto(const v1::Job& job);
engine::EpochResult FromProto(const v1::EpochResult& epoch);
engine::DeviceReport FromProto(const v1::DeviceReport& report);
absl::StatusOr<engine::JobState> FromProto(v1::JobState state);

// `t` as a protobuf Timestamp (convert.cc and convert_devices.cc).
void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out);

}  // namespace trainerd::convert
