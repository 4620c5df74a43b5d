// The engine's facade (engine.h): start (Create, which takes up the recorded jobs) and stop
// (Drain, Shutdown), the I/O thread (dataset commits) and the module-check threads with their
// queues (io_mu, check_mu), the disk figures (disk_mu), and the job calls, which the job manager
// answers (jobs/). Datasets, admission, devices and recovery are in the engine_*.cc files beside
// it; Engine::Impl is in engine_impl.h.
#include <limits>

#include "server/engine/engine_impl.h"

namespace trainerd::engine {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir must not be empty");
  TRAINERD_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(options.device));
  const int64_t budget = options.device_memory_budget.Resolve(DeviceTotalMemory(device));
  auto impl = std::make_unique<Impl>(options, device, budget);
  if (budget > 0) {
    LogInfo(absl::StrCat("device memory budget on ", DeviceName(device), ": ", budget, " bytes"));
  }
  // Datasets of an older data folder (one namespace for every tenant) move to their owners'
  // folders, the job records that name them rewritten first (the keys a restart resolves).
  TRAINERD_RETURN_IF_ERROR(impl->datasets.LoadFromDisk([&](const DatasetRenames& renames) {
    if (options.job_store == nullptr) return absl::OkStatus();
    absl::Status renamed = options.job_store->RenameDatasets(renames);
    if (!renamed.ok()) {
      return absl::Status(renamed.code(),
                          absl::StrCat("cannot rewrite the job records' dataset names as "
                                       "owner/name: ",
                                       renamed.message()));
    }
    LogInfo(absl::StrCat(renames.size(),
                         " dataset(s) of an older data folder moved into their "
                         "owners' folders; job records naming them rewritten"));
    return absl::OkStatus();
  }));
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
  // The sandbox that submitted code would get here, measured at once on a module-check thread
  // (a checker started and left waiting for the first module), so that the log, ListDevices and
  // the metrics say it before anyone submits.
  if (impl_->options.measure_sandbox_at_start && impl_->options.allow_torchscript &&
      !impl_->options.module_checker.program.empty()) {
    std::lock_guard<std::mutex> lock(impl_->check_mu);
    impl_->check_tasks.push_back(
        {"", false, [impl = impl_.get()] {
           absl::StatusOr<SandboxReport> measured =
               MeasureCheckerSandbox(impl->options.module_checker, absl::Now() + absl::Seconds(60));
           if (!measured.ok() && !impl->check_stop.load()) {
             LogWarning(absl::StrCat("cannot measure the module checker's sandbox: ",
                                     measured.status().message()));
           }
         }});
    impl_->check_cv.notify_one();
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
  // The checkers left waiting were started by those threads, and die with them
  // (PR_SET_PDEATHSIG): none may be taken for another engine's check in this process.
  if (!impl_->options.module_checker.program.empty()) {
    DiscardIdleCheckers(impl_->options.module_checker);
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

void Engine::IoLoop() {
  // Between tasks, idle copies for peers are removed every tenth of their retention, at least
  // every minute (and at start).
  const absl::Duration retention = impl_->options.peer_copy_retention;
  const absl::Duration period =
      std::clamp(retention / 10, absl::Milliseconds(100), absl::Minutes(1));
  absl::Time next_sweep = absl::Now();
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(impl_->io_mu);
      const auto ready = [this] { return impl_->io_stopping || !impl_->io_tasks.empty(); };
      if (retention > absl::ZeroDuration()) {
        impl_->io_cv.wait_until(lock, absl::ToChronoTime(next_sweep), ready);
      } else {
        impl_->io_cv.wait(lock, ready);
      }
      // Finish queued commits even while stopping: each has a waiting client.
      if (impl_->io_tasks.empty() && impl_->io_stopping) return;
      if (!impl_->io_tasks.empty()) {
        task = std::move(impl_->io_tasks.front());
        impl_->io_tasks.pop_front();
      }
    }
    if (task) {
      task();
    } else if (absl::Now() >= next_sweep) {
      RemoveIdlePeerCopies();
      next_sweep = absl::Now() + period;
    }
  }
}

void Engine::CheckLoop() {
  while (true) {
    Impl::CheckTask task;
    {
      std::unique_lock<std::mutex> lock(impl_->check_mu);
      impl_->check_cv.wait(lock,
                           [this] { return impl_->check_stopping || !impl_->check_tasks.empty(); });
      if (impl_->check_tasks.empty()) return;
      // The oldest task of the caller with the fewest checks running: a tenant with several
      // waiting does not keep another's first check behind them.
      auto chosen = impl_->check_tasks.begin();
      int fewest = std::numeric_limits<int>::max();
      for (auto it = impl_->check_tasks.begin(); it != impl_->check_tasks.end(); ++it) {
        auto running = impl_->running_checks_of.find(it->owner);
        const int n = running == impl_->running_checks_of.end() ? 0 : running->second;
        if (n < fewest) {
          fewest = n;
          chosen = it;
        }
      }
      task = std::move(*chosen);
      impl_->check_tasks.erase(chosen);
      ++impl_->running_checks_of[task.owner];
    }
    task.run();  // after check_stop is set, a task ends quickly with UNAVAILABLE
    std::lock_guard<std::mutex> lock(impl_->check_mu);
    for (auto* counts : {&impl_->running_checks_of, &impl_->checks_of}) {
      if (counts == &impl_->checks_of && !task.counted) continue;
      auto it = counts->find(task.owner);
      if (it != counts->end() && --it->second <= 0) counts->erase(it);
    }
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

absl::StatusOr<std::string> Engine::CheckpointFilePath(const std::string& id, int32_t epoch,
                                                       CheckpointInfo* info) const {
  return impl_->jobs.CheckpointPath(id, epoch, info);
}

absl::StatusOr<Engine::StateDictFile> Engine::StateDictPath(const std::string& id) const {
  absl::StatusOr<std::pair<std::string, std::string>> file = impl_->jobs.StateDictPath(id);
  if (!file.ok()) return file.status();
  return StateDictFile{std::move(file->first), std::move(file->second)};
}

absl::StatusOr<Engine::StateDictFile> Engine::Pt2Path(const std::string& id) const {
  absl::StatusOr<std::pair<std::string, std::string>> file = impl_->jobs.Pt2Path(id);
  if (!file.ok()) return file.status();
  return StateDictFile{std::move(file->first), std::move(file->second)};
}

void Engine::UnsubscribeJob(const std::string& id, const JobEventSink* sink) {
  impl_->jobs.Unsubscribe(id, sink);
}

}  // namespace trainerd::engine
