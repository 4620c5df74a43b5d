// The channel to trainerd and the wording of failed calls.
#include "client/connection.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/job_limits.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_interceptor.h"

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

// Adds "authorization: Bearer <token>" to every call's initial metadata.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;  // owned by the factory, which the channel keeps
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&value_);
  }

 private:
  const std::string value_;
};

// Whether a failed call's message comes from a TLS handshake that did not succeed.
bool IsHandshakeFailure(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "ssl") || absl::StrContains(lower, "handshake") ||
         absl::StrContains(lower, "tls") || absl::StrContains(lower, "certificate");
}

// What a plaintext client hears from a daemon that serves TLS: the server closes the connection at
// the client's first (plaintext) bytes, and gRPC reports that, with no word of TLS in it.
bool LooksLikeClosedByTlsServer(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "socket closed") ||
         absl::StrContains(lower, "connection reset") ||
         absl::StrContains(lower, "connection closed") || absl::StrContains(lower, "end of file");
}

absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

}  // namespace

absl::StatusOr<ClientSecurity> LoadClientSecurity(const GlobalOptions& global,
                                                  const char* env_token) {
  ClientSecurity security;
  if (!global.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadFlagFile("token-file", global.token_file);
    if (!text.ok()) return text.status();
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      const size_t colon = line.find(':');
      if (colon != absl::string_view::npos && colon > 0 &&
          line.substr(0, colon).find_first_not_of(
              "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._@-") ==
              absl::string_view::npos) {
        line = line.substr(colon + 1);
      }
      security.token = std::string(line);
      break;
    }
    if (security.token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file: '", global.token_file, "' holds no token"));
    }
  } else if (env_token != nullptr) {
    security.token = std::string(absl::StripAsciiWhitespace(env_token));
  }
  if (global.tls_cert.empty() != global.tls_key.empty()) {
    return absl::InvalidArgumentError("a client certificate needs both --tls-cert and --tls-key");
  }
  security.use_tls =
      !global.tls_ca.empty() || !global.tls_cert.empty() || !global.tls_server_name.empty();
  if (!global.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFlagFile("tls-ca", global.tls_ca);
    if (!ca.ok()) return ca.status();
    security.ca_pem = *std::move(ca);
  }
  if (!global.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFlagFile("tls-cert", global.tls_cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFlagFile("tls-key", global.tls_key);
    if (!key.ok()) return key.status();
    security.cert_pem = *std::move(cert);
    security.key_pem = *std::move(key);
  }
  security.server_name = global.tls_server_name;
  return security;
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             const ClientSecurity& security) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // The server's receive limit: a SubmitJobRequest with a TorchScript module.
  arguments.SetMaxSendMessageSize(static_cast<int>(kMaxRequestMessageBytes));
  arguments.SetUserAgentPrefix("trainctl");
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (security.use_tls) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = security.ca_pem;
    tls.pem_private_key = security.key_pem;
    tls.pem_cert_chain = security.cert_pem;
    credentials = grpc::SslCredentials(tls);
    if (!security.server_name.empty()) arguments.SetSslTargetNameOverride(security.server_name);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  // The token goes into each call's metadata by an interceptor rather than as call credentials,
  // which gRPC sends only over TLS: a token over plaintext is legitimate on a loopback, a Unix
  // socket or behind a proxy that ends TLS.
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, arguments,
                                                                 std::move(interceptors));
}

Connection::Connection(ConnectionOptions options)
    : options_(std::move(options)),
      channel_(CreateChannel(options_.address, options_.security)),
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
    case grpc::StatusCode::UNAUTHENTICATED: {
      const ClientSecurity& security = options_.security;
      std::string hint;
      if (security.token.empty() && security.cert_pem.empty()) {
        hint =
            "set --token-file FILE or $TRAINERD_TOKEN (or --tls-cert and --tls-key for a "
            "client certificate)";
      } else if (!security.token.empty()) {
        hint = "check the token of --token-file or $TRAINERD_TOKEN";
      } else {
        hint =
            "check the client certificate of --tls-cert and --tls-key, or set --token-file "
            "FILE or $TRAINERD_TOKEN";
      }
      return absl::StrCat("trainerd at ", options_.address,
                          " refused the call: ", message.empty() ? "unauthenticated" : message,
                          "; ", hint);
    }
    case grpc::StatusCode::UNAVAILABLE:
      if (!connected) {
        std::string hint;
        if (!had_replies && (IsHandshakeFailure(message) ||
                             (!options_.security.use_tls && LooksLikeClosedByTlsServer(message)))) {
          hint = options_.security.use_tls
                     ? " (check --tls-ca, --tls-server-name and, for mutual TLS, --tls-cert and "
                       "--tls-key)"
                     : " (if trainerd serves TLS, give --tls-ca)";
        }
        return absl::StrCat(
            had_replies ? "lost connection to trainerd at " : "cannot reach trainerd at ",
            options_.address, ": ", message.empty() ? "unavailable" : message, hint);
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
