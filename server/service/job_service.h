// trainerd.v1.JobService over the engine, on gRPC's callback API. WatchJob is a server-streaming
// reactor fed by the engine's per-job event stream, with one write in flight.
#pragma once

#include "server/engine/engine.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::service {

// Thread-safe (stateless over the engine, which must outlive it and its streams).
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(engine::Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;

 private:
  engine::Engine* const engine_;
};

}  // namespace trainerd::service
