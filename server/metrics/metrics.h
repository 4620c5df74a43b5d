// trainerd's Prometheus metrics (docs/METRICS.md): counters and histograms driven by the engine's
// job events and by the gRPC interceptor, gauges read at scrape time from the engine (datasets,
// host-to-device bytes), the device sampler (GPUs through NVML, the process) and the build, all
// served in the text exposition format (prometheus-cpp's TextSerializer) by http::HttpEndpoint
// (server/http). LibTorch-free: it sees the engine only through engine.h and types.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/engine/types.h"
#include "server/http/http_endpoint.h"

namespace trainerd::engine {
class Engine;
}  // namespace trainerd::engine

namespace trainerd::monitor {
class DeviceSampler;
}  // namespace trainerd::monitor

namespace trainerd::metrics {

struct MetricsOptions {
  // Per-job series (trainerd_job_*) stay this long after their job ends, so that a scrape after
  // the end still sees the final values; then they are removed to bound the series count.
  absl::Duration job_series_ttl = absl::Minutes(5);
  // trainerd_build_info's labels.
  std::string version;
  std::string libtorch_version;
  std::string cuda_version;
};

// Thread-safe. Create one per process, attach what it reads, then Serve.
class Metrics {
 public:
  explicit Metrics(MetricsOptions options = {});
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The sink to pass as the engine's job observer (EngineOptions::observer). It only updates
  // counters under a short lock and never blocks.
  std::shared_ptr<engine::JobEventSink> job_observer();

  // One finished RPC: its full method name ("/trainerd.v1.JobService/SubmitJob"; names outside
  // trainerd's, health's and reflection's services become "other", so that a client cannot grow
  // the label set), its status code name ("OK", "NOT_FOUND", ...) and its duration.
  void ObserveRpc(absl::string_view method, absl::string_view code, double seconds);

  // Sources read at scrape time; each may be null (its series are then absent). They must
  // outlive this object or be detached (set to null) first.
  void SetEngine(const engine::Engine* engine);
  void SetSampler(const monitor::DeviceSampler* sampler);
  // Calls refused for want of a valid token or certificate so far (trainerd_auth_rejected_total);
  // empty: the series is absent.
  void SetAuthRejections(std::function<int64_t()> read);
  // The tokens valid now (trainerd_auth_tokens); null: not exported (no token file).
  void SetAuthTokens(std::function<int64_t()> read);

  // Serves /metrics on `address` ("host:port"; port 0 picks a free one) from libmicrohttpd's
  // thread, with `options`' limits and bearer token (their path is ignored: always /metrics; see
  // server/http/http_endpoint.h for why not prometheus-cpp's exposer). Returns the bound port.
  // UNAVAILABLE when it cannot listen, INVALID_ARGUMENT for a bad address or options.
  absl::StatusOr<int> Serve(const std::string& address, http::HttpEndpointOptions options = {});

  // The exposition text of everything, as /metrics serves it (tests, and `trainerd --help`-free
  // debugging).
  std::string Render() const;

 private:
  class JobObserver;
  class ScrapeCollector;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<JobObserver> observer_;
  std::shared_ptr<ScrapeCollector> scrape_;
  prometheus::Family<prometheus::Counter>* grpc_requests_;
  prometheus::Family<prometheus::Histogram>* grpc_duration_;
  std::unique_ptr<http::HttpEndpoint> endpoint_;
};

// The label an RPC's method gets (see ObserveRpc).
std::string RpcMethodLabel(absl::string_view method);

}  // namespace trainerd::metrics
