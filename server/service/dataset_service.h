// trainerd.v1.DatasetService over the engine, on gRPC's callback API. Each method converts the
// request, makes one non-blocking engine call and finishes; an upload's blocking commit runs on
// the engine's I/O thread.
#pragma once

#include "server/engine/engine.h"
#include "trainerd/v1/datasets.grpc.pb.h"

namespace trainerd::service {

// Thread-safe (stateless over the engine, which must outlive it).
class DatasetServiceImpl final : public v1::DatasetService::CallbackService {
 public:
  explicit DatasetServiceImpl(engine::Engine* engine) : engine_(engine) {}

  grpc::ServerReadReactor<v1::UploadDatasetRequest>* UploadDataset(
      grpc::CallbackServerContext* context, v1::Dataset* response) override;
  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* context,
                                         const v1::ListDatasetsRequest* request,
                                         v1::ListDatasetsResponse* response) override;
  grpc::ServerUnaryReactor* GetDataset(grpc::CallbackServerContext* context,
                                       const v1::GetDatasetRequest* request,
                                       v1::Dataset* response) override;
  grpc::ServerUnaryReactor* DeleteDataset(grpc::CallbackServerContext* context,
                                          const v1::DeleteDatasetRequest* request,
                                          v1::DeleteDatasetResponse* response) override;

 private:
  engine::Engine* const engine_;
};

}  // namespace trainerd::service
