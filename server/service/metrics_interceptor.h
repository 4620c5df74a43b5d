// A server interceptor that counts every finished RPC and its latency in the metrics
// (trainerd_grpc_requests_total, trainerd_grpc_request_duration_seconds).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/string_view.h"
#include "server/metrics/metrics.h"

namespace trainerd::service {

// "OK", "NOT_FOUND", ... as gRPC's documentation spells the codes.
absl::string_view StatusCodeName(grpc::StatusCode code);

// For ServerBuilder::experimental().SetInterceptorCreators. `metrics` must outlive the server.
// A call to a path not in `known_methods` is counted with method="other": the paths a caller
// sends cannot add series.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsInterceptorFactory(
    metrics::Metrics* metrics, std::set<std::string> known_methods);

}  // namespace trainerd::service
