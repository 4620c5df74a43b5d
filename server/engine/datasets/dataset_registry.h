// The engine's datasets and the device memory they share with running jobs: upload (staging,
// checks, durable file, one host-to-device copy), lookup, listing, deletion, the registration of
// the files kept on disk at start, and the device memory budget: resident datasets plus the
// running jobs' working sets stay inside it, idle datasets are evicted (least recently used
// first) to make room and loaded back when a job needs them.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// A dataset's tensors on the device, with its metadata. Immutable once loaded and shared by the
// jobs that use it, so it stays valid while a job holds it (eviction only drops the registry's
// reference to an idle one).
struct Dataset {
  DatasetMeta meta;
  torch::Tensor features;  // [rows, feature_shape...], float32, on the device
  torch::Tensor targets;   // [rows, target_shape...], float32 or int64, on the device
};

class DatasetRegistry;

// The size of the blocks an upload's bytes are checked and written back in.
inline constexpr int64_t kStagingBlockBytes = int64_t{16} << 20;

// One upload in progress. The payload is appended into one host buffer of the declared size whose
// pages are committed as bytes arrive, counted against the registry's bound on the bytes staged by
// all uploads chunk by chunk, as received, so a header that declares gigabytes and sends nothing
// costs nothing. While the bytes arrive the upload also does what used to wait for
// the last one: it writes them to the dataset's temporary file (after room for the header) and
// starts their writeback, hashes them, and checks each completed block (non-finite values, the
// class-index range), so that a bad value ends the stream at once and the commit (on the engine's
// I/O thread) has only the header, an fsync of what writeback has not finished, and a rename
// left. Created by DatasetRegistry::BeginUpload; the dataset's name stays reserved until the
// upload is committed or destroyed (which removes the temporary file). Not thread-safe: one
// upload stream owns it. Must not outlive the registry.
class DatasetUpload final : public UploadSession {
 public:
  ~DatasetUpload() override;
  DatasetUpload(const DatasetUpload&) = delete;
  DatasetUpload& operator=(const DatasetUpload&) = delete;

  absl::Status Append(std::string_view chunk) override;
  absl::Status SetTrailingSha256(const std::string& sha256) override;
  int64_t received_bytes() const override { return received_; }
  int64_t expected_bytes() const override { return meta_.size_bytes; }
  int64_t staged_bytes() const override { return capacity_; }
  std::shared_ptr<std::atomic<bool>> cancellation() const override { return cancelled_; }
  const DatasetMeta& meta() const { return meta_; }

 private:
  friend class DatasetRegistry;
  DatasetUpload(DatasetRegistry* registry, DatasetMeta meta, std::string expected_sha256);
  // Counts `bytes` more (a chunk about to be copied in) against the bound on uploads in flight,
  // so that an upload is charged for what it holds, not for a block it might fill; the first
  // call allocates the payload's buffer.
  absl::Status Charge(int64_t bytes);
  // The whole payload as one uint8 tensor: the staging buffer itself (no copy), its staging
  // account given back.
  absl::StatusOr<torch::Tensor> Gather();
  // Writes the received bytes not yet in the file when a few MiB have gathered (all of them when
  // `all`), and starts the writeback of each full block; opens the file first.
  absl::Status WriteReceived(bool all);
  // Checks the received bytes not yet checked, a block at a time (all of them when `all`):
  // INVALID_ARGUMENT naming the row of a non-finite feature or float target; the int64 targets'
  // range into target_min_/target_max_.
  absl::Status CheckReceived(bool all);

  DatasetRegistry* registry_;
  DatasetMeta meta_;
  std::string expected_sha256_;
  // The payload's bytes, in order: one uint8 host buffer of the declared size, allocated at the
  // first chunk but only reserved address space until written (the kernel commits its pages as
  // bytes arrive), so that resident memory grows with what the client sent, as capacity_ counts
  // it. Becomes the resident dataset on the CPU: received once, never copied.
  torch::Tensor buffer_;
  int64_t capacity_ = 0;  // bytes received (charged just before each chunk is copied in)
  int64_t received_ = 0;
  // Hashes the buffer's bytes as they are received, on a thread of its own.
  BackgroundSha256 sha256_;
  // The temporary dataset file: DatasetFileHeaderBytes(meta_) reserved for the header, then the
  // payload; open from the first chunk.
  std::string tmp_path_;
  std::unique_ptr<ScopedFd> file_;
  int64_t header_bytes_ = 0;
  int64_t written_ = 0;            // payload bytes written to the file
  int64_t writeback_started_ = 0;  // payload bytes whose writeback was started
  int64_t checked_ = 0;            // payload bytes checked by CheckReceived
  int64_t target_min_ = std::numeric_limits<int64_t>::max();
  int64_t target_max_ = std::numeric_limits<int64_t>::min();
  bool trailing_sha256_given_ = false;
  bool committed_ = false;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

// What a job holds while it runs (DatasetRegistry::AcquireForJob).
struct JobDatasets {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<const Dataset> validation_dataset;  // null when the job names none
};

// The folder under the datasets folder that holds `owner`'s dataset files: the owner's bytes,
// those outside [A-Za-z0-9@=,+_-] (and '.' first) as %XX, or past 128 characters so written, their
// first 64, "~" and the SHA-256 of the owner (a file name has at most 255 bytes). One folder per
// owner, and never "." or "..".
std::string OwnerFolder(const std::string& owner);

// Datasets that LoadFromDisk moves from the flat layout of older versions into their owner's
// folder: each one's old name (all a job record could name it by) to its key.
using DatasetRenames = std::map<std::string, std::string>;

// Thread-safe. Owned by the Engine. Datasets are named by their keys (types.h: DatasetKey): names
// are per owner.
class DatasetRegistry {
 public:
  // `dir`: where dataset files live (created if missing). `device`: where tensors are resident.
  // `max_dataset_bytes`: the largest payload accepted (0 = no limit). `max_staged_bytes`: the
  // most host memory all uploads in progress may stage together (0 = no limit).
  // `memory_budget`: the bytes of `device` that resident datasets and running jobs' working sets
  // may use together (0 = no budget).
  DatasetRegistry(std::string dir, torch::Device device, int64_t max_dataset_bytes,
                  int64_t max_staged_bytes = 0, int64_t memory_budget = 0);

  // Tells the registry which datasets (keys) queued or running jobs use: eviction takes the others
  // first. Set once, before any job.
  void SetInUse(std::function<bool(const std::string& key)> in_use);

  // Registers every dataset file from its header, without loading it (the daemon serves at once;
  // a dataset is loaded when a job first needs it, or by Preload): <dir>/<name>.trds for those
  // without an owner, <dir>/<OwnerFolder(owner)>/<name>.trds for the others. A damaged file, or
  // one whose header does not name the owner and name of its place, is logged, renamed to
  // <file>.damaged and skipped, so one bad file never keeps the daemon from starting. Files of an
  // older version's flat layout that have an owner (<dir>/<name>.trds, owner alice) are moved to
  // their owner's folder, once `before_move` (when given) accepted their renames: its error stops
  // the start before anything moved.
  absl::Status LoadFromDisk(
      const std::function<absl::Status(const DatasetRenames&)>& before_move = nullptr);
  // Loads the datasets that are on disk only, most recently created first, while they fit the
  // budget without evicting anything. Blocking (file reads, copies): the engine's I/O thread.
  void Preload();

  // Checks the header (CheckDatasetHeader) and reserves the name among `owner`'s; allocates
  // nothing (but the owner's folder). The dataset will record `owner` (whose it is; may be empty)
  // and whether it is a copy for a peer's jobs. INVALID_ARGUMENT (name, shapes, dtype, rows,
  // sha256 form, sizes that overflow), ALREADY_EXISTS (the owner has a dataset of that name, or
  // is uploading one), RESOURCE_EXHAUSTED (over the size limit).
  absl::StatusOr<std::unique_ptr<DatasetUpload>> BeginUpload(const DatasetHeader& header,
                                                             const std::string& owner = "",
                                                             bool peer_copy = false);

  // Finishes an upload: byte count, checksum (DATA_LOSS on mismatch), a scan for NaN/Inf and the
  // class-index range, the durable file, one host-to-device copy, then registration, unless the
  // upload's cancellation flag is set (CANCELLED; nothing is registered and the file is removed).
  // Blocking (file I/O and the copy): the Engine runs it off the gRPC threads.
  absl::StatusOr<DatasetMeta> Commit(std::unique_ptr<DatasetUpload> upload);

  // Host memory staged by the uploads in progress, in bytes.
  int64_t staged_bytes() const;
  // Uploads begun and not yet committed or discarded (and deletes removing their files).
  int64_t uploads_in_progress() const;

  // NOT_FOUND when absent. The metadata says where the dataset is now (DatasetMeta::location).
  absl::StatusOr<DatasetMeta> GetMeta(const std::string& key) const;
  // Sorted by key.
  std::vector<DatasetMeta> List() const;

  // Restarts the clock of the copies for peers among `keys` (DatasetMeta::peer_copy): in memory
  // and as their files' modification time, which LoadFromDisk reads back. AcquireForJob and
  // ReleaseJob do it for a job's datasets.
  void TouchCopies(const std::vector<std::string>& keys);
  // The copies for peers that no running job holds and whose clock is at least `idle` old at
  // `now` (whether a queued job names one is the caller's question).
  std::vector<DatasetMeta> IdleCopies(absl::Duration idle, absl::Time now) const;

  // A job about to run on `job_device`: its dataset and validation dataset (keys; empty: none)
  // loaded onto the device (evicting datasets no running job holds, least recently used first,
  // those no queued job needs before the others) and, when the job runs on this registry's device,
  // its working set reserved, all inside the budget. UNAVAILABLE when it does not fit now because
  // running jobs hold the memory (try again when one ends); RESOURCE_EXHAUSTED, with the numbers,
  // when it cannot fit even with nothing else running; NOT_FOUND for a missing dataset; the
  // error of a load that failed. Blocking while a dataset loads.
  absl::StatusOr<JobDatasets> AcquireForJob(const std::string& job_id, const std::string& dataset,
                                            const std::string& validation_dataset,
                                            int64_t working_set_bytes,
                                            const torch::Device& job_device);
  // Gives back what AcquireForJob reserved for the job (its datasets stay resident, now idle).
  void ReleaseJob(const std::string& job_id);

  // The budget (0: none), the bytes resident datasets use, the bytes running jobs' working sets
  // reserve, and the datasets evicted so far.
  int64_t memory_budget() const { return budget_; }
  int64_t resident_bytes() const;
  int64_t reserved_bytes() const;
  int64_t evictions() const;
  // Marks the dataset shared (other tenants' jobs may train on it) or not, first in its file's
  // header (durable, in place), then in the registry. NOT_FOUND when absent.
  absl::StatusOr<DatasetMeta> SetShared(const std::string& key, bool shared);
  // Removes it from the registry and deletes its file. NOT_FOUND when absent. The caller checks
  // that no job uses it (the Engine does, under its admission lock).
  absl::Status Delete(const std::string& key);

  const torch::Device& device() const { return device_; }
  // Where the file of the dataset with key `key` is (or would be).
  std::string PathFor(const std::string& key) const;

 private:
  friend class DatasetUpload;
  void ReleaseName(const std::string& key);
  // Sets the files' modification time of `keys` to now (the clock LoadFromDisk reads back as
  // DatasetMeta::last_used and a copy's idle clock), and the copies' clocks in memory; with
  // `copies_only` the copies' only.
  void Touch(const std::vector<std::string>& keys, bool copies_only);
  // Registers a dataset file found at start (LoadFromDisk), on disk only.
  void RegisterFromDisk(const std::string& path, const DatasetMeta& meta);
  // Counts `bytes` more of staging memory against max_staged_bytes_ (RESOURCE_EXHAUSTED beyond
  // it), or gives `bytes` back.
  absl::Status ReserveStaging(int64_t bytes, const std::string& name);
  void ReleaseStaging(int64_t bytes);
  absl::StatusOr<std::shared_ptr<const Dataset>> MakeResident(const DatasetMeta& meta,
                                                              const torch::Tensor& payload);
  // Reads a registered dataset's file and makes it resident (no lock held).
  absl::StatusOr<std::shared_ptr<const Dataset>> LoadFile(const DatasetMeta& meta);

  struct Entry {
    DatasetMeta meta;                         // location kept current
    std::shared_ptr<const Dataset> resident;  // null: on disk only
    int running = 0;       // running jobs holding it (never evicted while > 0)
    bool loading = false;  // a load is under way (its bytes are in loading_bytes_)
    // A copy for peers: when it was made, or last taken or given back by a job.
    absl::Time copy_used = absl::InfinitePast();
  };
  // The bytes the budget has left (budget - resident - reserved - loading); INT64_MAX without one.
  int64_t FreeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes that running jobs hold (their working sets and the datasets they hold).
  int64_t HeldByRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts idle datasets (none in `keep`, none a running job holds), least recently used first
  // and those no queued job needs before the others, until `bytes` are free. False when they
  // cannot be freed (nothing is evicted then).
  // A dataset whose file turned out damaged when it was loaded (a flipped byte, a truncated
  // payload): its file is renamed *.damaged and the dataset is forgotten, as a start would have
  // done had it read the payload; the name is free again.
  void Forget(const DatasetMeta& meta, const absl::Status& why);
  bool MakeRoomLocked(int64_t bytes, const std::set<std::string>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const torch::Device device_;
  const int64_t max_dataset_bytes_;
  const int64_t max_staged_bytes_;
  const int64_t budget_;
  std::function<bool(const std::string&)> in_use_;  // set before jobs run

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> datasets_ ABSL_GUARDED_BY(mu_);  // by key
  std::set<std::string> reserved_ ABSL_GUARDED_BY(mu_);         // keys of the uploads in progress
  int64_t staged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t loading_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Running jobs' reservations: working set bytes and the datasets they hold.
  struct Hold {
    int64_t bytes = 0;
    std::vector<std::string> datasets;
  };
  std::map<std::string, Hold> holds_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  std::mutex acquire_mu_;  // serialises AcquireForJob
  std::mutex share_mu_;    // serialises SetShared's header rewrites
};

}  // namespace trainerd::engine
