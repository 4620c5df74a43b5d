// Admission (admission.h): Prepare, the checks under the admission lock (CheckLocked), the
// caller's job quota and the queues' bound, a device chosen by cost or placed, and the queue.
#include "server/engine/jobs/admission.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_size.h"
#include "common/flops.h"
#include "common/job_limits.h"
#include "common/status_macros.h"
#include "server/engine/devices/device.h"
#include "server/engine/devices/device_cost.h"
#include "server/engine/devices/placement.h"
#include "server/engine/log.h"
#include "server/engine/training/exported_program.h"
#include "server/engine/training/fused_path.h"
#include "server/engine/training/model.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

namespace {

// A submitted module's working set, roughly: its parameters, their gradients and the optimizer's
// state exactly (from the parameter count); for activations, which depend on code the daemon does
// not read, four times one batch's inputs and outputs.
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

std::string JobOrSweep(const JobSnapshot& first) {
  return first.sweep_id.empty() ? absl::StrCat("job '", first.id, "'")
                                : absl::StrCat("sweep '", first.sweep_id, "'");
}

}  // namespace

int64_t OptimizerSlots(const JobSpec& spec) {
  switch (spec.optimizer) {
    case OptimizerKind::kSgd:
      return spec.momentum > 0 ? 1 : 0;
    case OptimizerKind::kRmsprop:
      return (spec.momentum > 0 ? 2 : 1) + (spec.centered ? 1 : 0);
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return spec.amsgrad ? 3 : 2;
    case OptimizerKind::kNAdam:
    case OptimizerKind::kRAdam:
      return 2;
    case OptimizerKind::kAdagrad:
      return 1;
  }
  return 2;
}

Admission::Admission(AdmissionOptions options, JobManager& jobs, DatasetRegistry& datasets)
    : options_(std::move(options)), jobs_(jobs), datasets_(datasets) {}

absl::StatusOr<PreparedJob> Admission::Prepare(JobSpec spec, const Applicant& caller) const {
  PreparedJob prepared;
  // Draining or stopped: said first, whatever else is wrong with the spec.
  if (!jobs_.accepting()) return absl::UnavailableError("the daemon is shutting down");
  // The datasets by key from here on (and in the records): a restart, or a caller with another
  // name, finds the same ones. What the nodes hold is the engine's to ask (CheckPeers).
  if (!spec.dataset.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(spec.dataset, caller.key_for(spec.dataset));
  }
  if (!spec.validation_dataset.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(spec.validation_dataset, caller.key_for(spec.validation_dataset));
  }
  spec.node_dataset.clear();
  spec.node_validation_dataset.clear();
  spec.peer.clear();  // a member's peer is its sweep's to deal (SubmitSweep)
  if (spec.device == "auto") {
    // Chosen by cost in CheckLocked, once the model and the dataset are known (device_cost.h).
  } else if (!spec.device.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(prepared.device, ResolveDevice(spec.device));
    spec.device = DeviceName(*prepared.device);
  } else if (!options_.device.is_cuda() || torch::cuda::device_count() < 2) {
    prepared.device = options_.device;
    spec.device = DeviceName(options_.device);
  }  // else CheckLocked places the job, once its estimate is known.
  if (!spec.seed.has_value()) {
    std::random_device random;
    spec.seed = (static_cast<uint64_t>(random()) << 32) | random();
  }
  if (!spec.exported_program.empty()) {
    if (!spec.torchscript.empty()) {
      return absl::InvalidArgumentError(
          "give either a TorchScript module or an exported program, not both");
    }
    if (!IsExportedProgramArchive(spec.exported_program)) {
      return absl::InvalidArgumentError(
          "exported_program is not an archive written by torch.export.save (a zip holding "
          "models/model.json)");
    }
    if (!spec.model.empty() && spec.model != kExportedModelName) {
      return absl::InvalidArgumentError(absl::StrCat("give either a model spec ('", spec.model,
                                                     "') or an exported program, not both"));
    }
    // From here on a submitted module, whose archive says which kind it is.
    spec.model.clear();
    spec.torchscript = std::move(spec.exported_program);
    spec.exported_program.clear();
    if (!options_.allow_torchscript) {
      return absl::PermissionDeniedError(
          "this daemon does not accept submitted models (it runs with --allow_torchscript=false, "
          "which covers TorchScript modules and exported programs); describe the model with a text "
          "spec instead");
    }
  } else if (!spec.torchscript.empty() && IsExportedProgramArchive(spec.torchscript)) {
    return absl::InvalidArgumentError(
        "torchscript_module holds an exported program (torch.export.save); send it as "
        "exported_program");
  }
  if (!spec.torchscript.empty() && !options_.allow_torchscript) {
    return absl::PermissionDeniedError(
        "this daemon does not accept TorchScript modules (it runs with --allow_torchscript=false); "
        "describe the model with a text spec instead");
  }
  // A job's own time limit may only be shorter than the operator's: a caller cannot lift the
  // bound --max_job_time puts on submitted code.
  if (options_.max_job_time > absl::ZeroDuration() &&
      spec.max_job_seconds > absl::ToDoubleSeconds(options_.max_job_time)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_job_seconds ", spec.max_job_seconds, " is over this daemon's --max_job_time of ",
        absl::FormatDuration(options_.max_job_time), "; a job's own limit may only be shorter"));
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
    TRAINERD_ASSIGN_OR_RETURN(prepared.model, ParseModelSpec(spec.model));
    spec.model = prepared.model.ToString();
  }
  prepared.spec = std::move(spec);
  return prepared;
}

std::optional<absl::StatusOr<std::vector<JobSnapshot>>> Admission::Submitted(
    const Submitter& by) const {
  if (by.request_id.empty()) return std::nullopt;
  JobQuery query;
  query.owner = by.owner;  // an id is the caller's own, an admin's too
  query.request_id = by.request_id;
  query.page_size = static_cast<int32_t>(kMaxSweepMembers);
  absl::StatusOr<JobPage> page = jobs_.List(query);
  if (!page.ok()) return page.status();
  if (page->jobs.empty()) return std::nullopt;  // new, or its jobs were deleted
  const JobSnapshot& first = page->jobs.front();
  if (first.request_digest != by.request_digest) {
    return absl::AlreadyExistsError(
        absl::StrCat("request id '", by.request_id, "' was already used for another request (",
                     JobOrSweep(first), "); send a new request id with a new request"));
  }
  LogInfo(
      absl::StrCat("request id '", by.request_id, "' repeated: answered with ", JobOrSweep(first)));
  return std::move(page->jobs);
}

absl::Status Admission::CheckJobQuotaLocked(const Submitter& by, int64_t more) const {
  if (options_.max_jobs_per_caller <= 0 || by.quota_exempt) return absl::OkStatus();
  int64_t held = 0;
  for (const JobSnapshot& job : jobs_.ActiveJobs()) held += job.owner == by.owner ? 1 : 0;
  if (held + more > options_.max_jobs_per_caller) {
    return absl::ResourceExhaustedError(
        absl::StrCat("caller '", by.owner, "' has ", held, " queued or running jobs",
                     more > 1 ? absl::StrCat(" and asked for ", more, " more") : "",
                     "; its quota is ", options_.max_jobs_per_caller,
                     " (--max_jobs_per_caller): wait for some to end or cancel some"));
  }
  return absl::OkStatus();
}

absl::Status Admission::CheckAdmissible(const PreparedJob& job, const Applicant& caller,
                                        int64_t count) {
  absl::MutexLock lock(&mu_);
  TRAINERD_RETURN_IF_ERROR(CheckJobQuotaLocked(caller.submitter, count));
  if (options_.max_queued_jobs > 0) {
    int64_t queued = 0;
    for (const JobSnapshot& active : jobs_.ActiveJobs()) {
      queued += active.state == JobState::kQueued ? 1 : 0;
    }
    if (queued + count > options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          queued, " jobs are already queued; this daemon queues at most ", options_.max_queued_jobs,
          " (--max_queued_jobs); submit again when some have started"));
    }
  }
  // The spec as its first member here would be checked (a sweep spread over nodes has its members
  // there checked by the nodes' own admission).
  return CheckLocked(job, caller, nullptr).status();
}

absl::StatusOr<DatasetMeta> Admission::CheckBeforeModule(JobSpec& spec, const Applicant& caller) {
  absl::MutexLock lock(&mu_);
  TRAINERD_ASSIGN_OR_RETURN(DatasetMeta dataset, caller.dataset(spec.dataset));
  ResolveLossFromTargets(spec, dataset);
  TRAINERD_RETURN_IF_ERROR(CheckJobSpec(spec, dataset).status());
  return dataset;
}

absl::StatusOr<SweepMember> Admission::CheckLocked(PreparedJob job, const Applicant& caller,
                                                   const CheckedModule* module) {
  JobSpec& spec = job.spec;
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta dataset, caller.dataset(spec.dataset));
  ResolveLossFromTargets(spec, dataset);
  if (module != nullptr && (dataset.sha256 != module->checked_against.sha256 ||
                            dataset.create_time != module->checked_against.create_time)) {
    return absl::AbortedError(
        absl::StrCat("dataset '", DatasetNameFor(spec.dataset, caller.submitter.owner),
                     "' was replaced while the module was checked; submit the job again"));
  }
  const bool submitted_model = module != nullptr;
  ModelSpec model;  // stays empty for a submitted model
  // (A submitted model's spec passed CheckJobSpec before its module's check, against this same
  // dataset.) The batch is worked out only from a checked spec: a validation fraction outside
  // [0, 1) or NaN must not reach the arithmetic.
  if (!submitted_model) {
    TRAINERD_RETURN_IF_ERROR(CheckJobSpec(spec, job.model, dataset));
    model = std::move(job.model);
  }
  const int64_t training_rows = dataset.rows - HeldOutRows(spec.validation_fraction, dataset.rows);
  const int64_t batch = std::max<int64_t>(1, std::min(spec.batch_size, training_rows));
  MemoryEstimate estimate;
  if (!submitted_model) {
    TRAINERD_ASSIGN_OR_RETURN(estimate, EstimateTrainingMemory(model, dataset.feature_shape, batch,
                                                               OptimizerSlots(spec)));
    TRAINERD_RETURN_IF_ERROR(CheckModelSize(estimate, spec.model));
  } else {
    estimate = EstimateModuleMemory(module->loaded.parameter_count, dataset,
                                    module->loaded.output_shape, batch, OptimizerSlots(spec));
  }
  // A job that hands back its best epoch keeps a copy of its weights on its device.
  const int64_t best_copy_bytes =
      spec.hands_back_best() && spec.has_validation() ? estimate.parameter_bytes : 0;
  estimate.total_bytes += best_copy_bytes;
  // The validation dataset is looked up under the same lock, so that it cannot be deleted before
  // the job holds it (JobUsingDataset counts it as in use).
  int64_t validation_bytes = 0;
  if (!spec.validation_dataset.empty()) {
    auto validation = caller.dataset(spec.validation_dataset);
    if (!validation.ok()) {
      return absl::Status(validation.status().code(),
                          absl::StrCat("validation ", validation.status().message()));
    }
    validation_bytes = spec.validation_dataset == spec.dataset ? 0 : validation->size_bytes;
    TRAINERD_RETURN_IF_ERROR(
        CheckValidationDataset(spec, model, dataset, *validation,
                               submitted_model ? &module->loaded.output_shape : nullptr));
  }
  torch::Device device = options_.device;
  std::vector<DeviceCostEstimate> estimates;
  if (spec.device == "auto") {
    // The cheapest device by the cost model, when Diagnose has measured them; else the first GPU
    // or the CPU, as ResolveDevice("auto") always was.
    estimates = EstimateDevices(spec, model, submitted_model, dataset,
                                dataset.size_bytes + validation_bytes, training_rows, batch);
    if (std::optional<size_t> best = Cheapest(estimates)) {
      TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice(estimates[*best].device));
    } else {
      TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice("auto"));
    }
    spec.device = DeviceName(device);
  } else if (job.device.has_value()) {
    device = *job.device;  // resolved by Prepare
  } else {
    device = Place(spec, dataset, estimate.total_bytes);
    spec.device = DeviceName(device);
  }
  // A data-parallel job: within the daemon's bound, and one its ranks can train; each rank holds
  // a replica of the working set on the device.
  if (spec.replicas > 1) {
    if (spec.replicas > options_.max_replicas) {
      return absl::InvalidArgumentError(absl::StrCat("replicas ", spec.replicas,
                                                     " is more than this daemon runs for one job (",
                                                     options_.max_replicas, ", --max_replicas)"));
    }
    const std::string why = DataParallelSpecUnsupported(spec, model, submitted_model, device);
    if (!why.empty()) {
      const std::string message = absl::StrCat("a job with replicas cannot train here: ", why);
      if (!device.is_cpu()) return absl::FailedPreconditionError(message);
      return absl::InvalidArgumentError(message);
    }
    TRAINERD_ASSIGN_OR_RETURN(estimate.total_bytes, CheckedMul(estimate.total_bytes, spec.replicas,
                                                               "the ranks' working sets"));
  }
  // engine fused is a promise: a job it cannot take is refused now, saying why.
  if (spec.engine == EngineKind::kFused) {
    const std::string why =
        FusedPathUnsupported(spec, model, dataset.feature_shape, submitted_model, device);
    if (!why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine fused cannot run this job: ", why, " (use engine auto)"));
    }
  }
  // A job that could never fit the device's budget, even alone, is refused now rather than
  // failing later.
  const int64_t budget = datasets_.memory_budget();
  if (budget > 0 && device == options_.device) {
    const int64_t need = estimate.total_bytes + dataset.size_bytes + validation_bytes;
    if (need > budget) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the job needs about %d bytes on %s: an estimated working set of %d (parameters %d, "
          "gradients %d, optimizer state %d, activations for a batch of %d rows %d%s) and its "
          "datasets' %d; the device memory budget is %d bytes (--device_memory_budget)",
          need, DeviceName(device), estimate.total_bytes, estimate.parameter_bytes,
          estimate.gradient_bytes, estimate.optimizer_bytes, batch, estimate.activation_bytes,
          best_copy_bytes > 0 ? absl::StrCat(", the best epoch's copy ", best_copy_bytes) : "",
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

absl::StatusOr<JobSnapshot> Admission::Admit(PreparedJob job, const Applicant& caller,
                                             std::optional<CheckedModule> module) {
  absl::MutexLock lock(&mu_);
  if (auto found = Submitted(caller.submitter)) {
    if (!found->ok()) return found->status();
    return (*found)->front();
  }
  TRAINERD_RETURN_IF_ERROR(CheckJobQuotaLocked(caller.submitter, 1));
  TRAINERD_ASSIGN_OR_RETURN(SweepMember checked,
                            CheckLocked(std::move(job), caller, module ? &*module : nullptr));
  std::shared_ptr<const TorchScriptJob> submitted;
  std::string_view bytes;
  if (module.has_value()) {
    submitted = std::make_shared<const TorchScriptJob>(
        TorchScriptJob{module->bytes, module->loaded.parameter_count, true});
    bytes = module->bytes;
  }
  TRAINERD_ASSIGN_OR_RETURN(
      JobSnapshot queued,
      jobs_.Enqueue(std::move(checked.spec), std::move(checked.model), checked.device,
                    std::move(submitted), caller.submitter, bytes, checked.estimated_memory_bytes,
                    std::move(checked.device_estimates)));
  if (!bytes.empty() && options_.stored) {
    options_.stored(caller.submitter.owner, static_cast<int64_t>(bytes.size()));
  }
  LogInfo(absl::StrCat("job '", queued.id, "' queued on ", queued.device, ": ", queued.spec.model,
                       " on dataset '", queued.spec.dataset, "', ", queued.spec.epochs, " epochs",
                       queued.owner.empty() ? "" : absl::StrCat(", for ", queued.owner)));
  return queued;
}

absl::StatusOr<std::vector<JobSnapshot>> Admission::AdmitSweep(
    std::vector<PreparedJob> members, const Applicant& caller, const std::string& device_on_peer,
    const std::function<std::string(const JobSpec&)>& label) {
  absl::MutexLock lock(&mu_);
  if (auto found = Submitted(caller.submitter)) return *std::move(found);
  TRAINERD_RETURN_IF_ERROR(
      CheckJobQuotaLocked(caller.submitter, static_cast<int64_t>(members.size())));
  std::vector<SweepMember> checked_members;
  checked_members.reserve(members.size());
  for (size_t index = 0; index < members.size(); ++index) {
    PreparedJob& member = members[index];
    // One device for the whole sweep here: the first member's (placed or chosen by cost).
    if (!checked_members.empty()) {
      member.spec.device = checked_members.front().spec.device;
      member.device = checked_members.front().device;
    }
    const std::string values = label(member.spec);
    absl::StatusOr<SweepMember> checked = CheckLocked(std::move(member), caller, nullptr);
    if (!checked.ok()) {
      return absl::Status(checked.status().code(),
                          absl::StrCat("sweep member ", index + 1, " (", values,
                                       "): ", checked.status().message()));
    }
    if (checked->spec.runs_on_peer()) checked->spec.device = device_on_peer;
    checked_members.push_back(*std::move(checked));
  }
  return jobs_.EnqueueSweep(std::move(checked_members), caller.submitter);
}

torch::Device Admission::Place(const JobSpec& spec, const DatasetMeta& dataset,
                               int64_t need) const {
  const int count = static_cast<int>(torch::cuda::device_count());
  std::vector<PlacementCandidate> candidates;
  bool validation_resident = true;
  if (!spec.validation_dataset.empty() && spec.validation_dataset != spec.dataset) {
    auto validation = datasets_.GetMeta(spec.validation_dataset);
    validation_resident = validation.ok() && validation->location == DatasetLocation::kDevice;
  }
  const int64_t budget = datasets_.memory_budget();
  for (int i = 0; i < count; ++i) {
    const torch::Device candidate(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
    PlacementCandidate c;
    c.device = DeviceName(candidate);
    // Datasets are resident on the daemon's device (--device); the others copy them per job.
    const bool home = candidate == options_.device;
    c.holds_datasets = home && dataset.location == DatasetLocation::kDevice && validation_resident;
    c.jobs = jobs_.DeviceLoad(c.device);
    if (home && budget > 0) {
      c.free_memory =
          std::max<int64_t>(0, budget - datasets_.resident_bytes() - datasets_.reserved_bytes());
    }
    candidates.push_back(std::move(c));
  }
  const size_t chosen = ChooseDevice(candidates, need);
  LogInfo(absl::StrCat(
      "job on dataset '", spec.dataset, "' placed on ", candidates[chosen].device,
      candidates[chosen].holds_datasets ? " (it holds the dataset)" : " (the least loaded GPU)"));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(chosen));
}

std::vector<DeviceCostEstimate> Admission::EstimateDevices(
    const JobSpec& spec, const ModelSpec& model, bool submitted_model, const DatasetMeta& dataset,
    int64_t dataset_bytes, int64_t training_rows, int64_t batch) const {
  const std::optional<Diagnosis> diagnosis =
      options_.diagnosis ? options_.diagnosis() : std::nullopt;
  if (!diagnosis) return {};
  JobCostInput job;
  job.flops_per_step = model.layers.empty()
                           ? 0.0
                           : common::TrainingFlopsPerStep(model, dataset.feature_shape, batch);
  job.layers = std::max<int64_t>(1, static_cast<int64_t>(model.layers.size()));
  job.steps_per_epoch =
      spec.drop_last ? training_rows / batch : (training_rows + batch - 1) / batch;
  job.epochs = spec.epochs;
  job.dataset_bytes = dataset_bytes;
  job.fused_on_cpu =
      spec.engine != EngineKind::kLibTorch &&
      FusedPathUnsupported(spec, model, dataset.feature_shape, submitted_model, torch::kCPU)
          .empty() &&
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
        d.device == DeviceName(options_.device) && dataset.location == DatasetLocation::kDevice;
    figures.push_back(std::move(f));
  }
  return EstimateJobCost(job, figures);
}

}  // namespace trainerd::engine
