// trainerd.v1.JobService over the engine, on gRPC's callback API. WatchJob is a server-streaming
// reactor fed by the engine's per-job event stream, with one write in flight; DownloadModel streams
// a trained model's file the same way.
#pragma once

#include "server/engine/engine.h"
#include "server/service/auth.h"
#include "server/service/blocking_calls.h"
#include "server/service/caller_slots.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::service {

// Thread-safe (stateless over the engine and the authenticator, which must outlive it and its
// streams; a null authenticator records no caller names).
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `max_watches_per_caller`: WatchJob streams one caller may hold open at once (0: no limit).
  // `blocking`: where the calls that commit a job record run (blocking_calls.h); must outlive the
  // service's calls. Null: on gRPC's threads (a service built alone in a test).
  explicit JobServiceImpl(engine::Engine* engine, Authenticator* authenticator = nullptr,
                          int max_watches_per_caller = 64, BlockingCalls* blocking = nullptr)
      : engine_(engine),
        authenticator_(authenticator),
        blocking_(blocking),
        watch_slots_("open watches", "--max_watches_per_caller", max_watches_per_caller) {}

  grpc::ServerUnaryReactor* SubmitSweep(grpc::CallbackServerContext* context,
                                        const v1::SubmitSweepRequest* request,
                                        v1::SubmitSweepResponse* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  // Streams the archive of a SUCCEEDED job's model (Engine::ModelArchivePath) in chunks of at
  // most 1 MiB, reading the next chunk only after the previous one was written.
  grpc::ServerWriteReactor<v1::ModelChunk>* DownloadModel(
      grpc::CallbackServerContext* context, const v1::DownloadModelRequest* request) override;
  grpc::ServerWriteReactor<v1::ModelChunk>* DownloadCheckpoint(
      grpc::CallbackServerContext* context,
      const v1::DownloadCheckpointRequest* request) override;

 private:
  engine::Engine* const engine_;
  Authenticator* const authenticator_;
  BlockingCalls* const blocking_;
  CallerSlots watch_slots_;
};

}  // namespace trainerd::service
