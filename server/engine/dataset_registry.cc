#include "server/engine/dataset_registry.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dataset_header.h"
#include "common/status_macros.h"
#include "server/engine/dataset_file.h"
#include "server/engine/device.h"
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

DatasetUpload::DatasetUpload(DatasetRegistry* registry, DatasetMeta meta,
                             std::string expected_sha256)
    : registry_(registry), meta_(std::move(meta)), expected_sha256_(std::move(expected_sha256)) {}

DatasetUpload::~DatasetUpload() {
  blocks_.clear();
  registry_->ReleaseStaging(capacity_);
  if (!committed_) registry_->ReleaseName(meta_.name);
}

absl::Status DatasetUpload::AddBlock() {
  const int64_t size = std::min(kStagingBlockBytes, meta_.size_bytes - capacity_);
  TRAINERD_RETURN_IF_ERROR(registry_->ReserveStaging(size, meta_.name));
  try {
    blocks_.push_back(torch::empty({size}, torch::kUInt8));
  } catch (const std::exception& e) {
    registry_->ReleaseStaging(size);
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                     " bytes of staging memory for dataset '",
                                                     meta_.name, "'"));
  }
  capacity_ += size;
  return absl::OkStatus();
}

absl::Status DatasetUpload::Append(std::string_view chunk) {
  if (static_cast<int64_t>(chunk.size()) > meta_.size_bytes - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset '", meta_.name, "': the payload is larger than the header declares (",
        meta_.size_bytes, " bytes for ", meta_.rows, " rows)"));
  }
  sha256_.Update(chunk);
  while (!chunk.empty()) {
    if (received_ == capacity_) TRAINERD_RETURN_IF_ERROR(AddBlock());
    // The block holding byte received_: every block but the last is kStagingBlockBytes long.
    torch::Tensor& block = blocks_[received_ / kStagingBlockBytes];
    const int64_t offset = received_ % kStagingBlockBytes;
    const int64_t n = std::min<int64_t>(block.numel() - offset, chunk.size());
    std::memcpy(static_cast<char*>(block.data_ptr()) + offset, chunk.data(), n);
    chunk.remove_prefix(n);
    received_ += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> DatasetUpload::Gather() {
  torch::Tensor all;
  try {
    all = torch::empty({meta_.size_bytes},
                       torch::TensorOptions(torch::kUInt8)
                           .pinned_memory(registry_->device().is_cuda()));
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", meta_.size_bytes,
                                                     " bytes to gather dataset '", meta_.name,
                                                     "'"));
  }
  int64_t offset = 0;
  for (torch::Tensor& block : blocks_) {
    std::memcpy(static_cast<char*>(all.data_ptr()) + offset, block.data_ptr(), block.numel());
    offset += block.numel();
    block = torch::Tensor();  // freed now, so the peak stays one block over the payload
  }
  blocks_.clear();
  registry_->ReleaseStaging(capacity_);
  capacity_ = 0;
  return all;
}

DatasetRegistry::DatasetRegistry(std::string dir, torch::Device device, int64_t max_dataset_bytes,
                                 int64_t max_staged_bytes)
    : dir_(std::move(dir)),
      device_(device),
      max_dataset_bytes_(max_dataset_bytes),
      max_staged_bytes_(max_staged_bytes) {}

std::string DatasetRegistry::PathFor(const std::string& name) const {
  return absl::StrCat(dir_, "/", name, kDatasetFileExtension);
}

void DatasetRegistry::ReleaseName(const std::string& name) {
  absl::MutexLock lock(&mu_);
  reserved_.erase(name);
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
    const DatasetHeader& header, const std::string& owner) {
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
  {
    absl::MutexLock lock(&mu_);
    if (datasets_.count(header.name) || reserved_.count(header.name)) {
      return absl::AlreadyExistsError(absl::StrCat("dataset '", header.name, "' already exists"));
    }
    reserved_.insert(header.name);
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
      dataset->targets = ViewAs(tbytes_t.clone(), tdtype, meta.rows, meta.target_shape);
    } else {
      // The one host-to-device copy of this dataset's life.
      dataset->features = ViewAs(fbytes_t.to(device_), torch::kFloat32, meta.rows,
                                 meta.feature_shape);
      dataset->targets = ViewAs(tbytes_t.to(device_), tdtype, meta.rows, meta.target_shape);
      CountHostToDeviceBytes(meta.size_bytes);
    }
    return std::shared_ptr<const Dataset>(std::move(dataset));
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory on ", DeviceName(device_), " while loading dataset '", meta.name, "' (",
        meta.size_bytes, " bytes)"));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot load dataset '", meta.name, "' onto ", DeviceName(device_), ": ",
                     e.what()));
  }
}

absl::StatusOr<DatasetMeta> DatasetRegistry::Commit(std::unique_ptr<DatasetUpload> upload) {
  DatasetMeta meta = upload->meta_;
  const auto cancelled_error = [&] {
    return absl::CancelledError(
        absl::StrCat("the upload of dataset '", meta.name, "' was cancelled; nothing was kept"));
  };
  if (upload->cancelled_->load()) return cancelled_error();
  if (upload->received_ != meta.size_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dataset '%s': received %d payload bytes; the header declares %d (%d rows)", meta.name,
        upload->received_, meta.size_bytes, meta.rows));
  }
  meta.sha256 = upload->sha256_.HexDigest();
  if (!upload->expected_sha256_.empty() && upload->expected_sha256_ != meta.sha256) {
    return absl::DataLossError(absl::StrCat("dataset '", meta.name,
                                            "': the payload's sha256 is ", meta.sha256,
                                            "; the header says ", upload->expected_sha256_));
  }
  TRAINERD_ASSIGN_OR_RETURN(const torch::Tensor staging, upload->Gather());
  try {
    const int64_t fbytes = meta.feature_bytes;
    torch::Tensor features = staging.narrow(0, 0, fbytes).view(torch::kFloat32);
    torch::Tensor finite = torch::isfinite(features);
    if (!finite.all().item<bool>()) {
      const int64_t first = torch::nonzero(finite.logical_not())[0][0].item<int64_t>();
      const int64_t per_row = meta.feature_bytes / 4 / meta.rows;  // float32 values per row
      return absl::InvalidArgumentError(absl::StrFormat(
          "dataset '%s': row %d has a non-finite feature value (NaN or Inf)", meta.name,
          first / per_row + 1));
    }
    torch::Tensor tbytes = staging.narrow(0, fbytes, meta.size_bytes - fbytes).clone();
    if (meta.target_dtype == TargetDType::kFloat32) {
      torch::Tensor t = tbytes.view(torch::kFloat32);
      torch::Tensor tfinite = torch::isfinite(t);
      if (!tfinite.all().item<bool>()) {
        const int64_t first = torch::nonzero(tfinite.logical_not())[0][0].item<int64_t>();
        return absl::InvalidArgumentError(absl::StrFormat(
            "dataset '%s': row %d has a non-finite target value (NaN or Inf)", meta.name,
            first / ((meta.size_bytes - meta.feature_bytes) / 4 / meta.rows) + 1));
      }
    } else {
      torch::Tensor t = tbytes.view(torch::kInt64);
      meta.target_min = t.min().item<int64_t>();
      meta.target_max = t.max().item<int64_t>();
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot check dataset '", meta.name, "': ", e.what()));
  }
  meta.create_time = absl::Now();
  TRAINERD_RETURN_IF_ERROR(
      WriteDatasetFile(PathFor(meta.name), meta, staging.data_ptr(), meta.size_bytes));
  auto resident = MakeResident(meta, staging);
  if (!resident.ok()) {
    std::remove(PathFor(meta.name).c_str());
    return resident.status();
  }
  absl::MutexLock lock(&mu_);
  // The last moment to honour a cancellation: after this the dataset is visible.
  if (upload->cancelled_->load()) {
    std::remove(PathFor(meta.name).c_str());
    return cancelled_error();
  }
  reserved_.erase(meta.name);
  upload->committed_ = true;
  datasets_[meta.name] = *std::move(resident);
  return meta;
}

absl::Status DatasetRegistry::LoadFromDisk() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create dataset folder '", dir_, "': ", ec.message()));
  }
  // `ec` reports only the folder's listing: a file that cannot be removed or renamed is logged
  // and skipped, never a reason to refuse to start.
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string path = entry.path().string();
    std::error_code file_ec;
    if (entry.path().extension() != kDatasetFileExtension) {
      if (entry.path().extension() == ".tmp") std::filesystem::remove(entry.path(), file_ec);
      continue;
    }
    auto quarantine = [&](const absl::Status& why) {
      std::filesystem::rename(path, path + ".damaged", file_ec);
      LogWarning(absl::StrCat("skipping dataset file: ", why.message(),
                              file_ec ? "; cannot rename it to " : "; renamed to ", path,
                              ".damaged", file_ec ? absl::StrCat(": ", file_ec.message()) : ""));
    };
    auto header = ReadDatasetFileHeader(path);
    if (!header.ok()) {
      quarantine(header.status());
      continue;
    }
    const DatasetMeta& meta = header->meta;
    if (!ValidateDatasetName(meta.name).ok() || PathFor(meta.name) != path) {
      quarantine(absl::DataLossError(absl::StrCat("dataset file '", path,
                                                  "' does not match its name")));
      continue;
    }
    torch::Tensor staging;
    try {
      staging = torch::empty({meta.size_bytes},
                             torch::TensorOptions(torch::kUInt8).pinned_memory(device_.is_cuda()));
    } catch (const std::exception& e) {
      // Not the file's fault: keep the file, skip the dataset.
      LogWarning(absl::StrCat("cannot load dataset '", meta.name, "': no memory for its ",
                              meta.size_bytes, " bytes"));
      continue;
    }
    absl::Status read = ReadDatasetPayload(path, *header, staging.data_ptr(), meta.size_bytes);
    if (!read.ok()) {
      quarantine(read);
      continue;
    }
    DatasetMeta resident_meta = meta;
    resident_meta.device = DeviceName(device_);
    auto resident = MakeResident(resident_meta, staging);
    if (!resident.ok()) {
      // Not the file's fault (e.g. the device is full): keep the file, skip the dataset.
      LogWarning(absl::StrCat("cannot load dataset '", meta.name, "': ", resident.status().message()));
      continue;
    }
    absl::MutexLock lock(&mu_);
    datasets_[meta.name] = *std::move(resident);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read dataset folder '", dir_, "': ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Dataset>> DatasetRegistry::Get(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = datasets_.find(name);
  if (it == datasets_.end()) {
    return absl::NotFoundError(absl::StrCat("dataset '", name, "' not found"));
  }
  return it->second;
}

std::vector<DatasetMeta> DatasetRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<DatasetMeta> out;
  out.reserve(datasets_.size());
  for (const auto& [name, dataset] : datasets_) out.push_back(dataset->meta);
  return out;
}

absl::Status DatasetRegistry::Delete(const std::string& name) {
  std::shared_ptr<const Dataset> doomed;  // freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = datasets_.find(name);
    if (it == datasets_.end()) {
      return absl::NotFoundError(absl::StrCat("dataset '", name, "' not found"));
    }
    doomed = std::move(it->second);
    datasets_.erase(it);
    // The name stays reserved until the file is gone, so that a new upload of the same name
    // cannot write its file before this removal deletes it.
    reserved_.insert(name);
  }
  if (std::remove(PathFor(name).c_str()) != 0 && errno != ENOENT) {
    LogWarning(absl::StrCat("cannot remove the file of dataset '", name, "': ",
                            std::strerror(errno)));
  }
  ReleaseName(name);
  return absl::OkStatus();
}

}  // namespace trainerd::engine
