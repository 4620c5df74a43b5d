// A job that trains whole on a peer: a sweep's member that the sweep dealt to one of its nodes
// (JobSpec::peer). The peer trains it as a job of its own, in its queue and within its
// limits, through PeerJobCalls::RunJob; this daemon keeps the member's record, publishes its epochs
// as the peer reports them, and keeps its model once the peer gives it.
//
// Before the member is submitted there, the request id it is submitted with is recorded here
// (JobSnapshot::there.request_id, once for the member's life): a daemon killed between the peer's
// taking the job and its recording the job's id submits again with that id and gets the same job
// back. The members a sweep deals to one peer go there together, as one sweep of the peer's
// (RunPackOnPeer, PeerJobCalls::RunSweep): packed there, as they would be here. Each is recorded
// with that sweep's request id and its place in it before the call, and follows its own job there
// afterwards; a member taken up again after a restart is followed (or found, or trained anew)
// alone. The peer's id of the job is recorded here (there.job_id) as soon as the peer took it.
// When this daemon stops (a drain, a shutdown) or is killed while the member trains there, the job
// is left training there, and the next start takes it up again by that id, reading its epochs from
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

JobManager::StartedRun JobManager::StartOnPeer(const std::shared_ptr<Record>& shared,
                                               const std::string& device, const JobOnPeer& there) {
  auto state = std::make_unique<StartedRunState>();
  state->threads = 0;  // none of this daemon's
  Publish(shared.get(), JobEvent{}, [&](JobSnapshot& snap) {
    snap.state = JobState::kRunning;
    // Its device and id there once the peer took it (on_queued); until then what the caller
    // named, the id of an earlier run there, and the request id it is (or was) submitted with.
    snap.ranks = {RankPlacement{0, device, snap.spec.peer}};
    snap.there = there;
    if (snap.start_time == absl::InfinitePast()) {
      snap.start_time = absl::Now();
      snap.report.queue_seconds = absl::ToDoubleSeconds(snap.start_time - snap.create_time);
    }
    state->started = snap;
  });
  return state;
}

RemoteMemberCalls JobManager::MemberCalls(Record* record) {
  RemoteMemberCalls calls;
  const int32_t planned = record->snap.spec.epochs;  // fixed at submit
  calls.on_epoch = [this, record, planned](const EpochResult& epoch) {
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
  calls.stop = [record] {
    if (record->cancel.load()) return RemoteStop::kCancel;
    if (record->drain.load() || record->interrupt.load()) return RemoteStop::kDetach;
    return RemoteStop::kNone;
  };
  // Recorded (SaveJob) before its first epoch: a daemon killed from here on finds it again.
  calls.on_queued = [this, record](const std::string& there, const std::string& device) {
    Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
      snap.there.job_id = there;
      if (!device.empty() && !snap.ranks.empty()) snap.ranks.front().device = device;
    });
  };
  return calls;
}

void JobManager::EndOnPeer(const std::shared_ptr<Record>& shared, StartedRunState& state,
                           RemoteJobResult result, const std::string& peer) {
  TrainingOutcome outcome;
  if (!result.status.ok()) {
    outcome.state = JobState::kFailed;
    outcome.error = std::string(result.status.message());
  } else if (result.detached) {
    outcome.interrupted = true;  // a drain or a shutdown: it goes on there, and is found again
  } else if (result.job.id.empty()) {
    // Cancelled, and the peer's end was not read (it did not answer in time): what came here.
    outcome.state = JobState::kCancelled;
    absl::MutexLock lock(&mu_);
    outcome.epochs_done = shared->snap.epochs_completed;
    outcome.final_loss = shared->snap.final_loss;
    outcome.wall_seconds = shared->snap.wall_seconds;
  } else {
    const JobSnapshot& there = result.job;
    outcome.state = there.state;
    outcome.error = there.error.empty() ? "" : absl::StrCat("on peer ", peer, ": ", there.error);
    outcome.steps = there.steps;
    outcome.host_syncs = there.host_syncs;
    outcome.epochs_done = there.epochs_completed;
    outcome.stopped_early = there.stopped_early;
    outcome.model_epoch = there.model_epoch;
    outcome.best_epoch = there.best_epoch;
    outcome.final_loss = there.final_loss;
    outcome.wall_seconds = there.wall_seconds;
    outcome.parameter_count = there.parameter_count;
    outcome.parameters = there.parameters;
    outcome.model_archive = std::move(result.model_archive);
    outcome.state_dict = std::move(result.state_dict);
    state.peer_report = there.report;
    state.peer_samples_per_second = there.samples_per_second;
  }
  EndRun(shared, state, std::move(outcome), [] {});
}

void JobManager::RunOnPeer(const std::shared_ptr<Record>& shared) {
  Record* record = shared.get();
  JobSpec spec;
  std::string id;
  JobOnPeer there;  // what a run before this daemon's restart recorded of it there
  {
    absl::MutexLock lock(&mu_);
    spec = record->snap.spec;
    id = record->snap.id;
    there = record->snap.there;
  }
  // A run before this daemon's restart may have submitted it there: its id there, or at least
  // the request id it was submitted with, was recorded.
  const bool may_be_there = !there.job_id.empty() || !there.request_id.empty();
  if (there.request_id.empty()) {
    absl::MutexLock lock(&mu_);
    there.request_id = absl::StrFormat("%s.%016x", id, rng_());
  }
  // Cancelled before it started here: ended, unless it may have gone on there (after a
  // restart), which RunJob then finds and cancels there.
  if ((!may_be_there || !record->cancel.load()) && StopsBeforeStart(shared)) return;
  const std::string peer = spec.peer;
  StartedRun state = StartOnPeer(shared, spec.device, there);
  if (options_.peers == nullptr) {
    TrainingOutcome outcome;
    outcome.error =
        absl::StrCat("it was to train on peer ", peer, ", and this daemon has no peers");
    EndRun(shared, *state, std::move(outcome), [] {});
    return;
  }
  LogInfo(absl::StrCat("job '", id, "' trains on peer ", peer));
  RemoteJobRequest request;
  request.spec = spec;
  request.spec.peer.clear();
  request.job_id = id;
  request.resume_id = there.job_id;
  if (there.sweep_member > 0) {
    // Sent before as one of a sweep there: found there by that sweep's request id and its place;
    // trained anew alone (should it be gone there) under an id of its own derived from both.
    request.share_request_id = there.request_id;
    request.share_member = there.sweep_member;
    request.request_id = absl::StrCat(there.request_id, ":", there.sweep_member);
  } else {
    request.request_id = there.request_id;
  }
  const RemoteMemberCalls calls = MemberCalls(record);
  RemoteJobResult result =
      options_.peers->RunJob(peer, request, calls.on_queued, calls.on_epoch, calls.stop);
  EndOnPeer(shared, *state, std::move(result), peer);
}

void JobManager::RunPackOnPeer(std::vector<std::shared_ptr<Record>> members) {
  std::string peer;
  std::string sweep_request;
  {
    absl::MutexLock lock(&mu_);
    peer = members.front()->snap.spec.peer;
    sweep_request = absl::StrFormat("%s.%016x", members.front()->snap.sweep_id, rng_());
  }
  // The members that start (one cancelled meanwhile ends here, with nothing of it there), each
  // recorded RUNNING with the sweep's request id and its place in the sweep there before the
  // call: a daemon killed before it recorded their ids there finds them by both.
  std::vector<std::shared_ptr<Record>> started;
  std::vector<StartedRun> states;
  RemoteSweepRequest request;
  request.request_id = sweep_request;
  for (const std::shared_ptr<Record>& member : members) {
    if (StopsBeforeStart(member)) continue;
    JobSpec spec;
    {
      absl::MutexLock lock(&mu_);
      spec = member->snap.spec;
    }
    const int32_t place = static_cast<int32_t>(started.size()) + 1;
    states.push_back(StartOnPeer(member, spec.device, JobOnPeer{"", sweep_request, place}));
    started.push_back(member);
    request.job_ids.push_back(member->snap.id);
    spec.peer.clear();
    request.members.push_back(std::move(spec));
  }
  // The worker forgets the member it took; the pack's others leave memory here once ended, as a
  // pack's members do (RunPack).
  auto forget = [&] {
    for (size_t i = 1; i < members.size(); ++i) ForgetEnded(members[i]);
  };
  if (started.empty()) {
    forget();
    return;
  }
  if (options_.peers == nullptr) {
    for (size_t i = 0; i < started.size(); ++i) {
      TrainingOutcome outcome;
      outcome.error =
          absl::StrCat("it was to train on peer ", peer, ", and this daemon has no peers");
      EndRun(started[i], *states[i], std::move(outcome), [] {});
    }
    forget();
    return;
  }
  LogInfo(absl::StrCat(started.size(), " members of sweep '", started.front()->snap.sweep_id,
                       "' train on peer ", peer, " as one sweep there"));
  std::vector<RemoteMemberCalls> calls;
  for (const std::shared_ptr<Record>& member : started) calls.push_back(MemberCalls(member.get()));
  std::vector<RemoteJobResult> results = options_.peers->RunSweep(peer, request, calls);
  results.resize(started.size());  // a short answer fails the rest below
  for (size_t i = 0; i < started.size(); ++i) {
    if (results[i].status.ok() && !results[i].detached && !results[i].stopped &&
        results[i].job.id.empty()) {
      results[i].status =
          absl::InternalError(absl::StrCat("peer ", peer, " gave no result for the member"));
    }
    EndOnPeer(started[i], *states[i], std::move(results[i]), peer);
  }
  forget();
}

}  // namespace trainerd::engine
