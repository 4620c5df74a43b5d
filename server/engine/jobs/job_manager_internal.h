// What the files of JobManager (job_manager.cc, job_queue.cc, job_runner.cc, job_ranks.cc,
// job_events.cc, job_records.cc) share: small helpers of the engine's job bookkeeping. Not for use
// outside JobManager.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "server/engine/types.h"

namespace trainerd::engine::job_internal {

// A copy of `snap` without its epochs and parameters (epochs_completed says how many): what
// listings and the store's per-state records need, at a cost that does not grow with the job.
JobSnapshot SummaryOf(JobSnapshot& snap);

// Removes a file, quietly when it is already gone; logs other failures.
void RemoveFile(const std::string& path);

// What an exception says, for logs and a failed job's error.
std::string ExceptionText(const std::exception_ptr& e);

// Where TorchScript jobs' modules are kept, under the data folder.
inline constexpr char kModulesFolder[] = "modules";

// The queue a job waits in: its device's, or its peer's ("peer HOST:PORT").
inline std::string QueueOf(const JobSnapshot& snap) {
  return snap.spec.runs_on_peer() ? "peer " + snap.spec.peer : snap.device;
}

}  // namespace trainerd::engine::job_internal
