// JobManager's event streams (job_manager.h): Publish, which records a state change or an epoch
// (in the store first) and hands it to the job's watchers, in order under the job's publish_mu
// (taken before mu_); and the watches themselves (Subscribe, Epochs, Unsubscribe).
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
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

using job_internal::ExceptionText;
using job_internal::SummaryOf;

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

std::vector<std::pair<const TrainingRun*, std::exception_ptr>> JobManager::PublishEpochs(
    EpochBatch& batch) {
  std::vector<PendingEpoch> pending;
  pending.swap(batch.pending);
  std::vector<std::pair<const TrainingRun*, std::exception_ptr>> failed;
  if (pending.empty()) return failed;
  // Every member's ordering lock (each publisher holds one at a time, this one several, always
  // taken before mu_): no event of these jobs can come between their epoch's write and its
  // delivery.
  std::vector<std::unique_lock<std::mutex>> ordering;
  ordering.reserve(pending.size());
  for (const PendingEpoch& p : pending) ordering.emplace_back(p.record->publish_mu);
  std::vector<JobSnapshot> summaries(pending.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < pending.size(); ++i) {
      pending[i].mutate(pending[i].record->snap);
      pending[i].event.job_id = pending[i].record->snap.id;
      if (store_ != nullptr) summaries[i] = SummaryOf(pending[i].record->snap);
    }
  }
  if (store_ != nullptr) {
    std::vector<std::pair<const JobSnapshot*, const EpochResult*>> rows;
    rows.reserve(pending.size());
    for (size_t i = 0; i < pending.size(); ++i) {
      rows.emplace_back(&summaries[i], &pending[i].event.epoch);
    }
    if (absl::Status written = store_->AppendEpochs(rows); !written.ok()) {
      LogWarning(absl::StrCat("a pack's epochs (", pending.size(), " jobs, the first '",
                              pending.front().event.job_id, "'): ", written.message()));
    }
  }
  for (PendingEpoch& p : pending) {
    std::exception_ptr failure;
    auto deliver = [&](JobEventSink& sink) {
      try {
        sink.Push(p.event);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    };
    if (options_.hooks.observer) deliver(*options_.hooks.observer);
    for (const auto& sink : p.record->sinks) deliver(*sink);
    if (failure) failed.emplace_back(p.run, failure);
  }
  return failed;
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

}  // namespace trainerd::engine
