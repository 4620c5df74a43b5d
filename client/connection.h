// trainctl's link to trainerd: the one function that creates the channel (where TLS or token
// credentials will slot in), call deadlines, and the one function that turns a failed call into
// the sentence trainctl prints.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::client {

// Uploads may move gigabytes, so their deadline is at least this, whatever --timeout says.
inline constexpr absl::Duration kUploadTimeout = absl::Minutes(10);

struct ConnectionOptions {
  // gRPC target, e.g. "127.0.0.1:50051". Must not be empty.
  std::string address;
  // Deadline of each unary call, > 0.
  absl::Duration timeout;
};

// Creates the channel to `address`. Insecure for now; the only place that picks credentials.
// Connects lazily, on the first call.
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address);

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
  // Sets a deadline `timeout` from now.
  static void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

  // One line for "trainctl: <line>": the daemon's own message for the errors it reports
  // (NOT_FOUND, INVALID_ARGUMENT, ...), "cannot reach trainerd at ADDR: ..." when the call never
  // got to it, "lost connection to trainerd at ADDR: ..." when a stream had already received
  // messages (`had_replies`). `timeout` is the deadline the call ran under, for the message.
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
