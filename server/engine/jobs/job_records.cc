// JobManager's records (job_manager.h): reads (Get, List, ActiveJobs, CheckpointPath, from memory
// or the store), cancellation, deletion with the job's files, and retention (ForgetEnded,
// PruneEndedJobs: ended jobs leave memory, and past --max_finished_jobs or --job_retention the
// records). mu_ guards the records; a cancellation publishes under the job's publish_mu.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_io.h"
#include "common/page_token.h"
#include "common/status_macros.h"
#include "server/engine/devices/device.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

namespace {

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

using job_internal::RemoveFile;
using job_internal::SummaryOf;

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
    if (!query.request_id.empty() && snap.request_id != query.request_id) continue;
    if (!query.sweep_id.empty() && snap.sweep_id != query.sweep_id) continue;
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

absl::StatusOr<std::string> JobManager::CheckpointPath(const std::string& id, int32_t epoch,
                                                       CheckpointInfo* out) const {
  absl::StatusOr<JobSnapshot> job = Get(id);
  if (!job.ok()) return job.status();
  if (options_.data_dir.empty()) {
    return absl::FailedPreconditionError("this daemon keeps no checkpoints (it has no data folder)");
  }
  const std::vector<CheckpointInfo>& list = job->checkpoints;
  if (list.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "job '", id, "' has no checkpoints (JobSpec.checkpoint_every writes them)"));
  }
  const CheckpointInfo* found = nullptr;
  if (epoch == 0) {
    found = &list.back();
  } else {
    for (const CheckpointInfo& c : list) {
      if (c.epoch == epoch) found = &c;
    }
  }
  if (found == nullptr) {
    std::vector<int32_t> epochs;
    for (const CheckpointInfo& c : list) epochs.push_back(c.epoch);
    return absl::NotFoundError(absl::StrCat("job '", id, "' has no checkpoint of epoch ", epoch,
                                            "; it has epochs ", absl::StrJoin(epochs, ", ")));
  }
  *out = *found;
  return absl::StrCat(options_.data_dir, "/", found->path);
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
      // A running job (or one its worker has just taken) stops before its next step. So does a
      // member that went on training on a peer while this daemon restarted: its worker cancels it
      // there.
      if (state == JobState::kRunning || record->claimed || record->snap.may_be_on_peer()) {
        running = true;
      } else {
        // Queued: take it out of its device's queue; it never runs.
        workers_.at(job_internal::QueueOf(record->snap))->Remove(id);
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
  if (!options_.models_dir.empty()) {
    RemoveFile(absl::StrCat(options_.models_dir, "/", id, ".pt"));
    RemoveFile(absl::StrCat(options_.models_dir, "/", id, ".safetensors"));
    RemoveFile(absl::StrCat(options_.models_dir, "/", id, ".safetensors.sha256"));
    RemoveFile(absl::StrCat(options_.models_dir, "/", id, ".pt2"));
    RemoveFile(absl::StrCat(options_.models_dir, "/", id, ".pt2.sha256"));
  }
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

}  // namespace trainerd::engine
