#include "server/service/system_service.h"

#include "server/service/convert.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

SystemServiceImpl::~SystemServiceImpl() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
}

grpc::ServerUnaryReactor* SystemServiceImpl::ListDevices(grpc::CallbackServerContext* context,
                                                         const v1::ListDevicesRequest* /*request*/,
                                                         v1::ListDevicesResponse* response) {
  for (const engine::DeviceStatusInfo& device : engine_->ListDevices()) {
    *response->add_devices() = ToProto(device);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* SystemServiceImpl::Diagnose(grpc::CallbackServerContext* context,
                                                      const v1::DiagnoseRequest* request,
                                                      v1::DiagnoseResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool refresh = request->refresh();
  std::lock_guard<std::mutex> lock(mu_);
  // Diagnose calls are rare; their threads are joined when the service is destroyed.
  threads_.emplace_back([this, reactor, refresh, response] {
    absl::StatusOr<engine::Diagnosis> diagnosis = engine_->Diagnose(refresh);
    if (!diagnosis.ok()) {
      reactor->Finish(ToGrpcStatus(diagnosis.status()));
      return;
    }
    *response = ToProto(*diagnosis);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace trainerd::service
