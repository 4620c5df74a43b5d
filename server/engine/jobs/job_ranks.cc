// JobManager's data-parallel half: a job with replicas run as its ranks (RunRanks: threads here
// and ranks on peers, jobs/job_runner.cc calls it), taken up without a peer it lost
// (TakeUpWithoutPeer), and a peer's side: a rank of another daemon's job admitted here
// (RunPeerRank). Apart from job_runner.cc, which runs every job.
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
  parallel.remote = options_.peers.get();
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

absl::StatusOr<TrainingOutcome> JobManager::RunPeerRank(const PeerRank& rank,
                                                        const TrainPeerRank& train) {
  if (!options_.hooks.acquire) {
    return absl::FailedPreconditionError("this daemon cannot hold datasets for a peer's rank");
  }
  // What the acquire hook reads of a job: the rank's datasets on the CPU (ranks on GPUs are not
  // wired), and its working set.
  JobSnapshot as_job;
  as_job.id = rank.holder;
  as_job.device = "cpu";
  as_job.spec.dataset = rank.dataset;
  as_job.spec.validation_dataset = rank.validation_dataset;
  as_job.estimated_memory_bytes = rank.reserve_bytes;
  absl::StatusOr<JobDatasets> held;
  while (true) {
    if (peer_ranks_stop_.load()) return absl::UnavailableError("this daemon is stopping");
    held = options_.hooks.acquire(as_job);
    if (held.ok() || !absl::IsUnavailable(held.status())) break;
    if (absl::Now() >= rank.wait_until || (rank.cancel != nullptr && rank.cancel->load())) break;
    // Woken when a job gives memory back; a cancel or a stop is seen within 200 ms.
    absl::MutexLock lock(&mu_);
    memory_released_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
  }
  if (!held.ok()) return held.status();
  cpu_threads_.Take(1);
  {
    absl::MutexLock lock(&mu_);
    peer_ranks_[rank.holder] = rank.leader;
  }
  // Whatever way the rank ends: unlisted, its datasets and its thread given back.
  class Admitted {
   public:
    Admitted(JobManager& jobs, std::string holder) : jobs_(jobs), holder_(std::move(holder)) {}
    Admitted(const Admitted&) = delete;
    Admitted& operator=(const Admitted&) = delete;
    ~Admitted() {
      {
        absl::MutexLock lock(&jobs_.mu_);
        jobs_.peer_ranks_.erase(holder_);
      }
      jobs_.ReleaseResources(holder_, 1);
    }

   private:
    JobManager& jobs_;
    const std::string holder_;
  };
  Admitted admitted(*this, rank.holder);
  return train(*held, peer_ranks_stop_);
}

std::vector<std::string> JobManager::PeerRanks() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [holder, leader] : peer_ranks_) {
    out.push_back(absl::StrCat(holder, " for ", leader));
  }
  return out;
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
        rank = RankPlacement{rank.rank, snap.device, node};
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
