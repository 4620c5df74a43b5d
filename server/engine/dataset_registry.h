// The datasets resident on the engine's device: upload (staging, checks, durable file, one
// host-to-device copy), lookup, listing, deletion, and reloading from disk at start.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"
#include "server/engine/types.h"
#include <torch/torch.h>

namespace trainerd::engine {

// A registered dataset: metadata plus its tensors on the device. Immutable once registered and
// shared by the jobs that use it, so it stays valid while a job holds it.
struct Dataset {
  DatasetMeta meta;
  torch::Tensor features;  // [rows, feature_shape...], float32, on the device
  torch::Tensor targets;   // [rows, target_shape...], float32 or int64, on the device
};

class DatasetRegistry;

// The size of an upload's staging blocks.
inline constexpr int64_t kStagingBlockBytes = int64_t{16} << 20;

// One upload in progress. The payload is appended into host staging blocks of at most
// kStagingBlockBytes, allocated as bytes arrive and never past the size the header declared, so a
// header that declares gigabytes and sends nothing costs nothing, and no chunk ever waits for a
// large copy; each block is counted against the registry's bound on the bytes staged by all
// uploads. The commit (on the engine's I/O thread) gathers the blocks into one buffer (pinned when
// the device is a GPU), freeing each as it goes. Created by
// DatasetRegistry::BeginUpload; the dataset's name stays reserved until the upload is committed or
// destroyed. Not thread-safe: one upload stream owns it. Must not outlive the registry.
class DatasetUpload final : public UploadSession {
 public:
  ~DatasetUpload() override;
  DatasetUpload(const DatasetUpload&) = delete;
  DatasetUpload& operator=(const DatasetUpload&) = delete;

  absl::Status Append(std::string_view chunk) override;
  int64_t received_bytes() const override { return received_; }
  int64_t expected_bytes() const override { return meta_.size_bytes; }
  int64_t staged_bytes() const override { return capacity_; }
  std::shared_ptr<std::atomic<bool>> cancellation() const override { return cancelled_; }
  const DatasetMeta& meta() const { return meta_; }

 private:
  friend class DatasetRegistry;
  DatasetUpload(DatasetRegistry* registry, DatasetMeta meta, std::string expected_sha256);
  // Adds a block for the bytes after capacity_ (at most kStagingBlockBytes, at most what the
  // header has left).
  absl::Status AddBlock();
  // The whole payload as one uint8 tensor (pinned for a GPU), the blocks freed as they are
  // copied. RESOURCE_EXHAUSTED when it cannot be allocated.
  absl::StatusOr<torch::Tensor> Gather();

  DatasetRegistry* registry_;
  DatasetMeta meta_;
  std::string expected_sha256_;
  std::vector<torch::Tensor> blocks_;  // uint8, host, filled in order
  int64_t capacity_ = 0;  // bytes in blocks_, counted against the in-flight bound
  int64_t received_ = 0;
  Sha256 sha256_;
  bool committed_ = false;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

// Thread-safe. Owned by the Engine.
class DatasetRegistry {
 public:
  // `dir`: where dataset files live (created if missing). `device`: where tensors are resident.
  // `max_dataset_bytes`: the largest payload accepted (0 = no limit). `max_staged_bytes`: the
  // most host memory all uploads in progress may stage together (0 = no limit).
  DatasetRegistry(std::string dir, torch::Device device, int64_t max_dataset_bytes,
                  int64_t max_staged_bytes = 0);

  // Loads every dataset file in the folder onto the device. A damaged file is logged, renamed to
  // <file>.damaged and skipped, so one bad file never keeps the daemon from starting.
  absl::Status LoadFromDisk();

  // Checks the header (CheckDatasetHeader) and reserves the name; allocates nothing. The dataset
  // will record `owner` (who uploads it; may be empty). INVALID_ARGUMENT (name, shapes, dtype,
  // rows, sha256 form, sizes that overflow), ALREADY_EXISTS, RESOURCE_EXHAUSTED (over the
  // size limit).
  absl::StatusOr<std::unique_ptr<DatasetUpload>> BeginUpload(const DatasetHeader& header,
                                                             const std::string& owner = "");

  // Finishes an upload: byte count, checksum (DATA_LOSS on mismatch), a scan for NaN/Inf and the
  // class-index range, the durable file, one host-to-device copy, then registration, unless the
  // upload's cancellation flag is set (CANCELLED; nothing is registered and the file is removed).
  // Blocking (file I/O and the copy): the Engine runs it off the gRPC threads.
  absl::StatusOr<DatasetMeta> Commit(std::unique_ptr<DatasetUpload> upload);

  // Host memory staged by the uploads in progress, in bytes.
  int64_t staged_bytes() const;

  // NOT_FOUND when absent.
  absl::StatusOr<std::shared_ptr<const Dataset>> Get(const std::string& name) const;
  // Sorted by name.
  std::vector<DatasetMeta> List() const;
  // Removes it from the registry and deletes its file. NOT_FOUND when absent. The caller checks
  // that no job uses it (the Engine does, under its admission lock).
  absl::Status Delete(const std::string& name);

  const torch::Device& device() const { return device_; }

 private:
  friend class DatasetUpload;
  void ReleaseName(const std::string& name);
  // Counts `bytes` more of staging memory against max_staged_bytes_ (RESOURCE_EXHAUSTED beyond
  // it), or gives `bytes` back.
  absl::Status ReserveStaging(int64_t bytes, const std::string& name);
  void ReleaseStaging(int64_t bytes);
  std::string PathFor(const std::string& name) const;
  absl::StatusOr<std::shared_ptr<const Dataset>> MakeResident(const DatasetMeta& meta,
                                                              const torch::Tensor& payload);

  const std::string dir_;
  const torch::Device device_;
  const int64_t max_dataset_bytes_;
  const int64_t max_staged_bytes_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Dataset>> datasets_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> reserved_ ABSL_GUARDED_BY(mu_);  // uploads in progress
  int64_t staged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainerd::engine
