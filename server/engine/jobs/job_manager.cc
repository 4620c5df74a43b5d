// JobManager: queueing and admission to the queues, records and publishing (Publish, under a
// job's publish_mu, then mu_), reads, watches, cancel, delete and retention, drain and shutdown.
// Running jobs (the device workers' loop, a run's resources, start and end, packs) is in
// job_runner.cc. mu_ guards the records, queues and workers' state; publish_mu orders each job's
// events.
#include "server/engine/jobs/job_manager.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/page_token.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/devices/device.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {
namespace job_internal {

JobSnapshot SummaryOf(JobSnapshot& snap) {
  std::vector<EpochResult> epochs = std::move(snap.epochs);
  std::vector<ParameterValues> parameters = std::move(snap.parameters);
  JobSnapshot copy;
  try {
    copy = snap;
  } catch (...) {
    snap.epochs = std::move(epochs);
    snap.parameters = std::move(parameters);
    throw;
  }
  snap.epochs = std::move(epochs);
  snap.parameters = std::move(parameters);
  copy.epochs_completed = std::max(snap.epochs_completed, static_cast<int32_t>(snap.epochs.size()));
  return copy;
}

void RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    LogWarning(absl::StrCat("cannot delete '", path, "': ", std::strerror(errno)));
  }
}

}  // namespace job_internal

namespace {

constexpr char kModulesFolder[] = "modules";

// Removes a job's flat checkpoint folder (std::filesystem::remove_all misbehaves in binaries that
// link LibTorch; the folder holds files only).
void RemoveFlatFolder(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    files.push_back(entry.path().string());
  }
  if (ec) return;  // missing: nothing to do
  for (const std::string& file : files) job_internal::RemoveFile(file);
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    LogWarning(absl::StrCat("cannot delete '", dir, "': ", std::strerror(errno)));
  }
}

}  // namespace

namespace job_internal {

std::string ExceptionText(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return "out of host memory (std::bad_alloc)";
  } catch (const std::exception& ex) {
    return FirstLineOf(ex);
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace job_internal

using job_internal::ExceptionText;
using job_internal::RemoveFile;
using job_internal::SummaryOf;

JobManager::JobManager(JobManagerOptions options)
    : options_(std::move(options)),
      store_(options_.store.get()),
      cpu_threads_(options_.cpu_cores > 0 ? options_.cpu_cores : UsableCores()) {}

JobManager::~JobManager() { Shutdown(); }

std::string JobManager::NewId() {
  while (true) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      id = absl::StrFormat("job-%012x", rng_() & 0xffffffffffffULL);
      if (jobs_.count(id)) continue;
    }
    // A job from before a restart may have it (48 random bits: rare, but records are kept).
    if (store_ != nullptr && store_->LoadJob(id).status().code() != absl::StatusCode::kNotFound) {
      continue;
    }
    return id;
  }
}

std::shared_ptr<JobManager::Record> JobManager::FindLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::string JobManager::ModuleFilePath(const std::string& id) const {
  if (options_.data_dir.empty()) return "";
  return absl::StrCat(options_.data_dir, "/", kModulesFolder, "/", id, ".pt");
}

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

void JobManager::QueueLocked(std::shared_ptr<Record> record) {
  const std::string device_name = record->snap.device;
  std::unique_ptr<Worker>& worker = workers_[device_name];
  if (!worker) {
    worker = std::make_unique<Worker>();
    const int threads = options_.max_concurrent_jobs > 0 ? options_.max_concurrent_jobs
                        : device_name == "cpu"           ? 1
                                                         : 4;
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
                                                std::string owner, std::string_view module_bytes,
                                                int64_t estimated_memory_bytes,
                                                std::vector<DeviceCostEstimate> device_estimates,
                                                bool quota_exempt) {
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
  record->quota_exempt = quota_exempt;
  JobSnapshot& snap = record->snap;
  snap.estimated_memory_bytes = estimated_memory_bytes;
  snap.device_estimates = std::move(device_estimates);
  snap.id = NewId();
  snap.spec = std::move(spec);
  snap.state = JobState::kQueued;
  snap.owner = std::move(owner);
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
                                                                  std::string owner,
                                                                  bool quota_exempt) {
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
    record->quota_exempt = quota_exempt;
    JobSnapshot& snap = record->snap;
    snap.id = id;
    snap.sweep_id = sweep_id;
    snap.estimated_memory_bytes = member.estimated_memory_bytes;
    snap.device_estimates = std::move(member.device_estimates);
    snap.spec = std::move(member.spec);
    snap.state = JobState::kQueued;
    snap.owner = owner;
    snap.device = DeviceName(member.device);
    snap.create_time = absl::Now();
    ids->push_back(std::move(id));
    records.push_back(std::move(record));
  }
  absl::Status recorded = absl::OkStatus();
  size_t saved = 0;
  if (store_ != nullptr) {
    for (; saved < records.size() && recorded.ok(); ++saved) {
      recorded = store_->SaveJob(records[saved]->snap);
    }
  }
  absl::MutexLock lock(&mu_);
  pending_enqueues_ -= count;
  if (recorded.ok() && stopping_) recorded = absl::UnavailableError("the daemon is shutting down");
  if (!recorded.ok()) {
    // All or none: the members recorded so far are forgotten again.
    for (size_t i = 0; i < saved && store_ != nullptr; ++i) {
      (void)store_->DeleteJob(records[i]->snap.id);
    }
    if (recorded.code() == absl::StatusCode::kUnavailable) return recorded;
    return absl::InternalError(absl::StrCat("cannot record the sweep: ", recorded.message()));
  }
  std::vector<JobSnapshot> out;
  for (auto& record : records) {
    record->pack = ids;
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

absl::Status JobManager::FailUnrecoverable(JobSnapshot job, const std::string& reason,
                                           JobState state) {
  job.state = state;
  job.error = reason;
  job.end_time = absl::Now();
  if (store_ != nullptr) return store_->SaveJob(job);
  return absl::OkStatus();
}

bool JobManager::accepting() const {
  absl::MutexLock lock(&mu_);
  return !stopping_;
}

absl::StatusOr<JobSnapshot> JobManager::Get(const std::string& id) const {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Record> record = FindLocked(id)) return record->snap;
  }
  if (store_ != nullptr) return store_->LoadJob(id);
  return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
}

absl::StatusOr<JobPage> JobManager::List(const JobQuery& query) const {
  if (store_ != nullptr) return store_->ListJobs(query);
  // Records in memory only: the same paging over the ids in creation order.
  const std::string filter = JobQueryFilter(query);
  int64_t start = 0;
  if (!query.page_token.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(start, ReadPageToken(page_token_key_, query.page_token, filter));
  }
  const size_t size = static_cast<size_t>(std::clamp(query.page_size, 1, kMaxJobPageSize));
  JobPage page;
  absl::MutexLock lock(&mu_);
  const size_t n = order_.size();
  size_t i = std::min(static_cast<size_t>(start), n);
  for (; i < n && page.jobs.size() < size; ++i) {
    const std::string& id = order_[query.newest_first ? n - 1 - i : i];
    JobSnapshot& snap = jobs_.at(id)->snap;
    if (query.state.has_value() && snap.state != *query.state) continue;
    if (!query.dataset.empty() && snap.spec.dataset != query.dataset) continue;
    if (query.owner.has_value() && snap.owner != *query.owner) continue;
    if (query.full) {
      page.jobs.push_back(snap);
    } else {
      page.jobs.push_back(SummaryOf(snap));
      page.jobs.back().checkpoints.clear();
    }
    page.resume_tokens.push_back(
        MakePageToken(page_token_key_, static_cast<int64_t>(i + 1), filter));
  }
  if (i < n) page.next_page_token = MakePageToken(page_token_key_, static_cast<int64_t>(i), filter);
  return page;
}

std::vector<JobSnapshot> JobManager::ActiveJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobSnapshot> out;
  for (const std::string& id : order_) {
    JobSnapshot& snap = jobs_.at(id)->snap;
    if (!IsTerminal(snap.state)) out.push_back(SummaryOf(snap));
  }
  return out;
}

absl::StatusOr<std::string> JobManager::ModelPath(const std::string& id) const {
  std::optional<JobState> state;
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Record> record = FindLocked(id)) state = record->snap.state;
  }
  if (!state.has_value()) {
    if (store_ == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    absl::StatusOr<JobSnapshot> stored = store_->LoadJob(id);
    if (!stored.ok()) return stored.status();
    state = stored->state;
  }
  if (*state != JobState::kSucceeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' is ", JobStateName(*state),
                     IsTerminal(*state) ? "; only a job that succeeded has a model"
                                        : "; its model is available once it succeeds"));
  }
  if (options_.models_dir.empty()) {
    return absl::FailedPreconditionError("this daemon does not keep trained models");
  }
  // Written before the job was published SUCCEEDED, so the file is complete.
  return absl::StrCat(options_.models_dir, "/", id, ".pt");
}

int64_t JobManager::DeviceLoad(const std::string& device) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(device);
  if (it == workers_.end()) return 0;
  return static_cast<int64_t>(it->second->queued()) + it->second->running;
}

std::string JobManager::JobUsingDataset(const std::string& dataset) const {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) {
    const JobSnapshot& snap = jobs_.at(id)->snap;
    if (IsTerminal(snap.state)) continue;
    if (snap.spec.dataset == dataset || snap.spec.validation_dataset == dataset) return id;
  }
  return "";
}

void JobManager::Publish(Record* record, JobEvent event,
                         const std::function<void(JobSnapshot&)>& mutate, absl::Status* recorded) {
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  JobSnapshot summary;  // an epoch's record for the store
  {
    absl::MutexLock lock(&mu_);
    mutate(record->snap);
    event.job_id = record->snap.id;
    if (event.kind == JobEvent::Kind::kState) {
      event.job = record->snap;
    } else if (store_ != nullptr) {
      summary = SummaryOf(record->snap);
    }
  }
  // Written through before anyone hears of it, so that whoever sees the event can read it back.
  if (store_ != nullptr) {
    const absl::Status written = event.kind == JobEvent::Kind::kState
                                     ? store_->SaveJob(event.job)
                                     : store_->AppendEpoch(summary, event.epoch);
    if (recorded != nullptr) *recorded = written;
    if (!written.ok()) {
      LogWarning(absl::StrCat("job '", event.job_id, "': ", written.message()));
    } else if (event.kind == JobEvent::Kind::kState && IsTerminal(event.job.state)) {
      record->recorded_end = true;
    }
  }
  // The observer first, so that whoever sees the event through a sink (a Watch) then finds it
  // counted in the metrics. One that throws does not keep the event from the others; the first
  // exception is rethrown at the end, so that a worker fails the job (FailAfterException).
  std::exception_ptr failure;
  auto deliver = [&](JobEventSink& sink) {
    try {
      sink.Push(event);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  if (options_.hooks.observer) deliver(*options_.hooks.observer);
  for (const auto& sink : record->sinks) deliver(*sink);
  if (event.kind == JobEvent::Kind::kState && IsTerminal(event.job.state)) record->sinks.clear();
  if (failure) std::rethrow_exception(failure);
}

void JobManager::PublishOutsideWorker(Record* record, JobEvent event,
                                      const std::function<void(JobSnapshot&)>& mutate,
                                      absl::Status* recorded) {
  try {
    Publish(record, std::move(event), mutate, recorded);
  } catch (...) {
    // The change is made and recorded; only an observer failed.
    LogWarning(absl::StrCat("job '", record->snap.id, "': an event observer failed: ",
                            ExceptionText(std::current_exception())));
  }
}

void JobManager::EndWatches(Record* record) {
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  JobEvent event;
  event.kind = JobEvent::Kind::kInterrupted;
  event.job_id = record->snap.id;
  for (const auto& sink : record->sinks) {
    try {
      sink->Push(event);
    } catch (...) {
      // Its stream ends with the server anyway.
    }
  }
  record->sinks.clear();
}

void JobManager::ForgetEnded(const std::shared_ptr<Record>& record) {
  {
    std::lock_guard<std::mutex> publish_lock(record->publish_mu);
    if (store_ == nullptr || !record->recorded_end) return;  // memory keeps it
  }
  absl::MutexLock lock(&mu_);
  jobs_.erase(record->snap.id);
  order_.erase(std::remove(order_.begin(), order_.end(), record->snap.id), order_.end());
}

absl::StatusOr<JobSnapshot> JobManager::Cancel(const std::string& id) {
  std::shared_ptr<Record> record;
  bool running = false;
  {
    absl::MutexLock lock(&mu_);
    record = FindLocked(id);
    if (record == nullptr && store_ == nullptr) {
      return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    }
    if (record != nullptr) {
      const JobState state = record->snap.state;
      if (IsTerminal(state)) {
        return absl::FailedPreconditionError(
            absl::StrCat("job '", id, "' already ended ", JobStateName(state)));
      }
      record->cancel.store(true);
      // A running job (or one its worker has just taken) stops before its next step.
      if (state == JobState::kRunning || record->claimed) {
        running = true;
      } else {
        // Queued: take it out of its device's queue; it never runs.
        workers_.at(record->snap.device)->Remove(id);
      }
    }
  }
  if (running) {
    // Recorded before it is answered: a restart ends the job CANCELLED instead of running it
    // again, even when the daemon dies before the job's worker has stopped.
    std::lock_guard<std::mutex> order(record->publish_mu);
    JobSnapshot summary;
    {
      absl::MutexLock lock(&mu_);
      record->snap.cancel_requested = true;
      summary = SummaryOf(record->snap);
    }
    if (store_ != nullptr && !IsTerminal(summary.state)) {
      if (absl::Status saved = store_->SaveJob(summary); !saved.ok()) return saved;
    }
    return summary;
  }
  if (record == nullptr) {
    // Not in memory: it ended (the store has it) or never existed.
    absl::StatusOr<JobSnapshot> stored = store_->LoadJob(id);
    if (!stored.ok()) return stored.status();
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' already ended ", JobStateName(stored->state)));
  }
  absl::Status recorded;
  PublishOutsideWorker(
      record.get(), JobEvent{},
      [](JobSnapshot& snap) {
        snap.state = JobState::kCancelled;
        snap.end_time = absl::Now();
      },
      &recorded);
  JobSnapshot out;
  {
    absl::MutexLock lock(&mu_);
    record->dataset.reset();
    record->validation_dataset.reset();
    record->torchscript.reset();
    out = record->snap;
  }
  RemoveFile(ModuleFilePath(id));
  ForgetEnded(record);
  PruneEndedJobs();
  // Not acknowledged unless recorded: the caller hears that the records could not take it (a
  // restart would take the job up again), not that it was cancelled.
  if (!recorded.ok()) return recorded;
  return out;
}

void JobManager::DeleteJobFiles(const std::string& id) const {
  if (!options_.models_dir.empty()) RemoveFile(absl::StrCat(options_.models_dir, "/", id, ".pt"));
  if (!options_.data_dir.empty()) {
    RemoveFlatFolder(absl::StrCat(options_.data_dir, "/", kCheckpointsFolder, "/", id));
    RemoveFile(ModuleFilePath(id));
  }
}

absl::Status JobManager::Delete(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Record> record = FindLocked(id);
    if (record != nullptr) {
      const JobState state = record->snap.state;
      if (!IsTerminal(state)) {
        return absl::FailedPreconditionError(absl::StrCat("job '", id, "' is ", JobStateName(state),
                                                          "; cancel it first (trainctl job cancel ",
                                                          id, ") or wait for it to end"));
      }
      if (store_ == nullptr) {
        jobs_.erase(id);
        order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
      }
    } else if (store_ == nullptr) {
      return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    }
  }
  if (store_ != nullptr) {
    absl::StatusOr<JobSnapshot> stored = store_->LoadJob(id);
    // A record that cannot be read (set aside at the start if it was unfinished; not in memory,
    // so not running) may still be deleted: that is the remedy its error names.
    const bool damaged = !stored.ok() && stored.status().code() == absl::StatusCode::kDataLoss;
    if (!stored.ok() && !damaged) return stored.status();
    if (damaged) {
      LogWarning(absl::StrCat("deleting job '", id,
                              "', whose record is damaged: ", stored.status().message()));
    } else if (!IsTerminal(stored->state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id, "' is ", JobStateName(stored->state),
                       "; cancel it first (trainctl job cancel ", id, ") or wait for it to end"));
    }
    // The record first: a job whose record is gone is gone, whatever files a crash leaves.
    if (absl::Status deleted = store_->DeleteJob(id); !deleted.ok()) return deleted;
    absl::MutexLock lock(&mu_);
    jobs_.erase(id);
    order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  }
  DeleteJobFiles(id);
  LogInfo(absl::StrCat("job '", id, "' deleted with its model and checkpoints"));
  return absl::OkStatus();
}

void JobManager::PruneEndedJobs() {
  if (store_ == nullptr) return;
  if (options_.max_finished_jobs <= 0 && options_.job_retention <= absl::ZeroDuration()) return;
  std::lock_guard<std::mutex> one_at_a_time(prune_mu_);
  const absl::Time ended_before = options_.job_retention > absl::ZeroDuration()
                                      ? absl::Now() - options_.job_retention
                                      : absl::InfinitePast();
  absl::StatusOr<std::vector<std::string>> doomed = store_->EndedJobsToPrune(
      options_.max_finished_jobs > 0 ? options_.max_finished_jobs : -1, ended_before);
  if (!doomed.ok()) {
    LogWarning(absl::StrCat("retention: ", doomed.status().message()));
    return;
  }
  for (const std::string& id : *doomed) {
    if (absl::Status deleted = Delete(id); !deleted.ok() && !absl::IsNotFound(deleted)) {
      LogWarning(absl::StrCat("retention: ", deleted.message()));
    }
  }
}

absl::StatusOr<JobSnapshot> JobManager::Subscribe(const std::string& id,
                                                  std::shared_ptr<JobEventSink> sink,
                                                  bool summary) {
  std::shared_ptr<Record> record;
  {
    absl::MutexLock lock(&mu_);
    record = FindLocked(id);
  }
  if (record == nullptr) {
    // Ended before this Watch (or before a restart): its whole history, no events to follow.
    if (store_ == nullptr) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    absl::StatusOr<JobSnapshot> stored = store_->LoadJob(id);
    if (stored.ok() && summary) {
      stored->epochs.clear();
      stored->epochs.shrink_to_fit();
      stored->parameters.clear();
    }
    return stored;
  }
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  JobSnapshot snap;
  {
    absl::MutexLock lock(&mu_);
    snap = summary ? SummaryOf(record->snap) : record->snap;
  }
  if (!IsTerminal(snap.state)) record->sinks.push_back(std::move(sink));
  return snap;
}

absl::StatusOr<std::vector<EpochResult>> JobManager::Epochs(const std::string& id, int32_t after,
                                                            int32_t limit) const {
  limit = std::max(0, limit);
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Record> record = FindLocked(id)) {
      const std::vector<EpochResult>& all = record->snap.epochs;
      // Epochs are kept in order of their numbers.
      auto first = std::upper_bound(
          all.begin(), all.end(), after,
          [](int32_t value, const EpochResult& epoch) { return value < epoch.epoch; });
      const auto last = first + std::min<ptrdiff_t>(limit, all.end() - first);
      return std::vector<EpochResult>(first, last);
    }
  }
  if (store_ != nullptr) return store_->LoadEpochs(id, after, limit);
  return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
}

void JobManager::Unsubscribe(const std::string& id, const JobEventSink* sink) {
  std::shared_ptr<Record> record;
  {
    absl::MutexLock lock(&mu_);
    record = FindLocked(id);
  }
  if (record == nullptr) return;
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  auto& sinks = record->sinks;
  sinks.erase(
      std::remove_if(sinks.begin(), sinks.end(), [sink](const auto& s) { return s.get() == sink; }),
      sinks.end());
}

void JobManager::Drain(absl::Duration timeout) {
  if (store_ == nullptr) {
    Shutdown();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // no new jobs; workers take no queued job
    for (auto& [name, worker] : workers_) worker->cv.SignalAll();
    for (auto& [id, record] : jobs_) {
      if (record->claimed && !IsTerminal(record->snap.state)) {
        record->drain.store(true);
      }
    }
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const auto& [name, worker] : workers_) {
      if (worker->running > 0) return false;
    }
    return true;
  };
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      LogWarning(absl::StrCat("jobs still run after --shutdown_timeout (",
                              absl::FormatDuration(timeout),
                              "); they stop now and resume from their last checkpoint"));
    }
  }
  Shutdown();
}

void JobManager::Shutdown(const std::string& reason) {
  std::vector<std::shared_ptr<Record>> queued;
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ && workers_.empty()) return;
    stopping_ = true;
    stopped_ = true;
    stop_reason_ = reason;
    for (auto& [name, worker] : workers_) {
      // With a store the queued jobs stay QUEUED in the records (the next start runs them); only
      // their watches end.
      for (auto& queue : worker->queues) {
        for (const std::string& id : queue) queued.push_back(jobs_.at(id));
        queue.clear();
      }
      worker->cv.SignalAll();
    }
    for (auto& [id, record] : jobs_) {
      if (IsTerminal(record->snap.state)) continue;
      if (store_ == nullptr) {
        record->cancel.store(true);
      } else {
        record->interrupt.store(true);
      }
    }
  }
  for (const auto& record : queued) {
    if (store_ != nullptr) {
      EndWatches(record.get());
      continue;
    }
    PublishOutsideWorker(record.get(), JobEvent{}, [&](JobSnapshot& snap) {
      snap.state = JobState::kCancelled;
      snap.error = reason;
      snap.end_time = absl::Now();
    });
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, worker] : workers_) {
      for (std::thread& t : worker->threads) threads.push_back(std::move(t));
    }
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  absl::MutexLock lock(&mu_);
  workers_.clear();
}

}  // namespace trainerd::engine
