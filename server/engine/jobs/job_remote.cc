// A job that trains whole on a peer: a sweep's member that the sweep dealt to one of its nodes
// (JobSpec::runs_on_peer). The peer trains it as a job of its own, in its queue and within its
// limits, through RemoteRanks::RunJob; this daemon keeps the member's record, publishes its epochs
// as the peer reports them, and keeps its model once the peer gives it.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"

namespace trainerd::engine {

void JobManager::RunOnPeer(const std::shared_ptr<Record>& shared) {
  Record* record = shared.get();
  if (StopsBeforeStart(shared)) return;
  JobSpec spec;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    spec = record->snap.spec;
    id = record->snap.id;
  }
  const std::string peer = spec.nodes.front();
  auto state = std::make_unique<StartedRunState>();
  state->threads = 0;  // none of this daemon's
  Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kRunning;  // a member taken up again starts over (no checkpoint here)
    // Its device there once the peer placed it (on_queued); until then what the caller named.
    snap.ranks = {RankPlacement{0, spec.device, peer}};
    if (snap.start_time == absl::InfinitePast()) {
      snap.start_time = absl::Now();
      snap.report.queue_seconds = absl::ToDoubleSeconds(snap.start_time - snap.create_time);
    }
    state->started = snap;
  });
  TrainingOutcome outcome;
  if (options_.remote_ranks == nullptr) {
    outcome.error =
        absl::StrCat("it was to train on peer ", peer, ", and this daemon has no peers");
    EndRun(shared, *state, std::move(outcome), [] {});
    return;
  }
  LogInfo(absl::StrCat("job '", id, "' trains on peer ", peer));
  RemoteJobRequest request;
  request.spec = spec;
  request.spec.nodes.clear();
  request.job_id = id;
  const int32_t planned = spec.epochs;
  auto on_epoch = [&](const EpochResult& epoch) {
    JobEvent event;
    event.kind = JobEvent::Kind::kEpoch;
    event.epoch = epoch;
    event.epochs_planned = planned;
    Publish(record, event, [&](JobSnapshot& snap) {
      snap.epochs.push_back(epoch);
      snap.epochs_completed = static_cast<int32_t>(snap.epochs.size());
      snap.final_loss = epoch.loss;
      snap.wall_seconds = epoch.elapsed_seconds;
    });
  };
  // A cancel ends it there as here; a drain or a shutdown cancels it there too, and it starts
  // over at the next start (this daemon holds no checkpoint of it).
  auto stop = [record] {
    return record->cancel.load() || record->drain.load() || record->interrupt.load();
  };
  auto on_queued = [&](const std::string& device) {
    Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
      if (!snap.ranks.empty()) snap.ranks.front().device = device;
    });
  };
  RemoteJobResult result = options_.remote_ranks->RunJob(peer, request, on_queued, on_epoch, stop);
  if (!result.status.ok()) {
    outcome.state = JobState::kFailed;
    outcome.error = std::string(result.status.message());
  } else if (result.stopped && !record->cancel.load() && result.job.state != JobState::kSucceeded) {
    outcome.interrupted = true;  // a drain or a shutdown (one that finished there first stands)
  } else if (result.job.id.empty()) {
    // Cancelled, and the peer's end was not read (it did not answer in time): what came here.
    outcome.state = JobState::kCancelled;
    absl::MutexLock lock(&mu_);
    outcome.epochs_done = record->snap.epochs_completed;
    outcome.final_loss = record->snap.final_loss;
    outcome.wall_seconds = record->snap.wall_seconds;
  } else {
    const JobSnapshot& there = result.job;
    outcome.state = there.state;
    outcome.error = there.error.empty() ? "" : absl::StrCat("on peer ", peer, ": ", there.error);
    outcome.steps = there.steps;
    outcome.host_syncs = there.host_syncs;
    outcome.epochs_done = there.epochs_completed;
    outcome.stopped_early = there.stopped_early;
    outcome.final_loss = there.final_loss;
    outcome.wall_seconds = there.wall_seconds;
    outcome.parameter_count = there.parameter_count;
    outcome.parameters = there.parameters;
    outcome.model_archive = std::move(result.model_archive);
    state->peer_report = there.report;
    state->peer_samples_per_second = there.samples_per_second;
  }
  EndRun(shared, *state, std::move(outcome), [] {});
}

}  // namespace trainerd::engine
