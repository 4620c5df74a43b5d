#include "server/engine/training/checkpoint.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "server/engine/log.h"
#include "server/engine/training/torchscript_export.h"

namespace trainerd::engine {

namespace {

CheckpointFiles& Files() {
  static auto* files = new CheckpointFiles;
  return *files;
}

}  // namespace

void SetCheckpointFiles(CheckpointFiles files) { Files() = std::move(files); }

std::string CheckpointFileName(int32_t epoch) { return absl::StrFormat("epoch-%06d.pt", epoch); }

absl::StatusOr<int64_t> WriteCheckpoint(
    const std::string& path,
    const std::function<void(torch::serialize::OutputArchive&)>& save_model,
    const torch::optim::Optimizer& optimizer, const LoopState& state,
    const std::function<void(torch::serialize::OutputArchive&)>& save_loss_scaler) {
  std::string bytes;
  try {
    // Model and optimizer in one file, as LibTorch's own examples keep them together: a resume
    // needs both from the same step, and one rename publishes both at once.
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive model_archive;
    save_model(model_archive);
    archive.write(kCheckpointModelKey, model_archive);
    torch::serialize::OutputArchive optimizer_archive;
    optimizer.save(optimizer_archive);
    archive.write(kCheckpointOptimizerKey, optimizer_archive);
    torch::serialize::OutputArchive meta;
    meta.write("epoch", torch::tensor(static_cast<int64_t>(state.epoch), torch::kInt64));
    // The archive has no unsigned 64-bit scalar; the bits are kept as int64.
    meta.write("seed", torch::tensor(static_cast<int64_t>(state.seed), torch::kInt64));
    meta.write("steps", torch::tensor(state.steps, torch::kInt64));
    meta.write("host_syncs", torch::tensor(state.host_syncs, torch::kInt64));
    meta.write("elapsed_seconds", torch::tensor(state.elapsed_seconds, torch::kFloat64));
    meta.write("loss", torch::tensor(state.loss, torch::kFloat64));
    meta.write("best_validation_loss", torch::tensor(state.best_validation_loss, torch::kFloat64));
    meta.write("best_validation_accuracy",
               torch::tensor(state.best_validation_accuracy, torch::kFloat64));
    meta.write(
        "epochs_without_improvement",
        torch::tensor(static_cast<int64_t>(state.epochs_without_improvement), torch::kInt64));
    if (state.generator_state.defined()) meta.write("generator", state.generator_state);
    meta.write("best_epoch", torch::tensor(static_cast<int64_t>(state.best_epoch), torch::kInt64));
    if (!state.best_model.empty()) {
      meta.write("best_model_tensors",
                 torch::tensor(static_cast<int64_t>(state.best_model.size()), torch::kInt64));
    }
    if (state.plateau_rate > 0) {
      meta.write("plateau_rate", torch::tensor(state.plateau_rate, torch::kFloat64));
      meta.write("plateau_best", torch::tensor(state.plateau_best, torch::kFloat64));
      meta.write("plateau_bad_epochs",
                 torch::tensor(static_cast<int64_t>(state.plateau_bad_epochs), torch::kInt64));
      meta.write("plateau_cooldown_left",
                 torch::tensor(static_cast<int64_t>(state.plateau_cooldown_left), torch::kInt64));
    }
    archive.write(kCheckpointMetaKey, meta);
    if (!state.best_model.empty()) {
      torch::serialize::OutputArchive best_archive;
      for (size_t k = 0; k < state.best_model.size(); ++k) {
        best_archive.write(std::to_string(k), state.best_model[k]);
      }
      archive.write(kCheckpointBestModelKey, best_archive);
    }
    if (save_loss_scaler) {
      torch::serialize::OutputArchive scaler_archive;
      save_loss_scaler(scaler_archive);
      archive.write(kCheckpointLossScalerKey, scaler_archive);
    }
    // Serialised in memory first so that the file itself is written by the one atomic writer.
    std::ostringstream out;
    archive.save_to(out);
    bytes = std::move(out).str();
  } catch (const std::exception& e) {
    return absl::InternalError(FirstLineOf(e));
  }
  if (Files().write) {
    const absl::Status sent = Files().write(path, bytes);
    if (!sent.ok()) return sent;
    return static_cast<int64_t>(bytes.size());
  }
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos) {
    // New folders durable in their parents, as the file will be in its folder.
    TRAINERD_RETURN_IF_ERROR(MakeFoldersDurably(path.substr(0, slash)));
  }
  const absl::Status written = WriteModelArchive(path, bytes);
  if (!written.ok()) return written;
  return static_cast<int64_t>(bytes.size());
}

absl::StatusOr<LoopState> ReadCheckpoint(
    const std::string& path, const torch::Device& device,
    const std::function<void(torch::serialize::InputArchive&)>& load_model,
    torch::optim::Optimizer& optimizer,
    const std::function<void(torch::serialize::InputArchive&)>& load_loss_scaler,
    const std::string* bytes) {
  LoopState state;
  try {
    torch::serialize::InputArchive archive;
    if (bytes != nullptr) {
      archive.load_from(bytes->data(), bytes->size(), device);
    } else if (Files().read) {
      absl::StatusOr<std::string> bytes = Files().read(path);
      if (!bytes.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot resume from checkpoint '", path, "': ", bytes.status().message()));
      }
      std::istringstream in(*bytes);
      archive.load_from(in, device);
    } else {
      archive.load_from(path, device);
    }
    torch::serialize::InputArchive model_archive;
    archive.read(kCheckpointModelKey, model_archive);
    load_model(model_archive);
    torch::serialize::InputArchive optimizer_archive;
    archive.read(kCheckpointOptimizerKey, optimizer_archive);
    optimizer.load(optimizer_archive);
    if (load_loss_scaler) {
      torch::serialize::InputArchive scaler_archive;
      archive.read(kCheckpointLossScalerKey, scaler_archive);
      load_loss_scaler(scaler_archive);
    }
    torch::serialize::InputArchive meta;
    archive.read(kCheckpointMetaKey, meta);
    auto read_int = [&](const char* key) {
      torch::Tensor value;
      meta.read(key, value);
      return value.to(torch::kCPU).item<int64_t>();
    };
    auto read_double = [&](const char* key) {
      torch::Tensor value;
      meta.read(key, value);
      return value.to(torch::kCPU).item<double>();
    };
    state.epoch = static_cast<int32_t>(read_int("epoch"));
    state.seed = static_cast<uint64_t>(read_int("seed"));
    state.steps = read_int("steps");
    state.host_syncs = read_int("host_syncs");
    state.elapsed_seconds = read_double("elapsed_seconds");
    state.loss = read_double("loss");
    state.best_validation_loss = read_double("best_validation_loss");
    state.epochs_without_improvement = static_cast<int32_t>(read_int("epochs_without_improvement"));
    torch::Tensor best_accuracy;
    if (meta.try_read("best_validation_accuracy", best_accuracy)) {
      state.best_validation_accuracy = best_accuracy.to(torch::kCPU).item<double>();
    }
    torch::Tensor best_epoch;
    if (meta.try_read("best_epoch", best_epoch)) {
      state.best_epoch = static_cast<int32_t>(best_epoch.to(torch::kCPU).item<int64_t>());
    }
    torch::Tensor best_count;
    if (meta.try_read("best_model_tensors", best_count)) {
      const int64_t count = best_count.to(torch::kCPU).item<int64_t>();
      if (count < 0 || count > kMaxCheckpointBestTensors) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot resume from checkpoint '", path, "': it names ", count, " best-epoch tensors"));
      }
      torch::serialize::InputArchive best_archive;
      archive.read(kCheckpointBestModelKey, best_archive);
      for (int64_t k = 0; k < count; ++k) {
        torch::Tensor value;
        best_archive.read(std::to_string(k), value);
        state.best_model.push_back(value);
      }
    }
    torch::Tensor generator;
    if (meta.try_read("generator", generator)) state.generator_state = generator.to(torch::kCPU);
    torch::Tensor plateau_rate;
    if (meta.try_read("plateau_rate", plateau_rate)) {
      state.plateau_rate = plateau_rate.to(torch::kCPU).item<double>();
      state.plateau_best = read_double("plateau_best");
      state.plateau_bad_epochs = static_cast<int32_t>(read_int("plateau_bad_epochs"));
      state.plateau_cooldown_left = static_cast<int32_t>(read_int("plateau_cooldown_left"));
    }
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot resume from checkpoint '", path, "': ", FirstLineOf(e)));
  }
  return state;
}

}  // namespace trainerd::engine
