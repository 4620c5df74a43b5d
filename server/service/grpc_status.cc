#include "server/service/grpc_status.h"

#include <string>

namespace trainerd::service {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  constexpr size_t kMaxMessage = 1024;
  std::string message(status.message());
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage - 3) + "...";
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

}  // namespace trainerd::service
