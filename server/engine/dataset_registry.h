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

// One upload in progress: the payload is appended into a staging buffer sized from the header
// (pinned host memory when the device is a GPU). Created by DatasetRegistry::BeginUpload; the
// dataset's name stays reserved until the upload is committed or destroyed. Not thread-safe: one
// upload stream owns it. Must not outlive the registry.
class DatasetUpload final : public UploadSession {
 public:
  ~DatasetUpload() override;
  DatasetUpload(const DatasetUpload&) = delete;
  DatasetUpload& operator=(const DatasetUpload&) = delete;

  // Appends the next payload bytes. INVALID_ARGUMENT when the payload would exceed the size the
  // header declared.
  absl::Status Append(std::string_view chunk) override;

  int64_t received_bytes() const override { return received_; }
  int64_t expected_bytes() const override { return meta_.size_bytes; }
  const DatasetMeta& meta() const { return meta_; }

 private:
  friend class DatasetRegistry;
  DatasetUpload(DatasetRegistry* registry, DatasetMeta meta, std::string expected_sha256,
                torch::Tensor staging);

  DatasetRegistry* registry_;
  DatasetMeta meta_;
  std::string expected_sha256_;
  torch::Tensor staging_;  // uint8 [size_bytes], host
  int64_t received_ = 0;
  Sha256 sha256_;
  bool committed_ = false;
};

// Thread-safe. Owned by the Engine.
class DatasetRegistry {
 public:
  // `dir`: where dataset files live (created if missing). `device`: where tensors are resident.
  // `max_dataset_bytes`: the largest payload accepted (0 = no limit).
  DatasetRegistry(std::string dir, torch::Device device, int64_t max_dataset_bytes);

  // Loads every dataset file in the folder onto the device. A damaged file is logged, renamed to
  // <file>.damaged and skipped, so one bad file never keeps the daemon from starting.
  absl::Status LoadFromDisk();

  // Validates the header and reserves the name. INVALID_ARGUMENT (name, shapes, dtype, rows,
  // sha256 form), ALREADY_EXISTS, RESOURCE_EXHAUSTED (over the limit or no memory for staging).
  absl::StatusOr<std::unique_ptr<DatasetUpload>> BeginUpload(const DatasetHeader& header);

  // Finishes an upload: byte count, checksum (DATA_LOSS on mismatch), a scan for NaN/Inf and the
  // class-index range, the durable file, one host-to-device copy, then registration. Blocking
  // (file I/O and the copy): the Engine runs it off the gRPC threads.
  absl::StatusOr<DatasetMeta> Commit(std::unique_ptr<DatasetUpload> upload);

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
  std::string PathFor(const std::string& name) const;
  absl::StatusOr<std::shared_ptr<const Dataset>> MakeResident(const DatasetMeta& meta,
                                                              const torch::Tensor& payload);

  const std::string dir_;
  const torch::Device device_;
  const int64_t max_dataset_bytes_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Dataset>> datasets_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> reserved_ ABSL_GUARDED_BY(mu_);  // uploads in progress
};

}  // namespace trainerd::engine
