#include "server/service/system_service.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"
#include "server/engine/access.h"
#include "server/service/call_context.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

using convert::FromProto;
using convert::ToProto;

namespace {

// One Diagnose call, finished exactly once: by the worker with the result, or at once when the
// client cancels or its deadline passes (OnCancel). The claim is made under the call's mutex and
// Finish is the claimant's last use of the reactor (gRPC may delete it, through OnDone, inside
// Finish). The worker holds the call's state, not the reactor: a reactor that OnCancel finished
// may be gone when the measurement ends, and the state then says so.
class DiagnoseReactor final : public grpc::ServerUnaryReactor {
 public:
  struct Call {
    std::mutex mu;
    bool finished = false;                     // guarded by mu
    DiagnoseReactor* reactor = nullptr;        // valid until finished
    v1::DiagnoseResponse* response = nullptr;  // likewise
  };

  explicit DiagnoseReactor(v1::DiagnoseResponse* response) : call_(std::make_shared<Call>()) {
    call_->reactor = this;
    call_->response = response;
  }

  const std::shared_ptr<Call>& call() const { return call_; }

  // Whether the call was already answered (its client went away while it waited): the worker
  // then skips its measurement.
  static bool Finished(const std::shared_ptr<Call>& call) {
    std::lock_guard<std::mutex> lock(call->mu);
    return call->finished;
  }

  // Finishes the call with the measurement (or a shutdown status), unless it was finished.
  static void Complete(const std::shared_ptr<Call>& call,
                       const absl::StatusOr<engine::Diagnosis>& diagnosis,
                       const std::vector<engine::WorkerSandboxStatus>& sandboxes = {}) {
    DiagnoseReactor* reactor = nullptr;
    {
      std::lock_guard<std::mutex> lock(call->mu);
      if (call->finished) return;
      call->finished = true;
      if (diagnosis.ok()) {
        *call->response = ToProto(*diagnosis);
        for (const engine::WorkerSandboxStatus& s : sandboxes) {
          *call->response->add_worker_sandboxes() = ToProto(s);
        }
      }
      reactor = call->reactor;
    }
    reactor->Finish(ToGrpcStatus(diagnosis.status()));
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(call_->mu);
      if (call_->finished) return;
      call_->finished = true;
    }
    Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                        "the call was cancelled or its deadline passed; the measurement goes on "
                        "and a later call gets it from the cache"));
  }

  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<Call> call_;
};

}  // namespace

SystemServiceImpl::SystemServiceImpl(engine::Engine* engine, v1::VersionInfo version,
                                     Authenticator* authenticator, int max_diagnose_per_caller)
    : engine_(engine),
      version_(std::move(version)),
      authenticator_(authenticator),
      diagnose_slots_("Diagnose calls", "--max_diagnose_per_caller", max_diagnose_per_caller) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

grpc::ServerUnaryReactor* SystemServiceImpl::GetVersion(grpc::CallbackServerContext* context,
                                                        const v1::GetVersionRequest* /*request*/,
                                                        v1::VersionInfo* response) {
  *response = version_;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

SystemServiceImpl::~SystemServiceImpl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void SystemServiceImpl::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
    if (waiting_.empty()) return;
    std::function<void(bool)> call = std::move(waiting_.front());
    waiting_.pop_front();
    const bool run = !stopping_;
    lock.unlock();
    call(run);
    lock.lock();
  }
}

grpc::ServerUnaryReactor* SystemServiceImpl::ListDevices(grpc::CallbackServerContext* context,
                                                         const v1::ListDevicesRequest* /*request*/,
                                                         v1::ListDevicesResponse* response) {
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  // The devices name datasets by key: each as the caller names it (its own bare, others'
  // "OWNER/NAME"), and only those it may see.
  std::map<std::string, engine::DatasetMeta> datasets;
  for (engine::DatasetMeta& meta : engine_->ListDatasets()) {
    std::string key = engine::DatasetKeyOf(meta);
    datasets.emplace(std::move(key), std::move(meta));
  }
  for (engine::DeviceStatusInfo& device : engine_->ListDevices()) {
    auto& names = device.datasets;
    // The node's figures stay (counts, bytes, utilization); other tenants' names do not.
    names.erase(std::remove_if(names.begin(), names.end(),
                               [&](const std::string& key) {
                                 auto it = datasets.find(key);
                                 return it == datasets.end() || !engine::MayUse(caller, it->second);
                               }),
                names.end());
    for (std::string& key : names) key = engine::DatasetNameFor(key, caller.owner);
    if (!caller.admin) {
      auto& ids = device.running_jobs;
      ids.erase(std::remove_if(ids.begin(), ids.end(),
                               [&](const std::string& id) {
                                 const absl::StatusOr<engine::JobSnapshot> job =
                                     engine_->GetJob(id);
                                 return !job.ok() || !engine::Owns(caller, job->owner);
                               }),
                ids.end());
      for (std::string& rank : device.peer_ranks) rank = "a rank for a peer";
    }
    *response->add_devices() = ToProto(device);
  }
  // The node's sandbox is the same for every tenant, and names nothing of another's.
  for (const engine::WorkerSandboxStatus& sandbox : engine_->WorkerSandboxes()) {
    *response->add_worker_sandboxes() = ToProto(sandbox);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* SystemServiceImpl::Diagnose(grpc::CallbackServerContext* context,
                                                      const v1::DiagnoseRequest* request,
                                                      v1::DiagnoseResponse* response) {
  auto* reactor = new DiagnoseReactor(response);
  std::shared_ptr<DiagnoseReactor::Call> call = reactor->call();
  const bool refresh = request->refresh();
  // One caller's Diagnose calls at a time are bounded apart from the queue, so that one tenant
  // refreshing in a loop cannot fill it for the others.
  absl::StatusOr<CallerSlots::Slot> slot =
      diagnose_slots_.Take(CallContextOf(context, authenticator_).owner);
  if (!slot.ok()) {
    DiagnoseReactor::Complete(call, slot.status());
    return reactor;
  }
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = stopping_;
    if (!stopping_ && waiting_.size() < kMaxWaitingDiagnoses) {
      waiting_.push_back([this, call, refresh, slot = *std::move(slot)](bool run) {
        if (!run) {
          DiagnoseReactor::Complete(call, absl::UnavailableError("the daemon is shutting down"));
          return;
        }
        if (DiagnoseReactor::Finished(call)) return;  // nobody waits for this measurement
        absl::StatusOr<engine::Diagnosis> diagnosis = engine_->Diagnose(refresh);
        DiagnoseReactor::Complete(call, diagnosis, engine_->WorkerSandboxes());
      });
      cv_.notify_one();
      return reactor;
    }
  }
  DiagnoseReactor::Complete(
      call, stopping ? absl::UnavailableError("the daemon is shutting down")
                     : absl::ResourceExhaustedError(absl::StrCat(
                           kMaxWaitingDiagnoses,
                           " Diagnose calls are already waiting for the measurement; try again "
                           "when they have finished")));
  return reactor;
}

}  // namespace trainerd::service
