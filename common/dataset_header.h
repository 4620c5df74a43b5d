// What a dataset declares before its payload (an upload's header, a stored dataset file's header),
// and the one check of it, shared by trainctl (before it sends a byte) and trainerd (before it
// stages a byte, and when it reloads a file at start). Every size is computed through
// common/checked_size.h: a declaration whose sizes overflow is INVALID_ARGUMENT, never arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/table.h"

namespace trainerd {

// Per-row shapes have at most this many dimensions, each between 1 and kMaxDatasetDimension.
inline constexpr int kMaxDatasetDims = 8;
inline constexpr int64_t kMaxDatasetDimension = int64_t{1} << 31;

// A dataset's declaration. A plain value.
struct DatasetHeader {
  std::string name;
  std::vector<int64_t> feature_shape;  // per row, at least one dimension
  std::vector<int64_t> target_shape;   // per row; empty = scalar
  TargetDType target_dtype = TargetDType::kFloat32;
  int64_t rows = 0;
  std::string sha256;  // optional, lower-case hex of the payload
};

// The sizes a checked header implies.
struct DatasetLayout {
  int64_t feature_values_per_row = 0;
  int64_t target_values_per_row = 0;
  int64_t feature_bytes = 0;  // all rows' features (float32)
  int64_t target_bytes = 0;   // all rows' targets
  int64_t total_bytes = 0;    // the payload: features then targets
};

// The header that describes `table` uploaded as `name` (no sha256).
DatasetHeader HeaderForTable(const std::string& name, const Table& table);

// 4 for float32, 8 for int64.
int64_t TargetItemBytes(TargetDType dtype);

// Checks the name (ValidateDatasetName), the shapes (rank, every dimension in
// [1, kMaxDatasetDimension]), rows >= 1 and the sha256's form (empty or 64 lower-case hex
// digits), and computes the layout with checked arithmetic: all INVALID_ARGUMENT with a sentence.
// A payload over `max_dataset_bytes` (0 = no limit) is RESOURCE_EXHAUSTED naming both sizes.
absl::StatusOr<DatasetLayout> CheckDatasetHeader(const DatasetHeader& header,
                                                 int64_t max_dataset_bytes);

}  // namespace trainerd
