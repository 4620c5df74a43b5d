// The job service's server streams, each a reactor of its own file: a job's events (WatchJob,
// job_watch.cc) and a job's files (DownloadModel and DownloadCheckpoint, job_downloads.cc). The
// unary calls are job_service.cc's. Internal to the service layer.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "server/engine/engine.h"
#include "server/service/caller_slots.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::service {

// OK when `caller` may see and manage job `id` (access.h); NOT_FOUND, worded as for an unknown
// id, when it may not. Owners never change, so the answer holds for the call that follows.
absl::Status CheckJobAccess(engine::Engine* engine, const engine::CallContext& caller,
                            const std::string& id);

// Streams job `id`'s events to a caller named `viewer` (as whom its datasets are named), holding
// `slot` (the caller's watch) while it runs. Not OK `access`: the stream ends at once with it.
grpc::ServerWriteReactor<v1::JobEvent>* StartWatch(engine::Engine* engine, const std::string& id,
                                                   const std::string& viewer,
                                                   const absl::Status& access,
                                                   std::optional<CallerSlots::Slot> slot);

// Streams a succeeded job's model in `format`, or one of its checkpoints (`epoch`; 0: the
// newest), in chunks of at most 1 MiB checked against the digest recorded with the job.
grpc::ServerWriteReactor<v1::ModelChunk>* StartModelDownload(engine::Engine* engine,
                                                             const std::string& id,
                                                             v1::ModelFormat format,
                                                             const absl::Status& access);
grpc::ServerWriteReactor<v1::ModelChunk>* StartCheckpointDownload(engine::Engine* engine,
                                                                  const std::string& id,
                                                                  int32_t epoch,
                                                                  const absl::Status& access);

}  // namespace trainerd::service
