// CheckDatasetHeader: a dataset's declaration, checked before anything is allocated for it.
#include "common/dataset_header.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/checked_size.h"
#include "common/status_macros.h"

namespace trainerd {
namespace {

absl::Status CheckShape(const std::vector<int64_t>& shape, const char* what, bool allow_empty) {
  if (shape.empty() && !allow_empty) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " needs at least one dimension"));
  }
  if (static_cast<int64_t>(shape.size()) > kMaxDatasetDims) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " has ", shape.size(),
                                                   " dimensions; at most ", kMaxDatasetDims));
  }
  for (int64_t d : shape) {
    if (d < 1 || d > kMaxDatasetDimension) {
      return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", ShapeToString(shape),
                                                     " is invalid: every dimension must be between "
                                                     "1 and ",
                                                     kMaxDatasetDimension));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TargetItemBytes(TargetDType dtype) { return dtype == TargetDType::kInt64 ? 8 : 4; }

DatasetHeader HeaderForTable(const std::string& name, const Table& table) {
  DatasetHeader header;
  header.name = name;
  header.feature_shape = table.feature_shape;
  header.target_shape = table.target_shape;
  header.target_dtype = table.target_dtype;
  header.rows = table.rows;
  return header;
}

absl::StatusOr<DatasetLayout> CheckDatasetHeader(const DatasetHeader& header,
                                                 int64_t max_dataset_bytes) {
  TRAINERD_RETURN_IF_ERROR(ValidateDatasetName(header.name));
  TRAINERD_RETURN_IF_ERROR(CheckShape(header.feature_shape, "feature shape", false));
  TRAINERD_RETURN_IF_ERROR(CheckShape(header.target_shape, "target shape", true));
  if (header.rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset '", header.name, "' must have at least one row; the header says ", header.rows));
  }
  if (!header.sha256.empty()) {
    const bool hex = header.sha256.size() == 64 &&
                     header.sha256.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex) return absl::InvalidArgumentError("sha256 must be 64 lower-case hex digits");
  }
  const std::string what = absl::StrCat("dataset '", header.name, "'");
  DatasetLayout layout;
  TRAINERD_ASSIGN_OR_RETURN(layout.feature_values_per_row,
                            CheckedShapeElements(header.feature_shape, "the feature shape"));
  TRAINERD_ASSIGN_OR_RETURN(layout.target_values_per_row,
                            CheckedShapeElements(header.target_shape, "the target shape"));
  TRAINERD_ASSIGN_OR_RETURN(layout.feature_bytes,
                            CheckedByteSize(header.rows, header.feature_shape, 4,
                                            absl::StrCat(what, "'s features")));
  TRAINERD_ASSIGN_OR_RETURN(
      layout.target_bytes,
      CheckedByteSize(header.rows, header.target_shape, TargetItemBytes(header.target_dtype),
                      absl::StrCat(what, "'s targets")));
  TRAINERD_ASSIGN_OR_RETURN(layout.total_bytes,
                            CheckedAdd(layout.feature_bytes, layout.target_bytes,
                                       absl::StrCat(what, "'s payload")));
  if (max_dataset_bytes > 0 && layout.total_bytes > max_dataset_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " would take ", layout.total_bytes, " bytes (", header.rows, " rows of ",
        layout.total_bytes / header.rows, " bytes); this daemon accepts at most ",
        max_dataset_bytes, " bytes per dataset"));
  }
  return layout;
}

}  // namespace trainerd
