// JobManager's queues (job_manager.h): each device's queues by priority, admission to them
// (Enqueue, EnqueueSweep, within --max_queued_jobs), and the jobs recovery takes up again
// (Requeue) or records as failed (FailUnrecoverable). Under mu_.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/page_token.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/devices/device.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

using job_internal::ExceptionText;
using job_internal::kModulesFolder;
using job_internal::RemoveFile;
using job_internal::SummaryOf;

std::string JobManager::Worker::PopNext() {
  for (int p = 2; p >= 0; --p) {
    if (queues[p].empty()) continue;
    std::string id = std::move(queues[p].front());
    queues[p].pop_front();
    return id;
  }
  return "";
}

void JobManager::Worker::Remove(const std::string& id) {
  for (auto& queue : queues) queue.erase(std::remove(queue.begin(), queue.end(), id), queue.end());
}

int64_t JobManager::QueuedLocked() const {
  int64_t queued = pending_enqueues_;
  for (const auto& [name, worker] : workers_) queued += static_cast<int64_t>(worker->queued());
  return queued;
}

void JobManager::NotifyQueuedLocked(const JobSnapshot& job) {
  if (!options_.hooks.observer) return;
  // Under mu_, so that the QUEUED event precedes the job's first event from its worker (which
  // needs mu_ to take the job); the observer only counts.
  JobEvent event;
  event.job_id = job.id;
  event.job = job;
  try {
    options_.hooks.observer->Push(event);
  } catch (...) {
    LogWarning(absl::StrCat(
        "job '", job.id, "': an event observer failed: ", ExceptionText(std::current_exception())));
  }
}

int JobManager::WorkersFor(const std::string& device_name, bool on_peer) const {
  // A peer's queue: one member at a time there (the peer queues and bounds its own jobs). The
  // CPU runs as many jobs as it has cores: each takes the intra-op threads its size asks for
  // from the cores' budget (a small model's one), and one that does not fit waits its turn.
  if (on_peer) return 1;
  if (options_.max_concurrent_jobs > 0) return options_.max_concurrent_jobs;
  return device_name == "cpu" ? cpu_threads_.cores() : 4;
}

void JobManager::QueueLocked(std::shared_ptr<Record> record) {
  const std::string device_name = job_internal::QueueOf(record->snap);
  std::unique_ptr<Worker>& worker = workers_[device_name];
  if (!worker) {
    worker = std::make_unique<Worker>();
    const int threads = WorkersFor(device_name, record->snap.spec.runs_on_peer());
    for (int i = 0; i < threads; ++i) {
      worker->threads.emplace_back([this, device_name] { WorkerLoop(device_name); });
    }
  }
  worker->queues[static_cast<int>(record->snap.spec.priority)].push_back(record->snap.id);
  order_.push_back(record->snap.id);
  jobs_[record->snap.id] = std::move(record);
  worker->cv.Signal();
}

absl::StatusOr<JobSnapshot> JobManager::Enqueue(JobSpec spec, ModelSpec model, torch::Device device,
                                                std::shared_ptr<const TorchScriptJob> torchscript,
                                                Submitter by, std::string_view module_bytes,
                                                int64_t estimated_memory_bytes,
                                                std::vector<DeviceCostEstimate> device_estimates) {
  // Admission first (cheap, under the lock), then the durable writes without it, then the queue.
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    if (const int64_t queued = QueuedLocked();
        options_.max_queued_jobs > 0 && queued >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          queued, " jobs are already queued; this daemon queues at most ", options_.max_queued_jobs,
          " (--max_queued_jobs); submit again when some have started"));
    }
    ++pending_enqueues_;
  }
  auto record = std::make_shared<Record>();
  record->model = std::move(model);
  record->torchscript = std::move(torchscript);
  record->device = device;
  record->quota_exempt = by.quota_exempt;
  JobSnapshot& snap = record->snap;
  snap.estimated_memory_bytes = estimated_memory_bytes;
  snap.device_estimates = std::move(device_estimates);
  snap.id = NewId();
  snap.spec = std::move(spec);
  snap.state = JobState::kQueued;
  snap.owner = std::move(by.owner);
  snap.request_id = std::move(by.request_id);
  snap.request_digest = std::move(by.request_digest);
  snap.device = DeviceName(device);
  snap.create_time = absl::Now();

  absl::Status recorded = absl::OkStatus();
  if (!module_bytes.empty() && !options_.data_dir.empty()) {
    // Before the record, so that a job the records hold always finds its module at a restart.
    recorded = MakeFoldersDurably(absl::StrCat(options_.data_dir, "/", kModulesFolder));
    if (recorded.ok()) recorded = WriteFileAtomically(ModuleFilePath(snap.id), {module_bytes});
  }
  if (recorded.ok() && store_ != nullptr) recorded = store_->SaveJob(snap);

  absl::MutexLock lock(&mu_);
  --pending_enqueues_;
  if (recorded.ok() && stopping_) {
    recorded = absl::UnavailableError("the daemon is shutting down");
    if (store_ != nullptr) (void)store_->DeleteJob(snap.id);
  }
  if (!recorded.ok()) {
    if (!module_bytes.empty()) RemoveFile(ModuleFilePath(snap.id));
    if (recorded.code() == absl::StatusCode::kUnavailable) return recorded;
    return absl::InternalError(absl::StrCat("cannot record the job: ", recorded.message()));
  }
  JobSnapshot copy = snap;
  QueueLocked(std::move(record));
  NotifyQueuedLocked(copy);
  return copy;
}

absl::StatusOr<std::vector<JobSnapshot>> JobManager::EnqueueSweep(std::vector<SweepMember> members,
                                                                  Submitter by) {
  const int64_t count = static_cast<int64_t>(members.size());
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    if (const int64_t queued = QueuedLocked();
        options_.max_queued_jobs > 0 && queued + count > options_.max_queued_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the sweep's ", count, " members would join ", queued,
          " queued jobs; this daemon queues at most ", options_.max_queued_jobs,
          " (--max_queued_jobs); submit a smaller sweep or again when some have started"));
    }
    pending_enqueues_ += count;
  }
  std::string sweep_id;
  {
    absl::MutexLock lock(&mu_);
    sweep_id = absl::StrFormat("sweep-%012x", rng_() & 0xffffffffffffULL);
  }
  std::vector<std::shared_ptr<Record>> records;
  auto ids = std::make_shared<std::vector<std::string>>();
  for (SweepMember& member : members) {
    std::string id = NewId();
    while (std::find(ids->begin(), ids->end(), id) != ids->end()) id = NewId();
    auto record = std::make_shared<Record>();
    record->model = std::move(member.model);
    record->device = member.device;
    record->quota_exempt = by.quota_exempt;
    JobSnapshot& snap = record->snap;
    snap.id = id;
    snap.sweep_id = sweep_id;
    snap.sweep_member = static_cast<int32_t>(records.size()) + 1;
    snap.estimated_memory_bytes = member.estimated_memory_bytes;
    snap.device_estimates = std::move(member.device_estimates);
    snap.spec = std::move(member.spec);
    snap.state = JobState::kQueued;
    snap.owner = by.owner;
    snap.request_id = by.request_id;
    snap.request_digest = by.request_digest;
    snap.device = DeviceName(member.device);
    snap.create_time = absl::Now();
    ids->push_back(std::move(id));
    records.push_back(std::move(record));
  }
  absl::Status recorded = absl::OkStatus();
  size_t saved = 0;
  if (store_ != nullptr) {
    // One write for the sweep, all or none (one fsync, not one per member).
    std::vector<const JobSnapshot*> snaps;
    snaps.reserve(records.size());
    for (const auto& record : records) snaps.push_back(&record->snap);
    recorded = store_->SaveJobs(snaps);
    if (recorded.ok()) saved = records.size();
  }
  absl::MutexLock lock(&mu_);
  pending_enqueues_ -= count;
  if (recorded.ok() && stopping_) recorded = absl::UnavailableError("the daemon is shutting down");
  if (!recorded.ok()) {
    // All or none: the members recorded are forgotten again (the daemon began stopping).
    for (size_t i = 0; i < saved && store_ != nullptr; ++i) {
      (void)store_->DeleteJob(records[i]->snap.id);
    }
    if (recorded.code() == absl::StatusCode::kUnavailable) return recorded;
    return absl::InternalError(absl::StrCat("cannot record the sweep: ", recorded.message()));
  }
  // Members whose specs differ only in what a pack varies share a pack (the others of the sweep
  // make packs of their own, or train alone); members with replicas train one after another, each
  // as its ranks. Those dealt to one peer go there together (the worker takes those of its own
  // queue).
  std::vector<std::pair<const JobSnapshot*, std::shared_ptr<std::vector<std::string>>>> packs;
  std::shared_ptr<SweepRungs> rungs;
  for (auto& record : records) {
    if (record->snap.spec.halving.has_value()) {
      if (rungs == nullptr) rungs = std::make_shared<SweepRungs>(*record->snap.spec.halving);
      record->rungs = rungs;
    }
    if (record->snap.spec.replicas > 1) continue;
    auto pack = std::find_if(packs.begin(), packs.end(), [&](const auto& candidate) {
      return candidate.first->device == record->snap.device &&
             candidate.first->spec.peer == record->snap.spec.peer &&
             SpecsPackUnsupported(candidate.first->spec, record->snap.spec).empty();
    });
    if (pack == packs.end()) {
      pack =
          packs.insert(packs.end(), {&record->snap, std::make_shared<std::vector<std::string>>()});
    }
    pack->second->push_back(record->snap.id);
    record->pack = pack->second;
  }
  // On the CPU a pack trains its members in turn on one worker; dealt round as many packs as the
  // CPU runs jobs at once, they train on every core. Each member's values stay the job alone's
  // (in turn, nothing of a member depends on its pack's others), and each part waits for its
  // threads as any job does.
  const int cpu_workers = WorkersFor("cpu", /*on_peer=*/false);
  for (auto& [lead, ids] : packs) {
    if (lead->device != "cpu" || !lead->spec.peer.empty() || cpu_workers < 2 || ids->size() < 2) {
      continue;
    }
    std::vector<std::shared_ptr<std::vector<std::string>>> parts(
        std::min(ids->size(), static_cast<size_t>(cpu_workers)));
    for (auto& part : parts) part = std::make_shared<std::vector<std::string>>();
    absl::flat_hash_map<std::string, std::shared_ptr<std::vector<std::string>>> part_of;
    for (size_t i = 0; i < ids->size(); ++i) {
      parts[i % parts.size()]->push_back((*ids)[i]);
      part_of[(*ids)[i]] = parts[i % parts.size()];
    }
    for (auto& record : records) {
      if (record->pack == ids) record->pack = part_of.at(record->snap.id);
    }
  }
  std::vector<JobSnapshot> out;
  for (auto& record : records) {
    out.push_back(record->snap);
    QueueLocked(std::move(record));
  }
  for (const JobSnapshot& copy : out) NotifyQueuedLocked(copy);
  return out;
}

absl::Status JobManager::Requeue(JobSnapshot job, ModelSpec model, torch::Device device,
                                 std::shared_ptr<const TorchScriptJob> torchscript,
                                 ResumePoint resume) {
  job.state = JobState::kQueued;
  job.end_time = absl::InfinitePast();
  job.epochs_completed = static_cast<int32_t>(job.epochs.size());
  if (store_ != nullptr) {
    // The epochs after the checkpoint run again: their old results go first, so that each epoch
    // is reported once.
    if (absl::Status erased = store_->DeleteEpochsAfter(job.id, resume.epoch); !erased.ok()) {
      return erased;
    }
    if (absl::Status saved = store_->SaveJob(job); !saved.ok()) return saved;
  }
  auto record = std::make_shared<Record>();
  record->model = std::move(model);
  record->torchscript = std::move(torchscript);
  record->device = device;
  record->resume = std::move(resume);
  // Whether its submitter was an admin is not recorded; a job the daemon had accepted keeps its
  // checkpoints (the quota still refuses its owner's new uploads and jobs).
  record->quota_exempt = true;
  // Only a member that went on training on a peer comes back with its cancel (recovery ends any
  // other such job): cancelled there once it is found again.
  record->cancel.store(job.cancel_requested);
  if (job.spec.halving.has_value() && !job.sweep_id.empty()) {
    record->rungs = RecoveredRungs(job.sweep_id, *job.spec.halving);
  }
  record->snap = std::move(job);
  JobSnapshot copy;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    copy = SummaryOf(record->snap);
    QueueLocked(std::move(record));
    if (options_.hooks.observer) {
      JobEvent event;
      event.job_id = copy.id;
      event.job = copy;
      try {
        options_.hooks.observer->Push(event);
      } catch (...) {
        LogWarning(absl::StrCat("job '", copy.id, "': an event observer failed: ",
                                ExceptionText(std::current_exception())));
      }
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<SweepRungs> JobManager::RecoveredRungs(const std::string& sweep_id,
                                                       const HalvingSpec& halving) {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, record] : jobs_) {
      if (record->rungs != nullptr && record->snap.sweep_id == sweep_id) return record->rungs;
    }
  }
  // The first member taken up again: the rungs as the sweep's members reached them before the
  // restart, from their records (a sweep is at most kMaxSweepMembers members: one page).
  auto rungs = std::make_shared<SweepRungs>(halving);
  if (store_ == nullptr) return rungs;
  JobQuery query;
  query.sweep_id = sweep_id;
  query.full = true;
  query.page_size = kMaxJobPageSize;
  absl::StatusOr<JobPage> page = store_->ListJobs(query);
  if (!page.ok()) {
    LogWarning(absl::StrCat("sweep '", sweep_id, "': its rungs before the restart cannot be read (",
                            page.status().message(), "); its members taken up compare anew"));
    return rungs;
  }
  for (const JobSnapshot& member : page->jobs) {
    for (const EpochResult& epoch : member.epochs) {
      rungs->Record(member.id, epoch.epoch, member.spec.epochs,
                    HalvingMetric(member.spec, epoch).first);
    }
  }
  return rungs;
}

absl::Status JobManager::FailUnrecoverable(JobSnapshot job, const std::string& reason,
                                           JobState state) {
  job.state = state;
  job.error = reason;
  job.end_time = absl::Now();
  if (store_ != nullptr) return store_->SaveJob(job);
  return absl::OkStatus();
}

}  // namespace trainerd::engine
