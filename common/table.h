// The in-memory form of a dataset on the client side (read from CSV or NPY) and its wire payload.
//
// The payload layout is the one proto/trainerd/v1/datasets.proto documents: all feature rows
// (float32, C order), then all target rows (float32 or int64), little-endian.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainerd {

// Element type of a dataset's targets. Features are always float32.
enum class TargetDType { kFloat32, kInt64 };

// "float32" / "int64".
const char* TargetDTypeName(TargetDType dtype);

// The target columns a reader (CSV, NPY) is asked to take from a table's last columns: at least
// one, and exactly one for int64 class indices. INVALID_ARGUMENT naming the option otherwise.
absl::Status CheckTargetColumns(int target_columns, TargetDType dtype);

// Rows of features and targets. Exactly one of targets_f32 / targets_i64 is filled, by
// target_dtype. Not thread-safe (a plain value).
struct Table {
  std::vector<int64_t> feature_shape;  // per row, e.g. {1} or {1, 28, 28}
  std::vector<int64_t> target_shape;   // per row; empty means one scalar per row
  TargetDType target_dtype = TargetDType::kFloat32;
  int64_t rows = 0;
  std::vector<float> features;       // rows * prod(feature_shape)
  std::vector<float> targets_f32;    // rows * prod(target_shape) when kFloat32
  std::vector<int64_t> targets_i64;  // rows * prod(target_shape) when kInt64
};

// "1x28x28"; "scalar" for an empty shape.
std::string ShapeToString(const std::vector<int64_t>& shape);

// Checks that the vectors' sizes agree with rows and shapes (and that the unused target vector
// is empty). Negative rows or dimensions are errors; zero rows are not (the daemon checks that).
absl::Status ValidateTable(const Table& table);

// The wire/disk payload: features then targets, little-endian.
std::string EncodePayload(const Table& table);

// Checks a dataset name against [A-Za-z0-9._-]{1,128}; the error names the offending name.
// "." and ".." match the pattern but are rejected too: a name may become a file name.
absl::Status ValidateDatasetName(const std::string& name);

// How a caller names a dataset: "NAME" (its own) or "OWNER/NAME" (OWNER's: a token's name or a
// certificate's subject; an empty OWNER, "/NAME", names the datasets that have no owner). Names
// cannot contain '/', so the split is at the last one and an owner may contain '/' itself.
struct DatasetReference {
  std::string owner;  // empty with qualified == false: the caller's own
  std::string name;
  bool qualified = false;  // "OWNER/NAME" rather than a bare "NAME"
};

// The longest owner a reference may name: longer than any token name (64) or certificate subject
// a CA issues in practice.
inline constexpr size_t kMaxDatasetOwnerLength = 1024;

// Splits and checks a reference: the name as ValidateDatasetName checks it; the owner at most
// kMaxDatasetOwnerLength bytes without control characters. INVALID_ARGUMENT with a sentence that
// quotes the reference only in part.
absl::StatusOr<DatasetReference> ParseDatasetReference(const std::string& text);

}  // namespace trainerd
