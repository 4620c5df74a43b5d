// Reads a numeric CSV file into a Table. Used by trainctl for `dataset upload`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/table.h"

namespace trainerd {

struct CsvOptions {
  // Number of trailing columns that are targets (>= 1). The rest are features.
  int target_columns = 1;
  // kInt64 requires integral target values (class indices) and target_columns == 1; the target
  // shape is then scalar. kFloat32 targets have shape {target_columns}.
  TargetDType target_dtype = TargetDType::kFloat32;
  // Leaves out the file's first column (the index pandas writes; see InspectCsv).
  bool skip_first_column = false;
};

// What a CSV file's layout says about it, read as the Python client reads one, so that trainctl
// and `client.upload` make the same dataset of the same file:
// - `index_column`: the file starts with the index DataFrame.to_csv writes unless index=False: a
//   header whose first field is empty or "Unnamed: N", at least 3 columns, and a first column of
//   distinct whole numbers. Uploaded as a feature it would be the row's number, and on a file
//   sorted by class it leaks the label.
// - `class_targets`: the last column (past the index) holds class labels: every field written as a
//   whole number of at least 0 ("3", not "3.0" or "3e0"), as pandas writes an integer column, and
//   at least one feature column besides it.
struct CsvLayout {
  bool index_column = false;
  int64_t index_max = 0;  // the index column's largest value
  bool class_targets = false;
  std::string target_name;       // the last header field ("" without a header)
  std::vector<int64_t> labels;   // the class labels, ascending, at most the first 9
  int64_t rows = 0;
};

// Reads the layout of CSV text (see CsvLayout). A file ParseCsv would refuse gives some layout;
// ParseCsv's error comes when it is read.
CsvLayout InspectCsv(std::string_view text);

// Parses CSV text: comma-separated numbers, one row per line, an optional header line (a first
// line with any non-numeric field), blank lines ignored, \r\n accepted. Every row must have the
// same number of columns. Errors are INVALID_ARGUMENT and name the 1-based line (and column), e.g.
// "line 7, column 2: 'abc' is not a number", "line 9 has 3 columns; line 1 has 2". NaN and Inf are
// rejected here too.
absl::StatusOr<Table> ParseCsv(std::string_view text, const CsvOptions& options);

// Reads `path` and parses it; NOT_FOUND when the file cannot be opened. Errors start with the path.
absl::StatusOr<Table> ReadCsvFile(const std::string& path, const CsvOptions& options);

}  // namespace trainerd
