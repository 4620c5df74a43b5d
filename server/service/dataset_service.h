// trainerd.v1.DatasetService over the engine, on gRPC's callback API. Each method converts the
// request, makes one non-blocking engine call and finishes; an upload's blocking commit runs on
// the engine's I/O thread, and a deletion or a change of sharing (files removed or rewritten) on
// the blocking pool (blocking_calls.h). An upload stream that goes idle is ended by the service's
// watchdog, and one that the client cancels or ends early is discarded.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/service/auth.h"
#include "server/service/blocking_calls.h"
#include "server/service/caller_slots.h"
#include "trainerd/v1/datasets.grpc.pb.h"

namespace trainerd::service {

class UploadReactor;

struct DatasetServiceOptions {
  // An upload stream that delivers nothing for this long ends DEADLINE_EXCEEDED and is discarded.
  absl::Duration upload_idle_timeout = absl::Seconds(60);
  // An upload that sends fewer bytes than this per second, averaged over each
  // upload_idle_timeout, ends DEADLINE_EXCEEDED too: a stream that trickles a byte now and then is
  // not idle, but holds its name, its staging and a slot. 0: no minimum.
  int64_t min_upload_bytes_per_second = int64_t{64} << 10;
  // Uploads one caller may have in progress at once (caller_slots.h); 0: no limit.
  int max_uploads_per_caller = 8;
  // Where DeleteDataset and ShareDataset run (blocking_calls.h); must outlive the service's calls.
  // Null: on gRPC's threads (a service built alone in a test).
  BlockingCalls* blocking = nullptr;
};

// Thread-safe. The engine and the authenticator (may be null: no caller names) must outlive it.
// Owns the watchdog thread that ends idle uploads; the destructor joins it.
class DatasetServiceImpl final : public v1::DatasetService::CallbackService {
 public:
  DatasetServiceImpl(engine::Engine* engine, Authenticator* authenticator = nullptr,
                     DatasetServiceOptions options = {});
  ~DatasetServiceImpl() override;

  grpc::ServerReadReactor<v1::UploadDatasetRequest>* UploadDataset(
      grpc::CallbackServerContext* context, v1::Dataset* response) override;
  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* context,
                                         const v1::ListDatasetsRequest* request,
                                         v1::ListDatasetsResponse* response) override;
  grpc::ServerUnaryReactor* GetDataset(grpc::CallbackServerContext* context,
                                       const v1::GetDatasetRequest* request,
                                       v1::Dataset* response) override;
  grpc::ServerUnaryReactor* DeleteDataset(grpc::CallbackServerContext* context,
                                          const v1::DeleteDatasetRequest* request,
                                          v1::DeleteDatasetResponse* response) override;
  grpc::ServerUnaryReactor* ShareDataset(grpc::CallbackServerContext* context,
                                         const v1::ShareDatasetRequest* request,
                                         v1::Dataset* response) override;

  // Uploads whose streams are open (for tests and metrics).
  size_t open_uploads() const;

 private:
  friend class UploadReactor;
  void Register(UploadReactor* upload);
  void Unregister(UploadReactor* upload);
  void WatchdogLoop();

  engine::Engine* const engine_;
  Authenticator* const authenticator_;
  const DatasetServiceOptions options_;
  CallerSlots upload_slots_{"uploads in progress", "--max_uploads_per_caller",
                            options_.max_uploads_per_caller};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<UploadReactor*> uploads_;  // guarded by mu_; a reactor leaves in its OnDone
  bool stopping_ = false;             // guarded by mu_
  std::thread watchdog_;
};

}  // namespace trainerd::service
