// JobManager's data-parallel half: a job with replicas run as its ranks (RunRanks: threads here
// and ranks on peers, jobs/job_runner.cc calls it), and taken up without a peer it lost
// (TakeUpWithoutPeer). Apart from job_runner.cc, which runs every job.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "server/engine/distributed/data_parallel.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"

namespace trainerd::engine {

namespace job_internal {

std::string PeerOfRank(const std::vector<std::string>& nodes, int32_t rank) {
  if (nodes.empty()) return "";
  const size_t slot = static_cast<size_t>(rank) % (nodes.size() + 1);
  return slot == 0 ? "" : nodes[slot - 1];
}

}  // namespace job_internal

namespace {

bool IsLost(const TrainingOutcome& failed, const std::string& peer) {
  return !peer.empty() && std::find(failed.lost_peers.begin(), failed.lost_peers.end(), peer) !=
                              failed.lost_peers.end();
}

}  // namespace

TrainingOutcome JobManager::RunRanks(const std::shared_ptr<Record>& shared, TrainingRun* run,
                                     int threads, int32_t attempt,
                                     std::vector<std::string> rank_peers) {
  auto here = [](const std::vector<std::string>& peers) {
    return std::max<int32_t>(1, static_cast<int32_t>(std::count(peers.begin(), peers.end(), "")));
  };
  run->intra_op_threads = std::max(1, threads / here(rank_peers));
  DataParallelOptions parallel;
  parallel.timeout = options_.collective_timeout;
  // The store's keys and the errors name the job and its attempt: a job taken up again after a
  // restart meets under a prefix of its own.
  parallel.group = absl::StrCat(shared->snap.id, "/", attempt);
  parallel.job_id = shared->snap.id;
  parallel.store_host = options_.advertise_host;
  parallel.interface_host = options_.advertise_host;
  parallel.port_min = options_.rendezvous_port_min;
  parallel.port_max = options_.rendezvous_port_max;
  parallel.peers = std::move(rank_peers);
  parallel.remote = options_.remote_ranks.get();
  TrainingOutcome outcome = RunDataParallel(*run, parallel);
  // Peers went away mid-job (killed, cut off, stopping, stalled): once, as torchrun restarts a
  // job, the job goes on from its last checkpoint with every lost peer's ranks here, under the
  // next attempt's prefix; without a checkpoint it fails, naming the rank and the first peer.
  if (outcome.state == JobState::kFailed && !outcome.lost_peers.empty() && !shared->cancel.load() &&
      TakeUpWithoutPeer(shared, outcome, run)) {
    for (std::string& peer : parallel.peers) {
      if (IsLost(outcome, peer)) peer.clear();
    }
    run->intra_op_threads = std::max(1, threads / here(parallel.peers));
    parallel.group = absl::StrCat(shared->snap.id, "/", attempt + 1);
    outcome = RunDataParallel(*run, parallel);
  }
  return outcome;
}

bool JobManager::TakeUpWithoutPeer(const std::shared_ptr<Record>& shared,
                                   const TrainingOutcome& failed, TrainingRun* run) {
  Record* record = shared.get();
  std::vector<CheckpointInfo> checkpoints;
  {
    absl::MutexLock lock(&mu_);
    checkpoints = record->snap.checkpoints;
  }
  // The newest checkpoint whose file is there and still matches its checksum, as a restart takes.
  ResumePoint point;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    const std::string path = absl::StrCat(options_.data_dir, "/", it->path);
    absl::StatusOr<std::string> bytes = ReadFileToString(path);
    if (!bytes.ok() || (!it->sha256.empty() && Sha256Hex(*bytes) != it->sha256)) continue;
    point.checkpoint_path = path;
    point.epoch = it->epoch;
    break;
  }
  if (point.checkpoint_path.empty()) return false;
  const int32_t from = point.epoch;
  if (store_ != nullptr) {
    if (absl::Status erased = store_->DeleteEpochsAfter(record->snap.id, from); !erased.ok()) {
      LogWarning(absl::StrCat("job '", record->snap.id, "': ", erased.message()));
      return false;
    }
  }
  const std::string node = NodeName(options_.node_name);
  Publish(record, JobEvent{}, [&](JobSnapshot& snap) {
    snap.epochs.erase(std::remove_if(snap.epochs.begin(), snap.epochs.end(),
                                     [from](const EpochResult& e) { return e.epoch > from; }),
                      snap.epochs.end());
    snap.checkpoints.erase(
        std::remove_if(snap.checkpoints.begin(), snap.checkpoints.end(),
                       [from](const CheckpointInfo& c) { return c.epoch > from; }),
        snap.checkpoints.end());
    snap.epochs_completed = from;
    snap.final_loss = snap.epochs.empty() ? 0.0 : snap.epochs.back().loss;
    snap.restarts.push_back(JobRestart{absl::Now(), from, JobState::kRunning});
    for (RankPlacement& rank : snap.ranks) {
      if (IsLost(failed, rank.node)) {
        rank = RankPlacement{rank.rank, snap.device, node, "", "", 0};
      }
    }
  });
  const std::vector<std::string>& lost = failed.lost_peers;
  LogWarning(absl::StrCat("job '", record->snap.id, "' lost its peer", lost.size() > 1 ? "s " : " ",
                          absl::StrJoin(lost, ", "), " (", failed.error,
                          "); it goes on from the checkpoint of epoch ", from, " with ",
                          lost.size() > 1 ? "those peers'" : "that peer's", " ranks here"));
  run->resume_from = point.checkpoint_path;
  return true;
}

}  // namespace trainerd::engine
