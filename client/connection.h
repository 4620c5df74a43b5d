// trainctl's link to trainerd: the one function that creates the channel (plaintext or TLS, with
// the bearer token added to every call), call deadlines, and the one function that turns a failed
// call into the sentence trainctl prints.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::client {

// Uploads may move gigabytes, so their deadline is at least this, whatever --timeout says.
inline constexpr absl::Duration kUploadTimeout = absl::Minutes(10);

// How trainctl proves who it is and checks whom it talks to (docs/SECURITY.md).
struct ClientSecurity {
  // The bearer token sent with every call as "authorization: Bearer <token>"; empty: none.
  std::string token;
  // TLS: the CA certificate(s) that signed trainerd's certificate (PEM text); with `use_tls` and
  // an empty CA, the system's roots. A client certificate and key (PEM text) for mutual TLS.
  // `server_name` overrides the name checked against trainerd's certificate.
  bool use_tls = false;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string server_name;
};

struct ConnectionOptions {
  // gRPC target, e.g. "127.0.0.1:50051" or "unix:/run/trainerd/trainerd.sock". Must not be
  // empty.
  std::string address;
  // Deadline of each unary call, > 0.
  absl::Duration timeout;
  ClientSecurity security = {};
};

// The security settings of the global flags: the token from --token-file (its first line that is
// not blank or a '#' comment; a "NAME:" prefix, as trainerd's token files allow, is dropped) or
// else `env_token` ($TRAINERD_TOKEN, null when unset), and the PEM text of the TLS files.
// INVALID_ARGUMENT naming the flag when a file cannot be read or holds no token, or when only one
// of --tls-cert and --tls-key is given.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const GlobalOptions& global,
                                                  const char* env_token);

// Creates the channel to `address`: TLS when `security.use_tls`, plaintext otherwise; the token,
// when there is one, goes with every call. The only place that picks credentials. Connects
// lazily, on the first call.
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             const ClientSecurity& security = {});

// The channel and the three service stubs. Owned by the command being run; gRPC stubs are
// thread-safe, but trainctl uses one thread.
class Connection {
 public:
  explicit Connection(ConnectionOptions options);

  const std::string& address() const { return options_.address; }
  v1::DatasetService::Stub& datasets() { return *datasets_; }
  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::SystemService::Stub& system() { return *system_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // Sets the deadline of a unary call (--timeout from now).
  void SetUnaryDeadline(grpc::ClientContext* context) const;
  // Calls the unary RPC `method` of `stub` (one of the three above) with that deadline:
  // Call(conn.jobs(), &v1::JobService::Stub::GetJob, request, &job).
  template <typename Stub, typename Request, typename Response>
  grpc::Status Call(Stub& stub,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) const {
    grpc::ClientContext call;
    SetUnaryDeadline(&call);
    return (stub.*method)(&call, request, response);
  }
  // Sets a deadline `timeout` from now.
  static void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

  // One line for "trainctl: <line>": the daemon's own message for the errors it reports
  // (NOT_FOUND, INVALID_ARGUMENT, ...), "cannot reach trainerd at ADDR: ..." when the call never
  // got to it, "lost connection to trainerd at ADDR: ..." when a stream had already received
  // messages (`had_replies`). UNAUTHENTICATED says which of --token-file, $TRAINERD_TOKEN,
  // --tls-cert/--tls-key to set, and a failed TLS handshake which of --tls-ca and
  // --tls-server-name. `timeout` is the deadline the call ran under, for the message.
  std::string DescribeError(const grpc::Status& status, absl::Duration timeout,
                            bool had_replies = false) const;

 private:
  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DatasetService::Stub> datasets_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::SystemService::Stub> system_;
};

}  // namespace trainerd::client
