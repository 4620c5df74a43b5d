// trainerd.v1.SystemService over the engine: ListDevices (quick) and Diagnose (seconds of device
// work on first use, so it runs on a thread of its own rather than on gRPC's callback threads).
#pragma once

#include <mutex>
#include <thread>
#include <vector>

#include "server/engine/engine.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::service {

// Thread-safe. The engine must outlive it; the destructor joins Diagnose's threads.
class SystemServiceImpl final : public v1::SystemService::CallbackService {
 public:
  explicit SystemServiceImpl(engine::Engine* engine) : engine_(engine) {}
  ~SystemServiceImpl() override;

  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const v1::ListDevicesRequest* request,
                                        v1::ListDevicesResponse* response) override;
  grpc::ServerUnaryReactor* Diagnose(grpc::CallbackServerContext* context,
                                     const v1::DiagnoseRequest* request,
                                     v1::DiagnoseResponse* response) override;

 private:
  engine::Engine* const engine_;
  std::mutex mu_;
  std::vector<std::thread> threads_;  // guarded by mu_; one per Diagnose call, joined at the end
};

}  // namespace trainerd::service
