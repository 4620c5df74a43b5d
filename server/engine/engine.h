// The engine: the state that matters (resident datasets, jobs, device workers) behind a plain C++
// API of domain types and absl::Status. It knows nothing of gRPC or Prometheus, and this header
// shows nothing of LibTorch either: the service layer, which also sees the generated protos, must
// not see LibTorch's include directories (its bundled protobuf headers clash with Debian's).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/memory_size.h"
#include "server/engine/devices/diagnosis_types.h"
// The group of daemons a cluster manager starts (ClusterDirectory), which the server runs.
#include "server/engine/distributed/cluster_directory.h"
#include "server/engine/distributed/peers.h"
#include "server/engine/job_store.h"
#include "server/engine/jobs/job_options.h"
#include "server/engine/torchscript/module_sandbox.h"
#include "server/engine/torchscript/worker_options.h"
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
  // The most datasets the daemon keeps, all tenants together (0: no bound). A resident CPU
  // dataset holds two descriptors (its shared-memory files), so this bounds the descriptors
  // uploads can take; an upload past it is RESOURCE_EXHAUSTED before a byte is read. Uploads in
  // progress are not counted (they are bounded by max_uploads_per_caller and the staging budget).
  int64_t max_datasets = 0;
  // The default device's memory that resident datasets and running jobs' working sets may use
  // together: bytes, or a share of the device's memory (host RAM for the CPU). Unset: no budget.
  MemorySize device_memory_budget;
  // Load every dataset kept on disk at start (on the I/O thread, while they fit the budget);
  // otherwise each loads when a job first needs it. The engine serves at once either way.
  bool preload = false;
  // The most host memory that all dataset uploads in progress may stage together, in bytes; 0
  // means no bound. Staging grows with the bytes received, so this bounds what clients have
  // actually sent, whatever their headers declare.
  int64_t max_upload_bytes_in_flight = 0;
  // Optional per-tenant quotas (0: none). They bound callers that are not admins (access.h), so
  // that one team cannot take a shared node: its queued and running jobs (a sweep counts each
  // member), and the bytes of the datasets it owns, counted at the upload's header.
  int64_t max_jobs_per_caller = 0;
  int64_t max_dataset_bytes_per_caller = 0;
  // Optional: the most datasets one tenant (not an admin) may own (0: none).
  int64_t max_datasets_per_caller = 0;
  // A copy of a dataset that a leader made here for its jobs' ranks or sweep members
  // (DatasetMeta::peer_copy) is deleted once no job has used it for this long: counted from when
  // it was made or a job here last took it or gave it back, a time kept as its file's
  // modification time (so a restart does not set it back). Zero: copies are kept until deleted.
  absl::Duration peer_copy_retention = absl::Hours(24);
  // The bytes under data_dir one caller's datasets, modules, checkpoints and models may hold
  // (disk_quota.h): checked at its uploads and submissions, and before each checkpoint of its jobs
  // (skipped over the quota; the job goes on and says so). 0: none.
  int64_t max_disk_bytes_per_caller = 0;
  // Where job records outlive the process (the daemon's SQLite database, server/store). With one,
  // Create takes up the jobs the records hold as QUEUED or RUNNING (from their last checkpoint),
  // and Shutdown leaves running jobs to resume at the next start instead of cancelling them.
  // Null: job records live in memory only.
  std::shared_ptr<JobStore> job_store;
  // Accept TorchScript modules with jobs (bring your own model); false refuses them with
  // PERMISSION_DENIED.
  bool allow_torchscript = true;
  // The separate process that loads and tries a submitted module first (module_sandbox.h), with
  // its time and memory limits. An empty program refuses modules with FAILED_PRECONDITION.
  ModuleCheckerOptions module_checker;
  // Required parts of the sandbox of the processes that run submitted code that this daemon
  // accepts missing (--worker_sandbox_may_lack; RequiredSandboxParts names them). Empty: a checker
  // or worker short of any of them is sent no code, and its job is refused FAILED_PRECONDITION.
  std::vector<std::string> worker_sandbox_may_lack;
  // Data-parallel jobs (JobSpec::replicas): the most ranks a job may ask for (INVALID_ARGUMENT
  // above it).
  int32_t max_replicas = 8;
  // Ranks on other daemons (JobSpec::nodes): the peers and the calls to them (--peers; the
  // service layer's gRPC client), null without peers.
  std::shared_ptr<Peers> peers;
  // How jobs run: queues, threads, checkpoints kept, retention, worker processes, time limits,
  // data-parallel ranks (jobs/job_options.h); handed unchanged to the job manager.
  JobRunOptions jobs;
  // Diagnose(refresh) measures again only when the cached figures are at least this old; younger
  // ones are returned (marked cached). Zero: every refresh measures.
  absl::Duration diagnose_min_interval = absl::Seconds(30);
  // Receives every job's events, in order per job (the Prometheus metrics). Optional.
  std::shared_ptr<JobEventSink> observer;
  // Samples the devices for job reports (utilization, CPU memory) and ListDevices. Optional (the
  // reports then lack utilization); not owned, must outlive the engine.
  monitor::DeviceSampler* sampler = nullptr;
  // Measure every device (Diagnose) on a background thread at start, so that the first jobs'
  // verdicts have the peak and launch figures. The daemon turns it on; tests leave it off.
  bool diagnose_at_start = false;
  // Measure the sandbox of the module checker at start (a checker is started and left waiting),
  // so that the log, ListDevices and the metrics say what submitted code would get before anyone
  // submits. The daemon turns it on; tests leave it off.
  bool measure_sandbox_at_start = false;
};

// The confinement a process that runs submitted code (program: "trainerd-module-check",
// "trainerd-worker") got when it last started, as measured (sandbox_policy.h), and what the daemon
// makes of it (proto WorkerSandbox).
struct WorkerSandboxStatus {
  SandboxReport report;
  // Required parts it lacks: refused (the daemon runs no submitted code in such a process), and
  // accepted by --worker_sandbox_may_lack.
  std::vector<std::string> missing;
  std::vector<std::string> accepted_missing;
  std::string refusal;  // the FAILED_PRECONDITION sentence when `missing` is not empty
  absl::Time measured_at = absl::InfinitePast();
};

// One device as ListDevices reports it (proto DeviceStatus).
struct DeviceStatusInfo {
  std::string device;  // "cpu" or "cuda:N"
  std::string name;
  std::string uuid;
  std::optional<double> utilization;
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  std::vector<std::string> datasets;  // keys (types.h: DatasetKey)
  int64_t dataset_bytes = 0;
  std::vector<std::string> running_jobs;
  int32_t queued_jobs = 0;
  // Ranks of other daemons' jobs that this daemon runs on the device (proto
  // DeviceStatus.peer_ranks): "<job>/rank-<r> for <leader host>".
  std::vector<std::string> peer_ranks;
  bool is_default = false;
  // Set for a GPU that the sampler's NVML sees but LibTorch cannot use: why (proto
  // DeviceStatus.unusable_reason). Empty for a usable device.
  std::string unusable_reason;
};

// What the data folder holds on disk, in bytes (the disk-use metric).
struct DiskUsage {
  int64_t datasets = 0;     // datasets/
  int64_t models = 0;       // models/: trained models
  int64_t checkpoints = 0;  // checkpoints/
  int64_t modules = 0;      // modules/: TorchScript modules kept for restarts
  int64_t records = 0;      // jobs.db and its write-ahead log
  // The file system that holds the data folder (statvfs, read at every call): what an
  // unprivileged writer may still use, and its size. -1 when it cannot be read.
  int64_t free_bytes = -1;
  int64_t total_bytes = -1;
};

// LibTorch's version ("2.11.0") and the CUDA version it was built with ("13.0"; "" without CUDA),
// for callers that do not see LibTorch (the daemon's build_info metric).
std::string LibTorchVersionString();
std::string CudaVersionString();

// Who calls, and until when: what the service layer knows of a request that the engine records or
// honours.
struct CallContext {
  // The caller's name (a token's name, a client certificate's subject), recorded on the jobs and
  // datasets it creates; empty without authentication.
  std::string owner;
  // Whether the caller sees and manages every tenant's datasets and jobs (access.h). Without
  // authentication every caller is one local admin.
  bool admin = true;
  // The caller's deadline: work done for the call (a module check) stops there.
  absl::Time deadline = absl::InfiniteFuture();
  // A submit's request id (SubmitJobRequest.request_id, checked by the service: IsRequestId) and
  // a digest of the rest of the request: a submit whose id this owner already used returns what
  // that call queued, and is ALREADY_EXISTS when the digests differ. Empty: no id.
  std::string request_id;
  std::string request_digest;
  // Optional, for work done for the call after its handler returned (a module check): not OK once
  // the call is over for its client (cancelled, its deadline passed, its connection gone), and the
  // work then stops with that status. Valid only until the call is answered.
  std::function<absl::Status()> cancelled;
};

// A sweep's lists (SubmitSweep): each member takes one value of each; an empty list keeps the
// spec's value.
// One member given by its values (SweepAxes::points): unset keeps the spec's.
struct SweepPoint {
  std::optional<double> learning_rate;
  std::optional<double> momentum;
  std::optional<double> weight_decay;
  std::optional<uint64_t> seed;
  // The member's own spec when it varies more than these four (model, batch size, epochs,
  // optimizer, loss, schedule, ...: SubmitSweepRequest's SweepPoint.fields): the sweep's spec with
  // those fields replaced. Its dataset, validation and placement must be the sweep's; its seed,
  // when unset, is the sweep's. The four values above apply after it.
  std::optional<JobSpec> spec;
};

struct SweepAxes {
  std::vector<double> learning_rates;
  std::vector<double> momenta;
  std::vector<double> weight_decays;
  std::vector<uint64_t> seeds;
  // The members one by one instead of the lists' product (the lists then empty).
  std::vector<SweepPoint> points;
};

struct SweepSnapshot {
  std::string id;
  std::vector<JobSnapshot> members;  // QUEUED, in product order
};

// Thread-safe. Every call returns quickly (training runs on the device workers, dataset commits
// on the engine's I/O thread, module checks on the engine's check threads), except the blocking
// forms that say so: CommitUpload, Diagnose, and SubmitJob for a job with a TorchScript module.
class Engine {
 public:
  // Resolves the device, creates the data folder and reloads the datasets kept there.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stops accepting work, stops queued and running jobs, finishes pending dataset commits and
  // joins the threads. Without a job store the jobs end CANCELLED (at a step boundary); with one
  // they stay QUEUED or RUNNING in the records and resume at the next start. Idempotent.
  void Shutdown();
  // SIGTERM's graceful form (with a job store): new jobs are refused at once (UNAVAILABLE), each
  // running job finishes its current epoch and writes a checkpoint, and past `timeout` the rest
  // stop at a step boundary; then Shutdown. Blocks until done.
  void Drain(absl::Duration timeout);

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
  // The sandbox of the processes that run submitted code as last measured, one per program that
  // has started (the module checker is measured at the daemon's start; a worker when its first
  // job starts); empty before any measurement or with TorchScript turned off.
  std::vector<WorkerSandboxStatus> WorkerSandboxes() const;
  // Bytes copied from the host to a device since the process started.
  int64_t host_to_device_bytes() const;
  // Unfinished jobs set aside at the start because their records could not be read (named in the
  // log; trainerd_job_records_damaged).
  int64_t job_records_set_aside() const;
  // The default device's memory budget (0: none) and what uses it.
  struct MemoryAccount {
    std::string device;
    int64_t budget_bytes = 0;
    int64_t resident_dataset_bytes = 0;
    int64_t reserved_job_bytes = 0;  // running jobs' estimated working sets
    int64_t evictions = 0;           // datasets evicted so far
  };
  MemoryAccount memory_account() const;
  // The data folder's use of the disk: measured (a walk of its folders) at most every 10 s, the
  // figures cached in between, so that a scrape never walks a large folder often.
  DiskUsage disk_usage() const;

  // --- Datasets ---
  // Dataset names are per owner: every call below takes a caller's reference, "NAME" for its own
  // dataset or "OWNER/NAME" for another owner's (types.h: ResolveDatasetReference), and a dataset
  // the caller may not see (access.h) is NOT_FOUND as an unknown name is. A DatasetMeta carries
  // the bare name and the owner (DatasetKeyOf gives its key; DatasetNameFor how a caller names it).
  //
  // Validates the header and reserves the name among the caller's datasets (the header's name is
  // bare: an upload is always into `caller.owner`'s names, and counts against its quotas); see
  // DatasetRegistry::BeginUpload. `peer_copy`: a leader's copy for its jobs here
  // (DatasetMeta::peer_copy). Allocates nothing until bytes arrive.
  absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(const DatasetHeader& header,
                                                             const CallContext& caller = {},
                                                             bool peer_copy = false);
  // Runs the blocking part of an upload (checks, durable file, host-to-device copy) on the I/O
  // thread and calls `done` there with the result. `upload` must come from BeginUpload.
  void CommitUploadAsync(std::unique_ptr<UploadSession> upload,
                         std::function<void(absl::StatusOr<DatasetMeta>)> done);
  // The same, on the calling thread.
  absl::StatusOr<DatasetMeta> CommitUpload(std::unique_ptr<UploadSession> upload);
  // A copy for peers that is looked up has its clock started again (a leader looks it up just
  // before its job's ranks use it).
  absl::StatusOr<DatasetMeta> GetDataset(const std::string& name, const CallContext& caller = {});
  // Every dataset, sorted by key; who may see which is the caller's question (access.h: MayUse).
  std::vector<DatasetMeta> ListDatasets() const;
  // Deletes the copies for peers that no job has used for EngineOptions::peer_copy_retention
  // (none queued or running uses them) and returns how many. The engine's I/O thread calls it
  // every so often (a tenth of the retention, at most a minute apart).
  int RemoveIdlePeerCopies();
  // FAILED_PRECONDITION while a queued or running job uses it. A caller that may not manage it
  // (access.h: DatasetAccess) gets NOT_FOUND, or PERMISSION_DENIED naming the owner when it is
  // shared with the caller.
  absl::Status DeleteDataset(const std::string& name, const CallContext& caller = {});
  // Lets other tenants' jobs train on the dataset (or no longer: jobs already queued keep it),
  // kept in its file so that it outlives a restart. The same refusals as DeleteDataset.
  absl::StatusOr<DatasetMeta> ShareDataset(const std::string& name, bool shared,
                                           const CallContext& caller = {});
  // Host memory staged by the uploads in progress, in bytes.
  int64_t staged_upload_bytes() const;

  // --- Jobs ---
  // Checks the spec against the dataset (INVALID_ARGUMENT / NOT_FOUND; RESOURCE_EXHAUSTED for a
  // model over the limits of common/job_limits.h or a full queue), fills in the seed and device,
  // and queues it. Returns the job QUEUED. A job with a TorchScript module first has the module
  // checked as code (torchscript_module.h: PERMISSION_DENIED for refused operators,
  // DEADLINE_EXCEEDED when its check runs past its limit or `caller.deadline`). SubmitJobAsync,
  // waited for: it blocks for as long as the check waits and runs, and must not be called from
  // a module-check thread.
  absl::StatusOr<JobSnapshot> SubmitJob(JobSpec spec, const CallContext& caller = {});
  // The same without blocking: `done` is called exactly once, on the calling thread for a
  // spec-built job and on one of the engine's module-check threads for a TorchScript job (at most
  // a few checks wait for those threads; beyond that RESOURCE_EXHAUSTED at once).
  void SubmitJobAsync(JobSpec spec, CallContext caller,
                      std::function<void(absl::StatusOr<JobSnapshot>)> done);
  // A sweep: the product of `axes` applied to `spec` (learning rates outermost, seeds innermost),
  // each member checked as SubmitJob checks a job and all queued, or none, on one device. Members
  // train together as one pack (trainer.h, RunPackedTraining). INVALID_ARGUMENT for a TorchScript
  // module or more than kMaxSweepMembers members; otherwise SubmitJob's errors, the first failing
  // member named with its values.
  absl::StatusOr<SweepSnapshot> SubmitSweep(JobSpec spec, const SweepAxes& axes,
                                            const CallContext& caller = {});
  absl::StatusOr<JobSnapshot> GetJob(const std::string& id) const;

  // A peer's side of a data-parallel job led by another daemon (PeerService.RunRank): checks the
  // call (an admin caller; the store on one of this daemon's peers; the dataset here the leader's,
  // by SHA-256; a spec ranks can train), is admitted by the job manager as a job is (its memory,
  // waiting at most the call's timeout while running jobs hold it, and a CPU thread), then joins
  // the leader's group and trains the rank on the CPU until the job ends there, or `cancel` is
  // set (the leader cancelled the call), or the daemon shuts down. Blocking for the job's
  // length: the caller runs it on a thread of its own.
  // The result's status says why the rank could not run (PERMISSION_DENIED, FAILED_PRECONDITION,
  // INVALID_ARGUMENT, UNAVAILABLE); otherwise how the rank ended.
  RemoteRankResult RunRankForPeer(const RemoteRankRequest& request, const CallContext& caller,
                                  const std::atomic<bool>* cancel);
  // A page of jobs, filtered, in the summary view unless `query.full` (job_store.h); jobs from
  // before a restart included. INVALID_ARGUMENT for a page token the engine did not give.
  absl::StatusOr<JobPage> ListJobs(const JobQuery& query = {}) const;
  // Forgets a job that ended, with its model and checkpoints. NOT_FOUND for an unknown id;
  // FAILED_PRECONDITION while it is queued or running.
  absl::Status DeleteJob(const std::string& id);
  absl::StatusOr<JobSnapshot> CancelJob(const std::string& id);
  // Registers `sink` for the job's future events and returns the job as it stands, atomically:
  // no event is missed or delivered twice. A job that already ended gets no events.
  // `summary`: the job without its epochs and parameters (epochs_completed says how many), so
  // that a watch of a long job costs a summary, not its whole history (JobEpochs pages it).
  absl::StatusOr<JobSnapshot> SubscribeJob(const std::string& id,
                                           std::shared_ptr<JobEventSink> sink,
                                           bool summary = false);
  // The job's epochs after epoch `after`, at most `limit` of them, in order: a watcher reads a
  // long history page by page. NOT_FOUND for an unknown id.
  absl::StatusOr<std::vector<EpochResult>> JobEpochs(const std::string& id, int32_t after,
                                                     int32_t limit) const;
  void UnsubscribeJob(const std::string& id, const JobEventSink* sink);
  // The file of a SUCCEEDED job's trained model, a TorchScript archive kept as
  // <data_dir>/models/<job-id>.pt (written atomically before the job is published SUCCEEDED).
  // NOT_FOUND for an unknown id; FAILED_PRECONDITION ("job 'x' is RUNNING; its model is available
  // once it succeeds") while the job has not succeeded.
  absl::StatusOr<std::string> ModelArchivePath(const std::string& id) const;
  // The file of one of a job's checkpoints (JobManager::CheckpointPath): `epoch`'s, or the newest
  // with 0; `info` gets its record. NOT_FOUND naming the epochs that have one.
  absl::StatusOr<std::string> CheckpointFilePath(const std::string& id, int32_t epoch,
                                                 CheckpointInfo* info) const;
  // The same model's weights as a safetensors state_dict (nn.Sequential's names for a spec-built
  // model, the module's own for a TorchScript job), kept as <data_dir>/models/<job-id>.safetensors
  // beside the archive: the file and the SHA-256 recorded when it was written. As
  // ModelArchivePath, and FAILED_PRECONDITION when the job kept none (trained by an older build).
  struct StateDictFile {
    std::string path;
    std::string sha256;
  };
  absl::StatusOr<StateDictFile> StateDictPath(const std::string& id) const;
  // A spec-built job's model as torch.export's archive for deployment (the graph of
  // nn.Sequential(...).eval(), any batch size), made from its state_dict on the first call and
  // kept as <data_dir>/models/<job-id>.pt2. As StateDictPath; FAILED_PRECONDITION for a
  // TorchScript job (whose Python module the daemon does not have) and an exported one (whose
  // own archive ModelArchivePath gives).
  absl::StatusOr<StateDictFile> Pt2Path(const std::string& id) const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  void IoLoop();
  void CheckLoop();

  std::unique_ptr<Impl> impl_;
};

}  // namespace trainerd::engine
