// The engine: the state that matters (resident datasets, jobs, device workers) behind a plain C++
// API of domain types and absl::Status. It knows nothing of gRPC or Prometheus, and this header
// shows nothing of LibTorch either: the service layer, which also sees the generated protos, must
// not see LibTorch's include directories (its bundled protobuf headers clash with Debian's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/diagnosis_types.h"
#include "server/engine/types.h"

namespace trainerd::monitor {
class DeviceSampler;
}  // namespace trainerd::monitor

namespace trainerd::engine {

struct EngineOptions {
  // Where datasets are kept across restarts (created if missing). Must not be empty.
  std::string data_dir = "./trainerd-data";
  // The default device and where datasets are resident: "auto" (the first CUDA device, else the
  // CPU), "cpu", "cuda" or "cuda:N".
  std::string device = "auto";
  // The largest dataset payload accepted, in bytes; 0 means no limit.
  int64_t max_dataset_bytes = int64_t{16} << 30;
  // Receives every job's events, in order per job (the Prometheus metrics). Optional.
  std::shared_ptr<JobEventSink> observer;
  // Samples the devices for job reports (utilization, CPU memory) and ListDevices. Optional (the
  // reports then lack utilization); not owned, must outlive the engine.
  monitor::DeviceSampler* sampler = nullptr;
  // Measure every device (Diagnose) on a background thread at start, so that the first jobs'
  // verdicts have the peak and launch figures. The daemon turns it on; tests leave it off.
  bool diagnose_at_start = false;
};

// One device as ListDevices reports it (proto DeviceStatus).
struct DeviceStatusInfo {
  std::string device;  // "cpu" or "cuda:N"
  std::string name;
  std::string uuid;
  std::optional<double> utilization;
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  std::vector<std::string> datasets;
  int64_t dataset_bytes = 0;
  std::vector<std::string> running_jobs;
  int32_t queued_jobs = 0;
  bool is_default = false;
};

// LibTorch's version ("2.11.0") and the CUDA version it was built with ("13.0"; "" without CUDA),
// for callers that do not see LibTorch (the daemon's build_info metric).
std::string LibTorchVersionString();
std::string CudaVersionString();

// Thread-safe. Every call returns quickly: training runs on the device workers and dataset commits
// on the engine's I/O thread.
class Engine {
 public:
  // Resolves the device, creates the data folder and reloads the datasets kept there.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stops accepting work, cancels queued and running jobs (they end CANCELLED at a step boundary),
  // finishes pending dataset commits and joins the threads. Idempotent.
  void Shutdown();

  // The default device, e.g. "cuda:0".
  std::string default_device() const;
  // Every device a job may name: "cpu" and each CUDA device.
  std::vector<std::string> devices() const;
  // Each device with its last sample (when the engine has a sampler), resident datasets and jobs.
  std::vector<DeviceStatusInfo> ListDevices() const;
  // The seed's checks on every device (matrix-product FLOP/s, host-to-device bandwidth, launch and
  // sync costs, utilization during the products). The first call measures (seconds); later calls
  // return the cached figures unless `refresh`. One measurement at a time: a concurrent call waits
  // and shares it.
  absl::StatusOr<Diagnosis> Diagnose(bool refresh);
  // Bytes copied from the host to a device since the process started.
  int64_t host_to_device_bytes() const;

  // --- Datasets ---
  // Validates the header and reserves the name (see DatasetRegistry::BeginUpload).
  absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(const DatasetHeader& header);
  // Runs the blocking part of an upload (checks, durable file, host-to-device copy) on the I/O
  // thread and calls `done` there with the result. `upload` must come from BeginUpload.
  void CommitUploadAsync(std::unique_ptr<UploadSession> upload,
                         std::function<void(absl::StatusOr<DatasetMeta>)> done);
  // The same, on the calling thread.
  absl::StatusOr<DatasetMeta> CommitUpload(std::unique_ptr<UploadSession> upload);
  absl::StatusOr<DatasetMeta> GetDataset(const std::string& name) const;
  std::vector<DatasetMeta> ListDatasets() const;
  // FAILED_PRECONDITION while a queued or running job uses it.
  absl::Status DeleteDataset(const std::string& name);

  // --- Jobs ---
  // Checks the spec against the dataset (INVALID_ARGUMENT / NOT_FOUND), fills in the seed and
  // device, and queues it. Returns the job QUEUED.
  absl::StatusOr<JobSnapshot> SubmitJob(JobSpec spec);
  absl::StatusOr<JobSnapshot> GetJob(const std::string& id) const;
  std::vector<JobSnapshot> ListJobs() const;
  absl::StatusOr<JobSnapshot> CancelJob(const std::string& id);
  // Registers `sink` for the job's future events and returns the job as it stands, atomically:
  // no event is missed or delivered twice. A job that already ended gets no events.
  absl::StatusOr<JobSnapshot> SubscribeJob(const std::string& id,
                                           std::shared_ptr<JobEventSink> sink);
  void UnsubscribeJob(const std::string& id, const JobEventSink* sink);
  // The file of a SUCCEEDED job's trained model, a TorchScript archive kept as
  // <data_dir>/models/<job-id>.pt (written atomically before the job is published SUCCEEDED).
  // NOT_FOUND for an unknown id; FAILED_PRECONDITION ("job 'x' is RUNNING; its model is available
  // once it succeeds") while the job has not succeeded.
  absl::StatusOr<std::string> ModelArchivePath(const std::string& id) const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  void IoLoop();

  std::unique_ptr<Impl> impl_;
};

}  // namespace trainerd::engine
