#include "server/engine/distributed/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checked_size.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/distributed/collectives.h"

namespace trainerd::engine {
namespace {

// RankComms on a CpuGroup: the step's gradients rows-weighted in one all-reduce, the epoch's
// values summed in another. Times its collectives (seconds()): on the CPU a Gloo collective
// returns when it is done, so the wall time inside them is the rank's time in communication,
// waiting for the slowest rank included.
class GroupRankComms final : public RankComms {
 public:
  explicit GroupRankComms(CpuGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }
  void Exchange(const std::vector<torch::Tensor>& gradients, int64_t rows) override {
    std::vector<double> votes = {vote_.cancel ? 1.0 : 0.0, vote_.interrupt ? 1.0 : 0.0};
    Timed([&] { return group_.AllReduceRowWeightedMean(gradients, rows, &votes); });
    agreed_ = StopVote{votes[0] > 0, votes[1] > 0};
  }
  void VoteStop(StopVote vote) override { vote_ = vote; }
  StopVote agreed_stop() const override { return agreed_; }
  void AllReduceSum(torch::Tensor& values) override {
    Timed([&] { return group_.AllReduceSum(values); });
  }
  double seconds() const { return seconds_; }

 private:
  template <typename F>
  void Timed(F collective) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = collective();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Check(status);
  }
  static void Check(const absl::Status& status) {
    if (!status.ok()) throw std::runtime_error(std::string(status.message()));
  }
  CpuGroup& group_;
  StopVote vote_;
  StopVote agreed_;
  double seconds_ = 0.0;
};

// A failure that only says the rank lost the others (they left, or timed out).
bool LostTheOthers(const std::string& error) {
  return absl::StrContains(error, "all-reduce failed") ||
         absl::StrContains(error, "ranks joined within") ||
         absl::StrContains(error, "the leader gave the meeting up") ||
         absl::StrContains(error, "cannot connect to the other ranks") ||
         absl::StrContains(error, "cannot hand the checkpoint to rank");
}

TrainingOutcome Failed(std::string error) {
  TrainingOutcome failed;
  failed.state = JobState::kFailed;
  failed.error = std::move(error);
  return failed;
}

std::atomic<uint64_t> next_group{0};

}  // namespace

absl::StatusOr<int64_t> MostCheckpointBytes(const MemoryEstimate& estimate, size_t layers) {
  constexpr char kWhat[] = "the job's checkpoint";
  TRAINERD_ASSIGN_OR_RETURN(const int64_t state,
                            CheckedAdd(estimate.parameter_bytes, estimate.optimizer_bytes, kWhat));
  TRAINERD_ASSIGN_OR_RETURN(const int64_t twice, CheckedMul(state, 2, kWhat));
  TRAINERD_ASSIGN_OR_RETURN(const int64_t per_layer,
                            CheckedMul(int64_t{64} << 10, static_cast<int64_t>(layers), kWhat));
  TRAINERD_ASSIGN_OR_RETURN(const int64_t framing, CheckedAdd(int64_t{1} << 20, per_layer, kWhat));
  return CheckedAdd(twice, framing, kWhat);
}

JoinedGroup JoinedGroupOf(const RemoteRankRequest& request, const std::string& interface_host) {
  JoinedGroup joined;
  joined.group.store_host = request.store_host;
  joined.group.store_port = request.store_port;
  joined.group.store_secret = request.store_secret;
  joined.group.prefix = request.prefix;
  joined.group.rank = request.rank;
  joined.group.world_size = request.world_size;
  joined.group.timeout = absl::Seconds(request.timeout_seconds);
  if (!interface_host.empty()) joined.group.interface_host = interface_host;
  if (request.resume_bytes > 0) {
    joined.resume.expect_bytes = request.resume_bytes;
    joined.resume.expect_sha256 = request.resume_sha256;
  }
  return joined;
}

TrainingOutcome RunJoinedRank(const TrainingRun& run, const GroupOptions& group_options,
                              const GroupResume& resume) {
  absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(group_options);
  if (!group.ok()) return Failed(std::string(group.status().message()));
  // The checkpoint handed round before the first step: rank 0 sends the leader's bytes to each
  // rank on a peer, which checks them against what the leader said before it reads any of them.
  if (resume.bytes != nullptr && !resume.send_to.empty()) {
    // Gloo only reads a tensor it sends.
    const torch::Tensor bytes = torch::from_blob(const_cast<char*>(resume.bytes->data()),
                                                 {static_cast<int64_t>(resume.bytes->size())},
                                                 torch::TensorOptions(torch::kUInt8));
    for (const int to : resume.send_to) {
      if (absl::Status sent = (*group)->Send(bytes, to); !sent.ok()) {
        return Failed(
            absl::StrCat("cannot hand the checkpoint to rank ", to, ": ", sent.message()));
      }
    }
  }
  TrainingRun resumed;
  const TrainingRun* training = &run;
  if (resume.expect_bytes > 0) {
    auto bytes = std::make_shared<std::string>(static_cast<size_t>(resume.expect_bytes), '\0');
    torch::Tensor into =
        torch::from_blob(bytes->data(), {resume.expect_bytes}, torch::TensorOptions(torch::kUInt8));
    if (absl::Status received = (*group)->Receive(into, 0); !received.ok()) {
      return Failed(
          absl::StrCat("cannot receive the checkpoint the job resumes from: ", received.message()));
    }
    if (Sha256Hex(*bytes) != resume.expect_sha256) {
      return Failed(absl::StrCat("the checkpoint received from rank 0 (", bytes->size(),
                                 " bytes) is not the one the leader named (SHA-256 ",
                                 resume.expect_sha256, "): the rank does not start"));
    }
    resumed = run;
    resumed.resume_bytes = std::move(bytes);
    training = &resumed;
  }
  GroupRankComms comms(**group);
  TrainingOutcome outcome = RunRank(*training, comms);
  outcome.collective_seconds = comms.seconds();
  return outcome;
}

TrainingOutcome RunDataParallel(const TrainingRun& run, absl::Duration timeout,
                                const std::string& group) {
  DataParallelOptions options;
  options.timeout = timeout;
  options.group = group;
  return RunDataParallel(run, options);
}

TrainingOutcome RunDataParallel(const TrainingRun& run, const DataParallelOptions& options) {
  const int world = run.spec.replicas;
  if (world < 2) return Failed("a data-parallel job has at least 2 ranks");
  if (const std::string why = DataParallelUnsupported(run); !why.empty()) {
    return Failed(absl::StrCat("this job cannot train as ranks: ", why));
  }
  auto peer_of = [&](int rank) -> std::string {
    return static_cast<size_t>(rank) < options.peers.size() ? options.peers[rank] : "";
  };
  std::vector<int> remote_ranks;
  for (int rank = 0; rank < world; ++rank) {
    if (!peer_of(rank).empty() && (options.remote == nullptr || rank == 0)) {
      return Failed(
          absl::StrCat("rank ", rank, " cannot run on ", peer_of(rank),
                       rank == 0 ? ": rank 0 runs on the leader" : ": this daemon has no peers"));
    }
    if (!peer_of(rank).empty()) remote_ranks.push_back(rank);
  }
  // A job taken up again: every rank resumes from the same bytes. Those here read them from
  // memory once; the ranks on peers get them from rank 0 through the group, checked there against
  // the SHA-256 their call carries.
  TrainingRun local = run;
  std::string checkpoint_sha256;
  if (!run.resume_from.empty()) {
    std::shared_ptr<const std::string> bytes = run.resume_bytes;
    if (bytes == nullptr) {
      absl::StatusOr<std::string> read = ReadFileToString(run.resume_from);
      if (!read.ok()) {
        return Failed(absl::StrCat("cannot read the checkpoint the ranks resume from: ",
                                   read.status().message()));
      }
      bytes = std::make_shared<const std::string>(*std::move(read));
    }
    local.resume_bytes = bytes;
    if (!remote_ranks.empty()) checkpoint_sha256 = Sha256Hex(*bytes);
  }
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host = RendezvousHost::Start(
      options.store_host, options.port_min, options.port_max, world, options.timeout);
  if (!host.ok()) return Failed(std::string(host.status().message()));
  // The group's prefix: the job and its attempt (one store per job, but a clear name in errors).
  const std::string prefix = options.group.empty() ? absl::StrCat("job-", run.spec.dataset, "-",
                                                                  next_group.fetch_add(1), "/1")
                                                   : options.group;
  std::vector<TrainingOutcome> outcomes(static_cast<size_t>(world));
  // [rank]: its peer went away (the call failed after it started, the daemon there stopped, or
  // it did not answer once the ranks here ended).
  std::vector<bool> lost(static_cast<size_t>(world), false);
  // [rank]: its call answered; [rank]: its call was cancelled because it did not answer in time.
  std::vector<bool> answered(static_cast<size_t>(world), false);
  std::vector<bool> silent(static_cast<size_t>(world), false);

  // The peers' ranks first: each call returns at once and reports its rank's end. One that cannot
  // start gives the meeting up, so that the ranks here fail at once naming it.
  std::mutex remote_mu;
  std::condition_variable remote_done;
  int remote_pending = 0;
  std::vector<std::unique_ptr<PeerRankCalls::Call>> calls(static_cast<size_t>(world));
  for (const int rank : remote_ranks) {
    const std::string peer = peer_of(rank);
    RemoteRankRequest request;
    request.spec = run.spec;
    request.job_id = options.job_id;
    request.rank = rank;
    request.world_size = world;
    request.store_host = options.store_host;
    request.store_port = (*host)->port();
    request.store_secret = (*host)->secret();
    request.prefix = prefix;
    request.timeout_seconds = absl::ToDoubleSeconds(options.timeout);
    request.dataset_sha256 = run.dataset->meta.sha256;
    if (local.resume_bytes != nullptr) {
      request.resume_bytes = static_cast<int64_t>(local.resume_bytes->size());
      request.resume_sha256 = checkpoint_sha256;
    }
    {
      std::lock_guard<std::mutex> lock(remote_mu);
      ++remote_pending;
    }
    RendezvousHost* store = host->get();
    calls[rank] =
        options.remote->StartRank(peer, request, [&, rank, peer, store](RemoteRankResult result) {
          TrainingOutcome outcome;
          bool went_away = false;
          outcome.state = result.state;
          outcome.error = result.error;
          outcome.steps = result.steps;
          outcome.collective_seconds = result.collective_seconds;
          if (!result.status.ok()) {
            outcome.state = JobState::kFailed;
            outcome.error = std::string(result.status.message());  // it names the peer
            store->Abort(prefix, absl::StrCat("rank ", rank, ": ", outcome.error));
            // Unreachable or cut off (not a refusal, which says the peer cannot run it at all).
            went_away = result.status.code() == absl::StatusCode::kUnavailable;
          } else if (outcome.state == JobState::kRunning) {
            went_away = true;  // its daemon stopped it
          } else if (outcome.state == JobState::kFailed) {
            outcome.error = absl::StrCat("on ", peer, ": ", outcome.error);
          }
          std::lock_guard<std::mutex> lock(remote_mu);
          // (vector<bool>'s bits share words: under the lock)
          lost[rank] = lost[rank] || went_away;
          answered[rank] = true;
          if (!silent[rank]) outcomes[rank] = std::move(outcome);
          --remote_pending;
          remote_done.notify_all();
        });
  }

  auto rank_main = [&](int rank) {
    GroupOptions group_options;
    group_options.store_host = options.store_host;
    group_options.store_port = (*host)->port();
    group_options.store_secret = (*host)->secret();
    group_options.prefix = prefix;
    group_options.rank = rank;
    group_options.world_size = world;
    group_options.timeout = options.timeout;
    group_options.interface_host = options.interface_host;
    GroupResume resume;
    if (rank == 0 && local.resume_bytes != nullptr) {
      resume.bytes = local.resume_bytes;
      resume.send_to = remote_ranks;
    }
    // The group is gone when this returns: a rank that ended early closes its connections, and
    // the others' next collective fails at once instead of waiting for the timeout.
    outcomes[rank] = RunJoinedRank(local, group_options, resume);
  };
  std::vector<std::thread> threads;
  for (int rank = 1; rank < world; ++rank) {
    if (peer_of(rank).empty()) threads.emplace_back(rank_main, rank);
  }
  rank_main(0);
  for (std::thread& t : threads) t.join();
  // The peers' ranks end with the job. Their answers (how and why they ended) come a moment
  // after the ranks here ended: the ranks ended together, or a rank here lost them, and they
  // lost it. A call that has not answered within the grace is cancelled, and its peer counts as
  // lost: its daemon is stopped (SIGSTOP), hung or cut off, which is to the job what a daemon
  // killed is. A quarter of the collective timeout, 1 to 5 seconds: the answer of a peer that
  // is there takes a round trip.
  const absl::Duration grace = std::clamp(options.timeout / 4, absl::Seconds(1), absl::Seconds(5));
  {
    std::unique_lock<std::mutex> lock(remote_mu);
    if (!remote_done.wait_for(lock, absl::ToChronoMilliseconds(grace),
                              [&] { return remote_pending == 0; })) {
      for (const int rank : remote_ranks) {
        if (answered[rank]) continue;
        silent[rank] = true;
        lost[rank] = true;
        outcomes[rank] = Failed(absl::StrCat(
            "peer ", peer_of(rank), " did not answer for its rank within the collective timeout (",
            absl::FormatDuration(options.timeout),
            ") and after: its daemon is stopped, hung or cut off"));
      }
      lock.unlock();
      for (const int rank : remote_ranks) {
        if (silent[rank]) calls[rank]->Cancel();
      }
      lock.lock();
    }
    remote_done.wait(lock, [&] { return remote_pending == 0; });
  }
  calls.clear();

  TrainingOutcome outcome = std::move(outcomes[0]);
  // The ranks agreed to stop for a reason this daemon did not give (a peer's daemon stopping, its
  // rank cancelled there): the job fails, naming that rank, rather than waiting to be taken up
  // again (an interrupt) or looking cancelled by its owner.
  const bool stopping_here = (run.interrupt != nullptr && run.interrupt->load()) ||
                             (run.drain != nullptr && run.drain->load());
  const bool cancelled_here = run.cancel != nullptr && run.cancel->load();
  if ((outcome.interrupted && !stopping_here) ||
      (outcome.state == JobState::kCancelled && !cancelled_here)) {
    outcome.interrupted = false;
    outcome.state = JobState::kFailed;
    outcome.error = "a rank on a peer stopped the job";
    for (int rank = 1; rank < world; ++rank) {
      const TrainingOutcome& other = outcomes[rank];
      if (peer_of(rank).empty() || other.state == JobState::kSucceeded) continue;
      outcome.error =
          absl::StrCat("rank ", rank, " on ", peer_of(rank), " stopped the job: ",
                       other.error.empty() ? std::string("it was cancelled there") : other.error);
      break;
    }
  }
  // The job succeeded only if every rank did: rank 0's model is the job's only when the others
  // trained the same steps beside it. A rank that failed (its checkpoint, its step) or that no
  // one heard from fails the job, naming it, however rank 0 ended.
  if (outcome.state == JobState::kSucceeded) {
    for (int rank = 1; rank < world; ++rank) {
      const TrainingOutcome& other = outcomes[rank];
      if (other.state == JobState::kSucceeded) continue;
      const std::string where = peer_of(rank).empty() ? std::string("here") : peer_of(rank);
      outcome.state = JobState::kFailed;
      outcome.model_archive.clear();
      outcome.state_dict.clear();
      outcome.error =
          absl::StrCat("rank ", rank, " (", where, ") did not finish with rank 0: ",
                       other.error.empty() ? std::string(JobStateName(other.state)) : other.error);
      break;
    }
  }
  if (outcome.state == JobState::kFailed) {
    for (int rank = 1; rank < world; ++rank) {
      if (!lost[rank]) continue;
      const std::string peer = peer_of(rank);
      if (outcome.lost_peer.empty()) outcome.lost_peer = peer;
      if (std::find(outcome.lost_peers.begin(), outcome.lost_peers.end(), peer) ==
          outcome.lost_peers.end()) {
        outcome.lost_peers.push_back(peer);
      }
    }
  }
  if (outcome.state == JobState::kFailed && LostTheOthers(outcome.error)) {
    // The first rank that failed for its own reason; a silent peer's rank before one that only
    // lost the others.
    for (int rank = 1; rank < world; ++rank) {
      const TrainingOutcome& other = outcomes[rank];
      if (other.state == JobState::kFailed && !LostTheOthers(other.error)) {
        outcome.error = absl::StrCat("rank ", rank, ": ", other.error);
        break;
      }
    }
  }
  return outcome;
}

}  // namespace trainerd::engine
