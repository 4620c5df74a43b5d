// How the daemon runs jobs, as its operator sets it (the flags of docs/CONFIGURATION.md): bound
// from the flags once into EngineOptions::jobs and handed unchanged to the JobManager, whose
// options extend it with what the engine supplies (folders, hooks, the record store, the peers).
// LibTorch-free, for the engine's options (engine.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "server/engine/torchscript/worker_options.h"

namespace trainerd::engine {

struct JobRunOptions {
  // Bounds the jobs waiting in all queues together (0 = no bound).
  int64_t max_queued_jobs = 0;
  // Jobs a device runs at once, each on a worker thread of its own (and on a GPU on a CUDA stream
  // of its own); 0: `cpu_cores` on the CPU (each job takes the intra-op threads its size asks for
  // from them and waits its turn when they are taken), 4 on a GPU.
  int32_t max_concurrent_jobs = 0;
  // The cores CPU jobs share (their intra-op threads together; the CPU's workers by default);
  // 0: UsableCores() (affinity mask and cgroup quota).
  int32_t cpu_cores = 0;
  // Intra-op threads of a CPU job (cpu_threads.h): 0 chooses each job's from its FLOPs per step
  // (one thread for a small model), N > 0 gives every CPU job N. Either way the CPU jobs running
  // together hold at most `cpu_cores` threads (each at least one). A GPU job's host side runs on
  // one thread: its operators run on the device.
  int32_t intra_op_threads = 0;
  // Jobs flush subnormal floats to zero on their threads (x86 FTZ/DAZ): subnormals cost up to 100x
  // per operation, and flushing changes only values below 1.2e-38 (cpu_threads.h).
  bool flush_denormal = true;
  // The nice value (0-19) CPU jobs train at, so that answering RPCs comes first when both want
  // the cores (cpu_threads.h, LowerThreadPriority); 0: the daemon's own priority.
  int32_t cpu_training_nice = 10;
  // > 0: a job keeps only its last N checkpoints (older files are deleted as new ones are
  // written); 0 keeps them all.
  int32_t keep_checkpoints = 0;
  // Retention of ended jobs (with a record store): beyond the newest `max_finished_jobs` (0 = no
  // bound), and those that ended more than `job_retention` ago (zero = kept), are deleted with
  // their models and checkpoints, after each job ends and at PruneEndedJobs.
  int64_t max_finished_jobs = 0;
  absl::Duration job_retention = absl::ZeroDuration();
  // TorchScript and exported-program jobs train in worker processes (trainerd-worker) started
  // with these options.
  WorkerOptions worker;
  // A submitted module's job time limit when its spec gives none (JobSpec::max_job_seconds);
  // zero: none (--max_job_time).
  absl::Duration max_job_time = absl::ZeroDuration();
  // Data-parallel jobs (RunDataParallel): how long the ranks may take to meet and any one
  // collective may wait for the others before the job fails naming the rank that did not come,
  // and this daemon's name in their placements (empty: the host name).
  absl::Duration collective_timeout = absl::Seconds(60);
  std::string node_name;
  // Where this daemon's rendezvous stores listen and its ranks' transport binds, which peers
  // must reach (--advertise_host), and the stores' port range (--rendezvous_ports; 0-0: any).
  std::string advertise_host = "127.0.0.1";
  int32_t rendezvous_port_min = 0;
  int32_t rendezvous_port_max = 0;
};

}  // namespace trainerd::engine
