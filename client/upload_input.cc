// `dataset upload`'s input: its files read and checked, its notes and header (upload_input.h).
#include "client/upload_input.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace trainerd::client {
namespace {

// A guard against typos such as --target-columns 10000000; no real table has more.
constexpr int64_t kMaxTargetColumns = 1 << 20;

absl::StatusOr<TargetDType> ParseTargetDType(const std::string& text) {
  if (text == "float32") return TargetDType::kFloat32;
  if (text == "int64") return TargetDType::kInt64;
  return absl::InvalidArgumentError(
      absl::StrCat("--target-dtype: unknown dtype '", text, "' (expected float32 or int64)"));
}

v1::DType ToProto(TargetDType dtype) {
  return dtype == TargetDType::kInt64 ? v1::DTYPE_INT64 : v1::DTYPE_FLOAT32;
}

}  // namespace

absl::StatusOr<UploadInput> UploadInputFromFlags(const Invocation& invocation) {
  UploadInput input;
  input.features_path = invocation.args.at(1);
  input.npy = absl::EndsWithIgnoreCase(input.features_path, ".npy");
  TRAINERD_ASSIGN_OR_RETURN(int64_t columns,
                            invocation.GetInt("target-columns", 1, 1, kMaxTargetColumns));
  input.target_columns = static_cast<int>(columns);
  TRAINERD_ASSIGN_OR_RETURN(input.target_dtype,
                            ParseTargetDType(invocation.Get("target-dtype", "float32")));
  input.target_dtype_given = invocation.Has("target-dtype");
  if (invocation.Has("targets")) {
    if (!input.npy) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--targets needs the features as a .npy file too; '", input.features_path, "' is not"));
    }
    if (invocation.Has("target-columns")) {
      return absl::InvalidArgumentError(
          "--target-columns does not apply with --targets (every column of FILE is a feature)");
    }
    input.targets_path = invocation.Get("targets");
  }
  if (input.target_dtype == TargetDType::kInt64 && input.target_columns != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target-dtype int64 takes one target column (a class index), got --target-columns ",
        input.target_columns));
  }
  return input;
}

TargetDType EffectiveTargetDType(const UploadInput& input,
                                 std::optional<NpyDType> targets_file_dtype) {
  if (input.target_dtype_given || !targets_file_dtype.has_value()) return input.target_dtype;
  // A bool array is a 0/1 target for bce_with_logits more often than two classes (as the Python
  // client decides it too).
  const bool classes = NpyIsInteger(*targets_file_dtype) && *targets_file_dtype != NpyDType::kBool;
  return classes ? TargetDType::kInt64 : TargetDType::kFloat32;
}

std::vector<std::string> NpyConversionNotes(NpyDType features_dtype,
                                            std::optional<NpyDType> targets_file_dtype,
                                            TargetDType targets) {
  std::vector<std::string> notes;
  if (features_dtype != NpyDType::kFloat32) {
    notes.push_back(
        absl::StrCat("features: ", NpyDTypeName(features_dtype), " values sent as float32"));
  }
  const NpyDType from = targets_file_dtype.value_or(features_dtype);
  const bool int64 = targets == TargetDType::kInt64;
  if (from != (int64 ? NpyDType::kInt64 : NpyDType::kFloat32)) {
    notes.push_back(absl::StrCat("targets: ", NpyDTypeName(from), " values sent as ",
                                 int64 ? "int64 class indices" : "float32"));
  }
  return notes;
}

std::vector<std::string> CsvLayoutNotes(const UploadInput& input, const CsvLayout& layout,
                                        CsvOptions* options) {
  std::vector<std::string> notes;
  const std::string& path = input.features_path;
  if (layout.index_column) {
    options->skip_first_column = true;
    notes.push_back(absl::StrCat(
        path, " starts with an unnamed column of distinct whole numbers (0 to ", layout.index_max,
        " over ", layout.rows,
        " rows): the index DataFrame.to_csv writes unless index=False. It was left out, not "
        "uploaded as a feature; write the file with df.to_csv(path, index=False) to leave it "
        "out"));
  }
  if (!input.target_dtype_given && input.target_columns == 1 && layout.class_targets) {
    options->target_dtype = TargetDType::kInt64;
    std::vector<std::string> shown;
    for (size_t i = 0; i < layout.labels.size() && i < 8; ++i) {
      shown.push_back(absl::StrCat(layout.labels[i]));
    }
    if (layout.labels.size() > 8) shown.push_back("...");
    notes.push_back(absl::StrCat(
        path, ": its target column", layout.target_name.empty() ? "" : " '",
        layout.target_name, layout.target_name.empty() ? "" : "'", " holds whole numbers only (",
        absl::StrJoin(shown, ", "),
        "): uploaded as int64 class indices, as pandas reads such a column, so a job without a "
        "loss trains with cross_entropy (the model needs an output per class). Pass "
        "--target-dtype float32 to regress on them instead"));
  }
  return notes;
}

absl::StatusOr<Table> ReadUploadInput(const UploadInput& input, std::vector<std::string>* notes) {
  absl::StatusOr<Table> table;
  if (input.npy) {
    TRAINERD_ASSIGN_OR_RETURN(NpyArray features, ReadNpyFile(input.features_path));
    std::optional<NpyArray> targets;
    if (input.targets_path.has_value()) {
      TRAINERD_ASSIGN_OR_RETURN(targets, ReadNpyFile(*input.targets_path));
    }
    NpyTableOptions options;
    options.target_columns = input.target_columns;
    options.target_dtype = EffectiveTargetDType(
        input, targets.has_value() ? std::optional<NpyDType>(targets->dtype) : std::nullopt);
    table = TableFromNpy(features, targets, options);
    if (table.ok() && notes != nullptr) {
      for (std::string& note : NpyConversionNotes(
               features.dtype,
               targets.has_value() ? std::optional<NpyDType>(targets->dtype) : std::nullopt,
               options.target_dtype)) {
        notes->push_back(std::move(note));
      }
    }
    if (!table.ok()) {
      // TableFromNpy does not know the file names; say which files it was about.
      std::string files = input.features_path;
      if (input.targets_path.has_value()) absl::StrAppend(&files, " and ", *input.targets_path);
      return absl::Status(table.status().code(),
                          absl::StrCat(files, ": ", table.status().message()));
    }
  } else {
    TRAINERD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(input.features_path));
    CsvOptions options;
    options.target_columns = input.target_columns;
    options.target_dtype = input.target_dtype;
    std::vector<std::string> said = CsvLayoutNotes(input, InspectCsv(text), &options);
    table = ParseCsv(text, options);
    if (!table.ok()) {
      return absl::Status(table.status().code(),
                          absl::StrCat(input.features_path, ": ", table.status().message()));
    }
    if (notes != nullptr) notes->insert(notes->end(), said.begin(), said.end());
  }
  TRAINERD_RETURN_IF_ERROR(ValidateTable(*table));
  return table;
}

absl::Status CheckUploadAgainstLimits(const DatasetHeader& header) {
  return CheckDatasetHeader(header, /*max_dataset_bytes=*/0).status();
}

absl::Status CheckUploadAgainstLimits(const std::string& name, const Table& table) {
  return CheckUploadAgainstLimits(HeaderForTable(name, table));
}

v1::DatasetHeader MakeDatasetHeader(const DatasetHeader& header) {
  v1::DatasetHeader proto;
  proto.set_name(header.name);
  for (int64_t dim : header.feature_shape) proto.add_feature_shape(dim);
  for (int64_t dim : header.target_shape) proto.add_target_shape(dim);
  proto.set_target_dtype(ToProto(header.target_dtype));
  proto.set_row_count(header.rows);
  proto.set_sha256(header.sha256);
  return proto;
}

v1::DatasetHeader MakeDatasetHeader(const std::string& name, const Table& table,
                                    const std::string& sha256_hex) {
  DatasetHeader header = HeaderForTable(name, table);
  header.sha256 = sha256_hex;
  return MakeDatasetHeader(header);
}

}  // namespace trainerd::client
