// JobManager's running half: each device's worker loop (WorkerLoop), what a run needs before it
// starts (its module checked again, its datasets and CPU threads acquired, ReleaseResources), the
// run itself in process or in a worker process (StartRun, EndRun, RunJob) and checkpoints trimmed;
// a pack's run is in job_pack.cc. Queueing, records, reads and retention are in
// job_manager.cc. The same locks: mu_ for the manager's state, a job's publish_mu for its events
// (taken before mu_).
#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/flops.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/devices/device.h"
#include "server/engine/distributed/node_placement.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

using job_internal::ExceptionText;
using job_internal::RemoveFile;
using job_internal::SummaryOf;

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

}  // namespace

void JobManager::WorkerLoop(const std::string& device_name) {
  while (true) {
    std::shared_ptr<Record> record;
    std::vector<std::shared_ptr<Record>> pack;
    Worker* worker = nullptr;
    bool on_peer = false;
    {
      absl::MutexLock lock(&mu_);
      worker = workers_.at(device_name).get();
      while (!stopped_ && !stopping_ && worker->queued() == 0) worker->cv.Wait(&mu_);
      if (stopped_ || stopping_) return;
      record = jobs_.at(worker->PopNext());
      record->claimed = true;
      on_peer = record->snap.spec.runs_on_peer();
      ++worker->running;
      // A sweep's member takes the members still queued here with it: they train as one pack
      // (those dealt to one peer, as one sweep there).
      if (record->pack != nullptr) {
        pack.push_back(record);
        for (const std::string& id : *record->pack) {
          if (id == record->snap.id) continue;
          std::shared_ptr<Record> member = FindLocked(id);
          if (member == nullptr || member->claimed || IsTerminal(member->snap.state) ||
              job_internal::QueueOf(member->snap) != device_name) {
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
      if (pack.size() > 1 && on_peer) {
        RunPackOnPeer(pack);
      } else if (pack.size() > 1) {
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
    snap.error =
        absl::StrCat("cannot run again after the daemon restarted: ", checked.status().message());
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
  // Its threads are free, or it waits (still QUEUED) until running CPU jobs give theirs back;
  // the first to wait goes next (no job started after it overtakes it).
  const auto claimant = reinterpret_cast<uintptr_t>(record.get());
  while (!cpu_threads_.TryAcquire(threads, claimant)) {
    if (StopsBeforeStart(record)) {
      cpu_threads_.Withdraw(claimant);
      return false;
    }
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
                                            int32_t packed_members,
                                            std::shared_ptr<PublishBatch> batch) {
  Record* record = shared.get();
  auto started_run = std::make_unique<StartedRunState>();
  StartedRunState& state = *started_run;
  state.threads = threads;
  state.packed_members = packed_members;
  const std::function<void(JobSnapshot&)> running = [&](JobSnapshot& snap) {
    snap.state = JobState::kRunning;
    snap.report.intra_op_threads = threads;
    snap.report.packed_members = packed_members;
    // A data-parallel job's ranks: threads of this daemon on the job's device, or ranks on the
    // peers its nodes name (on their CPU).
    snap.ranks.clear();
    if (snap.spec.replicas > 1) {
      const std::string node = NodeName(options_.node_name);
      for (int32_t rank = 0; rank < snap.spec.replicas; ++rank) {
        const std::string peer = NodeOf(snap.spec.nodes, rank);
        snap.ranks.push_back(peer.empty() ? RankPlacement{rank, snap.device, node}
                                          : RankPlacement{rank, "cpu", peer});
      }
    }
    if (snap.start_time == absl::InfinitePast()) {
      snap.start_time = absl::Now();
      snap.report.queue_seconds = absl::ToDoubleSeconds(snap.start_time - snap.create_time);
    }
    state.started = snap;
  };
  state.batch = std::move(batch);
  if (state.batch != nullptr) {
    QueueEvent(*state.batch, record, &state.run, JobEvent{}, running);
  } else {
    Publish(record, JobEvent{}, running);
  }
  TrainingRun& run = state.run;
  std::string owner;
  {
    absl::MutexLock lock(&mu_);
    run.spec = record->snap.spec;
    owner = record->snap.owner;
  }
  run.model = record->model;
  run.dataset = record->dataset;
  run.validation_dataset = record->validation_dataset;
  state.module = std::move(record->torchscript);  // the run owns it; freed when it ends
  run.device = record->device;
  run.cancel = &record->cancel;
  if (record->rungs != nullptr) {
    run.stop_at_rung = [rungs = record->rungs, id = record->snap.id,
                        spec = run.spec](const EpochResult& epoch) {
      const auto [metric, name] = HalvingMetric(spec, epoch);
      return rungs->Reached(id, epoch.epoch, spec.epochs, metric, name);
    };
  }
  run.drain = &record->drain;
  run.interrupt = &record->interrupt;
  run.resume_from = record->resume.checkpoint_path;
  run.intra_op_threads = threads;
  run.flush_denormal = options_.flush_denormal;
  run.cpu_nice = options_.cpu_training_nice;
  // Throughput counts the rows trained on, not the ones held out for validation (nor, with
  // drop_last, the short last batch).
  const int64_t rows = TrainedRowsPerEpoch(run.spec, run.dataset->meta.rows);
  state.rows = rows;
  const int32_t planned = run.spec.epochs;
  // keep_checkpoints: files dropped from the list, deleted once the epoch whose record no longer
  // lists them is written (until then a restart may still resume from them). Training thread only.
  auto trimmed = std::make_shared<std::vector<std::string>>();
  run.on_epoch = [this, record, rows, planned, trimmed, &state, id = record->snap.id](
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
    auto mutate = [epoch, steps, syncs,
                   samples_per_second = event.samples_per_second](JobSnapshot& snap) {
      snap.epochs.push_back(epoch);
      snap.epochs_completed = static_cast<int32_t>(snap.epochs.size());
      snap.final_loss = epoch.loss;
      snap.steps = steps;
      snap.host_syncs = syncs;
      snap.wall_seconds = epoch.elapsed_seconds;
      snap.samples_per_second = samples_per_second;
      snap.report.host_syncs = syncs;
    };
    if (state.batch != nullptr) {  // published with the pack's (PublishQueued)
      QueueEvent(*state.batch, record, &state.run, std::move(event), mutate);
      return;
    }
    Publish(record, event, mutate);
    if (trimmed->empty()) return;
    // The record that no longer lists them must be durable before the files go: a power loss
    // could otherwise bring back a record that names deleted checkpoints.
    if (store_ != nullptr) {
      if (absl::Status synced = store_->Sync(); !synced.ok()) {
        LogWarning(
            absl::StrCat("job '", id, "': old checkpoints kept for now: ", synced.message()));
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
    run.on_checkpoint = [this, record, job_folder, trimmed, owner, batch = state.batch](
                            int32_t epoch, const std::string& file_name, int64_t size_bytes) {
      if (options_.hooks.wrote_file) options_.hooks.wrote_file(owner, size_bytes);
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
      // (A pack's batch may hold the ordering lock already, for the epochs it has not written.)
      std::unique_lock<std::mutex> order(record->publish_mu, std::defer_lock);
      if (batch == nullptr || !batch->Holds(record)) order.lock();
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
  run.on_checkpoint_failed = [this, record, batch = state.batch](int32_t epoch,
                                                                 const std::string& why) {
    // Shown in the job (and recorded with its next epoch); the log has it already.
    std::unique_lock<std::mutex> order(record->publish_mu, std::defer_lock);
    if (batch == nullptr || !batch->Holds(record)) order.lock();
    absl::MutexLock lock(&mu_);
    record->snap.checkpoint_error = why;
  };
  if (options_.hooks.may_checkpoint && !record->quota_exempt) {
    run.may_checkpoint = [hook = options_.hooks.may_checkpoint, owner] { return hook(owner); };
  }
  if (options_.hooks.start_report) {
    state.finish_report = options_.hooks.start_report(state.started, run.model, run.dataset->meta);
  }
  return started_run;
}

void JobManager::EndRun(const std::shared_ptr<Record>& shared, StartedRunState& state,
                        TrainingOutcome outcome, const std::function<void()>& release_now,
                        const EndingRun* kept) {
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
  // The model's files are complete before the job is published SUCCEEDED, so a download never
  // sees a partial archive. A model that cannot be kept fails the job: a SUCCEEDED job promises
  // one.
  std::string model_sha256;
  if (kept != nullptr) {
    model_sha256 = kept->model_sha256;
  } else {
    std::vector<EndingRun> ending = {{record->snap.id, state.started.owner, &outcome, ""}};
    KeepModels(ending);
    model_sha256 = std::move(ending.front().model_sha256);
  }
  outcome.model_archive.clear();
  outcome.model_archive.shrink_to_fit();
  outcome.state_dict.clear();
  outcome.state_dict.shrink_to_fit();
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
  report.packed_bitwise = outcome.packed_bitwise;
  report.packed_numerics = outcome.packed_numerics;
  report.worker_start_seconds = state.worker_start_seconds;
  report.worker_sandbox = outcome.worker_sandbox;
  report.collective_seconds = outcome.collective_seconds;
  if (state.peer_report) {
    report = *state.peer_report;  // measured where it trained
    report.queue_seconds = state.started.report.queue_seconds;
  } else if (state.finish_report) {
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
  const std::function<void(JobSnapshot&)> ended_as = [&](JobSnapshot& snap) {
    snap.state = outcome.state;
    snap.error = outcome.error;
    snap.model_sha256 = model_sha256;
    if (outcome.state == JobState::kCancelled && !stop_reason.empty()) snap.error = stop_reason;
    snap.steps = outcome.steps;
    snap.host_syncs = outcome.host_syncs;
    snap.wall_seconds = outcome.wall_seconds;
    snap.final_loss = outcome.final_loss;
    const double samples = static_cast<double>(rows) * outcome.epochs_done;
    snap.samples_per_second = state.peer_report          ? state.peer_samples_per_second
                              : outcome.wall_seconds > 0 ? samples / outcome.wall_seconds
                                                         : 0;
    snap.parameter_count = outcome.parameter_count;
    snap.parameters = std::move(outcome.parameters);
    snap.stopped_early = outcome.stopped_early;
    snap.stop_reason = outcome.stop_reason;
    snap.model_epoch = outcome.state == JobState::kSucceeded ? outcome.model_epoch : 0;
    snap.best_epoch = outcome.best_epoch;
    snap.end_time = absl::Now();
    snap.report = report;
  };
  // A pack member's end is published with the others' that end with it (PublishQueued).
  if (state.batch != nullptr) {
    QueueEvent(*state.batch, record, &run, JobEvent{}, ended_as);
  } else {
    Publish(record, JobEvent{}, ended_as);
  }
  RemoveFile(ModuleFilePath(record->snap.id));  // the job never runs again
  absl::MutexLock lock(&mu_);
  record->dataset.reset();  // frees a cross-device copy and lets the dataset be deleted
  record->validation_dataset.reset();
}

void JobManager::RunJob(const std::shared_ptr<Record>& shared) {
  bool on_peer = false;
  {
    absl::MutexLock lock(&mu_);
    on_peer = shared->snap.spec.runs_on_peer();
  }
  if (on_peer) {
    RunOnPeer(shared);  // job_remote.cc: nothing of it trains here
    return;
  }
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
  // A data-parallel job's ranks each want what one rank's slice would; together they hold at most
  // the cores (more ranks than cores share them).
  int32_t replicas = 1;
  int32_t attempt = 1;
  std::vector<std::string> rank_peers;  // [rank]: the peer that runs it, "" here
  {
    absl::MutexLock lock(&mu_);
    replicas = std::max<int32_t>(1, shared->snap.spec.replicas);
    attempt = static_cast<int32_t>(shared->snap.restarts.size()) + 1;
    for (int32_t rank = 0; rank < replicas; ++rank) {
      rank_peers.push_back(NodeOf(shared->snap.spec.nodes, rank));
    }
  }
  const int32_t local_ranks =
      static_cast<int32_t>(std::count(rank_peers.begin(), rank_peers.end(), std::string()));
  int threads = WantedThreads(shared);
  if (local_ranks > 1 && shared->device.is_cpu()) {
    threads = std::min(cpu_threads_.cores(), threads * local_ranks);
  }
  if (!AcquireThreads(shared, threads)) return;
  if (shared->device.is_cpu()) release.cpu_threads = threads;
  StartedRun started = StartRun(shared, threads, /*packed_members=*/0);
  TrainingOutcome outcome;
  if (replicas > 1) {
    outcome = RunRanks(shared, &started->run, threads, attempt, std::move(rank_peers));
  } else if (started->module != nullptr) {
    // Untrusted code: trained in a worker process of its own, never in the daemon.
    // The job's own limit, never past the operator's (a record from before a lower
    // --max_job_time keeps its own only while it is shorter).
    const double seconds = started->run.spec.max_job_seconds;
    absl::Duration limit = options_.max_job_time;
    if (seconds > 0 && (limit <= absl::ZeroDuration() || absl::Seconds(seconds) < limit)) {
      limit = absl::Seconds(seconds);
    }
    outcome = RunTrainingInWorker(started->run, shared->snap.id, *started->module, limit,
                                  worker_pool_, &started->worker_start_seconds);
  } else {
    outcome = RunTraining(started->run);
  }
  EndRun(shared, *started, std::move(outcome), [&] { release.Now(); });
}

}  // namespace trainerd::engine
