// Reads NumPy .npy files (format versions 1.0-3.0; float32, float64, signed and unsigned
// integers of 1 to 8 bytes or bool; little-endian; C order) and turns them into a Table. Used by
// trainctl for `dataset upload`, either whole (ReadNpyFile, TableFromNpy) or streamed
// (ReadNpyHeader, LayOutNpyTable and the NpyValuesTo* conversions, which TableFromNpy is built on:
// both give the same payload and the same errors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/table.h"

namespace trainerd {

enum class NpyDType {
  kFloat32,
  kFloat64,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt64,
  kUInt32,
  kUInt16,
  kUInt8,
  kBool,
};

// "float32", "int32", "uint8", "bool", ...: NumPy's names.
const char* NpyDTypeName(NpyDType dtype);

// Integer and bool arrays: what a class-index targets file is (int64 targets by default).
bool NpyIsInteger(NpyDType dtype);

struct NpyArray {
  std::vector<int64_t> shape;
  NpyDType dtype = NpyDType::kFloat32;
  std::vector<char> data;  // raw little-endian values, C order
};

// Parses the bytes of a .npy file. INVALID_ARGUMENT with a reason for a bad magic, an unsupported
// version, dtype ('<f4', '<f8', '<i1'..'<i8', '<u1'..'<u8', '|b1', with '|' / '=' forms) or
// Fortran order, a
// malformed header, or a payload whose size does not match the shape.
absl::StatusOr<NpyArray> ParseNpy(std::string_view bytes);
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);

// What a .npy file's header declares. A plain value.
struct NpyHeaderInfo {
  std::vector<int64_t> shape;
  NpyDType dtype = NpyDType::kFloat32;
  int64_t data_offset = 0;  // bytes before the data: magic, version, header length and header
  int64_t data_bytes = 0;   // bytes of data the shape and dtype need (checked arithmetic)
};

// Parses the start of a .npy file: the preamble and the header (any bytes after it are not looked
// at). The errors of ParseNpy for the same bytes, less the check of the data's size.
absl::StatusOr<NpyHeaderInfo> ParseNpyHeader(std::string_view bytes);

// Reads only the preamble and header of the file at `path` and checks the file's size against
// them: what ReadNpyFile would refuse, with its messages ("cannot open ..." as NOT_FOUND; the
// others INVALID_ARGUMENT starting with "path: ", e.g. a truncated file's "npy data has N bytes;
// shape (...) of float64 needs M"), without reading the data.
absl::StatusOr<NpyHeaderInfo> ReadNpyHeader(const std::string& path);

struct NpyTableOptions {
  // Without a separate targets array: the number of trailing columns of a 2-D array that are
  // targets (as in CSV). Ignored when targets are given.
  int target_columns = 1;
  TargetDType target_dtype = TargetDType::kFloat32;
};

// Builds a Table. With `targets`: features has shape {rows, ...} (any rank >= 1; a 1-D array is
// one feature per row) and targets {rows, ...} (1-D gives a scalar per row for int64, shape {1}
// for float32). Without: features must be 2-D and its last target_columns columns are the
// targets. Float64 converts to float32; int64 targets require integral values; NaN/Inf rejected.
absl::StatusOr<Table> TableFromNpy(const NpyArray& features, const std::optional<NpyArray>& targets,
                                   const NpyTableOptions& options);

// An array's figures without its data: an NpyArray's, or a file's header (NpyHeaderInfo).
struct NpyArrayInfo {
  std::vector<int64_t> shape;
  NpyDType dtype = NpyDType::kFloat32;
  int64_t data_bytes = 0;  // the bytes of data there are
};

// Values [begin, end) of each row of an array seen as rows of `stride` values: the part of an
// array that goes into the features or the targets.
struct NpyColumns {
  int64_t stride = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// How TableFromNpy lays out the table of `features` and `targets`, decided from their figures
// alone (with the same checks and messages). The payload is, row by row, the `feature_columns`
// of the features array converted to float32, then row by row the `target_columns` of the
// targets array (or, without one, of the features array) converted to target_dtype. Integers
// convert to float32 features (exactly up to 2^24) and to int64 targets (uint64 values above
// int64's range are refused), float values to int64 targets only when integral.
struct NpyTableLayout {
  int64_t rows = 0;
  std::vector<int64_t> feature_shape;
  std::vector<int64_t> target_shape;
  TargetDType target_dtype = TargetDType::kFloat32;
  NpyColumns feature_columns;
  NpyColumns target_columns;
  bool targets_in_features = false;  // no targets array: the targets are features' last columns
};

absl::StatusOr<NpyTableLayout> LayOutNpyTable(const NpyArrayInfo& features,
                                              const std::optional<NpyArrayInfo>& targets,
                                              const NpyTableOptions& options);

// TableFromNpy's conversion of `count` consecutive values of an array, for a reader that holds
// only a part of it: `in` has their raw little-endian bytes (of `from`), the first of them being
// flat element `first` of an array of `shape` named `name` ("features" or "targets"; errors name
// the element as TableFromNpy's do, e.g. "features[3, 1]: nan is not a finite number"). Writes
// `count` little-endian float32 (features, float32 targets) or int64 values (int64 targets:
// integral values required) at `out`, which need not be aligned.
absl::Status NpyValuesToFloat32(NpyDType from, const char* in, int64_t count, char* out,
                                const char* name, const std::vector<int64_t>& shape, int64_t first);
absl::Status NpyValuesToInt64(NpyDType from, const char* in, int64_t count, char* out,
                              const char* name, const std::vector<int64_t>& shape, int64_t first);

// The bytes of one value: 1 (int8, uint8, bool) to 8 (float64, int64, uint64).
size_t NpyItemSize(NpyDType dtype);

}  // namespace trainerd
