// grpc.health.v1.Health/Check through grpc::GenericStub with hand-encoded messages.
#include "client/health_check.h"

#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace trainerd::client {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr int kServiceField = 1;
constexpr int kStatusField = 1;

}  // namespace

std::string ServingStatusName(int64_t status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return absl::StrCat("STATUS_", status);
  }
}

std::string EncodeHealthCheckRequest(absl::string_view service) {
  google::protobuf::UnknownFieldSet fields;
  // proto3 leaves a field at its default value off the wire.
  if (!service.empty()) fields.AddLengthDelimited(kServiceField, std::string(service));
  std::string bytes;
  fields.SerializeToString(&bytes);
  return bytes;
}

absl::StatusOr<int64_t> DecodeHealthCheckResponse(absl::string_view bytes) {
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("the health check reply is not a protobuf message");
  }
  int64_t status = 0;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& field = fields.field(i);
    if (field.number() == kStatusField &&
        field.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      status = static_cast<int64_t>(field.varint());  // the last one wins, as in protobuf
    }
  }
  return status;
}

grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                         grpc::ClientContext* context, absl::string_view service,
                         int64_t* serving_status) {
  std::string request_bytes = EncodeHealthCheckRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;

  grpc::GenericStub stub(channel);
  std::promise<grpc::Status> done;
  stub.UnaryCall(context, kCheckMethod, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return status;

  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the health check reply");
  }
  std::string response_bytes;
  for (const grpc::Slice& part : slices) {
    response_bytes.append(reinterpret_cast<const char*>(part.begin()), part.size());
  }
  absl::StatusOr<int64_t> decoded = DecodeHealthCheckResponse(response_bytes);
  if (!decoded.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(decoded.status().message()));
  }
  *serving_status = *decoded;
  return grpc::Status::OK;
}

}  // namespace trainerd::client
