// Training checkpoints (JobSpec::checkpoint_every): one archive per checkpoint with everything a
// later resume needs, written atomically under <data_dir>/checkpoints/<job-id>/.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd::engine {

// The folder under the data folder that holds one sub-folder of checkpoints per job.
// Job.checkpoints lists paths relative to the data folder, so they start with this.
inline constexpr char kCheckpointsFolder[] = "checkpoints";

// "epoch-000010.pt": zero-padded so that a folder listing sorts by epoch (resume picks the last).
std::string CheckpointFileName(int32_t epoch);

// The archive's top-level entries. A checkpoint is a torch::serialize::OutputArchive (the file
// torch::save writes: a ZIP of TorchScript's serialisation, which torch.jit.load and
// torch.load's TorchScript reader open) holding three sub-archives: kCheckpointModelKey (Module::save: parameters and buffers by name),
// kCheckpointOptimizerKey (Optimizer::save: per-parameter state, step counters included, and the
// param groups' options) and kCheckpointMetaKey (the LoopState below, scalars by name).
inline constexpr char kCheckpointModelKey[] = "model";
inline constexpr char kCheckpointOptimizerKey[] = "optimizer";
inline constexpr char kCheckpointMetaKey[] = "meta";
// fp16 jobs only: LossScaler::Save (float32 "scale", int32 "growth_tracker"), so that a resumed
// job keeps its settled scale instead of overflowing its way down from 2^16 again.
inline constexpr char kCheckpointLossScalerKey[] = "loss_scaler";
// Jobs that hand back their best epoch: that epoch's parameters and buffers (LoopState::best_model),
// named "0", "1", ... in the path's ModelTensors() order; the meta's "best_model_tensors" counts
// them.
inline constexpr char kCheckpointBestModelKey[] = "best_model";
// A sanity bound on that count before anything is read (a model has far fewer tensors).
inline constexpr int64_t kMaxCheckpointBestTensors = int64_t{1} << 20;

// What a job's future depends on besides its model, optimizer and loss scaler: with them, a job
// resumed from epoch k trains exactly as if it had never stopped.
struct LoopState {
  int32_t epoch = 0;           // the last finished epoch (1-based)
  uint64_t seed = 0;           // the job's seed (kept as int64 bits: the archive has no uint64)
  int64_t steps = 0;           // optimizer steps taken so far
  int64_t host_syncs = 0;      // device-to-host copies so far
  double elapsed_seconds = 0;  // running time so far, earlier runs of the job included
  double loss = 0;             // the mean training loss of `epoch`
  // The job's generator on its device (at::Generator::get_state) at the end of `epoch`: the next
  // epoch's shuffle and dropout masks draw from it. Undefined in checkpoints of older builds.
  torch::Tensor generator_state;
  // Early stopping: the best value so far of the metric it watches (JobSpec.early_stop_metric:
  // the validation loss, +inf before any; or the validation accuracy, -inf before any; the other
  // field keeps its initial value) and the epochs since it last improved (by more than
  // early_stop_min_delta). Checkpoints without "best_validation_accuracy" read it as -inf.
  double best_validation_loss = 0;
  double best_validation_accuracy = -std::numeric_limits<double>::infinity();
  int32_t epochs_without_improvement = 0;
  // The best validation epoch so far (0: none, or a checkpoint of an older build) and, for a job
  // that hands back its best epoch (JobSpec::model_from), that epoch's weights: the path's
  // ModelTensors() in their order, on the job's device (kCheckpointBestModelKey; empty when the
  // job keeps none, or in checkpoints of older builds).
  int32_t best_epoch = 0;
  std::vector<torch::Tensor> best_model;
  // Schedule plateau (ReduceLROnPlateau): its rate, best validation loss, epochs since it and
  // cooldown epochs left after `epoch`. Absent (plateau_rate 0) in other jobs' checkpoints.
  double plateau_rate = 0;
  double plateau_best = 0;
  int32_t plateau_bad_epochs = 0;
  int32_t plateau_cooldown_left = 0;
};

// Where checkpoint files go and come from. In the daemon, the file system (the default). A worker
// process (server/worker/), which may write no file, sends each checkpoint's bytes to the daemon,
// which alone writes them, and reads the one it resumes from out of what the daemon sent it.
// Process-wide: set once, before any job runs.
struct CheckpointFiles {
  std::function<absl::Status(const std::string& path, const std::string& bytes)> write;
  std::function<absl::StatusOr<std::string>(const std::string& path)> read;
};
void SetCheckpointFiles(CheckpointFiles files);

// Serialises `model`, `optimizer` and `state` into one archive and writes it to `path`
// atomically (temporary file, fsync, rename, fsync of the folder; the folder and its parents are
// created when missing). Returns the file's size. Device tensors are copied to the host by the
// archive; the caller counts that as one host synchronisation off the CPU. Never throws: LibTorch
// and file errors become INTERNAL with the reason.
// `save_model` writes the model's part: Module::save for a spec-built model; for a TorchScript
// module its parameters and buffers under their flat names ("fc.weight"). `save_loss_scaler`, when
// set, writes the kCheckpointLossScalerKey part.
absl::StatusOr<int64_t> WriteCheckpoint(
    const std::string& path,
    const std::function<void(torch::serialize::OutputArchive&)>& save_model,
    const torch::optim::Optimizer& optimizer, const LoopState& state,
    const std::function<void(torch::serialize::OutputArchive&)>& save_loss_scaler = nullptr);

// The reverse, for a resume: reads `path` (its tensors onto `device`) into a model, optimizer and
// loss scaler already built for the job, through `load_model` and `load_loss_scaler` (set when the
// job has one), and returns the loop state. With `bytes`, the checkpoint is those bytes (already
// in memory: a data-parallel rank's), and `path` only names it. Never throws: a missing, damaged
// or mismatched checkpoint is FAILED_PRECONDITION naming the file and the reason.
absl::StatusOr<LoopState> ReadCheckpoint(
    const std::string& path, const torch::Device& device,
    const std::function<void(torch::serialize::InputArchive&)>& load_model,
    torch::optim::Optimizer& optimizer,
    const std::function<void(torch::serialize::InputArchive&)>& load_loss_scaler = nullptr,
    const std::string* bytes = nullptr);

}  // namespace trainerd::engine
