// The engine's side of admission (jobs/admission.h does the checks and the queue): the caller
// bound as an Applicant (its tenancy, access.h), the disk quota, a job's nodes asked before it is
// admitted (CheckPeers), a sweep's members built from its lists or points, and the path of a
// submitted module, whose check runs on the module-check threads.
#include <future>
#include <utility>

#include "absl/strings/str_join.h"
#include "server/engine/distributed/node_placement.h"
#include "server/engine/engine_impl.h"

namespace trainerd::engine {

namespace {

// A member with a spec of its own (SweepPoint::spec) trains on the sweep's data, validates on the
// same rows and runs where the sweep does: what it varies is the model and how it trains. Both
// specs as the caller gave them (the member's with the sweep's split seed filled in).
absl::Status SameDataAndPlace(const JobSpec& member, const JobSpec& sweep,
                              const std::optional<uint64_t>& split_seed) {
  std::vector<std::string> differ;
  if (member.dataset != sweep.dataset) differ.push_back("dataset");
  if (member.validation_dataset != sweep.validation_dataset) differ.push_back("validation dataset");
  if (member.validation_fraction != sweep.validation_fraction) {
    differ.push_back("validation fraction");
  }
  if (member.split_seed != split_seed) differ.push_back("validation split seed");
  if (member.nodes != sweep.nodes) differ.push_back("nodes");
  if (member.replicas != sweep.replicas) differ.push_back("replicas");
  if (member.halving != sweep.halving) differ.push_back("halving");
  if (member.device != sweep.device) differ.push_back("device");
  if (!member.torchscript.empty() || !member.exported_program.empty()) {
    differ.push_back("submitted model");
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("it varies its ", absl::StrJoin(differ, ", "),
                   "; those are the sweep's (its members train on the same data, validate on "
                   "the same rows and run where the sweep does)"));
}

// How an error names a sweep's member: its swept values, and what its own spec changed.
std::string MemberLabel(const JobSpec& member, const JobSpec& sweep) {
  std::string label = absl::StrCat(
      "learning rate ", member.learning_rate, ", momentum ", member.momentum, ", weight decay ",
      member.weight_decay.value_or(0.0), ", seed ", member.seed.value_or(0));
  if (member.model != sweep.model) absl::StrAppend(&label, ", model ", member.model);
  if (member.batch_size != sweep.batch_size) {
    absl::StrAppend(&label, ", batch size ", member.batch_size);
  }
  if (member.epochs != sweep.epochs) absl::StrAppend(&label, ", epochs ", member.epochs);
  if (member.optimizer != sweep.optimizer) absl::StrAppend(&label, ", another optimizer");
  if (member.loss != sweep.loss) absl::StrAppend(&label, ", another loss");
  return label;
}

// A sweep from the jobs a repeated request id found (Admission::Submitted).
SweepSnapshot SweepOf(std::vector<JobSnapshot> members) {
  SweepSnapshot sweep;
  sweep.id = members.front().sweep_id;
  sweep.members = std::move(members);
  return sweep;
}

}  // namespace

Applicant Engine::Impl::ApplicantOf(const CallContext& caller) const {
  Applicant applicant;
  // An admin's jobs are exempt from the quotas.
  applicant.submitter = Submitter{caller.owner, /*quota_exempt=*/caller.admin, caller.request_id,
                                  caller.request_digest};
  applicant.key_for = [this, caller](const std::string& reference) {
    return KeyFor(reference, caller);
  };
  applicant.dataset = [this, caller](const std::string& key) {
    return VisibleDataset(key, caller);
  };
  return applicant;
}

absl::StatusOr<JobSnapshot> Engine::Impl::SubmitWithModule(PreparedJob job,
                                                           const CallContext& caller) {
  JobSpec& spec = job.spec;
  // The cheap checks first, so that a spec that cannot work fails before a process starts; then
  // the module's check without any lock; then admission, which finds the dataset again.
  const Applicant applicant = ApplicantOf(caller);
  TRAINERD_ASSIGN_OR_RETURN(DatasetMeta checked_against,
                            admission.CheckBeforeModule(spec, applicant));
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
  CheckedModule module{std::move(loaded), std::move(checked_against), std::move(spec.torchscript)};
  spec.torchscript.clear();
  // Before the admission lock: the quota walks the caller's files (at most every few seconds).
  TRAINERD_RETURN_IF_ERROR(
      CheckDiskQuota(caller, static_cast<int64_t>(module.bytes.size()), "this job's module"));
  return admission.Admit(std::move(job), applicant, std::move(module));
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
  const Applicant applicant = impl_->ApplicantOf(caller);
  if (auto found = impl_->admission.Submitted(applicant.submitter)) {
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
  const std::vector<std::string> asked_nodes = spec.nodes;
  if (spec.replicas <= 1) deal = std::exchange(spec.nodes, {});
  const bool spread = !deal.empty();
  if (!spread) TRAINERD_RETURN_IF_ERROR(CheckNodesOfRanks(spec));
  // A member on a peer takes the device as the caller named it ("" or auto: the peer's choice);
  // this daemon's placement is this daemon's.
  const std::string asked_device = spec.device;
  const JobSpec spec_as_asked = spec;  // a member's own spec is compared with it (SameDataAndPlace)
  TRAINERD_ASSIGN_OR_RETURN(PreparedJob prepared,
                            impl_->admission.Prepare(std::move(spec), applicant));
  // Every member validates on the same held-out rows, drawn from the sweep's seed (a member's own
  // seed varies its weights and shuffles, not its data), so that members rank fairly.
  if (prepared.spec.validation_fraction > 0 && !prepared.spec.split_seed.has_value()) {
    prepared.spec.split_seed = prepared.spec.seed;
  }
  const JobSpec& base = prepared.spec;
  if (spread || !base.nodes.empty()) {
    TRAINERD_RETURN_IF_ERROR(impl_->CheckDiskQuota(caller, 0, "this sweep"));
    TRAINERD_RETURN_IF_ERROR(impl_->admission.CheckAdmissible(prepared, applicant, count));
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
          for (uint64_t seed : seeds)
            grid.push_back(SweepPoint{lr, momentum, decay, seed, std::nullopt});
        }
      }
    }
  }
  std::vector<PreparedJob> members;
  members.reserve(grid.size());
  for (size_t index = 0; index < grid.size(); ++index) {
    const SweepPoint& point = grid[index];
    if (point.spec.has_value()) {
      // A member of its own spec: prepared as a job is (its model parsed once), on the sweep's
      // data, validation rows and placement.
      JobSpec own = *point.spec;
      // A spread sweep's member is dealt as the others are (it carries the sweep's nodes).
      if (spread && own.nodes == asked_nodes) own.nodes.clear();
      if (!own.seed.has_value()) own.seed = base.seed;
      if (!own.split_seed.has_value()) own.split_seed = base.split_seed;
      if (absl::Status same = SameDataAndPlace(own, spec_as_asked, base.split_seed); !same.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sweep member ", index + 1, ": ", same.message()));
      }
      absl::StatusOr<PreparedJob> own_prepared =
          impl_->admission.Prepare(std::move(own), applicant);
      if (!own_prepared.ok()) {
        return absl::Status(
            own_prepared.status().code(),
            absl::StrCat("sweep member ", index + 1, ": ", own_prepared.status().message()));
      }
      members.push_back(*std::move(own_prepared));
    } else {
      members.push_back(prepared);
    }
    PreparedJob& member = members.back();
    member.spec.peer = NodeOf(deal, static_cast<int64_t>(index));
    member.spec.learning_rate = point.learning_rate.value_or(member.spec.learning_rate);
    member.spec.momentum = point.momentum.value_or(member.spec.momentum);
    if (point.weight_decay.has_value()) member.spec.weight_decay = point.weight_decay;
    member.spec.seed = point.seed.value_or(*member.spec.seed);
  }
  TRAINERD_RETURN_IF_ERROR(impl_->CheckDiskQuota(caller, 0, "this sweep"));
  TRAINERD_ASSIGN_OR_RETURN(std::vector<JobSnapshot> queued,
                            impl_->admission.AdmitSweep(std::move(members), applicant, asked_device,
                                                        [&base](const JobSpec& member) {
                                                          return MemberLabel(member, base);
                                                        }));
  SweepSnapshot sweep = SweepOf(std::move(queued));
  LogInfo(absl::StrCat("sweep '", sweep.id, "' queued on ", sweep.members.front().device, ": ",
                       sweep.members.size(), " members of ", sweep.members.front().spec.model,
                       " on dataset '", sweep.members.front().spec.dataset, "'",
                       caller.owner.empty() ? "" : absl::StrCat(", for ", caller.owner)));
  return sweep;
}

void Engine::SubmitJobAsync(JobSpec spec, CallContext caller,
                            std::function<void(absl::StatusOr<JobSnapshot>)> done) {
  const Applicant applicant = impl_->ApplicantOf(caller);
  // A retry gets its job before its module is checked again.
  if (auto found = impl_->admission.Submitted(applicant.submitter)) {
    if (!found->ok()) {
      done(found->status());
    } else {
      done((*found)->front());
    }
    return;
  }
  if (spec.halving.has_value()) {
    done(absl::InvalidArgumentError(
        "halving compares a sweep's members at its rungs; submit it with a sweep"));
    return;
  }
  if (absl::Status nodes = CheckNodesOfRanks(spec); !nodes.ok()) {
    done(nodes);
    return;
  }
  absl::StatusOr<PreparedJob> prepared = impl_->admission.Prepare(std::move(spec), applicant);
  if (!prepared.ok() || prepared->spec.torchscript.empty()) {
    if (!prepared.ok()) {
      done(prepared.status());
      return;
    }
    // A job with nodes asks them first (seconds at most; the caller runs this off the RPC
    // threads, as the service's blocking pool does), once admission would take it.
    if (!prepared->spec.nodes.empty()) {
      absl::Status admissible = impl_->CheckDiskQuota(caller, 0, "this job");
      if (admissible.ok()) admissible = impl_->admission.CheckAdmissible(*prepared, applicant, 1);
      if (!admissible.ok()) {
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
    // Before the admission lock: the quota walks the caller's files (at most every few seconds).
    if (absl::Status quota = impl_->CheckDiskQuota(caller, 0, "this job"); !quota.ok()) {
      done(quota);
      return;
    }
    done(impl_->admission.Admit(*std::move(prepared), applicant));
    return;
  }
  // std::function needs a copyable callable: the spec (with its module bytes) moves into a holder.
  auto holder = std::make_shared<PreparedJob>(*std::move(prepared));
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
