// trainerd's grpc.health.v1.Health (proto/grpc/health/v1/health.proto), in place of gRPC's
// default health service, which cannot bound its streams. Check and Watch answer as gRPC's
// default service does (the same statuses, SERVICE_UNKNOWN and NOT_FOUND, Shutdown's NOT_SERVING
// for good) and need no credentials (auth.h, IsHealthMethod: Kubernetes' probes send none). So
// that callers without credentials cannot hold memory without end, Watch streams are bounded:
// at most `max_watches_per_address` open at once from one client address (the peer's IP, its
// port left out) and `max_watches` in all; a stream beyond either gets RESOURCE_EXHAUSTED at
// once, and a stream's place is free again as soon as it ends (cancelled, or the connection
// gone). An open stream holds one reactor and its call, and a status change is written to it only
// once the last was read (only the newest waits), so a reader that never reads holds nothing
// more. docs/SECURITY.md, "Slow clients cost nothing".
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace trainerd::service {

struct HealthServiceOptions {
  // Watch streams open at once from one client address, and in all (trainerd
  // --max_health_watches_per_address, --max_health_watches); 0: no bound.
  int max_watches_per_address = 16;
  int max_watches = 1024;
};

// The client address a peer string names, without its port: "ipv4:127.0.0.2:5555" is
// "ipv4:127.0.0.2", "ipv6:[::1]:5555" is "ipv6:[::1]"; anything else ("unix:...", an in-process
// channel's) as it is.
std::string ClientAddress(absl::string_view peer);

// Thread-safe. Destroyed after the gRPC server that serves it has stopped.
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  explicit HealthService(HealthServiceOptions options);
  ~HealthService() override;
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // `service` ("" is the whole server) SERVING or NOT_SERVING, registered if new; its open Watch
  // streams receive the change. After Shutdown every status is NOT_SERVING.
  void SetServingStatus(const std::string& service, bool serving);
  // Every service NOT_SERVING, for good (a drain, a shutdown); watchers receive it.
  void Shutdown();
  // Ends every open Watch stream with UNAVAILABLE and refuses new ones: just before the gRPC
  // server stops, which would otherwise wait for streams that never end by themselves.
  void EndWatches();

  // Watch streams open now: in all, and from `address` (ClientAddress).
  int open_watches() const;
  int open_watches(const std::string& address) const;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class WatchReactor;
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // The status Watch reports for `service`: SERVICE_UNKNOWN when it is not registered.
  Status StatusLocked(const std::string& service) const;
  // Sends `service`'s status to its watchers.
  void NotifyLocked(const std::string& service);
  // A watch that ended: its place is free.
  void Forget(WatchReactor* watch);

  const HealthServiceOptions options_;
  mutable std::mutex mu_;
  bool shut_down_ = false;                  // guarded by mu_
  bool ending_ = false;                     // guarded by mu_: EndWatches was called
  std::map<std::string, bool> serving_;     // guarded by mu_
  std::set<WatchReactor*> watches_;         // guarded by mu_
  std::map<std::string, int> per_address_;  // guarded by mu_
};

}  // namespace trainerd::service
