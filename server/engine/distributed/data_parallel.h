// A data-parallel job (JobSpec::replicas) led by this process: its ranks as threads here on the
// CPU, and with JobSpec::nodes also ranks on peer daemons (RemoteRanks, remote_ranks.h), all
// meeting at a store this process hosts and training with RunRank (training/trainer.h) through one
// Gloo group. The job manager calls it for a job with replicas (jobs/job_runner.cc); a peer's
// side of a rank is RunJoinedRank.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/engine/distributed/collectives.h"
#include "server/engine/remote_ranks.h"
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
  RemoteRanks* remote = nullptr;
};

// One rank of a job led by another daemon (a peer's side of PeerService.RunRank): joins the group
// `group` describes and trains as RunRank does, silent (rank 0 reports). Never throws.
TrainingOutcome RunJoinedRank(const TrainingRun& run, const GroupOptions& group);

// As above, with ranks on peers: their calls start first; one that cannot start (the peer is
// down, refuses the credentials or the dataset) gives the meeting up, and the job fails at once
// naming the rank, the peer and the reason; a peer's rank that fails during the job ends the
// others' next collective. Every peer's rank has ended when this returns.
TrainingOutcome RunDataParallel(const TrainingRun& run, const DataParallelOptions& options);

}  // namespace trainerd::engine
