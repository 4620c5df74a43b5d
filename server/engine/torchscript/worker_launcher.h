// A TorchScript job's run in a worker process of its own (trainerd-worker, server/worker/): the
// daemon's side. The module is code from a caller, so it never runs in the daemon: the worker
// loads and trains it under its sandbox (server/worker/sandbox.h) on the same epoch loop and
// TrainingPath as a job run in-process (RunTraining), with the job's datasets mapped read-only
// from the daemon's shared memory (shared_memory.h), and reports over a socketpair
// (worker_protocol.h). The daemon stays the only writer of records, checkpoints and models: the
// worker sends each checkpoint's bytes and the trained model, and the daemon writes them.
//
// A cancel, a drain or an interrupt is first asked of the worker; one that does not end within
// the grace period is killed (SIGKILL), as is one that runs past the job's time limit. A worker
// that crashes, is killed, exceeds a limit or breaks the protocol fails only its job, with the
// reason; the daemon goes on.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/torchscript/worker_options.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

// A started trainerd-worker that has no job yet: it warms LibTorch up on its device and locks
// itself down meanwhile, then waits for one (kStart). The descriptors are the daemon's ends.
struct WorkerProcess {
  pid_t pid = -1;
  int socket = -1;  // the socketpair's daemon end
  int output = -1;  // the worker's standard output and error
  std::string device;
};

// Starts workers and keeps WorkerOptions::pool of them idle per device, so that a job's worker is
// warm when the job starts. A worker serves one job and exits: a process that ran one caller's
// code never runs another's. Idle workers die with the pool (and with the daemon: they have
// PR_SET_PDEATHSIG). Thread-safe.
class WorkerPool {
 public:
  explicit WorkerPool(WorkerOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  const WorkerOptions& options() const { return options_; }
  // A worker for `device` ("cpu", "cuda:0"): an idle one when it is still alive, else a new one.
  // INTERNAL when no process can be started. The caller owns the result's process and
  // descriptors.
  absl::StatusOr<WorkerProcess> Take(const std::string& device);
  // Starts an idle worker for `device` when the pool has fewer than WorkerOptions::pool: called
  // once a job's worker has ended, so that warming up never competes with a running job.
  void Refill(const std::string& device);

 private:
  absl::StatusOr<WorkerProcess> Spawn(const std::string& device) const;
  const WorkerOptions options_;
  std::mutex mu_;
  std::map<std::string, std::vector<WorkerProcess>> idle_;  // guarded by mu_
};

// RunTraining's contract for a TorchScript job (run.torchscript is not used; `module` is the
// archive), in a worker taken from `pool`: the callbacks run on the calling thread as the worker's
// messages arrive, the flags are read every 100 ms. `max_time` > 0 bounds the worker's running
// time. Never throws. `job_id` names the job in the log. `worker_start_seconds` gets the time from
// taking the worker to its being ready (near 0 for a warm one).
TrainingOutcome RunTrainingInWorker(const TrainingRun& run, const std::string& job_id,
                                    const TorchScriptJob& module, absl::Duration max_time,
                                    WorkerPool& pool, double* worker_start_seconds);

}  // namespace trainerd::engine
