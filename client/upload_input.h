// What `dataset upload` reads and sends: the file(s) named on its command line read and checked
// locally (CSV as the Python client reads it, .npy with its dtypes), the notes of what was
// converted, and the upload's header. Errors are INVALID_ARGUMENT (or the readers' codes) with a
// sentence meant for "trainctl: <message>" and exit code 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli.h"
#include "common/csv_reader.h"
#include "common/dataset_header.h"
#include "common/npy_reader.h"
#include "common/table.h"
#include "trainerd/v1/datasets.pb.h"

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
  // --target-dtype, or float32 when it was not given (see EffectiveTargetDType).
  TargetDType target_dtype = TargetDType::kFloat32;
  bool target_dtype_given = false;
  // features_path is read as NumPy .npy (by its extension) rather than CSV.
  bool npy = false;
};

// The dtype the targets are uploaded as: --target-dtype when given; else, with a separate .npy
// targets file, the file's own (an integer array holds class indices: int64; a float or bool
// array: float32), as NumPy users expect; else float32 (CSV, and targets in a features array's
// last columns, whose dtype says nothing about them).
TargetDType EffectiveTargetDType(const UploadInput& input,
                                 std::optional<NpyDType> targets_file_dtype);

// What a CSV upload takes from the file's layout (InspectCsv), as the Python client does: the
// index column pandas writes is left out (options->skip_first_column), and without --target-dtype
// one target column of whole numbers written as such becomes int64 class indices
// (options->target_dtype). A sentence for each, for trainctl to say (on stderr).
std::vector<std::string> CsvLayoutNotes(const UploadInput& input, const CsvLayout& layout,
                                        CsvOptions* options);

// What an upload of .npy arrays converts, a sentence each, for trainctl to say (on stderr): e.g.
// "features: float64 values sent as float32" or "targets: int32 values sent as int64 class
// indices". `targets_file_dtype` is the targets array's dtype, nullopt when the targets are the
// features array's last columns. Nothing for arrays sent as they are.
std::vector<std::string> NpyConversionNotes(NpyDType features_dtype,
                                            std::optional<NpyDType> targets_file_dtype,
                                            TargetDType targets);

absl::StatusOr<UploadInput> UploadInputFromFlags(const Invocation& invocation);

// Reads and checks the file(s) whole; the readers' messages name the file and, for CSV, the line.
// (.npy input that is regular files is streamed instead: client/upload_stream.h.) With `notes`,
// .npy input appends its NpyConversionNotes there.
absl::StatusOr<Table> ReadUploadInput(const UploadInput& input,
                                      std::vector<std::string>* notes = nullptr);

// The daemon's checks of an upload's header (common/dataset_header.h: the name, at most 8
// dimensions of 1 to 2^31, sizes that do not overflow), run before anything is sent. The size
// limit is the daemon's to apply (it is a flag of trainerd). The header's figures (rows, shapes,
// dtype) are all it looks at: those of a table read whole, or of a streamed upload's headers.
absl::Status CheckUploadAgainstLimits(const DatasetHeader& header);
absl::Status CheckUploadAgainstLimits(const std::string& name, const Table& table);

// The first message of the upload stream.
v1::DatasetHeader MakeDatasetHeader(const DatasetHeader& header);
v1::DatasetHeader MakeDatasetHeader(const std::string& name, const Table& table,
                                    const std::string& sha256_hex);

}  // namespace trainerd::client
