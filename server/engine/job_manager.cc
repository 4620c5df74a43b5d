#include "server/engine/job_manager.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/engine/checkpoint.h"
#include "server/engine/device.h"
#include "server/engine/log.h"
#include "server/engine/torchscript_export.h"
#include "server/engine/trainer.h"

namespace trainerd::engine {

JobManager::~JobManager() { Shutdown(); }

std::string JobManager::NewId() {
  while (true) {
    std::string id = absl::StrFormat("job-%012x", rng_() & 0xffffffffffffULL);
    if (!jobs_.count(id)) return id;
  }
}

absl::StatusOr<JobSnapshot> JobManager::Enqueue(JobSpec spec, ModelSpec model,
                                                std::shared_ptr<const Dataset> dataset,
                                                std::shared_ptr<const Dataset> validation_dataset,
                                                torch::Device device,
                                                std::shared_ptr<torch::jit::Module> torchscript,
                                                std::string owner) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the daemon is shutting down");
  if (max_queued_jobs_ > 0) {
    int64_t queued = 0;
    for (const auto& [name, worker] : workers_) queued += static_cast<int64_t>(worker->queue.size());
    if (queued >= max_queued_jobs_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          queued, " jobs are already queued; this daemon queues at most ", max_queued_jobs_,
          " (--max_queued_jobs); submit again when some have started"));
    }
  }
  auto record = std::make_unique<Record>();
  record->model = std::move(model);
  record->dataset = std::move(dataset);
  record->validation_dataset = std::move(validation_dataset);
  record->torchscript = std::move(torchscript);
  record->device = device;
  JobSnapshot& snap = record->snap;
  snap.id = NewId();
  snap.spec = std::move(spec);
  snap.state = JobState::kQueued;
  snap.owner = std::move(owner);
  snap.device = DeviceName(device);
  snap.create_time = absl::Now();
  JobSnapshot copy = snap;

  const std::string device_name = snap.device;
  std::unique_ptr<Worker>& worker = workers_[device_name];
  if (!worker) {
    worker = std::make_unique<Worker>();
    worker->thread = std::thread([this, device_name] { WorkerLoop(device_name); });
  }
  worker->queue.push_back(snap.id);
  order_.push_back(snap.id);
  jobs_[snap.id] = std::move(record);
  worker->cv.Signal();
  if (hooks_.observer) {
    // Under mu_, so that the QUEUED event precedes the job's first event from its worker (which
    // needs mu_ to take the job); the observer only counts.
    JobEvent event;
    event.job_id = copy.id;
    event.job = copy;
    hooks_.observer->Push(event);
  }
  return copy;
}

absl::StatusOr<JobSnapshot> JobManager::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  return it->second->snap;
}

std::vector<JobSnapshot> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobSnapshot> out;
  out.reserve(order_.size());
  for (const std::string& id : order_) out.push_back(jobs_.at(id)->snap);
  return out;
}

absl::StatusOr<std::string> JobManager::ModelPath(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  const JobState state = it->second->snap.state;
  if (state != JobState::kSucceeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", id, "' is ", JobStateName(state),
                     IsTerminal(state) ? "; only a job that succeeded has a model"
                                       : "; its model is available once it succeeds"));
  }
  if (models_dir_.empty()) {
    return absl::FailedPreconditionError("this daemon does not keep trained models");
  }
  // Written before the job was published SUCCEEDED, so the file is complete.
  return absl::StrCat(models_dir_, "/", id, ".pt");
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
                         const std::function<void(JobSnapshot&)>& mutate) {
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  {
    absl::MutexLock lock(&mu_);
    mutate(record->snap);
    event.job_id = record->snap.id;
    if (event.kind == JobEvent::Kind::kState) event.job = record->snap;
  }
  // The observer first, so that whoever sees the event through a sink (a Watch) then finds it
  // counted in the metrics.
  if (hooks_.observer) hooks_.observer->Push(event);
  for (const auto& sink : record->sinks) sink->Push(event);
  if (event.kind == JobEvent::Kind::kState && IsTerminal(event.job.state)) record->sinks.clear();
}

absl::StatusOr<JobSnapshot> JobManager::Cancel(const std::string& id) {
  Record* record = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    record = it->second.get();
    const JobState state = record->snap.state;
    if (IsTerminal(state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id, "' already ended ", JobStateName(state)));
    }
    record->cancel.store(true);
    // A running job (or one its worker has just taken) stops before its next step.
    if (state == JobState::kRunning || record->claimed) return record->snap;
    // Queued: take it out of its device's queue; it never runs.
    auto& queue = workers_.at(record->snap.device)->queue;
    queue.erase(std::remove(queue.begin(), queue.end(), id), queue.end());
  }
  Publish(record, StateEvent(), [](JobSnapshot& snap) {
    snap.state = JobState::kCancelled;
    snap.end_time = absl::Now();
  });
  absl::MutexLock lock(&mu_);
  record->dataset.reset();
  record->validation_dataset.reset();
  record->torchscript.reset();
  return record->snap;
}

absl::StatusOr<JobSnapshot> JobManager::Subscribe(const std::string& id,
                                                  std::shared_ptr<JobEventSink> sink) {
  Record* record = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    record = it->second.get();  // records live as long as the manager
  }
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  JobSnapshot snap;
  {
    absl::MutexLock lock(&mu_);
    snap = record->snap;
  }
  if (!IsTerminal(snap.state)) record->sinks.push_back(std::move(sink));
  return snap;
}

void JobManager::Unsubscribe(const std::string& id, const JobEventSink* sink) {
  Record* record = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    record = it->second.get();
  }
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  auto& sinks = record->sinks;
  sinks.erase(std::remove_if(sinks.begin(), sinks.end(),
                             [sink](const auto& s) { return s.get() == sink; }),
              sinks.end());
}

void JobManager::WorkerLoop(const std::string& device_name) {
  while (true) {
    Record* record = nullptr;
    {
      absl::MutexLock lock(&mu_);
      Worker* worker = workers_.at(device_name).get();
      while (!stopping_ && worker->queue.empty()) worker->cv.Wait(&mu_);
      if (stopping_) return;
      record = jobs_.at(worker->queue.front()).get();
      record->claimed = true;
      worker->queue.pop_front();
    }
    RunJob(record);
  }
}

void JobManager::RunJob(Record* record) {
  JobSnapshot started;
  Publish(record, StateEvent(), [&](JobSnapshot& snap) {
    snap.state = JobState::kRunning;
    snap.start_time = absl::Now();
    snap.report.queue_seconds = absl::ToDoubleSeconds(snap.start_time - snap.create_time);
    started = snap;
  });
  TrainingRun run;
  {
    absl::MutexLock lock(&mu_);
    run.spec = record->snap.spec;
  }
  run.model = record->model;
  run.dataset = record->dataset;
  run.validation_dataset = record->validation_dataset;
  run.torchscript = std::move(record->torchscript);  // the run owns it; freed when it ends
  run.device = record->device;
  run.cancel = &record->cancel;
  // Throughput counts the rows trained on, not the ones held out for validation.
  const int64_t rows =
      run.dataset->meta.rows - HeldOutRows(run.spec.validation_fraction, run.dataset->meta.rows);
  const int32_t planned = run.spec.epochs;
  run.on_epoch = [this, record, rows, planned](const EpochResult& epoch, int64_t steps,
                                               int64_t syncs) {
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
      snap.final_loss = epoch.loss;
      snap.steps = steps;
      snap.host_syncs = syncs;
      snap.wall_seconds = epoch.elapsed_seconds;
      snap.samples_per_second = event.samples_per_second;
      snap.report.host_syncs = syncs;
    });
  };
  if (!data_dir_.empty()) {
    const std::string job_folder = absl::StrCat(kCheckpointsFolder, "/", record->snap.id);
    run.checkpoint_dir = absl::StrCat(data_dir_, "/", job_folder);
    // Listed before the epoch that wrote it is published, under the same ordering lock.
    run.on_checkpoint = [this, record, job_folder](int32_t epoch, const std::string& file_name,
                                                   int64_t size_bytes) {
      CheckpointInfo checkpoint;
      checkpoint.epoch = epoch;
      checkpoint.path = absl::StrCat(job_folder, "/", file_name);
      checkpoint.size_bytes = size_bytes;
      checkpoint.create_time = absl::Now();
      std::lock_guard<std::mutex> order(record->publish_mu);
      absl::MutexLock lock(&mu_);
      record->snap.checkpoints.push_back(std::move(checkpoint));
    };
  }
  std::function<void(const JobSnapshot&, DeviceReport&)> finish_report;
  if (hooks_.start_report) {
    finish_report = hooks_.start_report(started, run.model, run.dataset->meta);
  }
  TrainingOutcome outcome = RunTraining(run);
  run.dataset.reset();
  // The model file is complete before the job is published SUCCEEDED, so a download never sees
  // a partial archive. A model that cannot be kept fails the job: a SUCCEEDED job promises one.
  if (outcome.state == JobState::kSucceeded && !models_dir_.empty()) {
    const std::string path = absl::StrCat(models_dir_, "/", record->snap.id, ".pt");
    const absl::Status written = WriteModelArchive(path, outcome.model_archive);
    if (!written.ok()) {
      outcome.state = JobState::kFailed;
      outcome.error = absl::StrCat("cannot keep the trained model: ", written.message());
    }
  }
  outcome.model_archive.clear();
  outcome.model_archive.shrink_to_fit();
  run.validation_dataset.reset();
  run.torchscript.reset();
  std::string stop_reason;
  {
    absl::MutexLock lock(&mu_);
    stop_reason = stop_reason_;
  }
  // The report: times and counts from the run, then (outside the engine's locks) what the
  // engine's samplers and measurements add (utilization, FLOPs, the verdict).
  DeviceReport report;
  report.queue_seconds = started.report.queue_seconds;
  report.data_seconds = outcome.data_seconds;
  report.compute_seconds = std::max(
      0.0, outcome.loop_seconds - outcome.loop_host_transfer_seconds - outcome.checkpoint_seconds);
  report.host_transfer_seconds = outcome.host_transfer_seconds;
  report.steps_per_second = report.compute_seconds > 0
                                ? static_cast<double>(outcome.steps) / report.compute_seconds
                                : 0.0;
  report.host_syncs = outcome.host_syncs;
  report.host_to_device_bytes = outcome.host_to_device_bytes;
  report.peak_memory_bytes = outcome.peak_memory_bytes;
  if (finish_report) {
    JobSnapshot ended;
    {
      absl::MutexLock lock(&mu_);
      ended = record->snap;  // with every epoch published so far
    }
    ended.state = outcome.state;
    ended.steps = outcome.steps;
    ended.wall_seconds = outcome.wall_seconds;
    finish_report(ended, report);
  }
  Publish(record, StateEvent(), [&](JobSnapshot& snap) {
    snap.state = outcome.state;
    snap.error = outcome.error;
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
  absl::MutexLock lock(&mu_);
  record->dataset.reset();  // frees a cross-device copy and lets the dataset be deleted
  record->validation_dataset.reset();
}

void JobManager::Shutdown(const std::string& reason) {
  std::vector<Record*> queued;
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    stop_reason_ = reason;
    for (auto& [name, worker] : workers_) {
      for (const std::string& id : worker->queue) queued.push_back(jobs_.at(id).get());
      worker->queue.clear();
      worker->cv.SignalAll();
    }
    for (auto& [id, record] : jobs_) {
      if (!IsTerminal(record->snap.state)) record->cancel.store(true);
    }
  }
  for (Record* record : queued) {
    Publish(record, StateEvent(), [&](JobSnapshot& snap) {
      snap.state = JobState::kCancelled;
      snap.error = reason;
      snap.end_time = absl::Now();
    });
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, worker] : workers_) threads.push_back(std::move(worker->thread));
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  absl::MutexLock lock(&mu_);
  workers_.clear();
}

}  // namespace trainerd::engine
