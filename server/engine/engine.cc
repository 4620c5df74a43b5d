#include "server/engine/engine.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "common/flops.h"
#include "server/engine/dataset_registry.h"
#include "server/engine/diagnose.h"
#include "server/engine/device.h"
#include "server/engine/job_manager.h"
#include "server/engine/log.h"
#include "server/engine/model.h"
#include "server/engine/speed_report.h"
#include "server/engine/torchscript_module.h"
#include "server/monitor/sampler.h"

namespace trainerd::engine {

struct Engine::Impl {
  Impl(const EngineOptions& options, torch::Device device)
      : options(options),
        device(device),
        datasets(options.data_dir + "/datasets", device, options.max_dataset_bytes),
        jobs(options.data_dir + "/models", options.data_dir, Hooks()) {}

  // The job manager's hooks: the observer, and the report's device figures (sampler window,
  // FLOPs from the model spec, the verdict against this device's cached Diagnose figures).
  JobHooks Hooks();
  // The cached diagnosis, if any (never measures).
  std::optional<Diagnosis> CachedDiagnosis() const;
  absl::StatusOr<Diagnosis> Measure();

  const EngineOptions options;
  const torch::Device device;
  DatasetRegistry datasets;

  // Diagnose: one measurement at a time; the figures are cached. Declared before `jobs` so that
  // they outlive the workers that read them.
  absl::Mutex diagnose_mu;  // held while measuring
  mutable absl::Mutex cache_mu;
  std::optional<Diagnosis> cache ABSL_GUARDED_BY(cache_mu);
  std::thread diagnose_thread;  // diagnose_at_start
  absl::Notification startup_measured;  // notified when diagnose_thread is done (or never ran)

  JobManager jobs;

  // Serialises Submit's dataset lookup with Delete's in-use check, so that a dataset cannot be
  // deleted between a job's admission and its registration.
  absl::Mutex admission_mu;

  // The I/O thread runs dataset commits (file writes and host-to-device copies), off gRPC's threads.
  std::mutex io_mu;
  std::condition_variable io_cv;
  std::deque<std::function<void()>> io_tasks;  // guarded by io_mu
  bool io_stopping = false;                     // guarded by io_mu
  std::thread io_thread;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir must not be empty");
  TRAINERD_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(options.device));
  auto impl = std::make_unique<Impl>(options, device);
  TRAINERD_RETURN_IF_ERROR(impl->datasets.LoadFromDisk());
  const size_t loaded = impl->datasets.List().size();
  LogInfo(absl::StrCat("engine ready on ", DeviceName(device), " with ", loaded,
                       " resident dataset", loaded == 1 ? "" : "s", " from ", options.data_dir));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->io_thread = std::thread([this] { IoLoop(); });
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

void Engine::Shutdown() {
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

std::vector<DeviceStatusInfo> Engine::ListDevices() const {
  std::vector<DeviceStatusInfo> out;
  const std::string default_name = DeviceName(impl_->device);
  const std::vector<DatasetMeta> datasets = impl_->datasets.List();
  const std::vector<JobSnapshot> jobs = impl_->jobs.List();
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
      if (meta.device != name) continue;
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
    std::string what = e.what();
    return absl::InternalError(absl::StrCat("diagnose failed: ", what.substr(0, what.find('\n'))));
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
  if (!refresh) {
    if (std::optional<Diagnosis> cached = impl_->CachedDiagnosis()) {
      cached->cached = true;
      return *cached;
    }
  }
  return impl_->Measure();
}

JobHooks Engine::Impl::Hooks() {
  JobHooks hooks;
  hooks.observer = options.observer;
  hooks.start_report = [this](const JobSnapshot& job, const ModelSpec& model,
                              const DatasetMeta& dataset)
      -> std::function<void(const JobSnapshot&, DeviceReport&)> {
    monitor::DeviceSampler* sampler = options.sampler;
    int64_t window = -1;
    int64_t memory_at_start = 0;
    if (sampler != nullptr) {
      window = sampler->BeginWindow(job.device);
      if (std::optional<monitor::DeviceReading> r = sampler->Latest(job.device)) {
        memory_at_start = r->memory_used_bytes;
      }
    }
    const int64_t rows =
        dataset.rows - HeldOutRows(job.spec.validation_fraction, dataset.rows);
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
      const SpeedVerdict verdict = JudgeSpeed(figures);
      report.achieved_flops_per_second = verdict.achieved_flops_per_second;
      report.peak_fraction = verdict.peak_fraction;
      report.overhead_fraction = verdict.overhead_fraction;
      report.bound = verdict.bound;
      report.verdict = verdict.line;
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

absl::StatusOr<std::unique_ptr<UploadSession>> Engine::BeginUpload(const DatasetHeader& header) {
  TRAINERD_ASSIGN_OR_RETURN(std::unique_ptr<DatasetUpload> upload,
                            impl_->datasets.BeginUpload(header));
  return std::unique_ptr<UploadSession>(std::move(upload));
}

absl::StatusOr<DatasetMeta> Engine::CommitUpload(std::unique_ptr<UploadSession> session) {
  // Every UploadSession comes from BeginUpload, which makes DatasetUploads.
  std::unique_ptr<DatasetUpload> upload(static_cast<DatasetUpload*>(session.release()));
  const std::string name = upload->meta().name;
  auto meta = impl_->datasets.Commit(std::move(upload));
  if (meta.ok()) {
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
  TRAINERD_ASSIGN_OR_RETURN(auto dataset, impl_->datasets.Get(name));
  return dataset->meta;
}

std::vector<DatasetMeta> Engine::ListDatasets() const { return impl_->datasets.List(); }

absl::Status Engine::DeleteDataset(const std::string& name) {
  absl::MutexLock lock(&impl_->admission_mu);
  const std::string job = impl_->jobs.JobUsingDataset(name);
  if (!job.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset '", name, "' is in use by job '", job, "'; cancel the job or wait for it to end"));
  }
  TRAINERD_RETURN_IF_ERROR(impl_->datasets.Delete(name));
  LogInfo(absl::StrCat("dataset '", name, "' deleted"));
  return absl::OkStatus();
}

absl::StatusOr<JobSnapshot> Engine::SubmitJob(JobSpec spec) {
  torch::Device device = impl_->device;
  if (!spec.device.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice(spec.device));
  }
  spec.device = DeviceName(device);
  if (!spec.seed.has_value()) {
    std::random_device random;
    spec.seed = (static_cast<uint64_t>(random()) << 32) | random();
  }
  absl::MutexLock lock(&impl_->admission_mu);
  TRAINERD_ASSIGN_OR_RETURN(auto dataset, impl_->datasets.Get(spec.dataset));
  TRAINERD_ASSIGN_OR_RETURN(ModelSpec model, CheckJobSpec(spec, dataset->meta));
  // Bring your own model: load and check the module now (see LoadTorchScriptModule), then keep
  // only a description in the spec, which every snapshot of the job copies.
  std::shared_ptr<torch::jit::Module> torchscript;
  std::vector<int64_t> torchscript_output;
  if (!spec.torchscript.empty()) {
    spec.model = absl::StrCat("torchscript (", spec.torchscript.size(), " bytes)");
    TRAINERD_ASSIGN_OR_RETURN(LoadedTorchScript loaded,
                              LoadTorchScriptModule(spec, dataset->meta));
    torchscript = std::move(loaded.module);
    torchscript_output = std::move(loaded.output_shape);
    spec.torchscript.clear();
    spec.torchscript.shrink_to_fit();
  }
  // The validation dataset is looked up under the same admission lock, so that it cannot be
  // deleted before the job holds it (JobUsingDataset counts it as in use).
  std::shared_ptr<const Dataset> validation;
  if (!spec.validation_dataset.empty()) {
    auto found = impl_->datasets.Get(spec.validation_dataset);
    if (!found.ok()) {
      return absl::Status(found.status().code(),
                          absl::StrCat("validation ", found.status().message()));
    }
    validation = *std::move(found);
    TRAINERD_RETURN_IF_ERROR(CheckValidationDataset(spec, model, dataset->meta, validation->meta,
                                                    torchscript ? &torchscript_output : nullptr));
  }
  TRAINERD_ASSIGN_OR_RETURN(JobSnapshot job,
                            impl_->jobs.Enqueue(std::move(spec), std::move(model), dataset,
                                                std::move(validation), device,
                                                std::move(torchscript)));
  LogInfo(absl::StrCat("job '", job.id, "' queued on ", job.device, ": ", job.spec.model,
                       " on dataset '", job.spec.dataset, "', ", job.spec.epochs, " epochs"));
  return job;
}

absl::StatusOr<JobSnapshot> Engine::GetJob(const std::string& id) const {
  return impl_->jobs.Get(id);
}

std::vector<JobSnapshot> Engine::ListJobs() const { return impl_->jobs.List(); }

absl::StatusOr<JobSnapshot> Engine::CancelJob(const std::string& id) {
  return impl_->jobs.Cancel(id);
}

absl::StatusOr<JobSnapshot> Engine::SubscribeJob(const std::string& id,
                                                 std::shared_ptr<JobEventSink> sink) {
  return impl_->jobs.Subscribe(id, std::move(sink));
}

absl::StatusOr<std::string> Engine::ModelArchivePath(const std::string& id) const {
  return impl_->jobs.ModelPath(id);
}

void Engine::UnsubscribeJob(const std::string& id, const JobEventSink* sink) {
  impl_->jobs.Unsubscribe(id, sink);
}

}  // namespace trainerd::engine
