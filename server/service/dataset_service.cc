#include "server/service/dataset_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "server/service/convert.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {
namespace {

constexpr size_t kMaxChunkBytes = 1 << 20;  // 1 MiB, as the API documents

// Reads the header, then appends each chunk into the engine's staging buffer; at the end of the
// stream hands the upload to the engine's I/O thread and finishes from its callback.
class UploadReactor final : public grpc::ServerReadReactor<v1::UploadDatasetRequest> {
 public:
  UploadReactor(engine::Engine* engine, v1::Dataset* response)
      : engine_(engine), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or went away)
      if (upload_ == nullptr) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError("the upload carried no header")));
        return;
      }
      engine_->CommitUploadAsync(std::move(upload_),
                                 [this](absl::StatusOr<engine::DatasetMeta> meta) {
                                   if (meta.ok()) *response_ = ToProto(*meta);
                                   Finish(ToGrpcStatus(meta.status()));
                                 });
      return;
    }
    absl::Status status = Handle();
    if (!status.ok()) {
      upload_.reset();  // releases the name and the staging memory now
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    if (request_.has_header()) {
      if (upload_ != nullptr) {
        return absl::InvalidArgumentError("the header must be sent once, as the first message");
      }
      auto header = FromProto(request_.header());
      if (!header.ok()) return header.status();
      auto upload = engine_->BeginUpload(*header);
      if (!upload.ok()) return upload.status();
      upload_ = *std::move(upload);
      return absl::OkStatus();
    }
    if (upload_ == nullptr) {
      return absl::InvalidArgumentError("the first message of an upload must be the header");
    }
    const std::string& chunk = request_.chunk();
    if (chunk.size() > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a chunk of ", chunk.size(),
                                                     " bytes is over the limit of ",
                                                     kMaxChunkBytes, " bytes (1 MiB)"));
    }
    return upload_->Append(chunk);
  }

  engine::Engine* const engine_;
  v1::Dataset* const response_;
  v1::UploadDatasetRequest request_;
  std::unique_ptr<engine::UploadSession> upload_;
};

}  // namespace

grpc::ServerReadReactor<v1::UploadDatasetRequest>* DatasetServiceImpl::UploadDataset(
    grpc::CallbackServerContext* context, v1::Dataset* response) {
  return new UploadReactor(engine_, response);
}

grpc::ServerUnaryReactor* DatasetServiceImpl::ListDatasets(grpc::CallbackServerContext* context,
                                                           const v1::ListDatasetsRequest* request,
                                                           v1::ListDatasetsResponse* response) {
  for (const auto& meta : engine_->ListDatasets()) *response->add_datasets() = ToProto(meta);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DatasetServiceImpl::GetDataset(grpc::CallbackServerContext* context,
                                                         const v1::GetDatasetRequest* request,
                                                         v1::Dataset* response) {
  auto meta = engine_->GetDataset(request->name());
  if (meta.ok()) *response = ToProto(*meta);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(meta.status()));
  return reactor;
}

grpc::ServerUnaryReactor* DatasetServiceImpl::DeleteDataset(
    grpc::CallbackServerContext* context, const v1::DeleteDatasetRequest* request,
    v1::DeleteDatasetResponse* response) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(engine_->DeleteDataset(request->name())));
  return reactor;
}

}  // namespace trainerd::service
