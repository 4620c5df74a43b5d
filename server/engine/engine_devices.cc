// The engine's devices: ListDevices, Diagnose and its cache (diagnose_mu held while measuring,
// cache_mu for the figures; admission reads them for `--device auto`), the job manager's hooks
// that give a job's report its device figures, and the sandbox of the processes that run
// submitted code as they measure it (sandbox_mu).
#include <unistd.h>

#include "absl/strings/str_join.h"
#include "server/engine/engine_impl.h"

namespace trainerd::engine {

EngineOptions Engine::Impl::WithSandboxPolicy(EngineOptions options, Impl* impl) {
  SandboxPolicy policy;
  policy.daemon_uid = ::geteuid();
  policy.may_lack.insert(options.worker_sandbox_may_lack.begin(),
                         options.worker_sandbox_may_lack.end());
  auto record = [impl](const SandboxReport& report) { impl->RecordSandbox(report); };
  options.module_checker.sandbox_policy = policy;
  options.module_checker.on_sandbox = record;
  options.jobs.worker.sandbox_policy = policy;
  options.jobs.worker.on_sandbox = record;
  return options;
}

void Engine::Impl::RecordSandbox(const SandboxReport& report) {
  WorkerSandboxStatus status;
  status.report = report;
  status.measured_at = absl::Now();
  for (const SandboxShortfall& s : SandboxShortfalls(report, SandboxPolicy{})) {
    if (options.module_checker.sandbox_policy.may_lack.count(s.part) > 0) {
      status.accepted_missing.push_back(s.part);
    } else {
      status.missing.push_back(s.part);
    }
  }
  const absl::Status checked = CheckSandbox(report, options.module_checker.sandbox_policy);
  if (!checked.ok()) status.refusal = std::string(checked.message());
  const std::string program = report.program.empty() ? "trainerd-worker" : report.program;
  bool changed = true;
  {
    absl::MutexLock lock(&sandbox_mu);
    auto it = sandboxes.find(program);
    if (it != sandboxes.end()) {
      changed = EncodeSandboxReport(it->second.report) != EncodeSandboxReport(report);
    }
    sandboxes[program] = status;
  }
  if (!changed) return;
  const std::string described = DescribeSandbox(report);
  if (!status.refusal.empty()) {
    LogWarning(absl::StrCat(program, "'s sandbox: ", described, ". ", status.refusal));
  } else if (!status.accepted_missing.empty()) {
    LogWarning(absl::StrCat(program, "'s sandbox: ", described, "; it lacks ",
                            absl::StrJoin(status.accepted_missing, ", "),
                            ", which --worker_sandbox_may_lack accepts: submitted code runs "
                            "without it"));
  } else {
    LogInfo(absl::StrCat(program, "'s sandbox: ", described));
  }
}

std::vector<WorkerSandboxStatus> Engine::WorkerSandboxes() const {
  std::vector<WorkerSandboxStatus> out;
  absl::MutexLock lock(&impl_->sandbox_mu);
  for (const auto& [program, status] : impl_->sandboxes) out.push_back(status);
  return out;
}

std::vector<DeviceStatusInfo> Engine::ListDevices() const {
  std::vector<DeviceStatusInfo> out;
  const std::string default_name = DeviceName(impl_->device);
  const std::vector<DatasetMeta> datasets = impl_->datasets.List();
  const std::vector<JobSnapshot> jobs = impl_->jobs.ActiveJobs();
  const std::vector<std::string> peer_ranks = impl_->jobs.PeerRanks();
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
      info.datasets.push_back(DatasetKeyOf(meta));  // the service names them for its caller
      info.dataset_bytes += meta.size_bytes;
    }
    for (const JobSnapshot& job : jobs) {
      if (job.device != name || job.spec.runs_on_peer()) continue;  // a member on a peer: there
      if (job.state == JobState::kRunning) info.running_jobs.push_back(job.id);
      if (job.state == JobState::kQueued) ++info.queued_jobs;
    }
    // Ranks for peers run on the CPU (GPU ranks are not wired: trainer.h).
    if (name == "cpu") info.peer_ranks = peer_ranks;
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
    TRAINERD_ASSIGN_OR_RETURN(
        LoadedTorchScript loaded,
        LoadTorchScriptModule(
            spec, dataset, options.module_checker, absl::InfiniteFuture(), [this] {
              return check_stop.load() ? absl::UnavailableError("the daemon is shutting down")
                                       : absl::OkStatus();
            }));
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
    if (sampler != nullptr) window = sampler->BeginWindow(job.device);
    const int64_t rows = dataset.rows - HeldOutRows(job.spec.validation_fraction, dataset.rows);
    const int64_t batch = std::min<int64_t>(job.spec.batch_size, std::max<int64_t>(rows, 1));
    // A TorchScript module's cost is unknown (its spec is empty).
    const double flops = model.layers.empty()
                             ? 0.0
                             : common::TrainingFlopsPerStep(model, dataset.feature_shape, batch);
    const int64_t layers = static_cast<int64_t>(model.layers.size());
    return [this, sampler, window, rows, batch, flops, layers](const JobSnapshot& ended,
                                                               DeviceReport& report) {
      if (window >= 0) {
        const monitor::WindowStats stats = sampler->EndWindow(window);
        report.utilization_average = stats.utilization_average;
        report.utilization_peak = stats.utilization_peak;
        // (The peak memory is the job's own: the training loop measured it, CpuMemoryMeter on
        // the CPU. The process's resident growth, which stood in for it once, said more about
        // the allocator and the other jobs than about this one.)
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
      figures.ranks = std::max<int32_t>(1, ended.spec.replicas);
      figures.collective_seconds = report.collective_seconds;
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
      report.collective_fraction = verdict.collective_fraction;
      report.bound = verdict.bound;
      report.verdict = verdict.line;
      if (fused && !report.verdict.empty()) {
        absl::StrAppend(&report.verdict, "; fused path (no per-operator dispatch)");
      }
    };
  };
  return hooks;
}

}  // namespace trainerd::engine
