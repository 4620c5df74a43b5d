// grpc.health.v1.Health with bounded Watch streams (health_service.h).
#include "server/service/health_service.h"

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainerd::service {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// gRPC's default health service refuses longer names (INVALID_ARGUMENT) rather than look them up.
constexpr size_t kMaxServiceNameLength = 200;

grpc::Status CheckServiceName(const HealthCheckRequest& request) {
  if (request.service().size() > kMaxServiceNameLength) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a service name has at most ", kMaxServiceNameLength,
                                     " characters; this one has ", request.service().size()));
  }
  return grpc::Status::OK;
}

// A stream refused before it started: finished at once, deleted when gRPC is done with it.
class RefusedWatch final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  explicit RefusedWatch(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

std::string ClientAddress(absl::string_view peer) {
  const bool ipv4 = absl::StartsWith(peer, "ipv4:");
  const bool ipv6 = absl::StartsWith(peer, "ipv6:");
  if (!ipv4 && !ipv6) return std::string(peer);
  // The port follows the last colon (an IPv6 address is in brackets, its colons inside them).
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos || colon <= 5) return std::string(peer);
  if (ipv6 && peer[colon - 1] != ']') return std::string(peer);
  return std::string(peer.substr(0, colon));
}

// One open Watch stream. Writes one status at a time: a change that comes while a write is in
// flight waits (only the newest), so a caller that reads nothing holds one message at most.
// Lock order: the service's mutex, then this one's.
class HealthService::WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  WatchReactor(HealthService* service, std::string name, std::string address)
      : service_(service), name_(std::move(name)), address_(std::move(address)) {}

  const std::string& name() const { return name_; }
  const std::string& address() const { return address_; }

  // Sends `status` unless it is the one sent last.
  void Send(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finishing_ || end_.has_value()) return;
    if (writing_) {
      pending_ = status;
      return;
    }
    WriteLocked(status);
  }

  // Ends the stream with `status` (after the write in flight, if any).
  void End(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    EndLocked(std::move(status));
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      // The call is gone (cancelled, the connection closed): nothing more can be written.
      if (!end_.has_value()) end_ = grpc::Status::CANCELLED;
      FinishLocked();
      return;
    }
    // A change that came meanwhile goes out before the stream ends (a drain's NOT_SERVING, then
    // the stop's UNAVAILABLE).
    if (pending_.has_value()) {
      const Status next = *pending_;
      pending_.reset();
      WriteLocked(next);
      if (writing_) return;
    }
    if (end_.has_value()) FinishLocked();
  }

  void OnCancel() override { End(grpc::Status::CANCELLED); }

  void OnDone() override {
    // No Send after this (the service forgets it under its own mutex first), and no reaction
    // after OnDone; wait for a caller still inside this one's critical section, then go.
    service_->Forget(this);
    { std::lock_guard<std::mutex> lock(mu_); }
    delete this;
  }

 private:
  void WriteLocked(Status status) {
    if (sent_.has_value() && *sent_ == status) return;
    sent_ = status;
    response_.set_status(status);
    writing_ = true;
    StartWrite(&response_);
  }

  void EndLocked(grpc::Status status) {
    if (finishing_ || end_.has_value()) return;
    end_ = std::move(status);
    // A cancelled call's write in flight fails, and OnWriteDone finishes it.
    if (!writing_) FinishLocked();
  }

  void FinishLocked() {
    if (finishing_) return;
    finishing_ = true;
    Finish(*end_);
  }

  HealthService* const service_;
  const std::string name_;
  const std::string address_;
  std::mutex mu_;
  HealthCheckResponse response_;     // guarded by mu_; alive while a write is in flight
  bool writing_ = false;             // guarded by mu_
  bool finishing_ = false;           // guarded by mu_: Finish was called
  std::optional<Status> sent_;       // guarded by mu_
  std::optional<Status> pending_;    // guarded by mu_: the newest change while writing
  std::optional<grpc::Status> end_;  // guarded by mu_: to finish with, once no write is in flight
};

HealthService::HealthService(HealthServiceOptions options) : options_(options) {
  // As gRPC's default service: the whole server is known (and SERVING) from the start.
  serving_[""] = true;
}

HealthService::~HealthService() = default;

void HealthService::SetServingStatus(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  serving_[service] = serving && !shut_down_;
  NotifyLocked(service);
}

void HealthService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [service, serving] : serving_) serving = false;
  for (WatchReactor* watch : watches_) watch->Send(StatusLocked(watch->name()));
}

void HealthService::EndWatches() {
  std::lock_guard<std::mutex> lock(mu_);
  ending_ = true;
  for (WatchReactor* watch : watches_) {
    watch->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"));
  }
}

int HealthService::open_watches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(watches_.size());
}

int HealthService::open_watches(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_address_.find(address);
  return it == per_address_.end() ? 0 : it->second;
}

HealthService::Status HealthService::StatusLocked(const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::NotifyLocked(const std::string& service) {
  const Status status = StatusLocked(service);
  for (WatchReactor* watch : watches_) {
    if (watch->name() == service) watch->Send(status);
  }
}

void HealthService::Forget(WatchReactor* watch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (watches_.erase(watch) == 0) return;
  auto it = per_address_.find(watch->address());
  if (it != per_address_.end() && --it->second <= 0) per_address_.erase(it);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = CheckServiceName(*request);
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    const Status serving = StatusLocked(request->service());
    if (serving == HealthCheckResponse::SERVICE_UNKNOWN) {
      status = grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown");
    } else {
      response->set_status(serving);
    }
  }
  reactor->Finish(status);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  if (grpc::Status bad = CheckServiceName(*request); !bad.ok()) return new RefusedWatch(bad);
  std::string address = ClientAddress(context->peer());
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) {
    return new RefusedWatch(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"));
  }
  int& from_address = per_address_[address];
  if (options_.max_watches_per_address > 0 && from_address >= options_.max_watches_per_address) {
    const int held = from_address;
    return new RefusedWatch(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(held, " health watches are open from ", address,
                     ", the most one client address may hold (--max_health_watches_per_address=",
                     options_.max_watches_per_address,
                     "); end one first, or ask Check, which is never refused")));
  }
  if (options_.max_watches > 0 && static_cast<int>(watches_.size()) >= options_.max_watches) {
    if (from_address == 0) per_address_.erase(address);
    return new RefusedWatch(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat(watches_.size(),
                                  " health watches are open, the most this daemon holds "
                                  "(--max_health_watches=",
                                  options_.max_watches,
                                  "); try again later, or ask Check, which is never refused")));
  }
  ++from_address;
  auto* watch = new WatchReactor(this, request->service(), std::move(address));
  watches_.insert(watch);
  watch->Send(StatusLocked(watch->name()));
  return watch;
}

}  // namespace trainerd::service
