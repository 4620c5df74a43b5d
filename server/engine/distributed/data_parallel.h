// A data-parallel job (JobSpec::replicas) led by this process: its ranks as threads here on the
// CPU, and with JobSpec::nodes also ranks on peer daemons (PeerRankCalls, peers.h), all
// meeting at a store this process hosts and training with RunRank (training/trainer.h) through one
// Gloo group. The job manager calls it for a job with replicas (jobs/job_runner.cc); a peer's
// side of a rank is RunJoinedRank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_limits.h"
#include "server/engine/distributed/collectives.h"
#include "server/engine/distributed/peers.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

// Runs `run` as run.spec.replicas ranks (threads of this process, rank 0 on the calling thread)
// and returns the job's outcome: rank 0's, or the failure of the rank that failed first for its
// own reason (named "rank R: ...") when the others only lost it. `timeout` bounds the ranks'
// meeting and every collective: a rank that fails or hangs ends the others within it. Never
// throws. `group` names the job and its attempt in the store's keys and in errors ("job-…/2");
// empty: a name unique in this process. The outcome's collective_seconds are rank 0's.
TrainingOutcome RunDataParallel(const TrainingRun& run, absl::Duration timeout = absl::Seconds(60),
                                const std::string& group = "");

// Where a job's ranks meet and run.
struct DataParallelOptions {
  // Bounds the meeting and every collective (--collective_timeout).
  absl::Duration timeout = absl::Seconds(60);
  // "<job id>/<attempt>": the prefix of the group's keys; empty: one unique in this process.
  std::string group;
  std::string job_id;
  // The rendezvous store: the address it listens on and the ranks reach it at (this daemon's
  // --advertise_host), and its port range (0-0: the kernel's choice, --rendezvous_ports).
  std::string store_host = "127.0.0.1";
  int port_min = 0;
  int port_max = 0;
  // The address this process's ranks' Gloo transport binds and tells the others.
  std::string interface_host = "127.0.0.1";
  // peers[r], when there and not empty: the peer (of remote's) that runs rank r; the others run
  // here as threads. Rank 0 always runs here (it reports, checkpoints and exports).
  std::vector<std::string> peers;
  PeerRankCalls* remote = nullptr;
};

// The checkpoint a job's ranks resume from, as one rank's part in handing it round the group:
// every rank resumes from the leader's very bytes (torchelastic restarts every worker from one
// checkpoint; DDP hands rank 0's model to the others through the group), or the job fails.
struct GroupResume {
  // Rank 0: the checkpoint, sent to each rank of `send_to` (the ranks on peers) over the group
  // after the meeting, before the first step.
  std::shared_ptr<const std::string> bytes;
  std::vector<int> send_to;
  // A rank on a peer: the size and SHA-256 (lower-case hex) the leader said in its authenticated
  // call. The size was checked against MostCheckpointBytes before this rank reserved its memory;
  // what arrives is checked against the SHA-256 before any of it is parsed. 0: the job starts
  // from its first epoch.
  int64_t expect_bytes = 0;
  std::string expect_sha256;
};

// The most bytes a checkpoint of a job shaped `estimate` with `layers` layers may have: its
// parameters and optimizer state (a checkpoint holds nothing else of size), once more for the
// archive's own records, and 1 MiB with 64 KiB per layer for names and framing. A peer refuses a
// rank whose leader declares more.
absl::StatusOr<int64_t> MostCheckpointBytes(const MemoryEstimate& estimate, size_t layers);

// One rank of a job led by another daemon (a peer's side of PeerService.RunRank): joins the group
// `group` describes, takes its part in handing the checkpoint round (`resume`), and trains as
// RunRank does, silent (rank 0 reports). Never throws.
TrainingOutcome RunJoinedRank(const TrainingRun& run, const GroupOptions& group,
                              const GroupResume& resume = {});

// The group a peer's rank joins and the checkpoint it expects from rank 0, as the leader's
// request says; `interface_host` is the address the rank's Gloo device binds (the peer's
// --advertise_host; empty: GroupOptions' loopback default).
struct JoinedGroup {
  GroupOptions group;
  GroupResume resume;
};
JoinedGroup JoinedGroupOf(const RemoteRankRequest& request, const std::string& interface_host);

// As above, with ranks on peers: their calls start first; one that cannot start (the peer is
// down, refuses the credentials or the dataset) gives the meeting up, and the job fails at once
// naming the rank, the peer and the reason; a peer's rank that fails during the job ends the
// others' next collective. A job taken up from a checkpoint (run.resume_from) hands its bytes to
// the ranks on peers through the group (GroupResume). The job succeeds only when every rank
// says it did: a rank that failed (or never answered) fails the job, naming it. A peer whose
// call does not answer within a grace after the ranks here ended (a daemon stopped, SIGSTOP, or
// cut off) is lost, as one killed is (outcome.lost_peer), and the error names the rank, the peer
// and the collective timeout. Every peer's rank has ended, or its call was cancelled, when this
// returns.
TrainingOutcome RunDataParallel(const TrainingRun& run, const DataParallelOptions& options);

}  // namespace trainerd::engine
