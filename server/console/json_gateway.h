// The console's way into the daemon: a request in protobuf's JSON form, called as the gRPC
// method it names over the daemon's in-process channel with the caller's metadata (the browser's
// Authorization header, or the console's word for the client certificate it verified), so that
// authentication, tenancy and every per-caller bound are the API's own; the reply (or the error)
// back as JSON. No second model of jobs: the messages are the API's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace trainerd::console {

// The metadata a call carries to say who makes it: ("authorization", "Bearer ...") as the
// browser sent it, and/or the pairs by which the console vouches for a verified client
// certificate (service::Authenticator::VouchForCertificate). Empty: nobody (a daemon without
// authentication).
using CallMetadata = std::vector<std::pair<std::string, std::string>>;

// What the gateway answers: an HTTP status and a JSON body (the response message, or
// {"code": "NOT_FOUND", "message": "..."}).
struct JsonReply {
  int http_status = 200;
  std::string json;
};

// The HTTP status of a gRPC status code (google.rpc's mapping) and the code's name.
int HttpStatusOf(int grpc_code);
std::string JsonError(int grpc_code, absl::string_view message);

class JsonGateway {
 public:
  explicit JsonGateway(std::shared_ptr<grpc::Channel> channel);

  // Whether the console may call `service`/`method` with Call (the reads, the devices'
  // diagnosis, and cancelling and deleting; submitting and uploading stay with trainctl, Python
  // and the API).
  static bool IsUnary(absl::string_view service, absl::string_view method);

  // Calls service/method ("JobService", "ListJobs") with `json` (empty: {}) as the request and
  // `caller` as its metadata. A request that is not the
  // method's JSON is INVALID_ARGUMENT (400), an unknown method NOT_FOUND (404).
  JsonReply Call(absl::string_view service, absl::string_view method, absl::string_view json,
                 const CallMetadata& caller) const;

  // JobService.WatchJob: each event as JSON to `on_event` (returning false ends the watch) until
  // the stream ends; then the call's status (OK when the job ended), as a JSON error when not.
  // `context` lets another thread cancel it (TryCancel). A request that is not a
  // WatchJobRequest's JSON is an error before any event.
  JsonReply Watch(absl::string_view json, const CallMetadata& caller, grpc::ClientContext* context,
                  const std::function<bool(const std::string&)>& on_event) const;

  // JobService.DownloadModel: the model's bytes, chunk by chunk, to `on_bytes` (returning false
  // ends it), as Watch.
  JsonReply Download(absl::string_view json, const CallMetadata& caller,
                     grpc::ClientContext* context,
                     const std::function<bool(const std::string&)>& on_bytes) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace trainerd::console
