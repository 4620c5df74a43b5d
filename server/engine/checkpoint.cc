#include "server/engine/checkpoint.h"

#include <filesystem>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/engine/log.h"
#include "server/engine/torchscript_export.h"

namespace trainerd::engine {

std::string CheckpointFileName(int32_t epoch) { return absl::StrFormat("epoch-%06d.pt", epoch); }

absl::StatusOr<int64_t> WriteCheckpoint(
    const std::string& path,
    const std::function<void(torch::serialize::OutputArchive&)>& save_model,
    const torch::optim::Optimizer& optimizer, int32_t epoch, uint64_t seed,
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
    meta.write("epoch", torch::tensor(static_cast<int64_t>(epoch), torch::kInt64));
    // The archive has no unsigned 64-bit scalar; the bits are kept as int64.
    meta.write("seed", torch::tensor(static_cast<int64_t>(seed), torch::kInt64));
    archive.write(kCheckpointMetaKey, meta);
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
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos) {
    // create_directories only: std::filesystem::remove_all misbehaves in binaries that link
    // LibTorch, and nothing here needs it.
    std::error_code ec;
    std::filesystem::create_directories(path.substr(0, slash), ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot create '", path.substr(0, slash), "': ", ec.message()));
    }
  }
  const absl::Status written = WriteModelArchive(path, bytes);
  if (!written.ok()) return written;
  return static_cast<int64_t>(bytes.size());
}

}  // namespace trainerd::engine
