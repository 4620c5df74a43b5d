// The one place where engine errors (absl::Status) become gRPC statuses.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace trainerd::service {

// Same code (Abseil's and gRPC's codes share their numbering); the message is truncated to 1 KiB
// so that a runaway error never turns into a huge trailer.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace trainerd::service
