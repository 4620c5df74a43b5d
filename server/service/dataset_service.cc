#include "server/service/dataset_service.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/convert/convert.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

using convert::FromProto;
using convert::ToProto;

namespace {

constexpr size_t kMaxChunkBytes = 1 << 20;  // 1 MiB, as the API documents

}  // namespace

// Reads the header, then appends each chunk into the engine's staging buffer; at the end of the
// stream hands the upload to the engine's I/O thread and finishes from its callback.
//
// Finish is called exactly once, by whichever path claims the stream first (a reaction, the
// commit's callback, the watchdog): the claim is made under mu_ and Finish is called after mu_ is
// released, as the caller's last use of the reactor, because gRPC may run OnDone (which deletes
// it) inside Finish. Until Finish is called, OnDone cannot run, so a claimed reactor stays alive.
class UploadReactor final : public grpc::ServerReadReactor<v1::UploadDatasetRequest> {
 public:
  UploadReactor(DatasetServiceImpl* service, grpc::CallbackServerContext* context,
                v1::Dataset* response)
      : service_(service), context_(context), response_(response) {
    caller_.owner = CallerName(context, service->authenticator_);
    last_activity_ = absl::Now();
    service_->Register(this);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    std::unique_ptr<engine::UploadSession> discarded;  // freed before Finish, outside mu_
    grpc::Status finish;
    bool read_more = false;
    std::unique_ptr<engine::UploadSession> to_commit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      last_activity_ = absl::Now();
      if (ok) {
        const absl::Status status = HandleLocked();
        read_more = status.ok();
        if (!read_more) finish = ToGrpcStatus(status);
      } else if (context_->IsCancelled()) {
        finish = grpc::Status(grpc::StatusCode::CANCELLED, "the upload was cancelled");
      } else if (upload_ == nullptr) {
        finish = ToGrpcStatus(absl::InvalidArgumentError("the upload carried no header"));
      } else if (upload_->received_bytes() != upload_->expected_bytes()) {
        finish = ToGrpcStatus(absl::InvalidArgumentError(absl::StrFormat(
            "the upload ended after %d of the %d payload bytes its header declared; nothing was "
            "kept",
            upload_->received_bytes(), upload_->expected_bytes())));
      } else {
        // The whole payload arrived: commit it on the engine's I/O thread. Only the commit's
        // callback finishes from now on; a cancellation meanwhile sets the upload's flag, which
        // the commit honours.
        committing_ = true;
        cancellation_ = upload_->cancellation();
        to_commit = std::move(upload_);
      }
      if (!read_more && to_commit == nullptr) {
        discarded = std::move(upload_);
        finished_ = true;
      }
    }
    if (to_commit != nullptr) {
      // (The callback may run at once, on this thread, when the engine is shutting down.)
      service_->engine_->CommitUploadAsync(std::move(to_commit),
                                           [this](absl::StatusOr<engine::DatasetMeta> meta) {
                                             if (meta.ok()) *response_ = ToProto(*meta);
                                             FinishOnce(ToGrpcStatus(meta.status()));
                                           });
      return;
    }
    // Outside mu_: a reaction must not hold a lock that another reaction (OnCancel) needs while it
    // starts an operation.
    if (read_more) {
      StartRead(&request_);
      return;
    }
    discarded.reset();  // releases the name and the staging memory before the client hears
    Finish(std::move(finish));
  }

  void OnCancel() override {
    std::unique_ptr<engine::UploadSession> discarded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancellation_ != nullptr) cancellation_->store(true);
      if (finished_ || committing_) return;
      discarded = std::move(upload_);
      finished_ = true;
    }
    discarded.reset();
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the upload was cancelled"));
  }

  void OnDone() override {
    service_->Unregister(this);
    delete this;
  }

  // Called by the watchdog with its lock held (so the reactor cannot be deleted meanwhile):
  // claims the stream when it has been idle for `timeout`, discarding the upload. The watchdog
  // then calls FinishIdle outside its lock.
  bool ClaimIfIdle(absl::Time now, absl::Duration timeout) {
    std::unique_ptr<engine::UploadSession> discarded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || committing_ || now - last_activity_ < timeout) return false;
      finished_ = true;
      discarded = std::move(upload_);
    }
    return true;
  }
  void FinishIdle(absl::Duration timeout) {
    Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrFormat("the upload sent nothing for %g s and was discarded",
                                        absl::ToDoubleSeconds(timeout))));
  }

 private:
  void FinishOnce(grpc::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(std::move(status));
  }

  absl::Status HandleLocked() {
    if (request_.has_header()) {
      if (upload_ != nullptr) {
        return absl::InvalidArgumentError("the header must be sent once, as the first message");
      }
      auto header = FromProto(request_.header());
      if (!header.ok()) return header.status();
      auto upload = service_->engine_->BeginUpload(*header, caller_);
      if (!upload.ok()) return upload.status();
      upload_ = *std::move(upload);
      return absl::OkStatus();
    }
    if (upload_ == nullptr) {
      return absl::InvalidArgumentError("the first message of an upload must be the header");
    }
    if (request_.data_case() == v1::UploadDatasetRequest::kSha256) {
      return upload_->SetTrailingSha256(request_.sha256());
    }
    const std::string& chunk = request_.chunk();
    if (chunk.size() > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a chunk of ", chunk.size(),
                                                     " bytes is over the limit of ", kMaxChunkBytes,
                                                     " bytes (1 MiB)"));
    }
    return upload_->Append(chunk);
  }

  DatasetServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  v1::Dataset* const response_;
  engine::CallContext caller_;
  v1::UploadDatasetRequest request_;  // the read in flight
  std::mutex mu_;
  std::unique_ptr<engine::UploadSession> upload_;    // guarded by mu_
  std::shared_ptr<std::atomic<bool>> cancellation_;  // guarded by mu_; set when committing
  absl::Time last_activity_;                         // guarded by mu_
  bool committing_ = false;                          // guarded by mu_
  bool finished_ = false;                            // guarded by mu_
};

DatasetServiceImpl::DatasetServiceImpl(engine::Engine* engine, Authenticator* authenticator,
                                       DatasetServiceOptions options)
    : engine_(engine), authenticator_(authenticator), options_(options) {
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

DatasetServiceImpl::~DatasetServiceImpl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void DatasetServiceImpl::Register(UploadReactor* upload) {
  std::lock_guard<std::mutex> lock(mu_);
  uploads_.insert(upload);
}

void DatasetServiceImpl::Unregister(UploadReactor* upload) {
  std::lock_guard<std::mutex> lock(mu_);
  uploads_.erase(upload);
}

size_t DatasetServiceImpl::open_uploads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return uploads_.size();
}

void DatasetServiceImpl::WatchdogLoop() {
  // Checks a few times per timeout, at least every second.
  const absl::Duration period = std::min(
      absl::Seconds(1), std::max(absl::Milliseconds(10), options_.upload_idle_timeout / 4));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, absl::ToChronoMilliseconds(period));
    if (stopping_) break;
    std::vector<UploadReactor*> idle;
    const absl::Time now = absl::Now();
    for (UploadReactor* upload : uploads_) {
      if (upload->ClaimIfIdle(now, options_.upload_idle_timeout)) idle.push_back(upload);
    }
    // Finish outside the lock: gRPC may run OnDone, which unregisters, inside Finish.
    lock.unlock();
    for (UploadReactor* upload : idle) upload->FinishIdle(options_.upload_idle_timeout);
    lock.lock();
  }
}

grpc::ServerReadReactor<v1::UploadDatasetRequest>* DatasetServiceImpl::UploadDataset(
    grpc::CallbackServerContext* context, v1::Dataset* response) {
  return new UploadReactor(this, context, response);
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

grpc::ServerUnaryReactor* DatasetServiceImpl::DeleteDataset(grpc::CallbackServerContext* context,
                                                            const v1::DeleteDatasetRequest* request,
                                                            v1::DeleteDatasetResponse* response) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(engine_->DeleteDataset(request->name())));
  return reactor;
}

}  // namespace trainerd::service
