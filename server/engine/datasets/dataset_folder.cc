// DatasetRegistry's data folder (dataset_registry.h): where each dataset's file lives (its
// owner's folder), what a start finds there (LoadFromDisk: damaged files set aside, an older
// layout's files moved to their owners' folders), and the files' modification times as the
// datasets' clocks (their last use, a copy for peers' idle time), which a restart reads back.
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/datasets/dataset_file.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/devices/device.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// Renames a damaged dataset file to *.damaged (kept for a person to look at) and says so.
void QuarantineFile(const std::string& path, const absl::Status& why) {
  std::error_code ec;
  std::filesystem::rename(path, path + ".damaged", ec);
  LogWarning(absl::StrCat("skipping dataset file: ", why.message(),
                          ec ? "; cannot rename it to " : "; renamed to ", path, ".damaged",
                          ec ? absl::StrCat(": ", ec.message()) : ""));
}

}  // namespace

std::string OwnerFolder(const std::string& owner) {
  std::string out;
  for (size_t i = 0; i < owner.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(owner[i]);
    const bool plain = absl::ascii_isalnum(c) || c == '@' || c == '=' || c == ',' || c == '+' ||
                       c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  // A file name is at most 255 bytes: a long owner's folder is its start and a digest ('~' is
  // always escaped above, so the two forms never meet).
  if (out.size() > 128) out = absl::StrCat(out.substr(0, 64), "~", Sha256Hex(owner));
  return out;
}

std::string DatasetRegistry::PathFor(const std::string& key) const {
  const DatasetKeyParts parts = SplitDatasetKey(key);
  if (parts.owner.empty()) return absl::StrCat(dir_, "/", parts.name, kDatasetFileExtension);
  return absl::StrCat(dir_, "/", OwnerFolder(parts.owner), "/", parts.name, kDatasetFileExtension);
}

void DatasetRegistry::TouchCopies(const std::vector<std::string>& keys) {
  Touch(keys, /*copies_only=*/true);
}

void DatasetRegistry::Touch(const std::vector<std::string>& keys, bool copies_only) {
  const absl::Time now = absl::Now();
  std::vector<std::string> paths;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& key : keys) {
      auto it = datasets_.find(key);
      if (it == datasets_.end()) continue;
      if (it->second.meta.peer_copy) {
        it->second.copy_used = now;
      } else if (copies_only) {
        continue;
      }
      paths.push_back(PathFor(key));
    }
  }
  // The file's modification time is the clock a restart reads back (LoadFromDisk).
  for (const std::string& path : paths) {
    if (::utimensat(AT_FDCWD, path.c_str(), nullptr, 0) != 0) {
      LogWarning(absl::StrCat("cannot set the time of '", path, "': ", std::strerror(errno)));
    }
  }
}

std::vector<DatasetMeta> DatasetRegistry::IdleCopies(absl::Duration idle, absl::Time now) const {
  std::vector<DatasetMeta> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, entry] : datasets_) {
    if (entry.meta.peer_copy && entry.running == 0 && !entry.loading &&
        now - entry.copy_used >= idle) {
      out.push_back(entry.meta);
    }
  }
  return out;
}

void DatasetRegistry::Forget(const DatasetMeta& meta, const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    auto it = datasets_.find(DatasetKeyOf(meta));
    // Only the dataset that was loaded: not one uploaded again under its name meanwhile.
    if (it == datasets_.end() || it->second.meta.sha256 != meta.sha256 ||
        it->second.resident != nullptr) {
      return;
    }
    datasets_.erase(it);
  }
  QuarantineFile(PathFor(DatasetKeyOf(meta)), why);
}

void DatasetRegistry::RegisterFromDisk(const std::string& path, const DatasetMeta& meta) {
  absl::Time modified = meta.create_time;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) modified = absl::TimeFromTimespec(st.st_mtim);
  absl::MutexLock lock(&mu_);
  Entry& record = datasets_[DatasetKeyOf(meta)];
  record.meta = meta;
  record.meta.device = DeviceName(device_);
  record.meta.location = DatasetLocation::kDisk;
  // The file's time: when a job last took it (or a copy's job gave it back), or when it was
  // written.
  record.meta.last_used = modified;
  record.copy_used = modified;  // a copy's clock: set when it was made and whenever it is used
}

absl::Status DatasetRegistry::LoadFromDisk(
    const std::function<absl::Status(const DatasetRenames&)>& before_move) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create dataset folder '", dir_, "': ", ec.message()));
  }
  // A dataset file's header, checked to be the file PathFor names; a damaged or misplaced one is
  // set aside.
  auto read = [&](const std::filesystem::path& file) -> std::optional<DatasetMeta> {
    const std::string path = file.string();
    std::error_code file_ec;
    if (file.extension() != kDatasetFileExtension) {
      if (file.extension() == ".tmp") std::filesystem::remove(file, file_ec);
      return std::nullopt;
    }
    absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path);
    if (!header.ok()) {
      QuarantineFile(path, header.status());
      return std::nullopt;
    }
    return header->meta;
  };
  auto misplaced = [&](const std::string& path) {
    QuarantineFile(path, absl::DataLossError(absl::StrCat("dataset file '", path,
                                                          "' does not match its name or owner")));
  };
  // Files of the layout before names were per owner (every dataset in this folder) that have an
  // owner: moved into their owner's folder below.
  std::vector<std::pair<std::string, DatasetMeta>> flat;
  // `ec` reports only the folders' listings: a file that cannot be removed or renamed is logged
  // and skipped, never a reason to refuse to start.
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    std::error_code type_ec;
    if (entry.is_directory(type_ec)) {
      // An owner's folder: its datasets, each checked to be its owner's.
      std::error_code folder_ec;
      for (const auto& file : std::filesystem::directory_iterator(entry.path(), folder_ec)) {
        std::optional<DatasetMeta> meta = read(file.path());
        if (!meta.has_value()) continue;
        if (!ValidateDatasetName(meta->name).ok() || meta->owner.empty() ||
            PathFor(DatasetKeyOf(*meta)) != file.path().string()) {
          misplaced(file.path().string());
          continue;
        }
        // Registered from its header only: the payload is read (and its checksum checked) when a
        // job first needs it, or by Preload, so that the daemon serves at once.
        RegisterFromDisk(file.path().string(), *meta);
      }
      if (folder_ec) {
        LogWarning(absl::StrCat("cannot read dataset folder '", entry.path().string(),
                                "': ", folder_ec.message()));
      }
      continue;
    }
    std::optional<DatasetMeta> meta = read(entry.path());
    if (!meta.has_value()) continue;
    const std::string path = entry.path().string();
    if (!ValidateDatasetName(meta->name).ok() || PathFor(meta->name) != path) {
      misplaced(path);
      continue;
    }
    if (!meta->owner.empty()) {
      flat.emplace_back(path, *std::move(meta));
      continue;
    }
    RegisterFromDisk(path, *meta);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read dataset folder '", dir_, "': ", ec.message()));
  }
  if (flat.empty()) return absl::OkStatus();
  // The job records that name these datasets by their old names first (before_move rewrites them
  // as keys), then the files: a crash in between moves them at the next start, the records
  // already rewritten (a key is not an old name, so a second rewrite changes nothing).
  DatasetRenames renames;
  for (const auto& [path, meta] : flat) renames[meta.name] = DatasetKeyOf(meta);
  if (before_move) TRAINERD_RETURN_IF_ERROR(before_move(renames));
  for (const auto& [path, meta] : flat) {
    const std::string target = PathFor(DatasetKeyOf(meta));
    std::error_code exists_ec;
    if (std::filesystem::exists(target, exists_ec)) {
      LogWarning(absl::StrCat("dataset file '", path, "' is not moved to '", target,
                              "', which exists; it is left where it is and not served"));
      continue;
    }
    absl::Status moved = MakeFoldersDurably(std::filesystem::path(target).parent_path().string());
    if (moved.ok() && std::rename(path.c_str(), target.c_str()) != 0) {
      moved = FileError(errno, "cannot rename", path);
    }
    if (moved.ok()) moved = SyncParentFolder(target);
    if (moved.ok()) moved = SyncParentFolder(path);
    if (!moved.ok()) {
      LogWarning(absl::StrCat("dataset '", meta.name, "' of ", meta.owner,
                              " is not served: ", moved.message()));
      continue;
    }
    LogInfo(absl::StrCat("dataset '", meta.name, "' moved into the folder of its owner, ",
                         meta.owner, " (dataset names are per owner)"));
    RegisterFromDisk(target, meta);
  }
  return absl::OkStatus();
}

}  // namespace trainerd::engine
