// The gRPC server of trainerd: the engine, the two API services, the standard health service
// (health_service.h: trainerd's own, with bounded Watch streams) and server reflection, started
// together and stopped in order.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/console/console_server.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/monitor/sampler.h"
#include "server/service/auth.h"
#include "server/service/blocking_calls.h"
#include "server/service/credentials.h"
#include "server/service/dataset_service.h"
#include "server/service/health_service.h"
#include "server/service/job_service.h"
#include "server/service/peer_client.h"
#include "server/service/peer_service.h"
#include "server/service/system_service.h"

namespace trainerd::service {

struct ServerOptions {
  // host:port to listen on, port 0 picking a free port (read it back with Server::port()); or
  // unix:PATH for a Unix socket (mode 0660).
  std::string listen = "127.0.0.1:50051";
  // Who may call (docs/SECURITY.md): a token file; TLS and mutual TLS. On an address that other
  // machines can reach (not IsLocalAddress) the server refuses to start without a token file or
  // mutual TLS unless `insecure` is set.
  std::string auth_token_file;
  // Callers that are admins (token names or certificate subjects), besides the token file's
  // lines marked "admin".
  std::vector<std::string> admins;
  TlsOptions tls;
  bool insecure = false;
  // A token file for /metrics (one token; Prometheus sends it as "Authorization: Bearer"). Empty:
  // no token.
  std::string metrics_token_file;
  // An upload stream that delivers nothing for this long is ended and discarded; so is one that
  // sends fewer than min_upload_bytes_per_second over that long (0: no minimum).
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  int64_t min_upload_bytes_per_second = int64_t{64} << 10;
  // What one caller may hold open at once (caller_slots.h); 0: no limit.
  int max_uploads_per_caller = 8;
  int max_watches_per_caller = 64;
  int max_diagnose_per_caller = 2;
  // Health Watch streams open at once from one client address and in all (health_service.h);
  // 0: no bound.
  HealthServiceOptions health;
  // host:port to serve Prometheus's /metrics on; port 0 picks a free port (metrics_address());
  // empty turns the endpoint off (the metrics are still kept).
  std::string metrics_listen;
  metrics::MetricsOptions metrics;
  // host:port of the web console (server/console); port 0 picks a free port
  // (console_address()); empty: no console. Like --listen, an address other machines can reach
  // needs authentication (tokens or mutual TLS) or `insecure`. It serves HTTPS with `tls`'s files
  // when TLS is on, and asks browsers for client certificates with its client CA.
  std::string console_listen;
  console::ConsoleOptions console;
  // How often the device sampler reads the GPUs (NVML) and the process; and the NVML library to
  // load ("" for none: CPU only).
  absl::Duration sample_interval = absl::Milliseconds(500);
  std::string nvml_library = "libnvidia-ml.so.1";
  // The engine's options; the server sets its observer, sampler and job store.
  engine::EngineOptions engine;
  // Keep job records in <engine.data_dir>/jobs.db (SQLite), so that jobs outlive the process and
  // unfinished ones resume at the next start. Off only in tests that want the in-memory engine.
  bool keep_job_records = true;
  // The peers this daemon may place ranks on (JobSpec.nodes), and its credentials for them
  // (peer_client.h); no peers: none, and it runs no ranks for others.
  PeerClientOptions peers;
  // The group of daemons a cluster manager started this one in (MASTER_ADDR and the rest,
  // engine::ClusterFromEnvironment): its other daemons are peers too, found through node 0's
  // directory: node 0 serves it on MASTER_PORT too, and the others join it with the peer
  // credentials (peers), each saying it is at peers.self.
  std::optional<engine::ClusterOptions> cluster;
};

// Owns the engine and the gRPC server. Thread-safe: Shutdown may be called from any thread, once
// or more.
class Server {
 public:
  // Checks the security settings (FAILED_PRECONDITION, with one sentence, for an open address
  // without authentication; INVALID_ARGUMENT for unusable token or TLS files), creates the engine
  // (which reloads persisted datasets), registers the services and starts listening; health turns
  // SERVING only after the server started. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(const ServerOptions& options);
  ~Server();  // Shutdown(absl::Seconds(5))

  // The bound port.
  int port() const { return port_; }
  std::string address() const { return address_; }
  // "host:port" of /metrics; empty when the endpoint is off.
  std::string metrics_address() const { return metrics_address_; }
  // "host:port" of the web console; empty when it is off.
  std::string console_address() const { return console_address_; }
  // The console's page: "http(s)://host:port/"; empty without a console.
  std::string console_url() const { return console_url_; }
  metrics::Metrics* metrics() { return metrics_.get(); }
  monitor::DeviceSampler* sampler() { return sampler_.get(); }
  engine::Engine* engine() { return engine_.get(); }
  DatasetServiceImpl* dataset_service() { return dataset_service_.get(); }
  HealthService* health_service() { return health_.get(); }
  // A channel to this server that does not go through the network stack.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Health turns NOT_SERVING, the engine stops (with job records, running jobs stop at a step
  // boundary and resume at the next start; without, they end CANCELLED and their watchers receive
  // that), then the gRPC server stops, cancelling calls still open after `deadline`.
  void Shutdown(absl::Duration deadline);
  // SIGTERM: health turns NOT_SERVING and new jobs get UNAVAILABLE at once, while the API keeps
  // answering; each running job finishes its epoch and writes a checkpoint (Engine::Drain, at
  // most `drain_timeout`); then Shutdown(deadline).
  void Drain(absl::Duration drain_timeout, absl::Duration deadline);
  // Blocks until the server has shut down.
  void Wait();

 private:
  Server() = default;

  // Declared before the engine so that they outlive it (the engine reports to them).
  std::unique_ptr<monitor::DeviceSampler> sampler_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::string metrics_address_;
  // The web console: stopped first, so that its watches end before the server they call.
  std::unique_ptr<console::ConsoleServer> console_;
  std::string console_address_;
  std::string console_url_;
  // The cluster manager's group (or null): the peer client asks it, the peer service serves it.
  std::shared_ptr<engine::ClusterDirectory> group_;
  std::unique_ptr<engine::Engine> engine_;
  // The calls that wait on the disk (blocking_calls.h): after the gRPC server, before the engine.
  std::unique_ptr<BlockingCalls> blocking_;
  std::shared_ptr<Authenticator> authenticator_;
  std::unique_ptr<DatasetServiceImpl> dataset_service_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<SystemServiceImpl> system_service_;
  std::unique_ptr<PeerServiceImpl> peer_service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;  // guarded by shutdown_mu_
};

}  // namespace trainerd::service
