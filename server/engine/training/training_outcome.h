// What a job's run came to (RunTraining's result, trainer.h): LibTorch-free, so that a worker
// process's report of it can cross the daemon-worker protocol (worker_protocol.h) as the struct
// itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sandbox_report.h"
#include "server/engine/types.h"

namespace trainerd::engine {

struct TrainingOutcome {
  JobState state = JobState::kFailed;  // kSucceeded, kFailed or kCancelled
  // Stopped by `drain` or `interrupt`: the job is not over (state stays kRunning) and resumes
  // from its last checkpoint.
  bool interrupted = false;
  // A resumed job: the steps taken before this run (from the checkpoint), included in `steps`.
  int64_t resumed_steps = 0;
  std::string error;  // kFailed: a sentence
  int64_t steps = 0;
  int64_t host_syncs = 0;
  int32_t epochs_done = 0;
  bool stopped_early = false;  // kSucceeded after fewer than spec.epochs (early stopping)
  std::string stop_reason;     // with stopped_early: why (JobSnapshot::stop_reason)
  // The epoch whose weights model_archive holds (kSucceeded: the last epoch, or the best when the
  // job hands back its best, JobSpec::model_from), and the best validation epoch (0 without
  // validation).
  int32_t model_epoch = 0;
  int32_t best_epoch = 0;
  double final_loss = 0.0;
  double wall_seconds = 0.0;
  int64_t parameter_count = 0;
  std::vector<ParameterValues> parameters;  // when parameter_count <= kMaxReportedParameters
  // Where the time went (DeviceReport): start to the first step; the epoch loop (first step to
  // the end of the last epoch); the device-to-host copies (all of them, and those inside the
  // loop); checkpoint writing. Bytes the job copied to its device (a dataset resident
  // elsewhere), and a CUDA device's allocator peak while the job ran less what was allocated
  // when it started (0 on the CPU).
  double data_seconds = 0.0;
  double loop_seconds = 0.0;
  double host_transfer_seconds = 0.0;
  double loop_host_transfer_seconds = 0.0;
  double checkpoint_seconds = 0.0;
  int64_t host_to_device_bytes = 0;
  int64_t peak_memory_bytes = 0;
  // The path the steps ran on ("fused" or "libtorch") and, for engine auto on LibTorch, why the
  // fused path could not take the job.
  std::string engine;
  std::string engine_reason;
  // A member of a pack (RunPackedTraining): whether its values are those of the same job run
  // alone to the last bit, and in a sentence what its path does about that
  // (DeviceReport.packed_numerics). Unset for a job alone.
  bool packed_bitwise = false;
  std::string packed_numerics;
  // kSucceeded: the trained model as a TorchScript archive (ExportTorchScript), which the job
  // manager writes to the models folder; empty otherwise.
  std::string model_archive;
  // kSucceeded: the same model's state_dict as a safetensors file (state_dict.h), written beside
  // the archive; empty otherwise.
  std::string state_dict;
  // A data-parallel job: rank 0's seconds inside collectives (in loop_seconds).
  double collective_seconds = 0.0;
  // A data-parallel job that failed because peers went away (killed, cut off, stopping, stalled):
  // the first of them (lost_peer, which its error names) and every one of them, in rank order
  // without repeats (lost_peers), so that the job may go on from its last checkpoint without them.
  // Empty otherwise.
  std::string lost_peer;
  std::vector<std::string> lost_peers;
  // A job run in a worker process (a TorchScript job): the sandbox that worker got, as measured
  // before it was sent the job (sandbox_report.h).
  std::optional<SandboxReport> worker_sandbox;
};

}  // namespace trainerd::engine
