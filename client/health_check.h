// The standard grpc.health.v1.Health/Check call, made through a generic stub: Debian's gRPC ships
// no generated code for health.proto, and both messages are a single field, so trainctl encodes
// them itself rather than carrying a copy of the .proto.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace trainerd::client {

// HealthCheckResponse.ServingStatus.
inline constexpr int64_t kHealthServing = 1;
inline constexpr int64_t kHealthServiceUnknown = 3;

// "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"; "STATUS_<n>" for others.
std::string ServingStatusName(int64_t status);

// HealthCheckRequest {string service = 1;} in wire format.
std::string EncodeHealthCheckRequest(absl::string_view service);
// HealthCheckResponse {ServingStatus status = 1;}: the status (0 when absent, as proto3 says);
// INVALID_ARGUMENT for bytes that are not a protobuf message.
absl::StatusOr<int64_t> DecodeHealthCheckResponse(absl::string_view bytes);

// Calls Check for `service` ("" is the whole server) and stores the serving status. Blocks until
// the call ends; the context carries the deadline. A reply that cannot be decoded is INTERNAL.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                         grpc::ClientContext* context, absl::string_view service,
                         int64_t* serving_status);

}  // namespace trainerd::client
