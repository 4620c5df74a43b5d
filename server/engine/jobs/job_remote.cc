// A job that trains whole on a peer: a sweep's member that the sweep dealt to one of its nodes
// (JobSpec::runs_on_peer). The peer trains it as a job of its own, in its queue and within its
// limits, through RemoteRanks::RunJob; this daemon keeps the member's record, publishes its epochs
// as the peer reports them, and keeps its model once the peer gives it.
//
// Before the member is submitted there, the request id it is submitted with is recorded here
// (ranks[0].request_id, once for the member's life): a daemon killed between the peer's taking the
// job and its recording the job's id submits again with that id and gets the same job back.
// The peer's id of the job is recorded here (ranks[0].job_id) as soon as the peer took it. When
// this daemon stops (a drain, a shutdown) or is killed while the member trains there, the job is
// left training there, and the next start takes it up again by that id, reading its epochs from
// the first: nothing is trained twice and nothing is left there unread. Only a cancel here
// cancels it there, even one that came while this daemon stopped (Requeue keeps it).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"

namespace trainerd::engine {

void JobManager::RunOnPeer(const std::shared_ptr<Record>& shared) {
  Record* record = shared.get();
  JobSpec spec;
  std::string id;
  std::string there_before;  // the peer's id of it from a run before this daemon's restart
  std::string request_id;    // its request id there, kept for the member's life
  {
    absl::MutexLock lock(&mu_);
    spec = record->snap.spec;
    id = record->snap.id;
    there_before = record->snap.peer_job_id();
    if (spec.runs_on_peer() && !record->snap.ranks.empty()) {
      request_id = record->snap.ranks.front().request_id;
    }
  }
  // A run before this daemon's restart may have submitted it there: its id there, or at least
  // the request id it was submitted with, was recorded.
  const bool may_be_there = !there_before.empty() || !request_id.empty();
  if (request_id.empty()) {
    absl::MutexLock lock(&mu_);
    request_id = absl::StrFormat("%s.%016x", id, rng_());
  }
  // Cancelled before it started here: ended, unless it may have gone on there (after a
  // restart), which RunJob then finds and cancels there.
  if ((!may_be_there || !record->cancel.load()) && StopsBeforeStart(shared)) return;
  const std::string peer = spec.nodes.front();
  auto state = std::make_unique<StartedRunState>();
  state->threads = 0;  // none of this daemon's
  Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kRunning;
    // Its device and id there once the peer took it (on_queued); until then what the caller
    // named, and the id of an earlier run there.
    snap.ranks = {RankPlacement{0, spec.device, peer, there_before, request_id}};
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
  request.resume_id = there_before;
  request.request_id = request_id;
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
  // A cancel ends it there as here; a drain or a shutdown leaves it training there, to be taken
  // up again at the next start.
  auto stop = [record] {
    if (record->cancel.load()) return RemoteStop::kCancel;
    if (record->drain.load() || record->interrupt.load()) return RemoteStop::kDetach;
    return RemoteStop::kNone;
  };
  // Recorded (SaveJob) before its first epoch: a daemon killed from here on finds it again.
  auto on_queued = [&](const std::string& there, const std::string& device) {
    Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
      if (snap.ranks.empty()) return;
      snap.ranks.front().job_id = there;
      if (!device.empty()) snap.ranks.front().device = device;
    });
  };
  RemoteJobResult result = options_.remote_ranks->RunJob(peer, request, on_queued, on_epoch, stop);
  if (!result.status.ok()) {
    outcome.state = JobState::kFailed;
    outcome.error = std::string(result.status.message());
  } else if (result.detached) {
    outcome.interrupted = true;  // a drain or a shutdown: it goes on there, and is found again
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
