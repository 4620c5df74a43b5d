// Reads a numeric CSV file into a Table. Used by trainctl for `dataset upload`.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/table.h"

namespace trainerd {

struct CsvOptions {
  // Number of trailing columns that are targets (>= 1). The rest are features.
  int target_columns = 1;
  // kInt64 requires integral target values (class indices) and target_columns == 1; the target
  // shape is then scalar. kFloat32 targets have shape {target_columns}.
  TargetDType target_dtype = TargetDType::kFloat32;
};

// Parses CSV text: comma-separated numbers, one row per line, an optional header line (a first
// line with any non-numeric field), blank lines ignored, \r\n accepted. Every row must have the
// same number of columns. Errors are INVALID_ARGUMENT and name the 1-based line (and column), e.g.
// "line 7, column 2: 'abc' is not a number", "line 9 has 3 columns; line 1 has 2". NaN and Inf are
// rejected here too.
absl::StatusOr<Table> ParseCsv(std::string_view text, const CsvOptions& options);

// Reads `path` and parses it; NOT_FOUND when the file cannot be opened. Errors start with the path.
absl::StatusOr<Table> ReadCsvFile(const std::string& path, const CsvOptions& options);

}  // namespace trainerd
