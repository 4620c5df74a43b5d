// JsonGateway (json_gateway.h): the allowed methods, each a typed stub call between protobuf's
// JSON form and the messages.
#include "server/console/json_gateway.h"

#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::console {
namespace {

using google::protobuf::Message;

// The requests are bounded by the HTTP server (ConsoleOptions::max_request_bytes); a call
// answers within this or is cancelled.
constexpr auto kCallDeadline = std::chrono::seconds(30);

const char* CodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

std::string ToJson(const Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}";
  return json;
}

// Parses `json` (empty: {}) into `message`; false with the reason in `reply`.
bool FromJson(absl::string_view json, Message* message, JsonReply* reply) {
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      json.empty() ? std::string("{}") : std::string(json), message);
  if (parsed.ok()) return true;
  reply->http_status = 400;
  reply->json = JsonError(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("the request is not a ", message->GetTypeName(),
                                       " in JSON: ", parsed.message().ToString()));
  return false;
}

void AddCaller(grpc::ClientContext* context, const CallMetadata& caller) {
  for (const auto& [key, value] : caller) context->AddMetadata(key, value);
}

void Prepare(grpc::ClientContext* context, const CallMetadata& caller) {
  AddCaller(context, caller);
  context->set_deadline(std::chrono::system_clock::now() + kCallDeadline);
}

JsonReply Reply(const grpc::Status& status, const Message& response) {
  if (status.ok()) return {200, ToJson(response)};
  return {HttpStatusOf(status.error_code()),
          JsonError(status.error_code(), status.error_message())};
}

// One unary method: parse, call, print.
template <typename Stub, typename Request, typename Response>
JsonReply Unary(Stub& stub,
                grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                absl::string_view json, const CallMetadata& caller) {
  Request request;
  JsonReply reply;
  if (!FromJson(json, &request, &reply)) return reply;
  grpc::ClientContext context;
  Prepare(&context, caller);
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  return Reply(status, response);
}

}  // namespace

int HttpStatusOf(int grpc_code) {
  switch (grpc_code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    default:
      return 500;
  }
}

std::string JsonError(int grpc_code, absl::string_view message) {
  google::protobuf::Struct error;
  (*error.mutable_fields())["code"].set_string_value(CodeName(grpc_code));
  (*error.mutable_fields())["message"].set_string_value(std::string(message));
  return ToJson(error);
}

JsonGateway::JsonGateway(std::shared_ptr<grpc::Channel> channel) : channel_(std::move(channel)) {}

bool JsonGateway::IsUnary(absl::string_view service, absl::string_view method) {
  if (service == "JobService") {
    return method == "ListJobs" || method == "GetJob" || method == "CancelJob" ||
           method == "DeleteJob";
  }
  if (service == "DatasetService") return method == "ListDatasets" || method == "DeleteDataset";
  if (service == "SystemService") {
    return method == "GetVersion" || method == "ListDevices" || method == "Diagnose";
  }
  return false;
}

JsonReply JsonGateway::Call(absl::string_view service, absl::string_view method,
                            absl::string_view json, const CallMetadata& caller) const {
  if (service == "JobService") {
    v1::JobService::Stub stub(channel_);
    using S = v1::JobService::Stub;
    if (method == "ListJobs") return Unary(stub, &S::ListJobs, json, caller);
    if (method == "GetJob") return Unary(stub, &S::GetJob, json, caller);
    if (method == "CancelJob") return Unary(stub, &S::CancelJob, json, caller);
    if (method == "DeleteJob") return Unary(stub, &S::DeleteJob, json, caller);
  } else if (service == "DatasetService") {
    v1::DatasetService::Stub stub(channel_);
    using S = v1::DatasetService::Stub;
    if (method == "ListDatasets") return Unary(stub, &S::ListDatasets, json, caller);
    if (method == "DeleteDataset") return Unary(stub, &S::DeleteDataset, json, caller);
  } else if (service == "SystemService") {
    v1::SystemService::Stub stub(channel_);
    using S = v1::SystemService::Stub;
    if (method == "GetVersion") return Unary(stub, &S::GetVersion, json, caller);
    if (method == "ListDevices") return Unary(stub, &S::ListDevices, json, caller);
    if (method == "Diagnose") return Unary(stub, &S::Diagnose, json, caller);
  }
  return {404, JsonError(grpc::StatusCode::NOT_FOUND,
                         absl::StrCat("the console does not call ", service, "/", method))};
}

namespace {

// A server stream, each message to `on_message` (false ends it), then the call's status.
template <typename Request, typename Message, typename Start>
JsonReply ServerStream(absl::string_view json, const CallMetadata& caller,
                       grpc::ClientContext* context, Start start,
                       const std::function<bool(const Message&)>& on_message) {
  Request request;
  JsonReply reply;
  if (!FromJson(json, &request, &reply)) return reply;
  AddCaller(context, caller);
  std::unique_ptr<grpc::ClientReader<Message>> reader = start(context, request);
  Message message;
  bool wanted = true;
  while (wanted && reader->Read(&message)) wanted = on_message(message);
  if (!wanted) context->TryCancel();
  const grpc::Status status = reader->Finish();
  if (!wanted || status.ok()) return {200, ""};
  return {HttpStatusOf(status.error_code()),
          JsonError(status.error_code(), status.error_message())};
}

}  // namespace

JsonReply JsonGateway::Watch(absl::string_view json, const CallMetadata& caller,
                             grpc::ClientContext* context,
                             const std::function<bool(const std::string&)>& on_event) const {
  v1::JobService::Stub stub(channel_);
  return ServerStream<v1::WatchJobRequest, v1::JobEvent>(
      json, caller, context,
      [&](grpc::ClientContext* c, const v1::WatchJobRequest& r) { return stub.WatchJob(c, r); },
      [&](const v1::JobEvent& event) { return on_event(ToJson(event)); });
}

JsonReply JsonGateway::Download(absl::string_view json, const CallMetadata& caller,
                                grpc::ClientContext* context,
                                const std::function<bool(const std::string&)>& on_bytes) const {
  v1::JobService::Stub stub(channel_);
  return ServerStream<v1::DownloadModelRequest, v1::ModelChunk>(
      json, caller, context,
      [&](grpc::ClientContext* c, const v1::DownloadModelRequest& r) {
        return stub.DownloadModel(c, r);
      },
      [&](const v1::ModelChunk& chunk) { return on_bytes(chunk.data()); });
}

}  // namespace trainerd::console
