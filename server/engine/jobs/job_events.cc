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

JobSnapshot JobManager::ApplyEvent(Record* record, JobEvent& event,
                                   const std::function<void(JobSnapshot&)>& mutate) {
  absl::MutexLock lock(&mu_);
  mutate(record->snap);
  event.job_id = record->snap.id;
  if (event.kind == JobEvent::Kind::kState) {
    event.job = record->snap;
    return JobSnapshot();
  }
  return store_ != nullptr ? SummaryOf(record->snap) : JobSnapshot();
}

std::exception_ptr JobManager::DeliverEvent(Record* record, const JobEvent& event) {
  // The observer first, so that whoever sees the event through a sink (a Watch) then finds it
  // counted in the metrics. One that throws does not keep the event from the others.
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
  return failure;
}

void JobManager::Publish(Record* record, JobEvent event,
                         const std::function<void(JobSnapshot&)>& mutate, absl::Status* recorded) {
  std::lock_guard<std::mutex> publish_lock(record->publish_mu);
  const JobSnapshot summary = ApplyEvent(record, event, mutate);  // an epoch's record
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
  // The first exception is rethrown, so that a worker fails the job (FailAfterException).
  if (std::exception_ptr failure = DeliverEvent(record, event)) std::rethrow_exception(failure);
}

void JobManager::QueueEvent(PublishBatch& batch, Record* record, const TrainingRun* run,
                            JobEvent event, const std::function<void(JobSnapshot&)>& mutate) {
  PendingEvent pending;
  // Several jobs' ordering locks at once (this thread's pack), always taken before mu_, as every
  // publisher takes its one; a job's once, by its first event waiting.
  if (batch.locked.insert(record).second) {
    pending.ordering = std::unique_lock<std::mutex>(record->publish_mu);
  }
  if (batch.pending.empty()) batch.first_pending = absl::Now();
  if (event.kind == JobEvent::Kind::kState) batch.has_state = true;
  pending.record = record;
  pending.run = run;
  pending.summary = ApplyEvent(record, event, mutate);
  pending.event = std::move(event);
  batch.pending.push_back(std::move(pending));
}

std::vector<std::pair<const TrainingRun*, std::exception_ptr>> JobManager::PublishQueued(
    PublishBatch& batch, bool hold_epochs) {
  if (hold_epochs && !batch.has_state && absl::Now() - batch.first_pending < kPackEpochsHeldFor) {
    return {};
  }
  std::vector<PendingEvent> pending;
  pending.swap(batch.pending);
  batch.locked.clear();  // the locks go with `pending`, once it is delivered
  batch.has_state = false;
  std::vector<std::pair<const TrainingRun*, std::exception_ptr>> failed;
  if (pending.empty()) return failed;
  // Written through before anyone hears of them, as Publish does: the states durably together,
  // the epochs together.
  if (store_ != nullptr) {
    std::vector<const JobSnapshot*> states;
    std::vector<std::pair<const JobSnapshot*, const EpochResult*>> epochs;
    for (const PendingEvent& p : pending) {
      if (p.event.kind == JobEvent::Kind::kState) {
        states.push_back(&p.event.job);
      } else {
        epochs.emplace_back(&p.summary, &p.event.epoch);
      }
    }
    // The epochs first: a job's end comes after its last epoch, whose record must not replace the
    // end's.
    absl::Status written = absl::OkStatus();
    if (!epochs.empty()) written = store_->AppendEpochs(epochs);
    if (written.ok() && !states.empty()) written = store_->SaveJobs(states);
    if (!written.ok()) {
      LogWarning(absl::StrCat("a pack's events (", pending.size(), " of jobs from '",
                              pending.front().event.job_id, "'): ", written.message()));
    } else {
      for (const PendingEvent& p : pending) {
        if (p.event.kind == JobEvent::Kind::kState && IsTerminal(p.event.job.state)) {
          p.record->recorded_end = true;
        }
      }
    }
  }
  for (PendingEvent& p : pending) {
    if (std::exception_ptr failure = DeliverEvent(p.record, p.event)) {
      failed.emplace_back(p.run, failure);
    }
  }
  return failed;  // the ordering locks let go with `pending`
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
