#include "server/service/grpc_status.h"

#include <string>

#include "common/safe_text.h"

namespace trainerd::service {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  constexpr size_t kMaxMessage = 1024;
  // A message may carry text from a caller or a worker (a module's operator name, a worker's
  // error): in one line, its control characters escaped, and cut where no escape is split.
  std::string message = EscapeControls(status.message(), LineBreaks::kSpace);
  if (message.size() > kMaxMessage) {
    size_t cut = kMaxMessage - 3;
    const size_t escape = message.rfind('\\', cut);
    if (escape != std::string::npos && cut - escape < 6) cut = escape;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
    message = message.substr(0, cut) + "...";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

}  // namespace trainerd::service
