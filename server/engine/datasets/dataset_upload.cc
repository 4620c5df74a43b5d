// DatasetUpload: one upload in progress, as its bytes arrive (charged, copied, hashed, checked,
// written and its writeback started), until the registry commits it (dataset_registry.cc). Used
// by one stream at a time; what it shares with the registry (staging, names) goes through the
// registry's lock.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "server/engine/datasets/dataset_file.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/datasets/shared_memory.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// True when every value of `values` (float32, 1-D) is finite. A slice at a time through one
// reduction (a NaN makes the min and max NaN, an infinity is the min or the max), so that checking
// a large upload needs no temporary the size of the payload (isfinite's would be a quarter of it).
bool AllFinite(const torch::Tensor& values) {
  constexpr int64_t kSlice = int64_t{4} << 20;  // values: 16 MiB
  const int64_t n = values.numel();
  for (int64_t begin = 0; begin < n; begin += kSlice) {
    const auto [lo, hi] = torch::aminmax(values.narrow(0, begin, std::min(kSlice, n - begin)));
    if (!std::isfinite(lo.item<float>()) || !std::isfinite(hi.item<float>())) return false;
  }
  return true;
}

// The index of the first NaN or infinity among the `count` float32 values at `data`, or -1.
int64_t FirstNonFinite(const char* data, int64_t count) {
  const torch::Tensor values = torch::from_blob(const_cast<char*>(data), {count}, torch::kFloat32);
  if (AllFinite(values)) return -1;
  return torch::nonzero(torch::isfinite(values).logical_not())[0][0].item<int64_t>();
}

}  // namespace

DatasetUpload::DatasetUpload(DatasetRegistry* registry, DatasetMeta meta,
                             std::string expected_sha256)
    : registry_(registry),
      meta_(std::move(meta)),
      expected_sha256_(std::move(expected_sha256)),
      tmp_path_(registry_->PathFor(DatasetKeyOf(meta_)) + ".tmp"),
      header_bytes_(DatasetFileHeaderBytes(meta_)) {}

DatasetUpload::~DatasetUpload() {
  sha256_.Stop();  // it reads the buffer
  // Not committed (or its commit failed before the rename): the partial file goes.
  if (file_ != nullptr) {
    file_.reset();
    ::unlink(tmp_path_.c_str());
  }
  buffer_ = torch::Tensor();
  registry_->ReleaseStaging(capacity_);
  if (!committed_) registry_->ReleaseName(DatasetKeyOf(meta_));
}

absl::Status DatasetUpload::Charge(int64_t size) {
  TRAINERD_RETURN_IF_ERROR(registry_->ReserveStaging(size, meta_.name));
  if (!buffer_.defined()) {
    // The declared size was checked against the daemon's limits when the upload began; this
    // reserves address space, and the pages are committed as the bytes are written.
    try {
      // On the CPU the buffer becomes the resident dataset: in shared memory, which a
      // TorchScript job's worker maps read-only instead of receiving a copy.
      if (registry_->device().is_cpu()) {
        absl::StatusOr<torch::Tensor> shared =
            AllocateSharedHostBytes(meta_.size_bytes, meta_.name);
        if (!shared.ok()) throw std::bad_alloc();
        buffer_ = *std::move(shared);
      } else {
        buffer_ = torch::empty({meta_.size_bytes}, torch::kUInt8);
      }
    } catch (const std::exception& e) {
      registry_->ReleaseStaging(size);
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", meta_.size_bytes,
                                                       " bytes of staging memory for dataset '",
                                                       meta_.name, "'"));
    }
  }
  capacity_ += size;
  return absl::OkStatus();
}

absl::Status DatasetUpload::Append(std::string_view chunk) {
  if (trailing_sha256_given_) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset '", meta_.name,
                     "': a chunk came after the payload's sha256, which "
                     "must be the last message"));
  }
  if (static_cast<int64_t>(chunk.size()) > meta_.size_bytes - received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset '", meta_.name, "': the payload is larger than the header declares (",
                     meta_.size_bytes, " bytes for ", meta_.rows, " rows)"));
  }
  if (!chunk.empty()) {
    TRAINERD_RETURN_IF_ERROR(Charge(static_cast<int64_t>(chunk.size())));
    const int64_t n = static_cast<int64_t>(chunk.size());
    char* to = static_cast<char*>(buffer_.data_ptr()) + received_;
    std::memcpy(to, chunk.data(), n);
    sha256_.Update(to, n);  // the buffer's bytes stay put until the hash is done
    received_ += n;
  }
  const bool last = received_ == meta_.size_bytes;
  TRAINERD_RETURN_IF_ERROR(CheckReceived(last));
  return WriteReceived(last);
}

absl::Status DatasetUpload::WriteReceived(bool all) {
  // Large enough that the syscalls cost nothing, small enough that the writes interleave with the
  // chunks' arrival.
  constexpr int64_t kFileWriteBytes = int64_t{4} << 20;
  if (!all && received_ - written_ < kFileWriteBytes) return absl::OkStatus();
  if (file_ == nullptr) {
    file_ = std::make_unique<ScopedFd>(
        ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (file_->get() < 0) {
      const int error_number = errno;
      file_.reset();
      return FileError(error_number, "cannot create", tmp_path_);
    }
  }
  if (received_ > written_) {
    const char* bytes = static_cast<const char*>(buffer_.data_ptr()) + written_;
    TRAINERD_RETURN_IF_ERROR(WriteAt(file_->get(), tmp_path_,
                                     std::string_view(bytes, received_ - written_),
                                     header_bytes_ + written_));
    written_ = received_;
  }
  // Start the writeback of what is written, a block at a time, so that the commit's fsync waits
  // for the last block only. A hint: a failure shows in that fsync.
  if (written_ - writeback_started_ >= kStagingBlockBytes ||
      (all && written_ > writeback_started_)) {
    ::sync_file_range(file_->get(), header_bytes_ + writeback_started_,
                      written_ - writeback_started_, SYNC_FILE_RANGE_WRITE);
    writeback_started_ = written_;
  }
  return absl::OkStatus();
}

absl::Status DatasetUpload::CheckReceived(bool all) {
  if (received_ == checked_ || (!all && received_ - checked_ < kStagingBlockBytes)) {
    return absl::OkStatus();
  }
  const char* base = static_cast<const char*>(buffer_.data_ptr());
  const int64_t fbytes = meta_.feature_bytes;
  const int64_t tbytes = meta_.size_bytes - fbytes;
  try {
    // Features (float32): a NaN or an infinity ends the upload, naming its row.
    if (checked_ < fbytes) {
      const int64_t end = std::min(received_, fbytes) / 4 * 4;
      if (end > checked_) {
        const int64_t bad = FirstNonFinite(base + checked_, (end - checked_) / 4);
        if (bad >= 0) {
          const int64_t per_row = fbytes / 4 / meta_.rows;  // float32 values per row
          return absl::InvalidArgumentError(
              absl::StrFormat("dataset '%s': row %d has a non-finite feature value (NaN or Inf)",
                              meta_.name, (checked_ / 4 + bad) / per_row + 1));
        }
        checked_ = end;
      }
    }
    if (checked_ < fbytes || received_ <= fbytes) return absl::OkStatus();
    if (meta_.target_dtype == TargetDType::kFloat32) {
      const int64_t end = fbytes + (received_ - fbytes) / 4 * 4;
      if (end > checked_) {
        const int64_t bad = FirstNonFinite(base + checked_, (end - checked_) / 4);
        if (bad >= 0) {
          const int64_t per_row = tbytes / 4 / meta_.rows;
          return absl::InvalidArgumentError(
              absl::StrFormat("dataset '%s': row %d has a non-finite target value (NaN or Inf)",
                              meta_.name, ((checked_ - fbytes) / 4 + bad) / per_row + 1));
        }
        checked_ = end;
      }
    } else {
      // int64 class indices, which may sit at any 4-byte offset: read through memcpy.
      const int64_t end = fbytes + (received_ - fbytes) / 8 * 8;
      int64_t lo = target_min_;
      int64_t hi = target_max_;
      for (int64_t at = checked_; at < end; at += 8) {
        int64_t value = 0;
        std::memcpy(&value, base + at, sizeof(value));
        lo = std::min(lo, value);
        hi = std::max(hi, value);
      }
      target_min_ = lo;
      target_max_ = hi;
      checked_ = std::max(checked_, end);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot check dataset '", meta_.name, "': ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status DatasetUpload::SetTrailingSha256(const std::string& sha256) {
  if (!expected_sha256_.empty() || trailing_sha256_given_) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset '", meta_.name,
                     "': the payload's sha256 was given already (send it in the "
                     "header or as the last message, once)"));
  }
  const bool hex = sha256.size() == 64 && std::all_of(sha256.begin(), sha256.end(), [](char c) {
                     return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                   });
  if (!hex) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset '", meta_.name, "': the payload's sha256 must be 64 lower-case hex digits"));
  }
  expected_sha256_ = sha256;
  trailing_sha256_given_ = true;
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> DatasetUpload::Gather() {
  torch::Tensor all = std::move(buffer_);
  buffer_ = torch::Tensor();
  if (!all.defined()) all = torch::empty({0}, torch::kUInt8);
  registry_->ReleaseStaging(capacity_);
  capacity_ = 0;
  return all;
}

DatasetRegistry::DatasetRegistry(std::string dir, torch::Device device, int64_t max_dataset_bytes,
                                 int64_t max_staged_bytes, int64_t memory_budget)
    : dir_(std::move(dir)),
      device_(device),
      max_dataset_bytes_(max_dataset_bytes),
      max_staged_bytes_(max_staged_bytes),
      budget_(memory_budget) {}

}  // namespace trainerd::engine
