// Engine::Impl, the engine's state behind its facade (engine.h), shared by the files that
// implement the facade: engine.cc (start, stop, the I/O and module-check threads, the job calls),
// engine_datasets.cc, engine_admission.cc, engine_devices.cc and engine_recovery.cc. Internal to
// the engine: nothing outside server/engine/ includes it.
#pragma once

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/checked_size.h"
#include "common/dataset_header.h"
#include "common/file_io.h"
#include "common/flops.h"
#include "common/job_limits.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/access.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/datasets/disk_quota.h"
#include "server/engine/devices/device.h"
#include "server/engine/devices/diagnose.h"
#include "server/engine/devices/placement.h"
#include "server/engine/devices/speed_report.h"
#include "server/engine/engine.h"
#include "server/engine/jobs/admission.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "server/engine/training/fused_path.h"
#include "server/engine/training/model.h"
#include "server/engine/training/trainer.h"
#include "server/monitor/sampler.h"

namespace trainerd::engine {

// Module checks that run at once, that may wait for a thread beyond those, and that one caller
// may have running and waiting together (its share: a tenant that sends many slow modules holds
// at most this many places, and the next free thread goes to the caller with the fewest checks
// running).
inline constexpr int kModuleCheckThreads = 2;
inline constexpr size_t kMaxWaitingModuleChecks = 8;
inline constexpr int kMaxModuleChecksPerCaller = 4;

struct Engine::Impl {
  Impl(const EngineOptions& options, torch::Device device, int64_t memory_budget)
      : options(WithSandboxPolicy(options, this)),
        device(device),
        datasets(options.data_dir + "/datasets", device, options.max_dataset_bytes,
                 options.max_upload_bytes_in_flight, memory_budget),
        disk_quota(options.max_disk_bytes_per_caller, DiskQuotaSources(options)),
        jobs(JobOptions(this->options)),
        admission(AdmissionOptionsOf(this->options, device, this), jobs, datasets) {
    datasets.SetInUse(
        [this](const std::string& key) { return !jobs.JobUsingDataset(key).empty(); });
  }

  static AdmissionOptions AdmissionOptionsOf(const EngineOptions& options, torch::Device device,
                                             Impl* impl) {
    AdmissionOptions out;
    out.max_jobs_per_caller = options.max_jobs_per_caller;
    out.max_queued_jobs = options.jobs.max_queued_jobs;
    out.max_replicas = options.max_replicas;
    out.allow_torchscript = options.allow_torchscript;
    out.max_job_time = options.jobs.max_job_time;
    out.device = device;
    out.diagnosis = [impl] { return impl->CachedDiagnosis(); };
    out.stored = [impl](const std::string& owner, int64_t bytes) {
      impl->disk_quota.Charge(owner, bytes);
    };
    return out;
  }
  JobManagerOptions JobOptions(const EngineOptions& options) {
    JobManagerOptions out;
    static_cast<JobRunOptions&>(out) = options.jobs;
    out.models_dir = options.data_dir + "/models";
    out.data_dir = options.data_dir;
    out.hooks = Hooks();
    out.store = options.job_store;
    out.peers = options.peers;
    return out;
  }
  // The options with the sandbox policy (--worker_sandbox_may_lack, the daemon's user) given to
  // the module checker and the workers, and their measurements published to `impl`
  // (RecordSandbox).
  static EngineOptions WithSandboxPolicy(EngineOptions options, Impl* impl);
  // A checker's or worker's sandbox as measured: kept for WorkerSandboxes() and logged when it
  // differs from what that program got before (a warning when it falls short).
  void RecordSandbox(const SandboxReport& report);
  // At start: takes up the jobs the store holds as QUEUED or RUNNING, each from its last
  // checkpoint (or epoch 0), and records those that cannot run any more as FAILED.
  absl::Status Recover();
  // Unfinished jobs whose records could not be read at the start, set aside (Recover).
  int64_t records_set_aside = 0;

  // The job manager's hooks: the observer, and the report's device figures (sampler window,
  // FLOPs from the model spec, the verdict against this device's cached Diagnose figures).
  JobHooks Hooks();
  // Where the disk quota finds a caller's files: its datasets (the registry) and its jobs (the
  // job manager's listing, ended jobs too).
  DiskQuota::Sources DiskQuotaSources(const EngineOptions& options);
  // The disk quota at admission, for a caller that is not an admin: OK below the quota with
  // `more` bytes to add.
  absl::Status CheckDiskQuota(const CallContext& caller, int64_t more, const std::string& what);
  // An upload of `name` into the caller's names: RESOURCE_EXHAUSTED past max_datasets
  // (everyone's) or max_datasets_per_caller (the caller's, not for admins). A name the caller
  // has already is left to the registry (ALREADY_EXISTS).
  absl::Status CheckDatasetCount(const std::string& name, const CallContext& caller) const;
  // The key of the dataset the caller means by `reference` (types.h: ResolveDatasetReference).
  absl::StatusOr<std::string> KeyFor(const std::string& reference, const CallContext& caller) const;
  // The dataset with key `key` when the caller may see it (access.h: MayUse); otherwise the
  // NOT_FOUND an unknown name gets, naming it as the caller does.
  absl::StatusOr<DatasetMeta> VisibleDataset(const std::string& key,
                                             const CallContext& caller) const;
  // The caller as admission sees it: its name, whether it is an admin, its request id, and the
  // datasets it may name and train on (KeyFor, VisibleDataset).
  Applicant ApplicantOf(const CallContext& caller) const;
  // The nodes of `spec` (its ranks' `spec->nodes`, or the nodes a sweep deals its members round):
  // each is one of this daemon's peers, takes this daemon's peer credentials as an admin's, and
  // holds the job's datasets (asked of it, within seconds, after CheckAdmissible and before
  // admission; outside the admission lock), or is sent them: as the submitting tenant's there
  // (node_dataset and node_validation_dataset in `spec` say under which names). OK for no nodes.
  // Nodes "*" become the peers known now (at most `most`: replicas - 1 for a job's ranks, the
  // members but one for a spread sweep), in `nodes`.
  absl::Status CheckPeers(std::vector<std::string>* nodes, JobSpec* spec, const CallContext& caller,
                          int64_t most) const;
  // A submitted model's job: its spec's cheap checks, its module's check (a separate process,
  // on a module-check thread, without the admission lock), then admission.
  absl::StatusOr<JobSnapshot> SubmitWithModule(PreparedJob job, const CallContext& caller);
  // The cached diagnosis, if any (never measures).
  std::optional<Diagnosis> CachedDiagnosis() const;
  absl::StatusOr<Diagnosis> Measure();

  const EngineOptions options;
  const torch::Device device;
  DatasetRegistry datasets;
  DiskQuota disk_quota;  // before `jobs`, whose hooks ask it

  // Diagnose: one measurement at a time; the figures are cached. Declared before `jobs` so that
  // they outlive the workers that read them.
  absl::Mutex diagnose_mu;  // held while measuring
  mutable absl::Mutex cache_mu;
  std::optional<Diagnosis> cache ABSL_GUARDED_BY(cache_mu);
  std::thread diagnose_thread;          // diagnose_at_start
  absl::Notification startup_measured;  // notified when diagnose_thread is done (or never ran)

  // The sandboxes measured, by program (RecordSandbox). Declared before `jobs`, whose workers
  // record theirs.
  mutable absl::Mutex sandbox_mu;
  std::map<std::string, WorkerSandboxStatus> sandboxes ABSL_GUARDED_BY(sandbox_mu);

  JobManager jobs;
  // Admission's checks and queueing (jobs/admission.h). Its lock also serialises a dataset's
  // delete and share with admission: a dataset cannot be deleted between a job's admission and
  // its registration.
  Admission admission;

  // disk_usage(): the last figures and when they were measured.
  mutable absl::Mutex disk_mu;
  DiskUsage disk ABSL_GUARDED_BY(disk_mu);
  absl::Time disk_measured ABSL_GUARDED_BY(disk_mu) = absl::InfinitePast();

  // The I/O thread runs dataset commits (file writes and host-to-device copies), off gRPC's
  // threads.
  std::mutex io_mu;
  std::condition_variable io_cv;
  std::deque<std::function<void()>> io_tasks;  // guarded by io_mu
  bool io_stopping = false;                    // guarded by io_mu
  std::thread io_thread;

  // The module-check threads run Submit's checks of TorchScript modules (a separate process each,
  // seconds at most), off gRPC's threads and without the admission lock. Set `check_stop` to end
  // the checks in progress at shutdown.
  std::mutex check_mu;
  std::condition_variable check_cv;
  struct CheckTask {
    std::string owner;     // the caller whose share it takes
    bool counted = false;  // in checks_of (a caller's check, not the daemon's own)
    std::function<void()> run;
  };
  std::deque<CheckTask> check_tasks;  // guarded by check_mu
  // Each caller's checks, running and waiting (guarded by check_mu; entries at 0 are erased).
  std::map<std::string, int> checks_of;
  std::map<std::string, int> running_checks_of;
  bool check_stopping = false;  // guarded by check_mu
  std::atomic<bool> check_stop{false};
  std::vector<std::thread> check_threads;
};

}  // namespace trainerd::engine
