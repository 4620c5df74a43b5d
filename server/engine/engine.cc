#include "server/engine/engine.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
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
#include "server/engine/jobs/job_manager.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "server/engine/training/fused_path.h"
#include "server/engine/training/model.h"
#include "server/monitor/sampler.h"

namespace trainerd::engine {

// How many times a TorchScript job is taken up again from the same epoch at a restart before it is
// FAILED instead (Recover).
constexpr int kMaxRestartsWithoutProgress = 3;

struct Engine::Impl {
  Impl(const EngineOptions& options, torch::Device device, int64_t memory_budget)
      : options(options),
        device(device),
        datasets(options.data_dir + "/datasets", device, options.max_dataset_bytes,
                 options.max_upload_bytes_in_flight, memory_budget),
        disk_quota(options.max_disk_bytes_per_caller, DiskQuotaSources(options)),
        jobs(JobOptions(options)) {
    datasets.SetInUse(
        [this](const std::string& name) { return !jobs.JobUsingDataset(name).empty(); });
  }

  JobManagerOptions JobOptions(const EngineOptions& options) {
    JobManagerOptions out;
    out.models_dir = options.data_dir + "/models";
    out.data_dir = options.data_dir;
    out.hooks = Hooks();
    out.max_queued_jobs = options.max_queued_jobs;
    out.max_concurrent_jobs = options.max_concurrent_jobs;
    out.intra_op_threads = options.intra_op_threads;
    out.flush_denormal = options.flush_denormal;
    out.cpu_training_nice = options.cpu_training_nice;
    out.store = options.job_store;
    out.keep_checkpoints = options.keep_checkpoints;
    out.max_finished_jobs = options.max_finished_jobs;
    out.job_retention = options.job_retention;
    out.worker = options.worker;
    out.max_job_time = options.max_job_time;
    return out;
  }
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
  // An upload: RESOURCE_EXHAUSTED past max_datasets (everyone's) or max_datasets_per_caller (the
  // caller's, not for admins). A name kept already is left to the registry (ALREADY_EXISTS).
  absl::Status CheckDatasetCount(const std::string& name, const CallContext& caller) const;
  // Submit's steps: the spec's defaults and the module's size and permission; admission (the
  // checks against the dataset, the limits, the queue) under admission_mu, with `module` when the
  // job brings one (then `checked_against` is the dataset it was checked against, which must not
  // have been replaced since); and the TorchScript path (blocking, see SubmitJob).
  absl::StatusOr<JobSpec> Prepare(JobSpec spec);
  // A job that names no device, on a daemon with several GPUs (Prepare left spec.device empty):
  // the GPU that holds its datasets, else the least loaded (ChooseDevice). Under admission_mu.
  torch::Device Place(const JobSpec& spec, const DatasetMeta& dataset, int64_t need);
  // A job with device "auto": the cost model's estimate for each device Diagnose measured
  // (device_cost.h); empty before any measurement.
  std::vector<DeviceCostEstimate> EstimateDevices(const JobSpec& spec, const ModelSpec& model,
                                                  bool torchscript, const DatasetMeta& dataset,
                                                  int64_t dataset_bytes, int64_t training_rows,
                                                  int64_t batch);
  absl::StatusOr<JobSnapshot> Admit(JobSpec spec, const CallContext& caller,
                                    std::optional<LoadedTorchScript> module,
                                    const DatasetMeta* checked_against,
                                    std::string_view module_bytes = {});
  // Admit's checks without the queue: the spec against its dataset and the limits, its device
  // placed, its estimates. Under admission_mu.
  absl::StatusOr<SweepMember> CheckLocked(JobSpec spec, const CallContext& caller,
                                          const LoadedTorchScript* module,
                                          const DatasetMeta* checked_against)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu);
  // RESOURCE_EXHAUSTED, naming the quota, when `caller` (not an admin) would have more than
  // max_jobs_per_caller queued and running jobs with `more` more. Under admission_mu, so that two
  // submissions cannot both take the last place.
  absl::Status CheckJobQuotaLocked(const CallContext& caller, int64_t more) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu);
  // The dataset `name` when `caller` may train on it (access.h); NOT_FOUND otherwise, as for a
  // name nobody uploaded.
  absl::StatusOr<DatasetMeta> UsableDataset(const std::string& name,
                                            const CallContext& caller) const;
  absl::StatusOr<JobSnapshot> SubmitWithModule(JobSpec spec, const CallContext& caller);
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

  JobManager jobs;

  // disk_usage(): the last figures and when they were measured.
  mutable absl::Mutex disk_mu;
  DiskUsage disk ABSL_GUARDED_BY(disk_mu);
  absl::Time disk_measured ABSL_GUARDED_BY(disk_mu) = absl::InfinitePast();

  // Serialises Submit's dataset lookup with Delete's in-use check, so that a dataset cannot be
  // deleted between a job's admission and its registration.
  absl::Mutex admission_mu;

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
  std::deque<std::function<void()>> check_tasks;  // guarded by check_mu
  bool check_stopping = false;                    // guarded by check_mu
  std::atomic<bool> check_stop{false};
  std::vector<std::thread> check_threads;
};

namespace {

// Module checks that run at once, and that may wait for a thread beyond those.
constexpr int kModuleCheckThreads = 2;
constexpr size_t kMaxWaitingModuleChecks = 8;

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir must not be empty");
  TRAINERD_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(options.device));
  const int64_t budget = options.device_memory_budget.Resolve(DeviceTotalMemory(device));
  auto impl = std::make_unique<Impl>(options, device, budget);
  if (budget > 0) {
    LogInfo(absl::StrCat("device memory budget on ", DeviceName(device), ": ", budget, " bytes"));
  }
  TRAINERD_RETURN_IF_ERROR(impl->datasets.LoadFromDisk());
  const size_t registered = impl->datasets.List().size();
  LogInfo(absl::StrCat("engine ready on ", DeviceName(device), " with ", registered, " dataset",
                       registered == 1 ? "" : "s", " from ", options.data_dir,
                       options.preload ? " (preloading them)" : " (each loads when first used)"));
  TRAINERD_RETURN_IF_ERROR(impl->Recover());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->io_thread = std::thread([this] { IoLoop(); });
  if (impl_->options.preload) {
    std::lock_guard<std::mutex> lock(impl_->io_mu);
    impl_->io_tasks.push_back([impl = impl_.get()] { impl->datasets.Preload(); });
    impl_->io_cv.notify_one();
  }
  for (int i = 0; i < kModuleCheckThreads; ++i) {
    impl_->check_threads.emplace_back([this] { CheckLoop(); });
  }
  if (impl_->options.diagnose_at_start) {
    impl_->diagnose_thread = std::thread([impl = impl_.get()] {
      absl::MutexLock lock(&impl->diagnose_mu);
      absl::StatusOr<Diagnosis> diagnosis = impl->Measure();
      if (!diagnosis.ok()) {
        LogWarning(absl::StrCat("cannot measure the devices: ", diagnosis.status().message()));
      }
      impl->startup_measured.Notify();
    });
  } else {
    impl_->startup_measured.Notify();
  }
}

Engine::~Engine() { Shutdown(); }

void Engine::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // New submissions and uploads are refused at once; the module checks in flight end with
  // Shutdown below.
  impl_->jobs.Drain(timeout);
  // Uploads that began before the drain may finish within it: their bytes are not thrown away
  // for want of the I/O thread that commits them.
  while (impl_->datasets.uploads_in_progress() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  Shutdown();
}

void Engine::Shutdown() {
  // Module checks in progress end at once (their clients get UNAVAILABLE); waiting ones too.
  impl_->check_stop.store(true);
  {
    std::lock_guard<std::mutex> lock(impl_->check_mu);
    impl_->check_stopping = true;
  }
  impl_->check_cv.notify_all();
  for (std::thread& t : impl_->check_threads) {
    if (t.joinable()) t.join();
  }
  if (impl_->diagnose_thread.joinable()) impl_->diagnose_thread.join();
  impl_->jobs.Shutdown();
  {
    std::lock_guard<std::mutex> lock(impl_->io_mu);
    impl_->io_stopping = true;
  }
  impl_->io_cv.notify_all();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
}

std::string Engine::default_device() const { return DeviceName(impl_->device); }

std::vector<std::string> Engine::devices() const { return AvailableDeviceNames(); }

std::string LibTorchVersionString() { return LibTorchVersion(); }
std::string CudaVersionString() { return CudaBuildVersion(); }

int64_t Engine::host_to_device_bytes() const { return HostToDeviceBytesTotal(); }

int64_t Engine::job_records_set_aside() const { return impl_->records_set_aside; }

Engine::MemoryAccount Engine::memory_account() const {
  MemoryAccount account;
  account.device = DeviceName(impl_->device);
  account.budget_bytes = impl_->datasets.memory_budget();
  account.resident_dataset_bytes = impl_->datasets.resident_bytes();
  account.reserved_job_bytes = impl_->datasets.reserved_bytes();
  account.evictions = impl_->datasets.evictions();
  return account;
}

DiskUsage Engine::disk_usage() const {
  constexpr absl::Duration kRefresh = absl::Seconds(10);
  const std::string& dir = impl_->options.data_dir;
  int64_t free_bytes = -1;
  int64_t total_bytes = -1;
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    total_bytes = static_cast<int64_t>(fs.f_blocks) * static_cast<int64_t>(fs.f_frsize);
  }
  absl::MutexLock lock(&impl_->disk_mu);
  const absl::Time now = absl::Now();
  if (now - impl_->disk_measured < kRefresh) {
    DiskUsage cached = impl_->disk;
    cached.free_bytes = free_bytes;
    cached.total_bytes = total_bytes;
    return cached;
  }
  DiskUsage usage;
  usage.free_bytes = free_bytes;
  usage.total_bytes = total_bytes;
  usage.datasets = BytesOnDisk(dir + "/datasets");
  usage.models = BytesOnDisk(dir + "/models");
  usage.checkpoints = BytesOnDisk(dir + "/checkpoints");
  usage.modules = BytesOnDisk(dir + "/modules");
  usage.records = BytesOnDisk(dir + "/jobs.db") + BytesOnDisk(dir + "/jobs.db-wal") +
                  BytesOnDisk(dir + "/jobs.db-shm");
  impl_->disk = usage;
  impl_->disk_measured = now;
  return usage;
}

std::vector<DeviceStatusInfo> Engine::ListDevices() const {
  std::vector<DeviceStatusInfo> out;
  const std::string default_name = DeviceName(impl_->device);
  const std::vector<DatasetMeta> datasets = impl_->datasets.List();
  const std::vector<JobSnapshot> jobs = impl_->jobs.ActiveJobs();
  for (const std::string& name : AvailableDeviceNames()) {
    DeviceStatusInfo info;
    info.device = name;
    info.is_default = name == default_name;
    info.name = name;
    if (impl_->options.sampler != nullptr) {
      if (std::optional<monitor::DeviceReading> r = impl_->options.sampler->Latest(name)) {
        if (!r->name.empty()) info.name = r->name;
        info.uuid = r->uuid;
        info.utilization = r->utilization;
        info.memory_used_bytes = r->memory_used_bytes;
        info.memory_total_bytes = r->memory_total_bytes;
      }
    }
    for (const DatasetMeta& meta : datasets) {
      if (meta.device != name || meta.location != DatasetLocation::kDevice) continue;
      info.datasets.push_back(meta.name);
      info.dataset_bytes += meta.size_bytes;
    }
    for (const JobSnapshot& job : jobs) {
      if (job.device != name) continue;
      if (job.state == JobState::kRunning) info.running_jobs.push_back(job.id);
      if (job.state == JobState::kQueued) ++info.queued_jobs;
    }
    out.push_back(std::move(info));
  }
  // GPUs that NVML samples but LibTorch does not see: listed with their readings, so that an
  // operator sees the GPU and why no job can use it.
  if (impl_->options.sampler != nullptr) {
    const std::vector<std::string> usable = AvailableDeviceNames();
    for (const monitor::DeviceReading& r : impl_->options.sampler->Latest()) {
      if (r.device == "cpu" || std::find(usable.begin(), usable.end(), r.device) != usable.end()) {
        continue;
      }
      DeviceStatusInfo info;
      info.device = r.device;
      info.name = r.name.empty() ? r.device : r.name;
      info.uuid = r.uuid;
      info.utilization = r.utilization;
      info.memory_used_bytes = r.memory_used_bytes;
      info.memory_total_bytes = r.memory_total_bytes;
      info.unusable_reason =
          torch::cuda::device_count() == 0
              ? "NVML sees this GPU but LibTorch sees no CUDA device (check the driver, the "
                "container's GPU runtime and CUDA_VISIBLE_DEVICES)"
              : "NVML sees this GPU but LibTorch does not (CUDA_VISIBLE_DEVICES hides it)";
      out.push_back(std::move(info));
    }
  }
  return out;
}

std::optional<Diagnosis> Engine::Impl::CachedDiagnosis() const {
  absl::MutexLock lock(&cache_mu);
  return cache;
}

// Measures every device; diagnose_mu held. Device work of a few seconds per device.
absl::StatusOr<Diagnosis> Engine::Impl::Measure() {
  Diagnosis diagnosis;
  diagnosis.libtorch_version = LibTorchVersion();
  diagnosis.cuda_version = CudaBuildVersion();
  monitor::DeviceSampler* sampler = options.sampler;
  if (sampler != nullptr) diagnosis.driver_version = sampler->driver_version();
  try {
    for (const std::string& name : AvailableDeviceNames()) {
      TRAINERD_ASSIGN_OR_RETURN(torch::Device d, ResolveDevice(name));
      DiagnoseOptions diagnose_options;
      if (sampler != nullptr) {
        diagnose_options.sample_during_matmul = [sampler, name](DeviceDiagnosis& out) {
          sampler->SampleNow();
          if (std::optional<monitor::DeviceReading> r = sampler->Latest(name)) {
            out.utilization_during_matmul = r->utilization;
            out.sm_activity_during_matmul = r->sm_activity;
          }
        };
      }
      diagnosis.devices.push_back(DiagnoseDevice(d, diagnose_options));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("diagnose failed: ", FirstLineOf(e)));
  }
  diagnosis.measure_time = absl::Now();
  absl::MutexLock lock(&cache_mu);
  cache = diagnosis;
  return diagnosis;
}

absl::StatusOr<Diagnosis> Engine::Diagnose(bool refresh) {
  // A call right after start shares the start-up measurement rather than racing it.
  impl_->startup_measured.WaitForNotification();
  absl::MutexLock lock(&impl_->diagnose_mu);
  if (std::optional<Diagnosis> cached = impl_->CachedDiagnosis()) {
    // A refresh measures again only when the figures are older than diagnose_min_interval:
    // callers who refresh back to back (each measurement loads every device for about a
    // second) would otherwise take the node from its jobs.
    if (!refresh || absl::Now() - cached->measure_time < impl_->options.diagnose_min_interval) {
      cached->cached = true;
      return *cached;
    }
  }
  return impl_->Measure();
}

DiskQuota::Sources Engine::Impl::DiskQuotaSources(const EngineOptions& options) {
  DiskQuota::Sources sources;
  sources.data_dir = options.data_dir;
  sources.dataset_bytes = [this](const std::string& owner) {
    int64_t total = 0;
    for (const DatasetMeta& meta : datasets.List()) {
      total += meta.owner == owner ? meta.size_bytes : 0;
    }
    return total;
  };
  sources.job_ids = [this](const std::string& owner) {
    std::vector<std::string> ids;
    JobQuery query;
    query.owner = owner;
    query.page_size = kMaxJobPageSize;
    // Pages until the end; bounded by the jobs the records keep (--max_finished_jobs).
    while (true) {
      absl::StatusOr<JobPage> page = jobs.List(query);
      if (!page.ok()) break;
      for (const JobSnapshot& job : page->jobs) ids.push_back(job.id);
      if (page->next_page_token.empty()) break;
      query.page_token = page->next_page_token;
    }
    return ids;
  };
  return sources;
}

absl::Status Engine::Impl::CheckDatasetCount(const std::string& name,
                                             const CallContext& caller) const {
  const bool per_caller = options.max_datasets_per_caller > 0 && !caller.admin;
  if (options.max_datasets <= 0 && !per_caller) return absl::OkStatus();
  const std::vector<DatasetMeta> kept = datasets.List();
  int64_t owned = 0;
  for (const DatasetMeta& meta : kept) {
    if (meta.name == name) return absl::OkStatus();  // the registry says it exists
    owned += meta.owner == caller.owner ? 1 : 0;
  }
  if (options.max_datasets > 0 && static_cast<int64_t>(kept.size()) >= options.max_datasets) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon keeps ", kept.size(), " datasets and at most ", options.max_datasets,
        " (--max_datasets); delete datasets that are no longer needed"));
  }
  if (per_caller && owned >= options.max_datasets_per_caller) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "caller '", caller.owner, "' owns ", owned, " datasets; its quota is ",
        options.max_datasets_per_caller,
        " (--max_datasets_per_caller): delete datasets it no longer needs"));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::CheckDiskQuota(const CallContext& caller, int64_t more,
                                          const std::string& what) {
  if (caller.admin) return absl::OkStatus();
  return disk_quota.Check(caller.owner, more, what);
}

JobHooks Engine::Impl::Hooks() {
  JobHooks hooks;
  hooks.observer = options.observer;
  if (options.max_disk_bytes_per_caller > 0) {
    hooks.may_checkpoint = [this](const std::string& owner) {
      return disk_quota.Check(owner, 0, "a checkpoint");
    };
    hooks.wrote_file = [this](const std::string& owner, int64_t bytes) {
      disk_quota.Charge(owner, bytes);
    };
  }
  hooks.acquire = [this](const JobSnapshot& job) -> absl::StatusOr<JobDatasets> {
    TRAINERD_ASSIGN_OR_RETURN(torch::Device job_device, ResolveDevice(job.device));
    return datasets.AcquireForJob(job.id, job.spec.dataset, job.spec.validation_dataset,
                                  job.estimated_memory_bytes, job_device);
  };
  hooks.release = [this](const std::string& id) { datasets.ReleaseJob(id); };
  // A TorchScript job taken up after a restart: its module checked as at Submit, on the job's
  // worker thread (a restart serves at once; nothing of the module ran in the daemon meanwhile).
  hooks.check_module = [this](const JobSnapshot& job,
                              const TorchScriptJob& module) -> absl::StatusOr<TorchScriptJob> {
    if (!options.allow_torchscript) {
      return absl::PermissionDeniedError(
          "this daemon no longer accepts TorchScript modules (--allow_torchscript=false)");
    }
    TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta dataset, datasets.GetMeta(job.spec.dataset));
    JobSpec spec = job.spec;
    spec.torchscript = module.archive;
    TRAINERD_ASSIGN_OR_RETURN(LoadedTorchScript loaded,
                              LoadTorchScriptModule(spec, dataset, options.module_checker,
                                                    absl::InfiniteFuture(), &check_stop));
    TorchScriptJob checked;
    checked.archive = module.archive;
    checked.parameter_count = loaded.parameter_count;
    checked.checked = true;
    return checked;
  };
  hooks.start_report =
      [this](const JobSnapshot& job, const ModelSpec& model,
             const DatasetMeta& dataset) -> std::function<void(const JobSnapshot&, DeviceReport&)> {
    monitor::DeviceSampler* sampler = options.sampler;
    int64_t window = -1;
    int64_t memory_at_start = 0;
    if (sampler != nullptr) {
      window = sampler->BeginWindow(job.device);
      if (std::optional<monitor::DeviceReading> r = sampler->Latest(job.device)) {
        memory_at_start = r->memory_used_bytes;
      }
    }
    const int64_t rows = dataset.rows - HeldOutRows(job.spec.validation_fraction, dataset.rows);
    const int64_t batch = std::min<int64_t>(job.spec.batch_size, std::max<int64_t>(rows, 1));
    // A TorchScript module's cost is unknown (its spec is empty).
    const double flops = model.layers.empty()
                             ? 0.0
                             : common::TrainingFlopsPerStep(model, dataset.feature_shape, batch);
    const int64_t layers = static_cast<int64_t>(model.layers.size());
    return [this, sampler, window, memory_at_start, rows, batch, flops, layers](
               const JobSnapshot& ended, DeviceReport& report) {
      if (window >= 0) {
        const monitor::WindowStats stats = sampler->EndWindow(window);
        report.utilization_average = stats.utilization_average;
        report.utilization_peak = stats.utilization_peak;
        // The CPU has no allocator peak: the process's resident growth stands in for it.
        if (report.peak_memory_bytes == 0 && ended.device == "cpu") {
          report.peak_memory_bytes =
              std::max<int64_t>(0, stats.peak_memory_used_bytes - memory_at_start);
        }
      }
      report.flops_per_step = flops;
      SpeedFigures figures;
      figures.device = ended.device;
      figures.queue_seconds = report.queue_seconds;
      figures.data_seconds = report.data_seconds;
      figures.compute_seconds = report.compute_seconds;
      figures.host_transfer_seconds = report.host_transfer_seconds;
      figures.steps = ended.steps;
      figures.batch_size = batch;
      figures.training_rows = rows;
      figures.epochs_done = static_cast<int32_t>(ended.epochs.size());
      figures.flops_per_step = flops;
      figures.layers = layers;
      if (std::optional<Diagnosis> diagnosis = CachedDiagnosis()) {
        for (const DeviceDiagnosis& d : diagnosis->devices) {
          if (d.device == ended.device) {
            figures.peak_flops_per_second = d.matmul_flops_per_second;
            figures.launch_seconds = d.launch_seconds;
          }
          if (d.device == "cpu") {
            figures.cpu_peak_flops_per_second = d.matmul_flops_per_second;
            figures.cpu_launch_seconds = d.launch_seconds;
          }
        }
      }
      // The fused path dispatches no operators: the kernel-count estimate of per-step overhead
      // (speed_report.h) does not apply to it, so its verdict rests on the other figures.
      const bool fused = report.engine == "fused";
      if (fused) figures.launch_seconds.reset();
      const SpeedVerdict verdict = JudgeSpeed(figures);
      report.achieved_flops_per_second = verdict.achieved_flops_per_second;
      report.peak_fraction = verdict.peak_fraction;
      report.overhead_fraction = verdict.overhead_fraction;
      report.bound = verdict.bound;
      report.verdict = verdict.line;
      if (fused && !report.verdict.empty()) {
        absl::StrAppend(&report.verdict, "; fused path (no per-operator dispatch)");
      }
    };
  };
  return hooks;
}

void Engine::IoLoop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(impl_->io_mu);
      impl_->io_cv.wait(lock, [this] { return impl_->io_stopping || !impl_->io_tasks.empty(); });
      // Finish queued commits even while stopping: each has a waiting client.
      if (impl_->io_tasks.empty()) return;
      task = std::move(impl_->io_tasks.front());
      impl_->io_tasks.pop_front();
    }
    task();
  }
}

void Engine::CheckLoop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(impl_->check_mu);
      impl_->check_cv.wait(lock,
                           [this] { return impl_->check_stopping || !impl_->check_tasks.empty(); });
      if (impl_->check_tasks.empty()) return;
      task = std::move(impl_->check_tasks.front());
      impl_->check_tasks.pop_front();
    }
    task();  // after check_stop is set, a task ends quickly with UNAVAILABLE
  }
}

absl::StatusOr<std::unique_ptr<UploadSession>> Engine::BeginUpload(const DatasetHeader& header,
                                                                   const CallContext& caller) {
  // Refused before a byte is read, rather than received whole and then refused.
  if (!impl_->jobs.accepting()) {
    return absl::UnavailableError(
        "the daemon is shutting down; upload again once it is back (nothing was received)");
  }
  TRAINERD_RETURN_IF_ERROR(impl_->CheckDatasetCount(header.name, caller));
  if (impl_->options.max_dataset_bytes_per_caller > 0 && !caller.admin) {
    // The declared size, checked before anything is received: what the caller owns already plus
    // this upload must fit its quota.
    const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(header, 0);
    int64_t owned = 0;
    for (const DatasetMeta& meta : impl_->datasets.List()) {
      owned += meta.owner == caller.owner ? meta.size_bytes : 0;
    }
    if (layout.ok() && owned + layout->total_bytes > impl_->options.max_dataset_bytes_per_caller) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "caller '", caller.owner, "' owns ", owned, " bytes of datasets and this one declares ",
          layout->total_bytes, "; its quota is ", impl_->options.max_dataset_bytes_per_caller,
          " bytes (--max_dataset_bytes_per_caller): delete datasets it no longer needs"));
    }
  }
  if (impl_->options.max_disk_bytes_per_caller > 0 && !caller.admin) {
    // The declared size again, against what the caller holds on disk.
    const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(header, 0);
    if (layout.ok()) {
      TRAINERD_RETURN_IF_ERROR(
          impl_->CheckDiskQuota(caller, layout->total_bytes, "this upload"));
    }
  }
  TRAINERD_ASSIGN_OR_RETURN(std::unique_ptr<DatasetUpload> upload,
                            impl_->datasets.BeginUpload(header, caller.owner));
  return std::unique_ptr<UploadSession>(std::move(upload));
}

int64_t Engine::staged_upload_bytes() const { return impl_->datasets.staged_bytes(); }

absl::StatusOr<DatasetMeta> Engine::CommitUpload(std::unique_ptr<UploadSession> session) {
  // Every UploadSession comes from BeginUpload, which makes DatasetUploads.
  std::unique_ptr<DatasetUpload> upload(static_cast<DatasetUpload*>(session.release()));
  const std::string name = upload->meta().name;
  auto meta = impl_->datasets.Commit(std::move(upload));
  if (meta.ok()) {
    impl_->disk_quota.Forget();  // the new dataset counts at the owner's next call
    LogInfo(absl::StrCat("dataset '", name, "' resident on ", meta->device, ": ", meta->rows,
                         " rows, ", meta->size_bytes, " bytes"));
  }
  return meta;
}

void Engine::CommitUploadAsync(std::unique_ptr<UploadSession> upload,
                               std::function<void(absl::StatusOr<DatasetMeta>)> done) {
  // std::function needs a copyable callable; the upload moves into a shared holder.
  auto holder = std::make_shared<std::unique_ptr<UploadSession>>(std::move(upload));
  {
    std::lock_guard<std::mutex> lock(impl_->io_mu);
    if (!impl_->io_stopping) {
      impl_->io_tasks.push_back(
          [this, holder, done = std::move(done)] { done(CommitUpload(std::move(*holder))); });
      impl_->io_cv.notify_one();
      return;
    }
  }
  done(absl::UnavailableError("the daemon is shutting down"));
}

absl::StatusOr<DatasetMeta> Engine::GetDataset(const std::string& name) const {
  return impl_->datasets.GetMeta(name);
}

std::vector<DatasetMeta> Engine::ListDatasets() const { return impl_->datasets.List(); }

absl::Status Engine::DeleteDataset(const std::string& name, const CallContext& caller) {
  absl::MutexLock lock(&impl_->admission_mu);
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta meta, impl_->datasets.GetMeta(name));
  TRAINERD_RETURN_IF_ERROR(CheckMayManage(caller, meta));
  const std::string job = impl_->jobs.JobUsingDataset(name);
  if (!job.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset '", name, "' is in use by job '", job, "'; cancel the job or wait for it to end"));
  }
  TRAINERD_RETURN_IF_ERROR(impl_->datasets.Delete(name));
  impl_->disk_quota.Forget();  // the owner's room is back at its next call
  LogInfo(absl::StrCat("dataset '", name, "' deleted"));
  return absl::OkStatus();
}

absl::StatusOr<DatasetMeta> Engine::ShareDataset(const std::string& name, bool shared,
                                                 const CallContext& caller) {
  // Under the admission lock, as a delete is: the owner checked is the owner changed.
  absl::MutexLock lock(&impl_->admission_mu);
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta meta, impl_->datasets.GetMeta(name));
  TRAINERD_RETURN_IF_ERROR(CheckMayManage(caller, meta));
  return impl_->datasets.SetShared(name, shared);
}

namespace {

// A TorchScript module's working set, roughly: its parameters, their gradients and the
// optimizer's state exactly (from the parameter count); for activations, which depend on code
// the daemon does not read, four times one batch's inputs and outputs.
MemoryEstimate EstimateModuleMemory(int64_t parameter_count, const DatasetMeta& dataset,
                                    const std::vector<int64_t>& output_shape, int64_t batch,
                                    int64_t optimizer_slots) {
  MemoryEstimate estimate;
  estimate.parameters = parameter_count;
  estimate.parameter_bytes = parameter_count * 4;
  estimate.gradient_bytes = parameter_count * 4;
  estimate.optimizer_bytes = parameter_count * 4 * optimizer_slots;
  int64_t row_inputs = 1;
  for (int64_t d : dataset.feature_shape) row_inputs *= d;
  int64_t row_outputs = 1;
  for (int64_t d : output_shape) row_outputs *= d;
  estimate.activation_bytes = 4 * batch * (row_inputs + row_outputs) * 4;
  estimate.total_bytes = estimate.parameter_bytes + estimate.gradient_bytes +
                         estimate.optimizer_bytes + estimate.activation_bytes;
  return estimate;
}

// The optimizer's float32 state per parameter, for the memory estimate.
int64_t OptimizerSlots(const JobSpec& spec) {
  switch (spec.optimizer) {
    case OptimizerKind::kSgd:
      return spec.momentum > 0 ? 1 : 0;
    case OptimizerKind::kRmsprop:
      return spec.momentum > 0 ? 2 : 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2;
  }
  return 2;
}

}  // namespace

absl::Status Engine::Impl::CheckJobQuotaLocked(const CallContext& caller, int64_t more) const {
  if (options.max_jobs_per_caller <= 0 || caller.admin) return absl::OkStatus();
  int64_t held = 0;
  for (const JobSnapshot& job : jobs.ActiveJobs()) held += job.owner == caller.owner ? 1 : 0;
  if (held + more > options.max_jobs_per_caller) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "caller '", caller.owner, "' has ", held, " queued or running jobs", more > 1 ? absl::StrCat(" and asked for ", more, " more") : "",
        "; its quota is ", options.max_jobs_per_caller,
        " (--max_jobs_per_caller): wait for some to end or cancel some"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DatasetMeta> Engine::Impl::UsableDataset(const std::string& name,
                                                        const CallContext& caller) const {
  TRAINERD_ASSIGN_OR_RETURN(DatasetMeta meta, datasets.GetMeta(name));
  // Another tenant's dataset that is not shared is, to this caller, no dataset at all.
  if (!MayUse(caller, meta)) {
    return absl::NotFoundError(absl::StrCat("dataset '", name, "' not found"));
  }
  return meta;
}

absl::StatusOr<SweepMember> Engine::Impl::CheckLocked(JobSpec spec, const CallContext& caller,
                                                      const LoadedTorchScript* module,
                                                      const DatasetMeta* checked_against) {
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta dataset, UsableDataset(spec.dataset, caller));
  if (checked_against != nullptr && (dataset.sha256 != checked_against->sha256 ||
                                     dataset.create_time != checked_against->create_time)) {
    return absl::AbortedError(absl::StrCat("dataset '", spec.dataset,
                                           "' was replaced while the module was checked; submit "
                                           "the job again"));
  }
  ModelSpec model;  // stays empty for a TorchScript job
  // (A TorchScript job's spec passed CheckJobSpec before its module's check, against this same
  // dataset.) The batch is worked out only from a checked spec: a validation fraction outside
  // [0, 1) or NaN must not reach the arithmetic.
  if (!(module != nullptr)) {
    TRAINERD_ASSIGN_OR_RETURN(model, CheckJobSpec(spec, dataset));
  }
  const int64_t training_rows = dataset.rows - HeldOutRows(spec.validation_fraction, dataset.rows);
  const int64_t batch = std::max<int64_t>(1, std::min(spec.batch_size, training_rows));
  MemoryEstimate estimate;
  if (!(module != nullptr)) {
    TRAINERD_ASSIGN_OR_RETURN(estimate, EstimateTrainingMemory(model, dataset.feature_shape, batch,
                                                               OptimizerSlots(spec)));
    TRAINERD_RETURN_IF_ERROR(CheckModelSize(estimate, spec.model));
  } else {
    estimate = EstimateModuleMemory(module->parameter_count, dataset, module->output_shape, batch,
                                    OptimizerSlots(spec));
  }
  // The validation dataset is looked up under the same admission lock, so that it cannot be
  // deleted before the job holds it (JobUsingDataset counts it as in use).
  int64_t validation_bytes = 0;
  if (!spec.validation_dataset.empty()) {
    auto validation = UsableDataset(spec.validation_dataset, caller);
    if (!validation.ok()) {
      return absl::Status(validation.status().code(),
                          absl::StrCat("validation ", validation.status().message()));
    }
    validation_bytes = spec.validation_dataset == spec.dataset ? 0 : validation->size_bytes;
    TRAINERD_RETURN_IF_ERROR(CheckValidationDataset(spec, model, dataset, *validation,
                                                    module ? &module->output_shape : nullptr));
  }
  torch::Device device = this->device;
  std::vector<DeviceCostEstimate> estimates;
  if (spec.device == "auto") {
    // The cheapest device by the cost model, when Diagnose has measured them; else the first GPU
    // or the CPU, as ResolveDevice("auto") always was.
    estimates = EstimateDevices(spec, model, (module != nullptr), dataset,
                                dataset.size_bytes + validation_bytes, training_rows, batch);
    if (std::optional<size_t> best = Cheapest(estimates)) {
      TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice(estimates[*best].device));
    } else {
      TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice("auto"));
    }
    spec.device = DeviceName(device);
  } else if (!spec.device.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice(spec.device));
  } else {
    device = Place(spec, dataset, estimate.total_bytes);
    spec.device = DeviceName(device);
  }
  // engine fused is a promise: a job it cannot take is refused now, saying why.
  if (spec.engine == EngineKind::kFused) {
    const std::string why =
        FusedPathUnsupported(spec, model, dataset.feature_shape, (module != nullptr), device);
    if (!why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine fused cannot run this job: ", why, " (use engine auto)"));
    }
  }
  // A job that could never fit the device's budget, even alone, is refused now rather than
  // failing later.
  const int64_t budget = datasets.memory_budget();
  if (budget > 0 && device == this->device) {
    const int64_t need = estimate.total_bytes + dataset.size_bytes + validation_bytes;
    if (need > budget) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the job needs about %d bytes on %s: an estimated working set of %d (parameters %d, "
          "gradients %d, optimizer state %d, activations for a batch of %d rows %d) and its "
          "datasets' %d; the device memory budget is %d bytes (--device_memory_budget)",
          need, DeviceName(device), estimate.total_bytes, estimate.parameter_bytes,
          estimate.gradient_bytes, estimate.optimizer_bytes, batch, estimate.activation_bytes,
          dataset.size_bytes + validation_bytes, budget));
    }
  }
  SweepMember checked;
  checked.spec = std::move(spec);
  checked.model = std::move(model);
  checked.device = device;
  checked.estimated_memory_bytes = estimate.total_bytes;
  checked.device_estimates = std::move(estimates);
  return checked;
}

absl::StatusOr<JobSnapshot> Engine::Impl::Admit(JobSpec spec, const CallContext& caller,
                                                std::optional<LoadedTorchScript> module,
                                                const DatasetMeta* checked_against,
                                                std::string_view module_bytes) {
  // Before admission_mu: it walks the caller's files (at most every few seconds).
  TRAINERD_RETURN_IF_ERROR(CheckDiskQuota(caller, static_cast<int64_t>(module_bytes.size()),
                                          "this job's module"));
  absl::MutexLock lock(&admission_mu);
  TRAINERD_RETURN_IF_ERROR(CheckJobQuotaLocked(caller, 1));
  TRAINERD_ASSIGN_OR_RETURN(
      SweepMember checked,
      CheckLocked(std::move(spec), caller, module ? &*module : nullptr, checked_against));
  TRAINERD_ASSIGN_OR_RETURN(
      JobSnapshot job,
      jobs.Enqueue(std::move(checked.spec), std::move(checked.model), checked.device,
                   module ? std::make_shared<const TorchScriptJob>(TorchScriptJob{
                                std::string(module_bytes), module->parameter_count, true})
                          : nullptr,
                   caller.owner, module_bytes, checked.estimated_memory_bytes,
                   std::move(checked.device_estimates), /*quota_exempt=*/caller.admin));
  if (!module_bytes.empty()) {
    disk_quota.Charge(caller.owner, static_cast<int64_t>(module_bytes.size()));
  }
  LogInfo(absl::StrCat("job '", job.id, "' queued on ", job.device, ": ", job.spec.model,
                       " on dataset '", job.spec.dataset, "', ", job.spec.epochs, " epochs",
                       job.owner.empty() ? "" : absl::StrCat(", for ", job.owner)));
  return job;
}

std::vector<DeviceCostEstimate> Engine::Impl::EstimateDevices(
    const JobSpec& spec, const ModelSpec& model, bool torchscript, const DatasetMeta& dataset,
    int64_t dataset_bytes, int64_t training_rows, int64_t batch) {
  const std::optional<Diagnosis> diagnosis = CachedDiagnosis();
  if (!diagnosis) return {};
  JobCostInput job;
  job.flops_per_step = model.layers.empty()
                           ? 0.0
                           : common::TrainingFlopsPerStep(model, dataset.feature_shape, batch);
  job.layers = std::max<int64_t>(1, static_cast<int64_t>(model.layers.size()));
  job.steps_per_epoch = (training_rows + batch - 1) / batch;
  job.epochs = spec.epochs;
  job.dataset_bytes = dataset_bytes;
  job.fused_on_cpu =
      spec.engine != EngineKind::kLibTorch &&
      FusedPathUnsupported(spec, model, dataset.feature_shape, torchscript, torch::kCPU).empty() &&
      (spec.engine == EngineKind::kFused ||
       FusedPathSlower(model, dataset.feature_shape, batch).empty());
  std::vector<DeviceCostFigures> figures;
  for (const DeviceDiagnosis& d : diagnosis->devices) {
    DeviceCostFigures f;
    f.device = d.device;
    f.peak_flops_per_second = d.matmul_flops_per_second;
    f.launch_seconds = d.launch_seconds;
    f.sync_seconds = d.sync_seconds;
    f.host_to_device_bytes_per_second = d.host_to_device_bytes_per_second;
    f.holds_dataset =
        d.device == DeviceName(device) && dataset.location == DatasetLocation::kDevice;
    figures.push_back(std::move(f));
  }
  return EstimateJobCost(job, figures);
}

torch::Device Engine::Impl::Place(const JobSpec& spec, const DatasetMeta& dataset, int64_t need) {
  const int count = static_cast<int>(torch::cuda::device_count());
  std::vector<PlacementCandidate> candidates;
  bool validation_resident = true;
  if (!spec.validation_dataset.empty() && spec.validation_dataset != spec.dataset) {
    auto validation = datasets.GetMeta(spec.validation_dataset);
    validation_resident = validation.ok() && validation->location == DatasetLocation::kDevice;
  }
  const int64_t budget = datasets.memory_budget();
  for (int i = 0; i < count; ++i) {
    const torch::Device candidate(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
    PlacementCandidate c;
    c.device = DeviceName(candidate);
    // Datasets are resident on the daemon's device (--device); the others copy them per job.
    const bool home = candidate == device;
    c.holds_datasets = home && dataset.location == DatasetLocation::kDevice && validation_resident;
    c.jobs = jobs.DeviceLoad(c.device);
    if (home && budget > 0) {
      c.free_memory =
          std::max<int64_t>(0, budget - datasets.resident_bytes() - datasets.reserved_bytes());
    }
    candidates.push_back(std::move(c));
  }
  const size_t chosen = ChooseDevice(candidates, need);
  LogInfo(absl::StrCat(
      "job on dataset '", spec.dataset, "' placed on ", candidates[chosen].device,
      candidates[chosen].holds_datasets ? " (it holds the dataset)" : " (the least loaded GPU)"));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(chosen));
}

absl::Status Engine::Impl::Recover() {
  if (options.job_store == nullptr) return absl::OkStatus();
  TRAINERD_ASSIGN_OR_RETURN(std::vector<JobSnapshot> unfinished,
                            options.job_store->LoadUnfinishedJobs());
  int resumed = 0;
  for (JobSnapshot& job : unfinished) {
    if (!job.record_damaged.empty()) {
      // Nothing of it can be trusted to run; the others must not wait for it.
      ++records_set_aside;
      LogWarning(absl::StrCat("job '", job.id, "' is set aside and not resumed: ",
                              job.record_damaged));
      continue;
    }
    const JobState previous = job.state;
    // A cancel recorded while it ran: it ends here, whatever stopped the daemon.
    if (job.cancel_requested) {
      LogInfo(absl::StrCat("job '", job.id, "' was cancelled before the daemon stopped"));
      TRAINERD_RETURN_IF_ERROR(jobs.FailUnrecoverable(
          job, "cancelled (the daemon stopped before the job did)", JobState::kCancelled));
      continue;
    }
    // From the last checkpoint the records list whose file is there (a checkpoint is written
    // before its epoch's record, so a crash between the two leaves the earlier one listed).
    // Newest first, the first whose file is there and still matches the checksum recorded when
    // it was written: a checkpoint cut short or damaged since costs the epochs after the one
    // before it, not the job.
    ResumePoint resume;
    for (auto it = job.checkpoints.rbegin(); it != job.checkpoints.rend(); ++it) {
      const std::string path = absl::StrCat(options.data_dir, "/", it->path);
      absl::StatusOr<std::string> bytes = ReadFileToString(path);
      if (!bytes.ok()) continue;
      if (!it->sha256.empty() && Sha256Hex(*bytes) != it->sha256) {
        LogWarning(absl::StrCat("job '", job.id, "': the checkpoint of epoch ", it->epoch, " ('",
                                it->path, "') is damaged; trying the one before"));
        continue;
      }
      resume.checkpoint_path = path;
      resume.epoch = it->epoch;
      break;
    }
    const int32_t from = resume.epoch;
    job.epochs.erase(std::remove_if(job.epochs.begin(), job.epochs.end(),
                                    [from](const EpochResult& e) { return e.epoch > from; }),
                     job.epochs.end());
    job.checkpoints.erase(
        std::remove_if(job.checkpoints.begin(), job.checkpoints.end(),
                       [from](const CheckpointInfo& c) { return c.epoch > from; }),
        job.checkpoints.end());
    job.final_loss = job.epochs.empty() ? 0.0 : job.epochs.back().loss;
    if (from == 0) {
      job.steps = 0;
      job.host_syncs = 0;
      job.wall_seconds = 0;
      job.samples_per_second = 0;
    }
    job.restarts.push_back(JobRestart{absl::Now(), from, previous});
    // A TorchScript job taken up again and again from the same point: whatever ends it (its
    // worker, or the daemon with it) ends it every time. Three times in a row, and it is FAILED
    // rather than taken up once more, so that a crash loop cannot happen.
    if (absl::StartsWith(job.spec.model, "torchscript")) {
      int in_a_row = 0;
      for (auto it = job.restarts.rbegin(); it != job.restarts.rend() && it->from_epoch == from;
           ++it) {
        ++in_a_row;
      }
      if (in_a_row >= kMaxRestartsWithoutProgress) {
        const std::string reason = absl::StrCat(
            "taken up ", kMaxRestartsWithoutProgress, " times in a row from epoch ", from,
            " without finishing an epoch; it is not taken up again");
        LogWarning(absl::StrCat("job '", job.id, "' ", reason));
        TRAINERD_RETURN_IF_ERROR(jobs.FailUnrecoverable(std::move(job), reason));
        continue;
      }
    }

    // What it needs to run again, checked as at Submit.
    auto take_up = [&]() -> absl::Status {
      TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta dataset, datasets.GetMeta(job.spec.dataset));
      if (!job.spec.validation_dataset.empty()) {
        TRAINERD_RETURN_IF_ERROR(datasets.GetMeta(job.spec.validation_dataset).status());
      }
      TRAINERD_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(job.spec.device));
      ModelSpec model;
      std::shared_ptr<const TorchScriptJob> module;
      if (absl::StartsWith(job.spec.model, "torchscript")) {
        if (!options.allow_torchscript) {
          return absl::PermissionDeniedError(
              "this daemon no longer accepts TorchScript modules (--allow_torchscript=false)");
        }
        // Checked again as code before it runs, on the job's worker thread: a newer build may
        // refuse what an older one let through, and the check must not hold up the start.
        TorchScriptJob unchecked;
        TRAINERD_ASSIGN_OR_RETURN(unchecked.archive, ReadFileToString(jobs.ModuleFilePath(job.id)));
        unchecked.checked = false;
        module = std::make_shared<const TorchScriptJob>(std::move(unchecked));
      } else {
        TRAINERD_ASSIGN_OR_RETURN(model, CheckJobSpec(job.spec, dataset));
      }
      const std::string id = job.id;
      TRAINERD_RETURN_IF_ERROR(
          jobs.Requeue(std::move(job), std::move(model), device, std::move(module), resume));
      LogInfo(absl::StrCat(
          "job '", id, "' (", JobStateName(previous), " when the daemon stopped) ",
          from > 0 ? absl::StrCat("resumes after epoch ", from) : std::string("starts over"),
          from > 0 ? " from its last checkpoint" : ""));
      return absl::OkStatus();
    };
    JobSnapshot copy = job;  // take_up moves `job` once it cannot fail any more
    absl::Status taken = take_up();
    if (taken.ok()) {
      ++resumed;
      continue;
    }
    const std::string reason =
        absl::StrCat("cannot run again after the daemon restarted: ", taken.message());
    LogWarning(absl::StrCat("job '", copy.id, "' ", reason));
    TRAINERD_RETURN_IF_ERROR(jobs.FailUnrecoverable(std::move(copy), reason));
  }
  if (!unfinished.empty()) {
    LogInfo(absl::StrCat(resumed, " of ", unfinished.size(),
                         " unfinished job(s) taken up again from the records"));
  }
  jobs.PruneEndedJobs();
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> Engine::Impl::Prepare(JobSpec spec) {
  // Draining or stopped: said first, whatever else is wrong with the spec.
  if (!jobs.accepting()) return absl::UnavailableError("the daemon is shutting down");
  if (spec.device == "auto") {
    // Chosen by cost in Admit, once the model and the dataset are known (device_cost.h).
  } else if (!spec.device.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(torch::Device resolved, ResolveDevice(spec.device));
    spec.device = DeviceName(resolved);
  } else if (!device.is_cuda() || torch::cuda::device_count() < 2) {
    spec.device = DeviceName(device);
  }  // else Admit places the job, once its estimate is known.
  if (!spec.seed.has_value()) {
    std::random_device random;
    spec.seed = (static_cast<uint64_t>(random()) << 32) | random();
  }
  if (!spec.torchscript.empty() && !options.allow_torchscript) {
    return absl::PermissionDeniedError(
        "this daemon does not accept TorchScript modules (it runs with --allow_torchscript=false); "
        "describe the model with a text spec instead");
  }
  if (static_cast<int64_t>(spec.torchscript.size()) > kMaxTorchScriptBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the TorchScript module has ",
                                                     spec.torchscript.size(), " bytes; at most ",
                                                     kMaxTorchScriptBytes, " are accepted"));
  }
  if (spec.torchscript.empty()) {
    // What is kept, copied into every snapshot and written to the records is the canonical
    // spec, not the caller's text: whitespace and case cost nothing ("linear:1" padded with
    // megabytes of spaces is stored as "linear:1"). A spec that does not parse fails here with
    // the parser's sentence, as it would in CheckJobSpec.
    TRAINERD_ASSIGN_OR_RETURN(const ModelSpec model, ParseModelSpec(spec.model));
    spec.model = model.ToString();
  }
  return spec;
}

absl::StatusOr<JobSnapshot> Engine::Impl::SubmitWithModule(JobSpec spec,
                                                           const CallContext& caller) {
  // The cheap checks first, so that a spec that cannot work fails before a process starts; then
  // the module's check without any lock; then admission, which finds the dataset again.
  DatasetMeta checked_against;
  {
    absl::MutexLock lock(&admission_mu);
    TRAINERD_ASSIGN_OR_RETURN(checked_against, UsableDataset(spec.dataset, caller));
    TRAINERD_RETURN_IF_ERROR(CheckJobSpec(spec, checked_against).status());
  }
  spec.model = absl::StrCat("torchscript (", spec.torchscript.size(), " bytes)");
  TRAINERD_ASSIGN_OR_RETURN(LoadedTorchScript loaded,
                            LoadTorchScriptModule(spec, checked_against, options.module_checker,
                                                  caller.deadline, &check_stop));
  // Only a description stays in the spec, which every snapshot of the job copies; the bytes are
  // kept in a file of their own while the job may run (a restart loads them again).
  const std::string module_bytes = std::move(spec.torchscript);
  spec.torchscript.clear();
  return Admit(std::move(spec), caller, std::move(loaded), &checked_against, module_bytes);
}

absl::StatusOr<JobSnapshot> Engine::SubmitJob(JobSpec spec, const CallContext& caller) {
  TRAINERD_ASSIGN_OR_RETURN(spec, impl_->Prepare(std::move(spec)));
  if (!spec.torchscript.empty()) return impl_->SubmitWithModule(std::move(spec), caller);
  return impl_->Admit(std::move(spec), caller, std::nullopt, nullptr);
}

absl::StatusOr<SweepSnapshot> Engine::SubmitSweep(JobSpec spec, const SweepAxes& axes,
                                                  const CallContext& caller) {
  if (!spec.torchscript.empty()) {
    return absl::InvalidArgumentError(
        "a sweep trains a model described by a text spec; submit a TorchScript module as a job of "
        "its own");
  }
  // The member count before anything is built from it, through the one checked helper.
  int64_t count = 1;
  for (const size_t axis : {axes.learning_rates.size(), axes.momenta.size(),
                            axes.weight_decays.size(), axes.seeds.size()}) {
    if (axis > static_cast<size_t>(kMaxSweepMembers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a sweep list has ", axis, " values; at most ", kMaxSweepMembers));
    }
    TRAINERD_ASSIGN_OR_RETURN(
        count, CheckedMul(count, std::max<int64_t>(1, static_cast<int64_t>(axis)), "sweep size"));
    if (count > kMaxSweepMembers) {
      return absl::InvalidArgumentError(
          absl::StrCat("the sweep has more than ", kMaxSweepMembers,
                       " members (the product of its lists); split it into smaller sweeps"));
    }
  }
  TRAINERD_ASSIGN_OR_RETURN(spec, impl_->Prepare(std::move(spec)));
  // An empty list keeps the spec's value (a seed Prepare drew when the spec had none: every
  // member then starts from the same weights).
  const std::vector<double> lrs =
      axes.learning_rates.empty() ? std::vector<double>{spec.learning_rate} : axes.learning_rates;
  const std::vector<double> momenta =
      axes.momenta.empty() ? std::vector<double>{spec.momentum} : axes.momenta;
  std::vector<std::optional<double>> decays;
  for (double d : axes.weight_decays) decays.push_back(d);
  if (decays.empty()) decays.push_back(spec.weight_decay);
  const std::vector<uint64_t> seeds =
      axes.seeds.empty() ? std::vector<uint64_t>{*spec.seed} : axes.seeds;
  std::vector<SweepMember> members;
  TRAINERD_RETURN_IF_ERROR(impl_->CheckDiskQuota(caller, 0, "this sweep"));
  {
    absl::MutexLock lock(&impl_->admission_mu);
    TRAINERD_RETURN_IF_ERROR(impl_->CheckJobQuotaLocked(
        caller, static_cast<int64_t>(lrs.size() * momenta.size() * decays.size() * seeds.size())));
    for (double lr : lrs) {
      for (double momentum : momenta) {
        for (const std::optional<double>& decay : decays) {
          for (uint64_t seed : seeds) {
            JobSpec member = spec;
            member.learning_rate = lr;
            member.momentum = momentum;
            member.weight_decay = decay;
            member.seed = seed;
            // One device for the whole sweep: the first member's (placed or chosen by cost).
            if (!members.empty()) member.device = members.front().spec.device;
            absl::StatusOr<SweepMember> checked =
                impl_->CheckLocked(std::move(member), caller, nullptr, nullptr);
            if (!checked.ok()) {
              return absl::Status(
                  checked.status().code(),
                  absl::StrCat("sweep member ", members.size() + 1, " (learning rate ", lr,
                               ", momentum ", momentum, ", weight decay ", decay.value_or(0.0),
                               ", seed ", seed, "): ", checked.status().message()));
            }
            members.push_back(*std::move(checked));
          }
        }
      }
    }
    TRAINERD_ASSIGN_OR_RETURN(std::vector<JobSnapshot> jobs,
                              impl_->jobs.EnqueueSweep(std::move(members), caller.owner,
                                                       /*quota_exempt=*/caller.admin));
    SweepSnapshot sweep;
    sweep.id = jobs.front().sweep_id;
    sweep.members = std::move(jobs);
    LogInfo(absl::StrCat("sweep '", sweep.id, "' queued on ", sweep.members.front().device, ": ",
                         sweep.members.size(), " members of ", spec.model, " on dataset '",
                         spec.dataset, "'", caller.owner.empty() ? "" : ", for ", caller.owner));
    return sweep;
  }
}

void Engine::SubmitJobAsync(JobSpec spec, CallContext caller,
                            std::function<void(absl::StatusOr<JobSnapshot>)> done) {
  absl::StatusOr<JobSpec> prepared = impl_->Prepare(std::move(spec));
  if (!prepared.ok() || prepared->torchscript.empty()) {
    done(prepared.ok() ? impl_->Admit(*std::move(prepared), caller, std::nullopt, nullptr)
                       : absl::StatusOr<JobSnapshot>(prepared.status()));
    return;
  }
  // std::function needs a copyable callable: the spec (with its module bytes) moves into a holder.
  auto holder = std::make_shared<JobSpec>(*std::move(prepared));
  {
    std::lock_guard<std::mutex> lock(impl_->check_mu);
    if (impl_->check_stopping) {
      // Below, outside the lock.
    } else if (impl_->check_tasks.size() >= kMaxWaitingModuleChecks) {
      // Below, outside the lock.
      holder.reset();
    } else {
      impl_->check_tasks.push_back([impl = impl_.get(), holder, caller, done = std::move(done)] {
        done(impl->SubmitWithModule(std::move(*holder), caller));
      });
      impl_->check_cv.notify_one();
      return;
    }
  }
  if (holder == nullptr) {
    done(absl::ResourceExhaustedError(
        absl::StrCat(kMaxWaitingModuleChecks,
                     " TorchScript module checks are already waiting; submit again "
                     "in a few seconds")));
  } else {
    done(absl::UnavailableError("the daemon is shutting down"));
  }
}

absl::StatusOr<JobSnapshot> Engine::GetJob(const std::string& id) const {
  return impl_->jobs.Get(id);
}

absl::StatusOr<JobPage> Engine::ListJobs(const JobQuery& query) const {
  return impl_->jobs.List(query);
}

absl::Status Engine::DeleteJob(const std::string& id) {
  TRAINERD_RETURN_IF_ERROR(impl_->jobs.Delete(id));
  impl_->disk_quota.Forget();  // the owner's room is back at its next call
  return absl::OkStatus();
}

absl::StatusOr<JobSnapshot> Engine::CancelJob(const std::string& id) {
  return impl_->jobs.Cancel(id);
}

absl::StatusOr<JobSnapshot> Engine::SubscribeJob(const std::string& id,
                                                 std::shared_ptr<JobEventSink> sink, bool summary) {
  return impl_->jobs.Subscribe(id, std::move(sink), summary);
}

absl::StatusOr<std::vector<EpochResult>> Engine::JobEpochs(const std::string& id, int32_t after,
                                                           int32_t limit) const {
  return impl_->jobs.Epochs(id, after, limit);
}

absl::StatusOr<std::string> Engine::ModelArchivePath(const std::string& id) const {
  return impl_->jobs.ModelPath(id);
}

void Engine::UnsubscribeJob(const std::string& id, const JobEventSink* sink) {
  impl_->jobs.Unsubscribe(id, sink);
}

}  // namespace trainerd::engine
