// The channel to trainerd and the wording of failed calls.
#include "client/connection.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace trainerd::client {
namespace {

// Job lists carry every epoch of every job; let them exceed gRPC's default 4 MiB.
constexpr int kMaxReceiveMessageBytes = 256 * 1024 * 1024;
// Daemon messages are sentences; anything longer is cut so the error stays one readable line.
constexpr size_t kMaxMessageChars = 1000;

std::string OneLine(absl::string_view message) {
  std::string line = absl::StrReplaceAll(message, {{"\r\n", " "}, {"\n", " "}, {"\r", " "}});
  absl::StripAsciiWhitespace(&line);
  if (line.size() > kMaxMessageChars) line = absl::StrCat(line.substr(0, kMaxMessageChars), "...");
  return line;
}

std::string Seconds(absl::Duration timeout) {
  return absl::StrFormat("%g s", absl::ToDoubleSeconds(timeout));
}

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
      return "cancelled";
    case grpc::StatusCode::UNKNOWN:
      return "unknown error";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "invalid argument";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "deadline exceeded";
    case grpc::StatusCode::NOT_FOUND:
      return "not found";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "already exists";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "permission denied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "resource exhausted";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "failed precondition";
    case grpc::StatusCode::ABORTED:
      return "aborted";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "out of range";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "not implemented";
    case grpc::StatusCode::INTERNAL:
      return "internal error";
    case grpc::StatusCode::UNAVAILABLE:
      return "unavailable";
    case grpc::StatusCode::DATA_LOSS:
      return "data loss";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "unauthenticated";
    default:
      return absl::StrCat("error code ", static_cast<int>(code));
  }
}

}  // namespace

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // The server's receive limit: a SubmitJobRequest with a TorchScript module of up to 64 MiB.
  arguments.SetMaxSendMessageSize(64 * 1024 * 1024);
  arguments.SetUserAgentPrefix("trainctl");
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
}

Connection::Connection(ConnectionOptions options)
    : options_(std::move(options)),
      channel_(CreateChannel(options_.address)),
      datasets_(v1::DatasetService::NewStub(channel_)),
      jobs_(v1::JobService::NewStub(channel_)),
      system_(v1::SystemService::NewStub(channel_)) {}

void Connection::SetUnaryDeadline(grpc::ClientContext* context) const {
  SetDeadline(context, options_.timeout);
}

void Connection::SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

std::string Connection::DescribeError(const grpc::Status& status, absl::Duration timeout,
                                      bool had_replies) const {
  const std::string message = OneLine(status.error_message());
  // A channel that is not READY after the call never reached trainerd (or lost it): the error is
  // gRPC's, not the daemon's.
  const bool connected = channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (!connected) {
        return absl::StrCat(
            had_replies ? "lost connection to trainerd at " : "cannot reach trainerd at ",
            options_.address, ": ", message.empty() ? "unavailable" : message);
      }
      return message.empty() ? "trainerd is unavailable; try again" : message;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (!connected && !had_replies) {
        return absl::StrCat("cannot reach trainerd at ", options_.address,
                            ": no connection within ", Seconds(timeout));
      }
      return absl::StrCat("trainerd did not answer within ", Seconds(timeout),
                          " (--timeout sets the limit)");
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::StrCat("trainerd at ", options_.address,
                          " does not implement this call (is it an older version?)",
                          message.empty() ? "" : ": ", message);
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
      return absl::StrCat("trainerd ", CodeName(status.error_code()), message.empty() ? "" : ": ",
                          message);
    default:
      // The daemon's own sentence, e.g. "dataset 'x' not found".
      return message.empty() ? absl::StrCat("trainerd: ", CodeName(status.error_code())) : message;
  }
}

}  // namespace trainerd::client
