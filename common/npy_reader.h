// Reads NumPy .npy files (format versions 1.0-3.0; float32, float64 or int64; little-endian;
// C order) and turns them into a Table. Used by trainctl for `dataset upload`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/table.h"

namespace trainerd {

enum class NpyDType { kFloat32, kFloat64, kInt64 };

struct NpyArray {
  std::vector<int64_t> shape;
  NpyDType dtype = NpyDType::kFloat32;
  std::vector<char> data;  // raw little-endian values, C order
};

// Parses the bytes of a .npy file. INVALID_ARGUMENT with a reason for a bad magic, an unsupported
// version, dtype ('<f4', '<f8', '<i8' and '|' / '=' forms are accepted) or Fortran order, a
// malformed header, or a payload whose size does not match the shape.
absl::StatusOr<NpyArray> ParseNpy(std::string_view bytes);
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);

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

}  // namespace trainerd
