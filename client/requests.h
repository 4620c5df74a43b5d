// Turns a parsed trainctl command line into what is sent to trainerd: the dataset read from its
// file(s) and the upload header, and the JobSpec of `submit`. Everything here is checked locally,
// before a connection is made; errors are INVALID_ARGUMENT (or the readers' codes) with a sentence
// meant for "trainctl: <message>" and exit code 2.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/cli.h"
#include "common/job_limits.h"
#include "common/table.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {

// Payload bytes per UploadDatasetRequest chunk: the daemon's limit.
inline constexpr size_t kUploadChunkBytes = 1 << 20;

// What `dataset upload NAME FILE` reads.
struct UploadInput {
  std::string features_path;
  // A separate .npy targets file (--targets); then features_path is .npy too.
  std::optional<std::string> targets_path;
  // Trailing columns that are targets (CSV, or a 2-D .npy without targets_path); >= 1.
  int target_columns = 1;
  TargetDType target_dtype = TargetDType::kFloat32;
  // features_path is read as NumPy .npy (by its extension) rather than CSV.
  bool npy = false;
};

absl::StatusOr<UploadInput> UploadInputFromFlags(const Invocation& invocation);

// Reads and checks the file(s); the readers' messages name the file and, for CSV, the line.
absl::StatusOr<Table> ReadUploadInput(const UploadInput& input);

// The daemon's checks of an upload's header (common/dataset_header.h: the name, at most 8
// dimensions of 1 to 2^31, sizes that do not overflow), run before anything is sent. The size
// limit is the daemon's to apply (it is a flag of trainerd).
absl::Status CheckUploadAgainstLimits(const std::string& name, const Table& table);

// The first message of the upload stream.
v1::DatasetHeader MakeDatasetHeader(const std::string& name, const Table& table,
                                    const std::string& sha256_hex);

// The spec of `submit`: --dataset and --model are required, the model spec is parsed (and sent
// in canonical form), and numbers are range-checked. Defaults: mse, sgd, lr 0.01, batch size 32,
// 10 epochs, momentum 0, shuffle on, seed and device left to the daemon.
// With --torchscript FILE instead of --model (not both), the spec's model is "torchscript".
absl::StatusOr<v1::JobSpec> JobSpecFromFlags(const Invocation& invocation);

// "queued", "running", "succeeded", "failed" or "cancelled" (any case) as the API's JobState;
// INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<v1::JobState> ParseJobState(absl::string_view text);

// The bytes of --torchscript FILE for SubmitJobRequest.torchscript_module; "" without the flag.
// The file's reader errors, or INVALID_ARGUMENT when it is empty or over kMaxTorchScriptBytes
// (common/job_limits.h, the daemon's own limit).
absl::StatusOr<std::string> ReadTorchScriptFlag(const Invocation& invocation);

}  // namespace trainerd::client
