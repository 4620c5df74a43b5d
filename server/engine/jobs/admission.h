// A job's admission, in one step: a submitted spec prepared once (its defaults, its datasets by
// key, its model parsed, its device resolved), then checked against its datasets, the daemon's
// limits, the caller's quota and the device's memory budget, its device chosen (by cost for
// "auto", placed on a daemon with several GPUs) and its working set estimated, then queued with the
// job manager. The engine (engine_admission.cc) supplies what admission cannot know: who calls and
// which datasets that caller may use (an Applicant, bound from the engine's access rules), the
// peers of a job with nodes, and the check of a submitted module on its own threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/devices/diagnose.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// The optimizer's float32 state per parameter, for the memory estimate.
int64_t OptimizerSlots(const JobSpec& spec);

// The caller as admission sees it: who queues the job, and the datasets it may name and train on
// (the engine's tenancy rule, access.h, bound to the caller).
struct Applicant {
  // Recorded on the job: its owner, whether it is an admin (exempt from the quotas), its request
  // id and digest (a repeated id answers with what the first call queued).
  Submitter submitter;
  // The key of the dataset the caller means by a reference (types.h: ResolveDatasetReference).
  std::function<absl::StatusOr<std::string>(const std::string& reference)> key_for;
  // The dataset with key `key` when the caller may train on it; otherwise the NOT_FOUND an unknown
  // name gets.
  std::function<absl::StatusOr<DatasetMeta>(const std::string& key)> dataset;
};

// What every step after Prepare takes, so that nothing of a request is parsed or resolved twice:
// the spec (datasets by key, seed drawn, model spec canonical), its model parsed (empty for a
// submitted module), and the device the caller named, resolved (unset for "auto", chosen by cost,
// and for none on a daemon with several GPUs, placed).
struct PreparedJob {
  JobSpec spec;
  ModelSpec model;
  std::optional<torch::Device> device;
};

// A submitted module after its check (module_sandbox.h): what the check measured, the dataset it
// was checked against (which must not have been replaced since), and its archive, kept in a file
// of its own while the job may run.
struct CheckedModule {
  LoadedTorchScript loaded;
  DatasetMeta checked_against;
  std::string bytes;
};

struct AdmissionOptions {
  // The caller's queued and running jobs (a sweep counts each member; 0: no bound; admins are
  // exempt), and the jobs waiting in all queues together (0: no bound).
  int64_t max_jobs_per_caller = 0;
  int64_t max_queued_jobs = 0;
  // The most ranks a data-parallel job may ask for.
  int32_t max_replicas = 8;
  // Whether submitted models (TorchScript modules, exported programs) are accepted at all.
  bool allow_torchscript = true;
  // The operator's bound on a submitted module's time: a job's own may only be shorter.
  absl::Duration max_job_time = absl::ZeroDuration();
  // The daemon's device: where datasets are resident and what the memory budget is of.
  torch::Device device = torch::kCPU;
  // The cached Diagnose figures (never measures), for a job with device "auto". Optional.
  std::function<std::optional<Diagnosis>()> diagnosis;
  // A queued job's stored module, charged to its owner's disk quota. Optional.
  std::function<void(const std::string& owner, int64_t bytes)> stored;
};

// Thread-safe. Its lock (`mu()`) orders admission with the engine's dataset deletes and shares:
// a dataset cannot be deleted between a job's admission and its registration with the manager.
class Admission {
 public:
  Admission(AdmissionOptions options, JobManager& jobs, DatasetRegistry& datasets);

  // A submit's spec made ready: UNAVAILABLE while the daemon drains; the datasets by key, a seed
  // drawn when it has none, the named device resolved, an exported program moved into the module
  // field, the module's size and permission checked, a text model parsed and made canonical.
  absl::StatusOr<PreparedJob> Prepare(JobSpec spec, const Applicant& caller) const;

  // A submit that repeats a request id its owner used: the jobs its first call queued (one job, or
  // a sweep's members in order), as they stand now; ALREADY_EXISTS naming them when the rest of
  // the request differed; nullopt for a new id (or none). Asked before the work a retry need not
  // repeat (its peers, its module), and again under the lock by Admit and AdmitSweep, so that two
  // calls racing with one id queue one job.
  std::optional<absl::StatusOr<std::vector<JobSnapshot>>> Submitted(const Submitter& by) const;

  // Before a job with nodes asks them anything: what admission would refuse of `count` jobs like
  // it now (the caller's quota, the queue's bound, the spec against its datasets and the limits),
  // so that nothing is sent to a peer for a submit this daemon refuses. Admit checks it all again.
  absl::Status CheckAdmissible(const PreparedJob& job, const Applicant& caller, int64_t count);

  // A module's cheap checks, before the module's own: the spec against the dataset it names, whose
  // meta is returned for the module's check (then CheckedModule::checked_against).
  absl::StatusOr<DatasetMeta> CheckBeforeModule(JobSpec& spec, const Applicant& caller);

  // Checks the job and queues it; with `module`, a submitted model's job. A repeated request id
  // answers with its job, checking nothing.
  absl::StatusOr<JobSnapshot> Admit(PreparedJob job, const Applicant& caller,
                                    std::optional<CheckedModule> module = std::nullopt);

  // Checks a sweep's members (`label` names each in an error: its values) and queues them all or
  // none, on one device here: the first member's. A member dealt to a peer (JobSpec::peer) takes
  // `device_on_peer`, the device as the caller named it.
  absl::StatusOr<std::vector<JobSnapshot>> AdmitSweep(
      std::vector<PreparedJob> members, const Applicant& caller, const std::string& device_on_peer,
      const std::function<std::string(const JobSpec&)>& label);

  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }

 private:
  // The checks without the queue: the spec against its datasets and the limits, its device chosen
  // or placed, its estimates.
  absl::StatusOr<SweepMember> CheckLocked(PreparedJob job, const Applicant& caller,
                                          const CheckedModule* module)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED, naming the quota, when the caller (not an admin) would have more than
  // max_jobs_per_caller queued and running jobs with `more` more. Under the lock, so that two
  // submissions cannot both take the last place.
  absl::Status CheckJobQuotaLocked(const Submitter& by, int64_t more) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that names no device, on a daemon with several GPUs: the GPU that holds its datasets,
  // else the least loaded (placement.h).
  torch::Device Place(const JobSpec& spec, const DatasetMeta& dataset, int64_t need) const;
  // A job with device "auto": the cost model's estimate for each device Diagnose measured
  // (device_cost.h); empty before any measurement.
  std::vector<DeviceCostEstimate> EstimateDevices(const JobSpec& spec, const ModelSpec& model,
                                                  bool submitted_model, const DatasetMeta& dataset,
                                                  int64_t dataset_bytes, int64_t training_rows,
                                                  int64_t batch) const;

  const AdmissionOptions options_;
  JobManager& jobs_;
  DatasetRegistry& datasets_;
  absl::Mutex mu_;
};

}  // namespace trainerd::engine
