// Table helpers: shapes, consistency checks, the wire payload and dataset-name validation.
#include "common/table.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_size.h"
#include "common/status_macros.h"

namespace trainerd {
namespace {

// The payload is little-endian and EncodePayload copies host memory as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "trainerd assumes a little-endian host");
static_assert(sizeof(float) == 4, "trainerd assumes a 4-byte float");

constexpr size_t kMaxDatasetNameLength = 128;

bool IsDatasetNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

absl::Status CheckTargetColumns(int target_columns, TargetDType dtype) {
  if (target_columns < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_columns must be at least 1; got ", target_columns));
  }
  if (dtype == TargetDType::kInt64 && target_columns != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("int64 targets need exactly one target column; got ", target_columns));
  }
  return absl::OkStatus();
}

const char* TargetDTypeName(TargetDType dtype) {
  switch (dtype) {
    case TargetDType::kFloat32:
      return "float32";
    case TargetDType::kInt64:
      return "int64";
  }
  return "unknown";
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  return absl::StrJoin(shape, "x");
}

absl::Status ValidateTable(const Table& table) {
  if (table.rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the table has a negative row count (", table.rows, ")"));
  }
  TRAINERD_ASSIGN_OR_RETURN(
      const int64_t feature_values,
      CheckedByteSize(table.rows, table.feature_shape, 1, "the feature shape"));
  if (static_cast<int64_t>(table.features.size()) != feature_values) {
    return absl::InvalidArgumentError(
        absl::StrCat("the table has ", table.rows, " rows of ", ShapeToString(table.feature_shape),
                     " features (", feature_values, " values) but holds ", table.features.size(),
                     " feature values"));
  }
  TRAINERD_ASSIGN_OR_RETURN(
      const int64_t target_values,
      CheckedByteSize(table.rows, table.target_shape, 1, "the target shape"));

  const bool is_f32 = table.target_dtype == TargetDType::kFloat32;
  const size_t active = is_f32 ? table.targets_f32.size() : table.targets_i64.size();
  const size_t inactive = is_f32 ? table.targets_i64.size() : table.targets_f32.size();
  if (static_cast<int64_t>(active) != target_values) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the table has ", table.rows, " rows of ", ShapeToString(table.target_shape), " ",
        TargetDTypeName(table.target_dtype), " targets (", target_values, " values) but holds ",
        active, " ", TargetDTypeName(table.target_dtype), " target values"));
  }
  if (inactive != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the table has ", TargetDTypeName(table.target_dtype), " targets but also holds ", inactive,
        " ", is_f32 ? "int64" : "float32", " target values"));
  }
  return absl::OkStatus();
}

std::string EncodePayload(const Table& table) {
  const size_t feature_bytes = table.features.size() * sizeof(float);
  const bool is_f32 = table.target_dtype == TargetDType::kFloat32;
  const size_t target_bytes = is_f32 ? table.targets_f32.size() * sizeof(float)
                                     : table.targets_i64.size() * sizeof(int64_t);
  std::string payload(feature_bytes + target_bytes, '\0');
  if (feature_bytes > 0) std::memcpy(payload.data(), table.features.data(), feature_bytes);
  if (target_bytes > 0) {
    const void* targets = is_f32 ? static_cast<const void*>(table.targets_f32.data())
                                 : static_cast<const void*>(table.targets_i64.data());
    std::memcpy(payload.data() + feature_bytes, targets, target_bytes);
  }
  return payload;
}

absl::Status ValidateDatasetName(const std::string& name) {
  bool valid = !name.empty() && name.size() <= kMaxDatasetNameLength;
  for (char c : name) valid = valid && IsDatasetNameChar(c);
  if (!valid) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset name '", absl::CHexEscape(name.substr(0, 64)),
                     name.size() > 64 ? absl::StrCat("...' (", name.size(), " characters)") : "'",
                     " is invalid: use 1 to 128 of A-Z a-z 0-9 . _ -"));
  }
  // The daemon keeps each dataset in a file named after it: "." and ".." would name directories.
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset name '", name, "' is invalid: '.' and '..' are reserved"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DatasetReference> ParseDatasetReference(const std::string& text) {
  DatasetReference out;
  const size_t slash = text.rfind('/');
  if (slash == std::string::npos) {
    TRAINERD_RETURN_IF_ERROR(ValidateDatasetName(text));
    out.name = text;
    return out;
  }
  out.qualified = true;
  out.owner = text.substr(0, slash);
  out.name = text.substr(slash + 1);
  bool plain = out.owner.size() <= kMaxDatasetOwnerLength;
  for (char c : out.owner) plain = plain && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  if (!plain) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset '", absl::CHexEscape(text.substr(0, 64)),
                     text.size() > 64 ? absl::StrCat("...' (", text.size(), " characters)") : "'",
                     " names an owner of more than ", kMaxDatasetOwnerLength,
                     " characters or with control characters; a dataset is NAME or OWNER/NAME"));
  }
  if (absl::Status name = ValidateDatasetName(out.name); !name.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name.message(), " (a dataset is NAME, or OWNER/NAME for another owner's)"));
  }
  return out;
}

}  // namespace trainerd
