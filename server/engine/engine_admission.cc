// The engine's admission of jobs: a spec's defaults and its module (Prepare), the checks
// against its dataset, the limits and the caller's quotas (CheckLocked, under admission_mu, so
// that a dataset cannot be deleted between a job's admission and its registration), the queue
// (Admit), sweeps, and the TorchScript path, whose module checks run on the module-check threads.
#include <future>
#include <utility>

#include "server/engine/distributed/node_placement.h"
#include "server/engine/engine_impl.h"

namespace trainerd::engine {

namespace {

// An admin's jobs are exempt from the disk quota.
Submitter SubmitterOf(const CallContext& caller) {
  return Submitter{caller.owner, /*quota_exempt=*/caller.admin, caller.request_id,
                   caller.request_digest};
}

// A sweep from the jobs a repeated request id found (Submitted).
SweepSnapshot SweepOf(std::vector<JobSnapshot> members) {
  SweepSnapshot sweep;
  sweep.id = members.front().sweep_id;
  sweep.members = std::move(members);
  return sweep;
}

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

absl::Status Engine::Impl::CheckJobQuotaLocked(const CallContext& caller, int64_t more) const {
  if (options.max_jobs_per_caller <= 0 || caller.admin) return absl::OkStatus();
  int64_t held = 0;
  for (const JobSnapshot& job : jobs.ActiveJobs()) held += job.owner == caller.owner ? 1 : 0;
  if (held + more > options.max_jobs_per_caller) {
    return absl::ResourceExhaustedError(
        absl::StrCat("caller '", caller.owner, "' has ", held, " queued or running jobs",
                     more > 1 ? absl::StrCat(" and asked for ", more, " more") : "",
                     "; its quota is ", options.max_jobs_per_caller,
                     " (--max_jobs_per_caller): wait for some to end or cancel some"));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::CheckAdmissible(const PreparedJob& job, const CallContext& caller,
                                           int64_t count) {
  TRAINERD_RETURN_IF_ERROR(CheckDiskQuota(caller, 0, count > 1 ? "this sweep" : "this job"));
  absl::MutexLock lock(&admission_mu);
  TRAINERD_RETURN_IF_ERROR(CheckJobQuotaLocked(caller, count));
  if (options.jobs.max_queued_jobs > 0) {
    int64_t queued = 0;
    for (const JobSnapshot& job : jobs.ActiveJobs()) {
      queued += job.state == JobState::kQueued ? 1 : 0;
    }
    if (queued + count > options.jobs.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          queued, " jobs are already queued; this daemon queues at most ", options.jobs.max_queued_jobs,
          " (--max_queued_jobs); submit again when some have started"));
    }
  }
  // The spec as its first member here would be checked (a sweep spread over nodes has its members
  // there checked by the nodes' own admission).
  return CheckLocked(job, caller, nullptr, nullptr).status();
}

absl::StatusOr<SweepMember> Engine::Impl::CheckLocked(PreparedJob job, const CallContext& caller,
                                                      const LoadedTorchScript* module,
                                                      const DatasetMeta* checked_against) {
  JobSpec& spec = job.spec;
  TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta dataset, UsableDataset(spec.dataset, caller));
  ResolveLossFromTargets(spec, dataset);
  if (checked_against != nullptr && (dataset.sha256 != checked_against->sha256 ||
                                     dataset.create_time != checked_against->create_time)) {
    return absl::AbortedError(absl::StrCat("dataset '", DatasetNameFor(spec.dataset, caller.owner),
                                           "' was replaced while the module was checked; submit "
                                           "the job again"));
  }
  ModelSpec model;  // stays empty for a TorchScript job
  // (A TorchScript job's spec passed CheckJobSpec before its module's check, against this same
  // dataset.) The batch is worked out only from a checked spec: a validation fraction outside
  // [0, 1) or NaN must not reach the arithmetic.
  if (!(module != nullptr)) {
    TRAINERD_RETURN_IF_ERROR(CheckJobSpec(spec, job.model, dataset));
    model = std::move(job.model);
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
  // A job that hands back its best epoch keeps a copy of its weights on its device.
  const int64_t best_copy_bytes =
      spec.hands_back_best() && spec.has_validation() ? estimate.parameter_bytes : 0;
  estimate.total_bytes += best_copy_bytes;
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
  } else if (job.device.has_value()) {
    device = *job.device;  // resolved by Prepare
  } else {
    device = Place(spec, dataset, estimate.total_bytes);
    spec.device = DeviceName(device);
  }
  // A data-parallel job: within the daemon's bound, and one its ranks can train; each rank holds
  // a replica of the working set on the device.
  if (spec.replicas > 1) {
    if (spec.replicas > options.max_replicas) {
      return absl::InvalidArgumentError(absl::StrCat("replicas ", spec.replicas,
                                                     " is more than this daemon runs for one job (",
                                                     options.max_replicas, ", --max_replicas)"));
    }
    const std::string why = DataParallelSpecUnsupported(spec, model, (module != nullptr), device);
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

std::optional<absl::StatusOr<std::vector<JobSnapshot>>> Engine::Impl::Submitted(
    const CallContext& caller) const {
  if (caller.request_id.empty()) return std::nullopt;
  JobQuery query;
  query.owner = caller.owner;  // an id is the caller's own, an admin's too
  query.request_id = caller.request_id;
  query.page_size = static_cast<int32_t>(kMaxSweepMembers);
  absl::StatusOr<JobPage> page = jobs.List(query);
  if (!page.ok()) return page.status();
  if (page->jobs.empty()) return std::nullopt;  // new, or its jobs were deleted
  const JobSnapshot& first = page->jobs.front();
  if (first.request_digest != caller.request_digest) {
    return absl::AlreadyExistsError(
        absl::StrCat("request id '", caller.request_id, "' was already used for another request (",
                     first.sweep_id.empty() ? absl::StrCat("job '", first.id, "'")
                                            : absl::StrCat("sweep '", first.sweep_id, "'"),
                     "); send a new request id with a new request"));
  }
  LogInfo(absl::StrCat("request id '", caller.request_id, "' repeated: answered with ",
                       first.sweep_id.empty() ? absl::StrCat("job '", first.id, "'")
                                              : absl::StrCat("sweep '", first.sweep_id, "'")));
  return std::move(page->jobs);
}

absl::StatusOr<JobSnapshot> Engine::Impl::Admit(PreparedJob prepared, const CallContext& caller,
                                                std::optional<LoadedTorchScript> module,
                                                const DatasetMeta* checked_against,
                                                std::string_view module_bytes) {
  // Before admission_mu: it walks the caller's files (at most every few seconds).
  TRAINERD_RETURN_IF_ERROR(
      CheckDiskQuota(caller, static_cast<int64_t>(module_bytes.size()), "this job's module"));
  absl::MutexLock lock(&admission_mu);
  if (auto found = Submitted(caller)) {
    if (!found->ok()) return found->status();
    return (*found)->front();
  }
  TRAINERD_RETURN_IF_ERROR(CheckJobQuotaLocked(caller, 1));
  TRAINERD_ASSIGN_OR_RETURN(
      SweepMember checked,
      CheckLocked(std::move(prepared), caller, module ? &*module : nullptr, checked_against));
  TRAINERD_ASSIGN_OR_RETURN(
      JobSnapshot job,
      jobs.Enqueue(std::move(checked.spec), std::move(checked.model), checked.device,
                   module ? std::make_shared<const TorchScriptJob>(TorchScriptJob{
                                std::string(module_bytes), module->parameter_count, true})
                          : nullptr,
                   SubmitterOf(caller), module_bytes, checked.estimated_memory_bytes,
                   std::move(checked.device_estimates)));
  if (!module_bytes.empty()) {
    disk_quota.Charge(caller.owner, static_cast<int64_t>(module_bytes.size()));
  }
  LogInfo(absl::StrCat("job '", job.id, "' queued on ", job.device, ": ", job.spec.model,
                       " on dataset '", job.spec.dataset, "', ", job.spec.epochs, " epochs",
                       job.owner.empty() ? "" : absl::StrCat(", for ", job.owner)));
  return job;
}

absl::StatusOr<Engine::Impl::PreparedJob> Engine::Impl::Prepare(JobSpec spec,
                                                                const CallContext& caller) {
  PreparedJob prepared;
  // Draining or stopped: said first, whatever else is wrong with the spec.
  if (!jobs.accepting()) return absl::UnavailableError("the daemon is shutting down");
  // The datasets by key from here on (and in the records): a restart, or a caller with another
  // name, finds the same ones. What the nodes hold is CheckPeers' to say.
  if (!spec.dataset.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(spec.dataset, KeyFor(spec.dataset, caller));
  }
  if (!spec.validation_dataset.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(spec.validation_dataset, KeyFor(spec.validation_dataset, caller));
  }
  spec.node_dataset.clear();
  spec.node_validation_dataset.clear();
  spec.peer.clear();  // a member's peer is its sweep's to deal (SubmitSweep)
  if (spec.device == "auto") {
    // Chosen by cost in Admit, once the model and the dataset are known (device_cost.h).
  } else if (!spec.device.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(prepared.device, ResolveDevice(spec.device));
    spec.device = DeviceName(*prepared.device);
  } else if (!device.is_cuda() || torch::cuda::device_count() < 2) {
    prepared.device = device;
    spec.device = DeviceName(device);
  }  // else Admit places the job, once its estimate is known.
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
      return absl::InvalidArgumentError(absl::StrCat(
          "give either a model spec ('", spec.model, "') or an exported program, not both"));
    }
    // From here on a submitted module, whose archive says which kind it is.
    spec.model.clear();
    spec.torchscript = std::move(spec.exported_program);
    spec.exported_program.clear();
    if (!options.allow_torchscript) {
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
  if (!spec.torchscript.empty() && !options.allow_torchscript) {
    return absl::PermissionDeniedError(
        "this daemon does not accept TorchScript modules (it runs with --allow_torchscript=false); "
        "describe the model with a text spec instead");
  }
  // A job's own time limit may only be shorter than the operator's: a caller cannot lift the
  // bound --max_job_time puts on submitted code.
  if (options.jobs.max_job_time > absl::ZeroDuration() &&
      spec.max_job_seconds > absl::ToDoubleSeconds(options.jobs.max_job_time)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_job_seconds ", spec.max_job_seconds, " is over this daemon's --max_job_time of ",
        absl::FormatDuration(options.jobs.max_job_time), "; a job's own limit may only be shorter"));
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

absl::StatusOr<JobSnapshot> Engine::Impl::SubmitWithModule(PreparedJob job,
                                                           const CallContext& caller) {
  JobSpec& spec = job.spec;
  // The cheap checks first, so that a spec that cannot work fails before a process starts; then
  // the module's check without any lock; then admission, which finds the dataset again.
  DatasetMeta checked_against;
  {
    absl::MutexLock lock(&admission_mu);
    TRAINERD_ASSIGN_OR_RETURN(checked_against, UsableDataset(spec.dataset, caller));
    ResolveLossFromTargets(spec, checked_against);
    TRAINERD_RETURN_IF_ERROR(CheckJobSpec(spec, checked_against).status());
  }
  spec.model = absl::StrCat(
      IsExportedProgramArchive(spec.torchscript) ? kExportedModelName : "torchscript", " (",
      spec.torchscript.size(), " bytes)");
  TRAINERD_ASSIGN_OR_RETURN(
      LoadedTorchScript loaded,
      LoadTorchScriptModule(spec, checked_against, options.module_checker, caller.deadline,
                            [this, &caller] {
                              if (check_stop.load()) {
                                return absl::UnavailableError("the daemon is shutting down");
                              }
                              // Its client gone: the check ends with it.
                              return caller.cancelled ? caller.cancelled() : absl::OkStatus();
                            }));
  // Only a description stays in the spec, which every snapshot of the job copies; the bytes are
  // kept in a file of their own while the job may run (a restart loads them again).
  const std::string module_bytes = std::move(spec.torchscript);
  spec.torchscript.clear();
  return Admit(std::move(job), caller, std::move(loaded), &checked_against, module_bytes);
}

namespace {

// A job's nodes place its ranks: replicas >= 2, and at most replicas - 1 nodes (rank 0 runs
// here). "*" is one entry (every peer, CheckPeers).
absl::Status CheckNodesOfRanks(const JobSpec& spec) {
  if (spec.nodes.empty()) return absl::OkStatus();
  if (spec.replicas < 2) {
    return absl::InvalidArgumentError(
        "nodes place some of a job's ranks on other daemons: give replicas (at least 2) too");
  }
  if (static_cast<int64_t>(spec.nodes.size()) >= spec.replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("nodes lists ", spec.nodes.size(), " daemons for ", spec.replicas,
                     " ranks, rank 0 running here: at most ", spec.replicas - 1, " nodes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSnapshot> Engine::SubmitJob(JobSpec spec, const CallContext& caller) {
  // The asynchronous path, waited for: one sequence of admission for every caller (a module's
  // check takes its turn on the check thread, within the same per-caller bounds).
  std::promise<absl::StatusOr<JobSnapshot>> answer;
  std::future<absl::StatusOr<JobSnapshot>> answered = answer.get_future();
  SubmitJobAsync(std::move(spec), caller, [&answer](absl::StatusOr<JobSnapshot> job) {
    answer.set_value(std::move(job));
  });
  return answered.get();
}

absl::StatusOr<SweepSnapshot> Engine::SubmitSweep(JobSpec spec, const SweepAxes& axes,
                                                  const CallContext& caller) {
  if (!spec.torchscript.empty() || !spec.exported_program.empty()) {
    return absl::InvalidArgumentError(
        "a sweep trains a model described by a text spec; submit a TorchScript module or an "
        "exported program as a job of its own");
  }
  if (auto found = impl_->Submitted(caller)) {
    if (!found->ok()) return found->status();
    return SweepOf(*std::move(*found));
  }
  const bool listed = !axes.learning_rates.empty() || !axes.momenta.empty() ||
                      !axes.weight_decays.empty() || !axes.seeds.empty();
  if (!axes.points.empty() && listed) {
    return absl::InvalidArgumentError(
        "a sweep takes lists (a product) or points (members one by one), not both");
  }
  if (axes.points.size() > static_cast<size_t>(kMaxSweepMembers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the sweep has ", axes.points.size(), " points; at most ", kMaxSweepMembers));
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
  if (!axes.points.empty()) count = static_cast<int64_t>(axes.points.size());
  // Nodes with replicas place each member's ranks; without, they spread the members: member m
  // trains here when m mod (1 + nodes) is 0, else whole on that node (round the list, as ranks
  // go), so that a sweep uses every daemon it names.
  std::vector<std::string> deal;  // the nodes the members are dealt round, with this daemon
  if (spec.replicas <= 1) deal = std::exchange(spec.nodes, {});
  const bool spread = !deal.empty();
  if (!spread) TRAINERD_RETURN_IF_ERROR(CheckNodesOfRanks(spec));
  // A member on a peer takes the device as the caller named it ("" or auto: the peer's choice);
  // this daemon's placement is this daemon's.
  const std::string asked_device = spec.device;
  TRAINERD_ASSIGN_OR_RETURN(Impl::PreparedJob prepared, impl_->Prepare(std::move(spec), caller));
  const JobSpec& base = prepared.spec;
  if (spread || !base.nodes.empty()) {
    TRAINERD_RETURN_IF_ERROR(impl_->CheckAdmissible(prepared, caller, count));
  }
  TRAINERD_RETURN_IF_ERROR(spread ? impl_->CheckPeers(&deal, &prepared.spec, caller, count - 1)
                                  : impl_->CheckPeers(&prepared.spec.nodes, &prepared.spec, caller,
                                                      int64_t{base.replicas} - 1));
  // The members' values: the points, or the lists' product in order. An empty list keeps the
  // spec's value (a seed Prepare drew when the spec had none: every member then starts from the
  // same weights), as an unset value of a point does.
  std::vector<SweepPoint> grid = axes.points;
  if (grid.empty()) {
    const std::vector<double> lrs =
        axes.learning_rates.empty() ? std::vector<double>{base.learning_rate} : axes.learning_rates;
    const std::vector<double> momenta =
        axes.momenta.empty() ? std::vector<double>{base.momentum} : axes.momenta;
    std::vector<std::optional<double>> decays;
    for (double d : axes.weight_decays) decays.push_back(d);
    if (decays.empty()) decays.push_back(base.weight_decay);
    const std::vector<uint64_t> seeds =
        axes.seeds.empty() ? std::vector<uint64_t>{*base.seed} : axes.seeds;
    for (double lr : lrs) {
      for (double momentum : momenta) {
        for (const std::optional<double>& decay : decays) {
          for (uint64_t seed : seeds) grid.push_back(SweepPoint{lr, momentum, decay, seed});
        }
      }
    }
  }
  std::vector<SweepMember> members;
  TRAINERD_RETURN_IF_ERROR(impl_->CheckDiskQuota(caller, 0, "this sweep"));
  {
    absl::MutexLock lock(&impl_->admission_mu);
    if (auto found = impl_->Submitted(caller)) {
      if (!found->ok()) return found->status();
      return SweepOf(*std::move(*found));
    }
    TRAINERD_RETURN_IF_ERROR(impl_->CheckJobQuotaLocked(caller, count));
    for (size_t index = 0; index < grid.size(); ++index) {
      const SweepPoint& point = grid[index];
      Impl::PreparedJob checking = prepared;
      JobSpec& member = checking.spec;
      member.peer = NodeOf(deal, static_cast<int64_t>(index));
      member.learning_rate = point.learning_rate.value_or(base.learning_rate);
      member.momentum = point.momentum.value_or(base.momentum);
      if (point.weight_decay.has_value()) member.weight_decay = point.weight_decay;
      member.seed = point.seed.value_or(*base.seed);
      // One device for the whole sweep here: the first member's (placed or chosen by cost).
      if (!members.empty()) {
        member.device = members.front().spec.device;
        checking.device = members.front().device;
      }
      const std::string values = absl::StrCat(
          "learning rate ", member.learning_rate, ", momentum ", member.momentum, ", weight decay ",
          member.weight_decay.value_or(0.0), ", seed ", *member.seed);
      absl::StatusOr<SweepMember> checked =
          impl_->CheckLocked(std::move(checking), caller, nullptr, nullptr);
      if (!checked.ok()) {
        return absl::Status(checked.status().code(),
                            absl::StrCat("sweep member ", index + 1, " (", values,
                                         "): ", checked.status().message()));
      }
      if (checked->spec.runs_on_peer()) checked->spec.device = asked_device;
      members.push_back(*std::move(checked));
    }
    TRAINERD_ASSIGN_OR_RETURN(std::vector<JobSnapshot> jobs,
                              impl_->jobs.EnqueueSweep(std::move(members), SubmitterOf(caller)));
    SweepSnapshot sweep;
    sweep.id = jobs.front().sweep_id;
    sweep.members = std::move(jobs);
    LogInfo(absl::StrCat("sweep '", sweep.id, "' queued on ", sweep.members.front().device, ": ",
                         sweep.members.size(), " members of ", base.model, " on dataset '",
                         base.dataset, "'", caller.owner.empty() ? "" : ", for ", caller.owner));
    return sweep;
  }
}

void Engine::SubmitJobAsync(JobSpec spec, CallContext caller,
                            std::function<void(absl::StatusOr<JobSnapshot>)> done) {
  // A retry gets its job before its module is checked again.
  if (auto found = impl_->Submitted(caller)) {
    if (!found->ok()) {
      done(found->status());
    } else {
      done((*found)->front());
    }
    return;
  }
  if (absl::Status nodes = CheckNodesOfRanks(spec); !nodes.ok()) {
    done(nodes);
    return;
  }
  absl::StatusOr<Impl::PreparedJob> prepared = impl_->Prepare(std::move(spec), caller);
  if (!prepared.ok() || prepared->spec.torchscript.empty()) {
    if (!prepared.ok()) {
      done(prepared.status());
      return;
    }
    // A job with nodes asks them first (seconds at most; the caller runs this off the RPC
    // threads, as the service's blocking pool does), once admission would take it.
    if (!prepared->spec.nodes.empty()) {
      if (absl::Status admissible = impl_->CheckAdmissible(*prepared, caller, 1);
          !admissible.ok()) {
        done(admissible);
        return;
      }
    }
    if (absl::Status peers = impl_->CheckPeers(&prepared->spec.nodes, &prepared->spec, caller,
                                               prepared->spec.replicas - 1);
        !peers.ok()) {
      done(peers);
      return;
    }
    done(impl_->Admit(*std::move(prepared), caller, std::nullopt, nullptr));
    return;
  }
  // std::function needs a copyable callable: the spec (with its module bytes) moves into a holder.
  auto holder = std::make_shared<Impl::PreparedJob>(*std::move(prepared));
  absl::Status refused;
  {
    std::lock_guard<std::mutex> lock(impl_->check_mu);
    auto mine = impl_->checks_of.find(caller.owner);
    if (impl_->check_stopping) {
      refused = absl::UnavailableError("the daemon is shutting down");
    } else if (mine != impl_->checks_of.end() && mine->second >= kMaxModuleChecksPerCaller) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "you have ", kMaxModuleChecksPerCaller,
          " TorchScript module checks running or waiting already; submit again when one has "
          "ended"));
    } else if (impl_->check_tasks.size() >= kMaxWaitingModuleChecks) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat(kMaxWaitingModuleChecks,
                       " TorchScript module checks are already waiting; submit again "
                       "in a few seconds"));
    } else {
      ++impl_->checks_of[caller.owner];
      impl_->check_tasks.push_back(
          {caller.owner, true, [impl = impl_.get(), holder, caller, done = std::move(done)] {
             // A call whose client went away while it waited is not checked at all.
             if (caller.cancelled) {
               if (absl::Status gone = caller.cancelled(); !gone.ok()) {
                 done(gone);
                 return;
               }
             }
             done(impl->SubmitWithModule(std::move(*holder), caller));
           }});
      impl_->check_cv.notify_one();
      return;
    }
  }
  done(refused);
}

}  // namespace trainerd::engine
