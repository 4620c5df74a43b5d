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

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "server/engine/trainer.h"
#include "server/engine/worker_options.h"

namespace trainerd::engine {

// RunTraining's contract for a TorchScript job (run.torchscript is not used; `module` is the
// archive): the callbacks run on the calling thread as the worker's messages arrive, the flags are
// read every 100 ms. `max_time` > 0 bounds the worker's running time. Never throws. `job_id` names
// the job in the log. `worker_start_seconds` gets the time to the worker's first message.
TrainingOutcome RunTrainingInWorker(const TrainingRun& run, const std::string& job_id,
                                    const TorchScriptJob& module, absl::Duration max_time,
                                    const WorkerOptions& options, double* worker_start_seconds);

}  // namespace trainerd::engine
