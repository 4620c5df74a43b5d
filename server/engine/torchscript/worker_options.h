// How the daemon runs TorchScript jobs in worker processes (worker_launcher.h), and what it keeps
// of such a job's module. LibTorch-free, for the engine's options (engine.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/sandbox_report.h"
#include "server/engine/torchscript/sandbox_policy.h"

namespace trainerd::engine {

struct WorkerOptions {
  // The trainerd-worker program (absolute path). Empty: TorchScript jobs fail to start.
  std::string program;
  // How long a worker may take to stop after a cancel or an interrupt before it is killed.
  absl::Duration grace = absl::Seconds(5);
  // The worker's address space beyond its libraries and the job's datasets (RLIMIT_AS), in bytes;
  // 0: none. A GPU job (CUDA reserves address space far beyond its use) gets this many bytes of
  // heap (RLIMIT_DATA) and of device memory (LibTorch's CUDA allocator) instead.
  int64_t memory_limit_bytes = int64_t{8} << 30;
  // Workers kept started and warm per device (WorkerPool), so that a job's worker has already
  // loaded LibTorch and locked itself down when the job starts; each serves one job. 0: each job
  // starts its own.
  int pool = 1;
  // How long a worker may take to start LibTorch and lock itself down (kReady) before it is
  // killed and the job fails.
  absl::Duration start_timeout = absl::Seconds(120);
  // What a worker's sandbox must hold before it is sent the job and its module (sandbox_policy.h),
  // and where each worker's measured sandbox is published (optional; called on the job's thread).
  SandboxPolicy sandbox_policy;
  std::function<void(const SandboxReport&)> on_sandbox;
};

// The job's module and what the checker found; `checked` is false for a job taken up again after a
// restart (its module is checked again before its worker starts, off the serving path).
struct TorchScriptJob {
  std::string archive;
  int64_t parameter_count = 0;
  bool checked = true;
};

}  // namespace trainerd::engine
