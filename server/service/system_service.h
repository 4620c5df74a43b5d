// trainerd.v1.SystemService over the engine: ListDevices (quick) and Diagnose (seconds of device
// work on first use). Diagnose runs on the service's one worker thread, never on gRPC's callback
// threads; a few calls may wait for it (beyond them RESOURCE_EXHAUSTED), and a call whose deadline
// passes or whose client goes away is answered at once while the measurement goes on.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "server/engine/engine.h"
#include "server/service/auth.h"
#include "server/service/caller_slots.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::service {

// Diagnose calls that may wait for the worker (besides the one it runs).
inline constexpr size_t kMaxWaitingDiagnoses = 4;

// Thread-safe. The engine must outlive it; the destructor answers waiting calls UNAVAILABLE and
// joins the worker.
class SystemServiceImpl final : public v1::SystemService::CallbackService {
 public:
  // `version`: what GetVersion answers. `authenticator` (may be null: every caller is an admin)
  // tells ListDevices whose dataset names and job ids a caller may see.
  // `max_diagnose_per_caller`: Diagnose calls one caller may have waiting or running (0: no
  // limit).
  SystemServiceImpl(engine::Engine* engine, v1::VersionInfo version,
                    Authenticator* authenticator = nullptr, int max_diagnose_per_caller = 2);
  ~SystemServiceImpl() override;

  grpc::ServerUnaryReactor* GetVersion(grpc::CallbackServerContext* context,
                                       const v1::GetVersionRequest* request,
                                       v1::VersionInfo* response) override;

  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const v1::ListDevicesRequest* request,
                                        v1::ListDevicesResponse* response) override;
  grpc::ServerUnaryReactor* Diagnose(grpc::CallbackServerContext* context,
                                     const v1::DiagnoseRequest* request,
                                     v1::DiagnoseResponse* response) override;

 private:
  void WorkerLoop();

  engine::Engine* const engine_;
  const v1::VersionInfo version_;
  Authenticator* const authenticator_;
  CallerSlots diagnose_slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(bool run)>> waiting_;  // guarded by mu_; run=false: shutting down
  bool stopping_ = false;                              // guarded by mu_
  std::thread worker_;
};

}  // namespace trainerd::service
