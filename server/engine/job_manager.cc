#include "server/engine/job_manager.h"

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
#include "common/flops.h"
#include "server/engine/checkpoint.h"
#include "server/engine/device.h"
#include "server/engine/log.h"
#include "server/engine/torchscript_export.h"
#include "server/engine/trainer.h"

namespace trainerd::engine {
namespace {

// The intra-op threads a job would like (cpu_threads.h), from its FLOPs per step at its batch: the
// model spec's, or for a TorchScript module (whose FLOPs the daemon does not know) 6 per parameter
// per row, as a stack of linear layers would cost forward and backward.
int WantedIntraOpThreads(const ModelSpec& model, const TorchScriptJob* torchscript,
                         const std::vector<int64_t>& feature_shape, int64_t batch, int cores) {
  double flops = 0.0;
  if (!model.layers.empty()) {
    flops = common::TrainingFlopsPerStep(model, feature_shape, batch);
  } else if (torchscript != nullptr) {
    flops = 6.0 * static_cast<double>(torchscript->parameter_count) * static_cast<double>(batch);
  }
  return IntraOpThreadsFor(flops, cores);
}

constexpr char kModulesFolder[] = "modules";

// A copy of `snap` without its epochs and parameters (epochs_completed says how many): what
// listings and the store's per-state records need, at a cost that does not grow with the job.
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

// The in-memory listing's page token: the position after the previous page's last job.
// Removes a file, quietly when it is already gone; logs other failures.
void RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    LogWarning(absl::StrCat("cannot delete '", path, "': ", std::strerror(errno)));
  }
}

// Removes a job's flat checkpoint folder (std::filesystem::remove_all misbehaves in binaries that
// link LibTorch; the folder holds files only).
void RemoveFlatFolder(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    files.push_back(entry.path().string());
  }
  if (ec) return;  // missing: nothing to do
  for (const std::string& file : files) RemoveFile(file);
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    LogWarning(absl::StrCat("cannot delete '", dir, "': ", std::strerror(errno)));
  }
}

// What an exception says, for logs and a failed job's error.
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

}  // namespace

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
                                                                  std::string owner) {
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
      LogWarning(absl::StrCat("deleting job '", id, "', whose record is damaged: ",
                              stored.status().message()));
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

void JobManager::WorkerLoop(const std::string& device_name) {
  while (true) {
    std::shared_ptr<Record> record;
    std::vector<std::shared_ptr<Record>> pack;
    Worker* worker = nullptr;
    {
      absl::MutexLock lock(&mu_);
      worker = workers_.at(device_name).get();
      while (!stopped_ && !stopping_ && worker->queued() == 0) worker->cv.Wait(&mu_);
      if (stopped_ || stopping_) return;
      record = jobs_.at(worker->PopNext());
      record->claimed = true;
      ++worker->running;
      // A sweep's member takes the members still queued here with it: they train as one pack.
      if (record->pack != nullptr) {
        pack.push_back(record);
        for (const std::string& id : *record->pack) {
          if (id == record->snap.id) continue;
          std::shared_ptr<Record> member = FindLocked(id);
          if (member == nullptr || member->claimed || IsTerminal(member->snap.state) ||
              member->snap.device != device_name) {
            continue;
          }
          const auto& queue = worker->queues[static_cast<int>(member->snap.spec.priority)];
          if (std::find(queue.begin(), queue.end(), id) == queue.end()) continue;
          worker->Remove(id);
          member->claimed = true;
          pack.push_back(std::move(member));
        }
      }
    }
    try {
      if (pack.size() > 1) {
        RunPack(pack);
      } else {
        RunJob(record);
      }
    } catch (...) {
      FailAfterException(record, ExceptionText(std::current_exception()));
    }
    {
      absl::MutexLock lock(&mu_);
      --worker->running;
    }
    ForgetEnded(record);
    PruneEndedJobs();
  }
}

void JobManager::FailAfterException(const std::shared_ptr<Record>& record,
                                    const std::string& what) {
  LogWarning(absl::StrCat("job '", record->snap.id, "' failed on an exception: ", what));
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    ended = IsTerminal(record->snap.state);
  }
  if (ended) return;
  PublishOutsideWorker(record.get(), JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kFailed;
    snap.error = absl::StrCat("the job's worker failed: ", what);
    snap.end_time = absl::Now();
  });
  absl::MutexLock lock(&mu_);
  record->dataset.reset();
  record->validation_dataset.reset();
  record->torchscript.reset();
}

std::vector<std::string> JobManager::TrimCheckpoints(
    std::vector<CheckpointInfo>& checkpoints) const {
  std::vector<std::string> doomed;
  const size_t keep = static_cast<size_t>(options_.keep_checkpoints);
  if (keep == 0 || checkpoints.size() <= keep) return doomed;
  const size_t drop = checkpoints.size() - keep;
  for (size_t i = 0; i < drop; ++i) {
    doomed.push_back(absl::StrCat(options_.data_dir, "/", checkpoints[i].path));
  }
  checkpoints.erase(checkpoints.begin(), checkpoints.begin() + static_cast<ptrdiff_t>(drop));
  return doomed;
}

bool JobManager::CheckModuleBeforeStart(const std::shared_ptr<Record>& record) {
  std::shared_ptr<const TorchScriptJob> module;
  JobSnapshot job;
  {
    absl::MutexLock lock(&mu_);
    module = record->torchscript;
    if (module == nullptr || module->checked) return true;
    job = SummaryOf(record->snap);
  }
  absl::StatusOr<TorchScriptJob> checked =
      options_.hooks.check_module
          ? options_.hooks.check_module(job, *module)
          : absl::StatusOr<TorchScriptJob>(absl::FailedPreconditionError("no module check"));
  if (checked.ok()) {
    absl::MutexLock lock(&mu_);
    record->torchscript = std::make_shared<const TorchScriptJob>(*std::move(checked));
    return true;
  }
  if (absl::IsUnavailable(checked.status())) return false;  // the daemon stops: it stays queued
  LogWarning(absl::StrCat("job '", job.id, "' cannot run again after the daemon restarted: ",
                          checked.status().message()));
  PublishOutsideWorker(record.get(), JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kFailed;
    snap.error = absl::StrCat("cannot run again after the daemon restarted: ",
                              checked.status().message());
    snap.end_time = absl::Now();
  });
  RemoveFile(ModuleFilePath(job.id));
  absl::MutexLock lock(&mu_);
  record->torchscript.reset();
  return false;
}

bool JobManager::StopsBeforeStart(const std::shared_ptr<Record>& record) {
  if (record->cancel.load()) {
    PublishOutsideWorker(record.get(), JobEvent{}, [](JobSnapshot& snap) {
      snap.state = JobState::kCancelled;
      snap.end_time = absl::Now();
    });
    RemoveFile(ModuleFilePath(record->snap.id));
    return true;
  }
  // Draining or stopping: it has not started, so it stays QUEUED and runs at the next start.
  if (record->drain.load() || record->interrupt.load()) {
    EndWatches(record.get());
    return true;
  }
  return false;
}

JobManager::Acquired JobManager::TryAcquireDatasets(const std::shared_ptr<Record>& record) {
  if (StopsBeforeStart(record)) return Acquired::kEnded;
  JobSnapshot job;
  {
    absl::MutexLock lock(&mu_);
    job = SummaryOf(record->snap);
  }
  absl::Status why_not = absl::InternalError("no dataset hook");
  if (options_.hooks.acquire) {
    absl::StatusOr<JobDatasets> acquired = options_.hooks.acquire(job);
    if (acquired.ok()) {
      absl::MutexLock lock(&mu_);
      record->dataset = std::move(acquired->dataset);
      record->validation_dataset = std::move(acquired->validation_dataset);
      return Acquired::kYes;
    }
    // Running jobs hold the memory it needs.
    if (absl::IsUnavailable(acquired.status())) return Acquired::kNotNow;
    why_not = acquired.status();
  }
  PublishOutsideWorker(record.get(), JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kFailed;
    snap.error = absl::StrCat("cannot start: ", why_not.message());
    snap.end_time = absl::Now();
  });
  RemoveFile(ModuleFilePath(job.id));
  return Acquired::kEnded;
}

bool JobManager::AcquireDatasets(const std::shared_ptr<Record>& record) {
  while (true) {
    switch (TryAcquireDatasets(record)) {
      case Acquired::kYes:
        return true;
      case Acquired::kEnded:
        return false;
      case Acquired::kNotNow:
        break;
    }
    // Running jobs hold the memory it needs: wait until one gives it back (or a while, for a
    // cancel or a drain to be seen).
    absl::MutexLock lock(&mu_);
    memory_released_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
  }
}

int JobManager::WantedThreads(const std::shared_ptr<Record>& record) {
  if (!record->device.is_cpu()) return 1;
  JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    spec = record->snap.spec;
  }
  const DatasetMeta& meta = record->dataset->meta;
  const int64_t rows = meta.rows - HeldOutRows(spec.validation_fraction, meta.rows);
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(spec.batch_size, rows));
  // An operator's count is capped at the cores: OpenMP would start every thread asked for.
  const int want = options_.intra_op_threads > 0
                       ? std::min(options_.intra_op_threads, cpu_threads_.cores())
                       : WantedIntraOpThreads(record->model, record->torchscript.get(),
                                              meta.feature_shape, batch, cpu_threads_.cores());
  return std::max(want, 1);
}

bool JobManager::AcquireThreads(const std::shared_ptr<Record>& record, int threads) {
  if (!record->device.is_cpu()) return true;
  // Its threads are free, or it waits (still QUEUED) until running CPU jobs give theirs back.
  while (!cpu_threads_.TryAcquire(threads)) {
    if (StopsBeforeStart(record)) return false;
    absl::MutexLock lock(&mu_);
    memory_released_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
  }
  return true;
}

void JobManager::ReleaseResources(const std::string& id, int cpu_threads) {
  if (!id.empty() && options_.hooks.release) options_.hooks.release(id);
  if (cpu_threads > 0) cpu_threads_.Release(cpu_threads);
  absl::MutexLock lock(&mu_);
  memory_released_.SignalAll();
}

JobManager::StartedRun JobManager::StartRun(const std::shared_ptr<Record>& shared, int threads,
                                            int32_t packed_members) {
  Record* record = shared.get();
  auto started_run = std::make_unique<StartedRunState>();
  StartedRunState& state = *started_run;
  state.threads = threads;
  state.packed_members = packed_members;
  Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kRunning;
    snap.report.intra_op_threads = threads;
    snap.report.packed_members = packed_members;
    if (snap.start_time == absl::InfinitePast()) {
      snap.start_time = absl::Now();
      snap.report.queue_seconds = absl::ToDoubleSeconds(snap.start_time - snap.create_time);
    }
    state.started = snap;
  });
  TrainingRun& run = state.run;
  {
    absl::MutexLock lock(&mu_);
    run.spec = record->snap.spec;
  }
  run.model = record->model;
  run.dataset = record->dataset;
  run.validation_dataset = record->validation_dataset;
  state.module = std::move(record->torchscript);  // the run owns it; freed when it ends
  run.device = record->device;
  run.cancel = &record->cancel;
  run.drain = &record->drain;
  run.interrupt = &record->interrupt;
  run.resume_from = record->resume.checkpoint_path;
  run.intra_op_threads = threads;
  run.flush_denormal = options_.flush_denormal;
  // Throughput counts the rows trained on, not the ones held out for validation.
  const int64_t rows =
      run.dataset->meta.rows - HeldOutRows(run.spec.validation_fraction, run.dataset->meta.rows);
  state.rows = rows;
  const int32_t planned = run.spec.epochs;
  // keep_checkpoints: files dropped from the list, deleted once the epoch whose record no longer
  // lists them is written (until then a restart may still resume from them). Training thread only.
  auto trimmed = std::make_shared<std::vector<std::string>>();
  run.on_epoch = [this, record, rows, planned, trimmed, id = record->snap.id](
                     const EpochResult& epoch, int64_t steps, int64_t syncs) {
    JobEvent event;
    event.kind = JobEvent::Kind::kEpoch;
    event.epoch = epoch;
    event.steps = steps;
    event.host_syncs = syncs;
    event.rows_per_epoch = rows;
    event.epochs_planned = planned;
    if (epoch.elapsed_seconds > 0) {
      event.samples_per_second = static_cast<double>(rows) * epoch.epoch / epoch.elapsed_seconds;
    }
    Publish(record, event, [&](JobSnapshot& snap) {
      snap.epochs.push_back(epoch);
      snap.epochs_completed = static_cast<int32_t>(snap.epochs.size());
      snap.final_loss = epoch.loss;
      snap.steps = steps;
      snap.host_syncs = syncs;
      snap.wall_seconds = epoch.elapsed_seconds;
      snap.samples_per_second = event.samples_per_second;
      snap.report.host_syncs = syncs;
    });
    if (trimmed->empty()) return;
    // The record that no longer lists them must be durable before the files go: a power loss
    // could otherwise bring back a record that names deleted checkpoints.
    if (store_ != nullptr) {
      if (absl::Status synced = store_->Sync(); !synced.ok()) {
        LogWarning(absl::StrCat("job '", id, "': old checkpoints kept for now: ",
                                synced.message()));
        return;
      }
    }
    for (const std::string& path : *trimmed) RemoveFile(path);
    trimmed->clear();
  };
  if (!options_.data_dir.empty()) {
    const std::string job_folder = absl::StrCat(kCheckpointsFolder, "/", record->snap.id);
    run.checkpoint_dir = absl::StrCat(options_.data_dir, "/", job_folder);
    // Listed before the epoch that wrote it is published (and recorded with it), under the same
    // ordering lock. keep_checkpoints deletes the oldest files only after the new one is listed.
    run.on_checkpoint = [this, record, job_folder, trimmed](
                            int32_t epoch, const std::string& file_name, int64_t size_bytes) {
      CheckpointInfo checkpoint;
      checkpoint.epoch = epoch;
      checkpoint.path = absl::StrCat(job_folder, "/", file_name);
      checkpoint.size_bytes = size_bytes;
      checkpoint.create_time = absl::Now();
      // Read back just after it was written (from the page cache): a resume compares the file
      // with it and falls back to an older checkpoint when it no longer matches.
      if (absl::StatusOr<std::string> bytes =
              ReadFileToString(absl::StrCat(options_.data_dir, "/", checkpoint.path));
          bytes.ok()) {
        checkpoint.sha256 = Sha256Hex(*bytes);
      }
      std::lock_guard<std::mutex> order(record->publish_mu);
      absl::MutexLock lock(&mu_);
      std::vector<CheckpointInfo>& list = record->snap.checkpoints;
      // A checkpoint written again (an epoch run again after a restart) replaces its entry.
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const CheckpointInfo& c) { return c.epoch >= epoch; }),
                 list.end());
      list.push_back(std::move(checkpoint));
      std::vector<std::string> doomed = TrimCheckpoints(list);
      trimmed->insert(trimmed->end(), doomed.begin(), doomed.end());
    };
  }
  run.on_checkpoint_failed = [this, record](int32_t epoch, const std::string& why) {
    // Shown in the job (and recorded with its next epoch); the log has it already.
    std::lock_guard<std::mutex> order(record->publish_mu);
    absl::MutexLock lock(&mu_);
    record->snap.checkpoint_error = why;
  };
  if (options_.hooks.start_report) {
    state.finish_report = options_.hooks.start_report(state.started, run.model, run.dataset->meta);
  }
  return started_run;
}

void JobManager::EndRun(const std::shared_ptr<Record>& shared, StartedRunState& state,
                        TrainingOutcome outcome, const std::function<void()>& release_now) {
  Record* record = shared.get();
  TrainingRun& run = state.run;
  run.dataset.reset();
  if (outcome.interrupted) {
    // Drain or shutdown: the job is not over. Its records stay RUNNING (with every epoch and
    // checkpoint published so far) and the next start takes it up again.
    run.validation_dataset.reset();
    state.module.reset();
    {
      absl::MutexLock lock(&mu_);
      record->dataset.reset();
      record->validation_dataset.reset();
      LogInfo(absl::StrCat("job '", record->snap.id, "' stopped after epoch ",
                           record->snap.epochs_completed, "; it resumes at the next start"));
    }
    // Outside mu_: EndWatches takes publish_mu, and the lock order is publish_mu, then mu_
    // (Publish, Subscribe).
    EndWatches(record);
    return;
  }
  // The model file is complete before the job is published SUCCEEDED, so a download never sees
  // a partial archive. A model that cannot be kept fails the job: a SUCCEEDED job promises one.
  std::string model_sha256;
  if (outcome.state == JobState::kSucceeded && !options_.models_dir.empty()) {
    const std::string path = absl::StrCat(options_.models_dir, "/", record->snap.id, ".pt");
    const absl::Status written = WriteModelArchive(path, outcome.model_archive);
    if (!written.ok()) {
      outcome.state = JobState::kFailed;
      outcome.error = absl::StrCat("cannot keep the trained model: ", written.message());
    } else {
      // Kept with the record: a download checks the file against it.
      model_sha256 = Sha256Hex(outcome.model_archive);
    }
  }
  outcome.model_archive.clear();
  outcome.model_archive.shrink_to_fit();
  run.validation_dataset.reset();
  state.module.reset();
  {
    absl::MutexLock lock(&mu_);
    record->dataset.reset();
    record->validation_dataset.reset();
  }
  release_now();
  std::string stop_reason;
  {
    absl::MutexLock lock(&mu_);
    stop_reason = stop_reason_;
  }
  // The report: times and counts from the run, then (outside the engine's locks) what the
  // engine's samplers and measurements add (utilization, FLOPs, the verdict).
  DeviceReport report;
  report.queue_seconds = state.started.report.queue_seconds;
  report.data_seconds = outcome.data_seconds;
  report.compute_seconds = std::max(
      0.0, outcome.loop_seconds - outcome.loop_host_transfer_seconds - outcome.checkpoint_seconds);
  report.host_transfer_seconds = outcome.host_transfer_seconds;
  // This run's steps over this run's compute (a resumed job's earlier steps ran before it).
  const int64_t run_steps = std::max<int64_t>(0, outcome.steps - outcome.resumed_steps);
  report.steps_per_second =
      report.compute_seconds > 0 ? static_cast<double>(run_steps) / report.compute_seconds : 0.0;
  report.host_syncs = outcome.host_syncs;
  report.host_to_device_bytes = outcome.host_to_device_bytes;
  report.peak_memory_bytes = outcome.peak_memory_bytes;
  report.intra_op_threads = state.threads;
  report.engine = outcome.engine;
  report.engine_reason = outcome.engine_reason;
  report.packed_members = state.packed_members;
  report.worker_start_seconds = state.worker_start_seconds;
  if (state.finish_report) {
    JobSnapshot ended;
    {
      absl::MutexLock lock(&mu_);
      ended = SummaryOf(record->snap);
    }
    ended.state = outcome.state;
    ended.steps = outcome.steps;
    ended.wall_seconds = outcome.wall_seconds;
    state.finish_report(ended, report);
  }
  const int64_t rows = state.rows;
  Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = outcome.state;
    snap.error = outcome.error;
    snap.model_sha256 = model_sha256;
    if (outcome.state == JobState::kCancelled && !stop_reason.empty()) snap.error = stop_reason;
    snap.steps = outcome.steps;
    snap.host_syncs = outcome.host_syncs;
    snap.wall_seconds = outcome.wall_seconds;
    snap.final_loss = outcome.final_loss;
    const double samples = static_cast<double>(rows) * outcome.epochs_done;
    snap.samples_per_second = outcome.wall_seconds > 0 ? samples / outcome.wall_seconds : 0;
    snap.parameter_count = outcome.parameter_count;
    snap.parameters = std::move(outcome.parameters);
    snap.stopped_early = outcome.stopped_early;
    snap.end_time = absl::Now();
    snap.report = report;
  });
  RemoveFile(ModuleFilePath(record->snap.id));  // the job never runs again
  absl::MutexLock lock(&mu_);
  record->dataset.reset();  // frees a cross-device copy and lets the dataset be deleted
  record->validation_dataset.reset();
}

void JobManager::RunJob(const std::shared_ptr<Record>& shared) {
  if (!CheckModuleBeforeStart(shared)) return;
  if (!AcquireDatasets(shared)) return;
  // Whatever way the run ends, the memory and the CPU threads go back and waiting jobs look again:
  // before the job's terminal state is published (so that whoever sees it end sees its memory
  // free), or at the latest when RunJob returns.
  struct Release {
    JobManager* manager;
    std::string id;
    int cpu_threads = 0;  // taken from cpu_threads_
    bool done = false;
    void Now() {
      if (done) return;
      done = true;
      manager->ReleaseResources(id, cpu_threads);
    }
    ~Release() { Now(); }
  } release{this, shared->snap.id};
  // A CPU job's intra-op threads, from its size alone (cpu_threads.h), taken from the cores the
  // running CPU jobs leave; a GPU job's host side needs one.
  const int threads = WantedThreads(shared);
  if (!AcquireThreads(shared, threads)) return;
  if (shared->device.is_cpu()) release.cpu_threads = threads;
  StartedRun started = StartRun(shared, threads, /*packed_members=*/0);
  TrainingOutcome outcome;
  if (started->module != nullptr) {
    // Untrusted code: trained in a worker process of its own, never in the daemon.
    const double seconds = started->run.spec.max_job_seconds;
    const absl::Duration limit =
        seconds > 0 ? absl::Seconds(seconds) : options_.max_job_time;
    outcome = RunTrainingInWorker(started->run, shared->snap.id, *started->module, limit,
                                  worker_pool_, &started->worker_start_seconds);
  } else {
    outcome = RunTraining(started->run);
  }
  EndRun(shared, *started, std::move(outcome), [&] { release.Now(); });
}

void JobManager::RunPack(std::vector<std::shared_ptr<Record>> members) {
  // The first member that can start leads: it waits for its datasets and memory like any job.
  // The others each reserve theirs without waiting; one that must wait goes back to the front of
  // its queue, and runs (with any others left) once memory is free.
  std::vector<std::shared_ptr<Record>> acquired;
  size_t next = 0;
  while (next < members.size() && acquired.empty()) {
    if (AcquireDatasets(members[next])) acquired.push_back(members[next]);
    ++next;
  }
  std::vector<std::shared_ptr<Record>> later;
  for (; next < members.size(); ++next) {
    switch (TryAcquireDatasets(members[next])) {
      case Acquired::kYes:
        acquired.push_back(members[next]);
        break;
      case Acquired::kNotNow:
        later.push_back(members[next]);
        break;
      case Acquired::kEnded:
        break;
    }
  }
  if (!later.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto it = later.rbegin(); it != later.rend(); ++it) {
      (*it)->claimed = false;
      Worker* worker = workers_.at((*it)->snap.device).get();
      worker->queues[static_cast<int>((*it)->snap.spec.priority)].push_front((*it)->snap.id);
      worker->cv.Signal();
    }
  }
  if (acquired.empty()) return;
  // Each member's memory goes back as it ends; the pack's threads when the last one ended.
  std::vector<bool> released(acquired.size(), false);
  const int threads = WantedThreads(acquired.front());
  const bool cpu = acquired.front()->device.is_cpu();
  auto release_all = [&] {
    for (size_t i = 0; i < acquired.size(); ++i) {
      if (!released[i]) ReleaseResources(acquired[i]->snap.id, 0);
      released[i] = true;
    }
  };
  if (!AcquireThreads(acquired.front(), threads)) {
    // The lead was cancelled or the daemon stops; the others go the same way one by one.
    release_all();
    for (size_t i = 1; i < acquired.size(); ++i) {
      if (!StopsBeforeStart(acquired[i])) {
        absl::MutexLock lock(&mu_);
        acquired[i]->claimed = false;
        Worker* worker = workers_.at(acquired[i]->snap.device).get();
        worker->queues[static_cast<int>(acquired[i]->snap.spec.priority)].push_front(
            acquired[i]->snap.id);
        worker->cv.Signal();
      }
    }
    return;
  }
  struct ThreadRelease {
    JobManager* manager;
    int threads;
    ~ThreadRelease() { manager->ReleaseResources("", threads); }
  } thread_release{this, cpu ? threads : 0};
  const int32_t packed = static_cast<int32_t>(acquired.size());
  std::vector<StartedRun> started;
  std::vector<const TrainingRun*> runs;
  for (const auto& member : acquired) {
    started.push_back(StartRun(member, threads, packed > 1 ? packed : 0));
    runs.push_back(&started.back()->run);
  }
  std::vector<bool> ended(acquired.size(), false);
  try {
    RunPackedTraining(runs, [&](size_t i, TrainingOutcome outcome) {
      ended[i] = true;
      EndRun(acquired[i], *started[i], std::move(outcome), [&] {
        if (!released[i]) ReleaseResources(acquired[i]->snap.id, 0);
        released[i] = true;
      });
    });
  } catch (...) {
    const std::string what = ExceptionText(std::current_exception());
    for (size_t i = 0; i < acquired.size(); ++i) {
      if (!ended[i]) FailAfterException(acquired[i], what);
    }
  }
  release_all();
  for (const auto& member : acquired) ForgetEnded(member);
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
