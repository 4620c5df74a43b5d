// The protocol between the daemon and a trainerd-worker process (server/worker/): frames over one
// Unix stream socket of a socketpair, each a 16-byte header (magic, type, payload length) and a
// payload; a frame may carry descriptors (SCM_RIGHTS) with its header. The payloads are encoded
// field by field (WireWriter) and decoded with every length and count checked against what is
// left (WireReader), so that a worker that sends garbage gets an error, never an allocation of a
// declared size or a read past the end. LibTorch-free.
//
// Daemon to worker: kStart (the job, its datasets' descriptors, the module, a checkpoint to resume
// from), then kControl (cancel, drain, interrupt). Worker to daemon: kReady (what the sandbox
// applied), kCheckpoint (a checkpoint's bytes: the daemon writes the file), kEpoch, kOutcome.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sandbox_report.h"
#include "server/engine/training/training_outcome.h"
#include "server/engine/types.h"

namespace trainerd::engine {

enum class WorkerFrame : uint32_t {
  kStart = 1,
  kControl = 2,
  kReady = 10,
  kCheckpoint = 11,
  kEpoch = 12,
  kOutcome = 13,
};

enum class WorkerControl : uint8_t { kCancel = 1, kDrain = 2, kInterrupt = 3 };

inline constexpr int kMaxFrameDescriptors = 4;
inline constexpr size_t kFrameHeaderBytes = 16;

// Appends fields to a payload.
class WireWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void Bool(bool v) { U8(v ? 1 : 0); }
  void I64(int64_t v);
  void F64(double v);  // its bits, so that a value crosses exactly
  void Str(std::string_view v);
  void I64s(const std::vector<int64_t>& v);
  void OptF64(const std::optional<double>& v);
  const std::string& bytes() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads fields back; each returns INVALID_ARGUMENT naming `what` when the payload is too short or a
// value is out of range, and never reads past the end.
class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}
  absl::StatusOr<uint8_t> U8();
  absl::StatusOr<bool> Bool();
  absl::StatusOr<int64_t> I64();
  absl::StatusOr<double> F64();
  absl::StatusOr<std::string> Str(size_t max_bytes);
  absl::StatusOr<std::vector<int64_t>> I64s(size_t max_count);
  absl::StatusOr<std::optional<double>> OptF64();
  // An integer in [lo, hi].
  absl::StatusOr<int64_t> Int(int64_t lo, int64_t hi, std::string_view what);
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

// One frame: blocking send of the whole frame (with `fds` attached to its first byte).
absl::Status SendFrame(int socket, WorkerFrame type, std::string_view payload,
                       const std::vector<int>& fds = {});

// A blocking read of one frame (the worker's side: the daemon is trusted, but lengths are still
// checked against `max_payload`). Received descriptors are appended to `fds`.
absl::Status ReceiveFrame(int socket, size_t max_payload, WorkerFrame* type, std::string* payload,
                          std::vector<int>* fds);

// The daemon's side: frames assembled from non-blocking reads, so that a worker that stops
// half-way through a frame never blocks the daemon. Descriptors sent by the worker are closed.
class FrameAssembler {
 public:
  explicit FrameAssembler(size_t max_payload) : max_payload_(max_payload) {}
  // Reads what the socket has, at most 4 MiB a call. OK with `*closed` set at end of stream;
  // INVALID_ARGUMENT for a bad header or a payload over the bound (also one Next found).
  absl::Status ReadAvailable(int socket, bool* closed);
  // The next complete frame, if one has arrived. Linear in the bytes: taken frames are dropped
  // from the buffer's front once per read. A bad header stops the frames (status()).
  bool Next(WorkerFrame* type, std::string* payload);
  const absl::Status& status() const { return error_; }

 private:
  size_t max_payload_;
  std::string buffer_;
  size_t start_ = 0;  // the first byte not yet taken by Next
  absl::Status error_;
};

// kReady: the worker's sandbox as it measured it (sandbox_report.h), and its phrases for the log.
struct WorkerReady {
  SandboxReport sandbox;
  std::string applied;  // at most 4 KiB
};
std::string EncodeWorkerReady(const WorkerReady& ready);
absl::StatusOr<WorkerReady> DecodeWorkerReady(std::string_view payload);

// The job as the worker needs it.
// A dataset's two tensors, each in shared memory of its own or in the same (two descriptors
// travel with the frame either way: features first, then targets).
struct WorkerDataset {
  DatasetMeta meta;
  int64_t features_region_bytes = 0;  // the size of the memory the features' descriptor maps
  int64_t features_offset = 0;        // bytes into it
  int64_t targets_region_bytes = 0;
  int64_t targets_offset = 0;
};

struct WorkerJob {
  std::string job_id;
  JobSpec spec;  // resolved; torchscript empty (the module travels in `module`)
  std::string device;
  int32_t intra_op_threads = 1;
  bool flush_denormal = true;
  int32_t cpu_nice = 0;      // TrainingRun::cpu_nice
  bool checkpoints = false;  // the daemon keeps checkpoints for this job
  WorkerDataset dataset;
  std::optional<WorkerDataset> validation_dataset;  // descriptors 3 and 4 when set
  std::string module;                               // the TorchScript archive
  std::string resume_checkpoint;   // the checkpoint to resume from; empty: from epoch 1
  int64_t memory_limit_bytes = 0;  // address space beyond the datasets; 0: none
  int64_t cpu_seconds = 0;         // RLIMIT_CPU; 0: none
  // A GPU job (whose address space cannot be capped): its heap beyond what it has allocated
  // (RLIMIT_DATA), and the device memory LibTorch's CUDA allocator may hold; 0: none.
  int64_t data_limit_bytes = 0;
  int64_t device_memory_limit_bytes = 0;
};

std::string EncodeWorkerJob(const WorkerJob& job);
absl::StatusOr<WorkerJob> DecodeWorkerJob(std::string_view payload);

struct WorkerEpoch {
  EpochResult epoch;
  int64_t steps = 0;
  int64_t host_syncs = 0;
};
std::string EncodeWorkerEpoch(const WorkerEpoch& epoch);
absl::StatusOr<WorkerEpoch> DecodeWorkerEpoch(std::string_view payload);

struct WorkerCheckpoint {
  int32_t epoch = 0;
  std::string bytes;
};
std::string EncodeWorkerCheckpoint(const WorkerCheckpoint& checkpoint);
absl::StatusOr<WorkerCheckpoint> DecodeWorkerCheckpoint(std::string_view payload,
                                                        int32_t max_epoch);

// The run's outcome (training_outcome.h), as the worker's RunTraining returned it.
std::string EncodeWorkerOutcome(const TrainingOutcome& outcome);
absl::StatusOr<TrainingOutcome> DecodeWorkerOutcome(std::string_view payload, int32_t max_epochs);

}  // namespace trainerd::engine
