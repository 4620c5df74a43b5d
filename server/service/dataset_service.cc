#include "server/service/dataset_service.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/table.h"
#include "server/convert/convert.h"
#include "server/engine/access.h"
#include "server/service/call_context.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

using convert::FromProto;
using convert::ToProtoFor;

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
    caller_ = CallContextOf(context, service->authenticator_);
    last_activity_ = absl::Now();
    window_start_ = last_activity_;
    service_->Register(this);
    absl::StatusOr<CallerSlots::Slot> slot = service_->upload_slots_.Take(caller_.owner);
    if (!slot.ok()) {
      // Refused before a byte is read.
      {
        std::lock_guard<std::mutex> lock(mu_);
        finished_ = true;
      }
      Finish(ToGrpcStatus(slot.status()));
      return;
    }
    slot_ = *std::move(slot);
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
      if (ok) window_bytes_ += static_cast<int64_t>(request_.chunk().size());
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
                                             if (meta.ok()) {
                                               *response_ = ToProtoFor(*meta, caller_.owner);
                                             }
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
  // claims the stream when it has been idle for `timeout`, or sent fewer than `min_rate` bytes a
  // second over the last `timeout`, discarding the upload. The watchdog then calls FinishIdle
  // outside its lock.
  bool ClaimIfIdle(absl::Time now, absl::Duration timeout, int64_t min_rate) {
    std::unique_ptr<engine::UploadSession> discarded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || committing_) return false;
      if (now - last_activity_ >= timeout) {
        why_ = absl::StrFormat("the upload sent nothing for %g s and was discarded",
                               absl::ToDoubleSeconds(timeout));
      } else if (now - window_start_ >= timeout) {
        const double seconds = absl::ToDoubleSeconds(now - window_start_);
        if (min_rate > 0 && static_cast<double>(window_bytes_) < min_rate * seconds) {
          why_ = absl::StrFormat(
              "the upload sent %d bytes in %g s, under the %d bytes a second an upload must "
              "keep up (--min_upload_bytes_per_second), and was discarded",
              window_bytes_, seconds, min_rate);
        } else {
          window_start_ = now;
          window_bytes_ = 0;
          return false;
        }
      } else {
        return false;
      }
      finished_ = true;
      discarded = std::move(upload_);
    }
    return true;
  }
  void FinishIdle() {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = why_;
    }
    Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, why));
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
      // Whose names the dataset goes into: the caller's, or (a leader's copy for its jobs here,
      // "OWNER/NAME" with for_peer_jobs, an admin's upload) OWNER's, as if OWNER uploaded it.
      const bool for_peers = request_.header().for_peer_jobs();
      if (for_peers && !caller_.admin) {
        return absl::PermissionDeniedError(
            "only another daemon with its peer credentials (an admin's) uploads copies for peer "
            "jobs (for_peer_jobs)");
      }
      absl::StatusOr<DatasetReference> name = ParseDatasetReference(header->name);
      if (!name.ok()) return name.status();
      engine::CallContext owner = caller_;
      if (name->qualified && name->owner != caller_.owner) {
        if (!for_peers) {
          return absl::InvalidArgumentError(absl::StrCat(
              "dataset name '", absl::CHexEscape(header->name.substr(0, 64)),
              header->name.size() > 64 ? "...'" : "'",
              " is invalid for an upload: a dataset is uploaded under a bare name, as the "
              "caller's own (OWNER/NAME names another owner's dataset in the other calls)"));
        }
        owner.owner = name->owner;
        owner.admin = name->owner.empty() || service_->authenticator_ == nullptr ||
                      service_->authenticator_->IsAdminName(name->owner);
      }
      header->name = name->name;
      auto upload =
          service_->engine_->BeginUpload(*header, owner, request_.header().for_peer_jobs());
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
  absl::Time window_start_;                          // guarded by mu_: the rate's window
  int64_t window_bytes_ = 0;                         // guarded by mu_: received in the window
  std::string why_;                                  // guarded by mu_: the watchdog's reason
  CallerSlots::Slot slot_;                           // one of the caller's upload slots
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
      if (upload->ClaimIfIdle(now, options_.upload_idle_timeout,
                              options_.min_upload_bytes_per_second)) {
        idle.push_back(upload);
      }
    }
    // Finish outside the lock: gRPC may run OnDone, which unregisters, inside Finish.
    lock.unlock();
    for (UploadReactor* upload : idle) upload->FinishIdle();
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
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  std::vector<v1::Dataset> visible;
  for (const auto& meta : engine_->ListDatasets()) {
    if (engine::MayUse(caller, meta)) visible.push_back(ToProtoFor(meta, caller.owner));
  }
  // By name as the caller sees it: its own (bare) and others' ("OWNER/NAME") in one order.
  std::sort(visible.begin(), visible.end(),
            [](const v1::Dataset& a, const v1::Dataset& b) { return a.name() < b.name(); });
  for (v1::Dataset& dataset : visible) *response->add_datasets() = std::move(dataset);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DatasetServiceImpl::GetDataset(grpc::CallbackServerContext* context,
                                                         const v1::GetDatasetRequest* request,
                                                         v1::Dataset* response) {
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  // The engine resolves the name for the caller ("NAME" its own, "OWNER/NAME" another's) and
  // answers what it may not see as NOT_FOUND.
  absl::StatusOr<engine::DatasetMeta> meta = engine_->GetDataset(request->name(), caller);
  if (meta.ok()) *response = ToProtoFor(*meta, caller.owner);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(meta.status()));
  return reactor;
}

grpc::ServerUnaryReactor* DatasetServiceImpl::DeleteDataset(grpc::CallbackServerContext* context,
                                                            const v1::DeleteDatasetRequest* request,
                                                            v1::DeleteDatasetResponse* response) {
  if (absl::Status name = ParseDatasetReference(request->name()).status(); !name.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(name));
    return reactor;
  }
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  return FinishFromPool(options_.blocking, context, caller.owner,
                        [engine = engine_, request, caller] {
                          return engine->DeleteDataset(request->name(), caller);
                        });
}

grpc::ServerUnaryReactor* DatasetServiceImpl::ShareDataset(grpc::CallbackServerContext* context,
                                                           const v1::ShareDatasetRequest* request,
                                                           v1::Dataset* response) {
  if (absl::Status name = ParseDatasetReference(request->name()).status(); !name.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(name));
    return reactor;
  }
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  return FinishFromPool(options_.blocking, context, caller.owner,
                        [engine = engine_, request, response, caller] {
                          absl::StatusOr<engine::DatasetMeta> meta =
                              engine->ShareDataset(request->name(), request->shared(), caller);
                          if (meta.ok()) *response = ToProtoFor(*meta, caller.owner);
                          return meta.status();
                        });
}

}  // namespace trainerd::service
