// Training checkpoints (JobSpec::checkpoint_every): one archive per checkpoint with everything a
// later resume needs, written atomically under <data_dir>/checkpoints/<job-id>/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include <torch/torch.h>

namespace trainerd::engine {

// The folder under the data folder that holds one sub-folder of checkpoints per job. Job.checkpoints
// lists paths relative to the data folder, so they start with this.
inline constexpr char kCheckpointsFolder[] = "checkpoints";

// "epoch-000010.pt": zero-padded so that a folder listing sorts by epoch (resume picks the last).
std::string CheckpointFileName(int32_t epoch);

// The archive's top-level entries. A checkpoint is a torch::serialize::OutputArchive holding
// three sub-archives: kCheckpointModelKey (Module::save: parameters and buffers by name),
// kCheckpointOptimizerKey (Optimizer::save: per-parameter state and the param groups' options) and
// kCheckpointMetaKey (int64 scalars "epoch" and "seed", the seed's 64 bits stored as int64).
inline constexpr char kCheckpointModelKey[] = "model";
inline constexpr char kCheckpointOptimizerKey[] = "optimizer";
inline constexpr char kCheckpointMetaKey[] = "meta";
// fp16 jobs only: LossScaler::Save (float32 "scale", int32 "growth_tracker"), so that a resumed
// job keeps its settled scale instead of overflowing its way down from 2^16 again.
inline constexpr char kCheckpointLossScalerKey[] = "loss_scaler";

// Serialises `model`, `optimizer`, `epoch` and `seed` into one archive and writes it to `path`
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
    const torch::optim::Optimizer& optimizer, int32_t epoch, uint64_t seed,
    const std::function<void(torch::serialize::OutputArchive&)>& save_loss_scaler = nullptr);

}  // namespace trainerd::engine
