// DatasetRegistry: the datasets and their residency (uploads committed, the budget, eviction,
// loads, a job's holds), under mu_; acquire_mu_ serialises AcquireForJob and share_mu_ the header
// rewrites. An upload in progress (DatasetUpload) is in dataset_upload.cc; the datasets' files in
// the data folder (where each lives, what a start finds there, their clocks) in dataset_folder.cc.
#include "server/engine/datasets/dataset_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dataset_header.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "server/engine/datasets/dataset_file.h"
#include "server/engine/datasets/shared_memory.h"
#include "server/engine/devices/device.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// Views `bytes` (uint8) as a tensor of `dtype` shaped [rows, shape...].
torch::Tensor ViewAs(const torch::Tensor& bytes, torch::ScalarType dtype, int64_t rows,
                     const std::vector<int64_t>& shape) {
  std::vector<int64_t> full = {rows};
  full.insert(full.end(), shape.begin(), shape.end());
  return bytes.view(dtype).view(full);
}

}  // namespace

void DatasetRegistry::SetInUse(std::function<bool(const std::string&)> in_use) {
  in_use_ = std::move(in_use);
}

int64_t DatasetRegistry::FreeLocked() const {
  if (budget_ <= 0) return std::numeric_limits<int64_t>::max();
  return budget_ - resident_bytes_ - reserved_bytes_ - loading_bytes_;
}

int64_t DatasetRegistry::HeldByRunningLocked() const {
  int64_t held = reserved_bytes_ + loading_bytes_;
  for (const auto& [name, entry] : datasets_) {
    if (entry.running > 0 && entry.resident != nullptr) held += entry.meta.size_bytes;
  }
  return held;
}

bool DatasetRegistry::MakeRoomLocked(int64_t bytes, const std::set<std::string>& keep) {
  int64_t free = FreeLocked();
  if (free >= bytes) return true;
  // Candidates: resident, held by no running job, not being loaded, not kept. Those no queued job
  // needs go first, least recently used first within each group.
  struct Candidate {
    bool needed;
    absl::Time last_used;
    std::string name;
  };
  std::vector<Candidate> candidates;
  for (const auto& [name, entry] : datasets_) {
    if (entry.resident == nullptr || entry.running > 0 || entry.loading || keep.count(name)) {
      continue;
    }
    candidates.push_back({in_use_ ? in_use_(name) : false, entry.meta.last_used, name});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.needed, a.last_used, a.name) < std::tie(b.needed, b.last_used, b.name);
  });
  size_t count = 0;
  int64_t freed = 0;
  while (free + freed < bytes && count < candidates.size()) {
    freed += datasets_.at(candidates[count].name).meta.size_bytes;
    ++count;
  }
  if (free + freed < bytes) return false;
  for (size_t i = 0; i < count; ++i) {
    Entry& entry = datasets_.at(candidates[i].name);
    entry.resident.reset();  // freed now: no job holds an idle dataset
    entry.meta.location = DatasetLocation::kDisk;
    resident_bytes_ -= entry.meta.size_bytes;
    ++evictions_;
    LogInfo(absl::StrCat("dataset '", candidates[i].name, "' evicted from ", DeviceName(device_),
                         " (", entry.meta.size_bytes,
                         " bytes) to make room; it loads again when used"));
  }
  return true;
}

int64_t DatasetRegistry::resident_bytes() const {
  absl::MutexLock lock(&mu_);
  return resident_bytes_;
}

int64_t DatasetRegistry::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_bytes_;
}

int64_t DatasetRegistry::evictions() const {
  absl::MutexLock lock(&mu_);
  return evictions_;
}

void DatasetRegistry::ReleaseName(const std::string& key) {
  absl::MutexLock lock(&mu_);
  reserved_.erase(key);
}

absl::Status DatasetRegistry::ReserveStaging(int64_t bytes, const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (max_staged_bytes_ > 0 && staged_bytes_ + bytes > max_staged_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dataset '%s': the uploads in progress already stage %d bytes and this one needs %d more; "
        "this daemon stages at most %d bytes at once (--max_upload_bytes_in_flight); retry when "
        "other uploads have finished",
        name, staged_bytes_, bytes, max_staged_bytes_));
  }
  staged_bytes_ += bytes;
  return absl::OkStatus();
}

void DatasetRegistry::ReleaseStaging(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  staged_bytes_ -= bytes;
}

int64_t DatasetRegistry::staged_bytes() const {
  absl::MutexLock lock(&mu_);
  return staged_bytes_;
}

absl::StatusOr<std::unique_ptr<DatasetUpload>> DatasetRegistry::BeginUpload(
    const DatasetHeader& header, const std::string& owner, bool peer_copy) {
  TRAINERD_ASSIGN_OR_RETURN(const DatasetLayout layout,
                            CheckDatasetHeader(header, max_dataset_bytes_));
  DatasetMeta meta;
  meta.name = header.name;
  meta.feature_shape = header.feature_shape;
  meta.target_shape = header.target_shape;
  meta.target_dtype = header.target_dtype;
  meta.rows = header.rows;
  meta.size_bytes = layout.total_bytes;
  meta.feature_bytes = layout.feature_bytes;
  meta.device = DeviceName(device_);
  meta.owner = owner;
  meta.peer_copy = peer_copy;
  const std::string key = DatasetKeyOf(meta);
  {
    absl::MutexLock lock(&mu_);
    if (datasets_.count(key) || reserved_.count(key)) {
      return absl::AlreadyExistsError(absl::StrCat("dataset '", header.name, "' already exists"));
    }
    // Refused before any byte arrives when it could not be resident even with every dataset
    // that no running job holds evicted.
    if (budget_ > 0) {
      const int64_t held = HeldByRunningLocked();
      if (meta.size_bytes > budget_ - held) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "dataset '%s' needs %d bytes on %s, but the device memory budget is %d bytes "
            "(--device_memory_budget) and running jobs hold %d of them; even with every idle "
            "dataset evicted at most %d bytes are free",
            meta.name, meta.size_bytes, DeviceName(device_), budget_, held,
            std::max<int64_t>(0, budget_ - held)));
      }
    }
    reserved_.insert(key);
  }
  // The owner's folder, before the upload's first bytes go to a file in it.
  if (const std::string folder = std::filesystem::path(PathFor(key)).parent_path().string();
      folder != dir_) {
    if (absl::Status made = MakeFoldersDurably(folder); !made.ok()) {
      ReleaseName(key);
      return made;
    }
  }
  return std::unique_ptr<DatasetUpload>(new DatasetUpload(this, std::move(meta), header.sha256));
}

absl::StatusOr<std::shared_ptr<const Dataset>> DatasetRegistry::MakeResident(
    const DatasetMeta& meta, const torch::Tensor& payload) {
  try {
    const int64_t fbytes = meta.feature_bytes;
    torch::Tensor fbytes_t = payload.narrow(0, 0, fbytes);
    torch::Tensor tbytes_t = payload.narrow(0, fbytes, meta.size_bytes - fbytes);
    auto dataset = std::make_shared<Dataset>();
    dataset->meta = meta;
    const torch::ScalarType tdtype =
        meta.target_dtype == TargetDType::kInt64 ? torch::kInt64 : torch::kFloat32;
    if (device_.is_cpu()) {
      // The staging buffer becomes the resident storage; the targets start at an offset that
      // need not be aligned for their dtype, so they get their own small buffer.
      dataset->features = ViewAs(fbytes_t, torch::kFloat32, meta.rows, meta.feature_shape);
      absl::StatusOr<torch::Tensor> targets =
          AllocateSharedHostBytes(tbytes_t.numel(), absl::StrCat(meta.name, "-targets"));
      if (!targets.ok()) return targets.status();
      targets->copy_(tbytes_t);
      dataset->targets = ViewAs(*targets, tdtype, meta.rows, meta.target_shape);
    } else {
      // The one host-to-device copy of this dataset's life.
      dataset->features =
          ViewAs(fbytes_t.to(device_), torch::kFloat32, meta.rows, meta.feature_shape);
      dataset->targets = ViewAs(tbytes_t.to(device_), tdtype, meta.rows, meta.target_shape);
      CountHostToDeviceBytes(meta.size_bytes);
    }
    return std::shared_ptr<const Dataset>(std::move(dataset));
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory on ", DeviceName(device_),
                                                     " while loading dataset '", meta.name, "' (",
                                                     meta.size_bytes, " bytes)"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot load dataset '", meta.name, "' onto ",
                                            DeviceName(device_), ": ", e.what()));
  }
}

absl::StatusOr<DatasetMeta> DatasetRegistry::Commit(std::unique_ptr<DatasetUpload> upload) {
  DatasetMeta meta = upload->meta_;
  const std::string key = DatasetKeyOf(meta);
  const auto cancelled_error = [&] {
    return absl::CancelledError(
        absl::StrCat("the upload of dataset '", meta.name, "' was cancelled; nothing was kept"));
  };
  if (upload->cancelled_->load()) return cancelled_error();
  if (upload->received_ != meta.size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("dataset '%s': received %d payload bytes; the header declares %d (%d rows)",
                        meta.name, upload->received_, meta.size_bytes, meta.rows));
  }
  // Whatever the last chunk left unchecked or unwritten (nothing, when the stream ended with it).
  TRAINERD_RETURN_IF_ERROR(upload->CheckReceived(/*all=*/true));
  TRAINERD_RETURN_IF_ERROR(upload->WriteReceived(/*all=*/true));
  meta.sha256 = upload->sha256_.HexDigest();
  if (!upload->expected_sha256_.empty() && upload->expected_sha256_ != meta.sha256) {
    return absl::DataLossError(absl::StrCat("dataset '", meta.name, "': the payload's sha256 is ",
                                            meta.sha256, "; the header says ",
                                            upload->expected_sha256_));
  }
  if (meta.target_dtype == TargetDType::kInt64 && upload->target_min_ <= upload->target_max_) {
    meta.target_min = upload->target_min_;
    meta.target_max = upload->target_max_;
  }
  TRAINERD_ASSIGN_OR_RETURN(const torch::Tensor staging, upload->Gather());
  meta.create_time = absl::Now();
  // The header goes into the room kept for it; then the file becomes the dataset's.
  const std::string header = DatasetFileHeaderText(meta);
  if (static_cast<int64_t>(header.size()) != upload->header_bytes_) {
    return absl::InternalError(absl::StrCat("dataset '", meta.name, "': its file header takes ",
                                            header.size(), " bytes, not the ",
                                            upload->header_bytes_, " kept for it"));
  }
  TRAINERD_RETURN_IF_ERROR(WriteAt(upload->file_->get(), upload->tmp_path_, header, 0));
  TRAINERD_RETURN_IF_ERROR(SyncAndRename(upload->file_->get(), upload->tmp_path_, PathFor(key)));
  upload->file_.reset();  // renamed: nothing for the destructor to remove
  // Resident when it fits the budget (evicting idle datasets); else kept on disk only, loaded
  // when a job needs it. The file is durable either way.
  bool room = false;
  {
    absl::MutexLock lock(&mu_);
    room = MakeRoomLocked(meta.size_bytes, {});
    if (room) loading_bytes_ += meta.size_bytes;
  }
  absl::StatusOr<std::shared_ptr<const Dataset>> resident = absl::UnavailableError("no room");
  if (room) resident = MakeResident(meta, staging);
  absl::MutexLock lock(&mu_);
  if (room) loading_bytes_ -= meta.size_bytes;
  if (room && !resident.ok() && !absl::IsResourceExhausted(resident.status())) {
    std::remove(PathFor(key).c_str());
    return resident.status();
  }
  // The last moment to honour a cancellation: after this the dataset is visible.
  if (upload->cancelled_->load()) {
    std::remove(PathFor(key).c_str());
    return cancelled_error();
  }
  reserved_.erase(key);
  upload->committed_ = true;
  Entry& entry = datasets_[key];
  entry.meta = meta;
  entry.meta.last_used = absl::Now();
  entry.copy_used = entry.meta.last_used;
  if (resident.ok()) {
    entry.resident = *std::move(resident);
    entry.meta.location = DatasetLocation::kDevice;
    resident_bytes_ += meta.size_bytes;
  } else {
    entry.meta.location = DatasetLocation::kDisk;
    LogInfo(absl::StrCat(
        "dataset '", key, "' kept on disk only: ",
        room ? resident.status().message() : "it does not fit the device memory budget now"));
  }
  return entry.meta;
}

absl::StatusOr<std::shared_ptr<const Dataset>> DatasetRegistry::LoadFile(const DatasetMeta& meta) {
  const std::string path = PathFor(DatasetKeyOf(meta));
  TRAINERD_ASSIGN_OR_RETURN(const DatasetFileHeader header, ReadDatasetFileHeader(path));
  if (header.meta.size_bytes != meta.size_bytes || header.meta.sha256 != meta.sha256) {
    return absl::DataLossError(
        absl::StrCat("dataset file '", path, "' no longer matches dataset '", meta.name, "'"));
  }
  torch::Tensor staging;
  try {
    if (device_.is_cpu()) {
      absl::StatusOr<torch::Tensor> shared = AllocateSharedHostBytes(meta.size_bytes, meta.name);
      if (!shared.ok()) throw std::bad_alloc();
      staging = *std::move(shared);
    } else {
      staging = torch::empty({meta.size_bytes},
                             torch::TensorOptions(torch::kUInt8).pinned_memory(device_.is_cuda()));
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("no host memory to load dataset '", meta.name,
                                                     "' (", meta.size_bytes, " bytes)"));
  }
  TRAINERD_RETURN_IF_ERROR(ReadDatasetPayload(path, header, staging.data_ptr(), meta.size_bytes));
  return MakeResident(meta, staging);
}

void DatasetRegistry::Preload() {
  std::vector<DatasetMeta> on_disk;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : datasets_) {
      if (entry.resident == nullptr && !entry.loading) on_disk.push_back(entry.meta);
    }
  }
  std::sort(on_disk.begin(), on_disk.end(), [](const DatasetMeta& a, const DatasetMeta& b) {
    return a.create_time > b.create_time;
  });
  for (const DatasetMeta& meta : on_disk) {
    {
      absl::MutexLock lock(&mu_);
      auto it = datasets_.find(DatasetKeyOf(meta));
      if (it == datasets_.end() || it->second.resident != nullptr || it->second.loading) continue;
      if (meta.size_bytes > FreeLocked()) continue;  // preloading never evicts
      it->second.loading = true;
      loading_bytes_ += meta.size_bytes;
    }
    absl::StatusOr<std::shared_ptr<const Dataset>> loaded = LoadFile(meta);
    {
      absl::MutexLock lock(&mu_);
      loading_bytes_ -= meta.size_bytes;
      auto it = datasets_.find(DatasetKeyOf(meta));
      // Only into the dataset that was loaded: one deleted and uploaded again under its name
      // meanwhile is another dataset, with tensors (and a loading flag) of its own.
      if (it == datasets_.end() || it->second.meta.create_time != meta.create_time ||
          it->second.meta.sha256 != meta.sha256) {
        continue;
      }
      it->second.loading = false;
      if (loaded.ok()) {
        it->second.resident = *std::move(loaded);
        it->second.meta.location = DatasetLocation::kDevice;
        resident_bytes_ += meta.size_bytes;
        continue;
      }
    }
    LogWarning(absl::StrCat("cannot preload dataset '", DatasetKeyOf(meta),
                            "': ", loaded.status().message()));
    if (absl::IsDataLoss(loaded.status())) Forget(meta, loaded.status());
  }
}

absl::StatusOr<JobDatasets> DatasetRegistry::AcquireForJob(const std::string& job_id,
                                                           const std::string& dataset,
                                                           const std::string& validation_dataset,
                                                           int64_t working_set_bytes,
                                                           const torch::Device& job_device) {
  std::vector<std::string> names = {dataset};
  if (!validation_dataset.empty() && validation_dataset != dataset) {
    names.push_back(validation_dataset);
  }
  const int64_t working = job_device == device_ ? std::max<int64_t>(0, working_set_bytes) : 0;
  // One acquisition at a time: two jobs never load the same dataset twice.
  std::lock_guard<std::mutex> one_at_a_time(acquire_mu_);
  std::vector<DatasetMeta> to_load;
  {
    absl::MutexLock lock(&mu_);
    int64_t load_bytes = 0;
    for (const std::string& name : names) {
      auto it = datasets_.find(name);
      if (it == datasets_.end()) {
        return absl::NotFoundError(absl::StrCat("dataset '", name, "' not found"));
      }
      // Another job may be loading it right now: it then counts as resident to be.
      if (it->second.resident == nullptr && !it->second.loading) {
        load_bytes += it->second.meta.size_bytes;
      }
    }
    const int64_t need = working + load_bytes;
    if (!MakeRoomLocked(need, std::set<std::string>(names.begin(), names.end()))) {
      const int64_t held = HeldByRunningLocked();
      const std::string numbers = absl::StrFormat(
          "the job needs %d bytes on %s (a working set of about %d and %d to load its datasets), "
          "but the device memory budget is %d bytes (--device_memory_budget) and running jobs "
          "hold %d of them",
          need, DeviceName(device_), working, load_bytes, budget_, held);
      if (holds_.empty()) return absl::ResourceExhaustedError(numbers);
      return absl::UnavailableError(numbers);
    }
    Hold& hold = holds_[job_id];
    hold.bytes = working;
    hold.datasets = names;
    reserved_bytes_ += working;
    for (const std::string& name : names) {
      Entry& entry = datasets_.at(name);
      ++entry.running;
      entry.meta.last_used = absl::Now();
      if (entry.resident == nullptr && !entry.loading) {
        entry.loading = true;
        loading_bytes_ += entry.meta.size_bytes;
        to_load.push_back(entry.meta);
      }
    }
  }
  absl::Status failed = absl::OkStatus();
  for (const DatasetMeta& meta : to_load) {
    absl::StatusOr<std::shared_ptr<const Dataset>> loaded = LoadFile(meta);
    absl::MutexLock lock(&mu_);
    loading_bytes_ -= meta.size_bytes;
    Entry& entry = datasets_.at(DatasetKeyOf(meta));  // not deleted: a job uses it
    entry.loading = false;
    if (!loaded.ok()) {
      failed = absl::Status(loaded.status().code(),
                            absl::StrCat("cannot load dataset '", meta.name, "' onto ",
                                         DeviceName(device_), ": ", loaded.status().message()));
      continue;
    }
    entry.resident = *std::move(loaded);
    entry.meta.location = DatasetLocation::kDevice;
    resident_bytes_ += meta.size_bytes;
  }
  if (!failed.ok()) {
    ReleaseJob(job_id);
    for (const DatasetMeta& meta : to_load) {
      if (absl::IsDataLoss(failed)) Forget(meta, failed);
    }
    return failed;
  }
  // A dataset Preload was loading when this job came: wait until it is there.
  while (true) {
    bool failed_elsewhere = false;
    std::optional<JobDatasets> out;
    {
      absl::MutexLock lock(&mu_);
      bool ready = true;
      for (const std::string& name : names) {
        const Entry& entry = datasets_.at(name);
        if (entry.resident != nullptr) continue;
        ready = false;
        failed_elsewhere = failed_elsewhere || !entry.loading;
      }
      if (ready) {
        out.emplace();
        out->dataset = datasets_.at(dataset).resident;
        if (!validation_dataset.empty()) {
          out->validation_dataset = datasets_.at(validation_dataset).resident;
        }
      }
    }
    if (out.has_value()) {
      // Its last use, kept as its file's time for a restart; a copy for peers is in use: its
      // clock starts again.
      Touch(names, /*copies_only=*/false);
      return *std::move(out);
    }
    if (failed_elsewhere) {
      ReleaseJob(job_id);
      return absl::UnavailableError("a dataset of the job failed to preload; trying again");
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void DatasetRegistry::ReleaseJob(const std::string& job_id) {
  std::vector<std::string> held;
  {
    absl::MutexLock lock(&mu_);
    auto it = holds_.find(job_id);
    if (it == holds_.end()) return;
    reserved_bytes_ -= it->second.bytes;
    for (const std::string& name : it->second.datasets) {
      auto entry = datasets_.find(name);
      if (entry != datasets_.end() && entry->second.running > 0) --entry->second.running;
    }
    held = std::move(it->second.datasets);
    holds_.erase(it);
  }
  // A copy for peers is idle from now on: its clock starts at the end of its last job.
  TouchCopies(held);
}

absl::StatusOr<DatasetMeta> DatasetRegistry::GetMeta(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = datasets_.find(key);
  if (it == datasets_.end()) {
    return absl::NotFoundError(absl::StrCat("dataset '", key, "' not found"));
  }
  return it->second.meta;
}

std::vector<DatasetMeta> DatasetRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<DatasetMeta> out;
  out.reserve(datasets_.size());
  for (const auto& [name, entry] : datasets_) out.push_back(entry.meta);
  return out;
}

int64_t DatasetRegistry::uploads_in_progress() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(reserved_.size());
}

absl::StatusOr<DatasetMeta> DatasetRegistry::SetShared(const std::string& key, bool shared) {
  std::lock_guard<std::mutex> sharing(share_mu_);
  absl::Time created;
  {
    absl::MutexLock lock(&mu_);
    auto it = datasets_.find(key);
    if (it == datasets_.end()) {
      return absl::NotFoundError(absl::StrCat("dataset '", key, "' not found"));
    }
    if (it->second.meta.shared == shared) return it->second.meta;
    created = it->second.meta.create_time;
  }
  // The file first: a restart must not forget what the caller was told.
  TRAINERD_ASSIGN_OR_RETURN(DatasetFileHeader header, ReadDatasetFileHeader(PathFor(key)));
  if (header.meta.create_time != created) {
    return absl::AbortedError(absl::StrCat("dataset '", key, "' was replaced meanwhile"));
  }
  header.meta.shared = shared;
  TRAINERD_RETURN_IF_ERROR(RewriteDatasetFileHeader(PathFor(key), header));
  absl::MutexLock lock(&mu_);
  auto it = datasets_.find(key);
  if (it == datasets_.end() || it->second.meta.create_time != created) {
    return absl::AbortedError(absl::StrCat("dataset '", key, "' was deleted meanwhile"));
  }
  it->second.meta.shared = shared;
  LogInfo(absl::StrCat("dataset '", key, "' is ", shared ? "shared" : "no longer shared"));
  return it->second.meta;
}

absl::Status DatasetRegistry::Delete(const std::string& key) {
  std::shared_ptr<const Dataset> doomed;  // freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = datasets_.find(key);
    if (it == datasets_.end()) {
      return absl::NotFoundError(absl::StrCat("dataset '", key, "' not found"));
    }
    doomed = std::move(it->second.resident);
    if (doomed != nullptr) resident_bytes_ -= it->second.meta.size_bytes;
    datasets_.erase(it);
    // The name stays reserved until the file is gone, so that a new upload of the same name
    // cannot write its file before this removal deletes it.
    reserved_.insert(key);
  }
  if (std::remove(PathFor(key).c_str()) != 0 && errno != ENOENT) {
    LogWarning(
        absl::StrCat("cannot remove the file of dataset '", key, "': ", std::strerror(errno)));
  }
  ReleaseName(key);
  return absl::OkStatus();
}

}  // namespace trainerd::engine
