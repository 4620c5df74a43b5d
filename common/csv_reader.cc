// Numeric CSV -> Table. Strict: every field of every data row must be a whole, finite number.
#include "common/csv_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace trainerd {
namespace {

enum class NumberKind { kNumber, kNotANumber, kOutOfRange };

// from_chars does not take a leading '+'; accept one when a digit or '.' follows.
absl::string_view StripPlus(absl::string_view field) {
  if (field.size() >= 2 && field[0] == '+' &&
      ((field[1] >= '0' && field[1] <= '9') || field[1] == '.')) {
    field.remove_prefix(1);
  }
  return field;
}

// Parses the whole (already trimmed) field as a double. NaN and Inf parse (as kNumber); the caller
// rejects them with a clearer message than "not a number".
NumberKind ParseDouble(absl::string_view field, double* value) {
  const absl::string_view digits = StripPlus(field);
  if (digits.empty()) return NumberKind::kNotANumber;
  const char* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, *value);
  if (ptr != end) return NumberKind::kNotANumber;
  if (ec == std::errc::result_out_of_range) return NumberKind::kOutOfRange;
  if (ec != std::errc()) return NumberKind::kNotANumber;
  return NumberKind::kNumber;
}

std::string Where(int64_t line, int64_t column) {
  return absl::StrCat("line ", line, ", column ", column, ": ");
}

std::string Columns(size_t n) { return absl::StrCat(n, n == 1 ? " column" : " columns"); }

absl::Status FieldError(int64_t line, int64_t column, absl::string_view field, NumberKind kind) {
  if (field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(line, column), "the field is empty"));
  }
  if (kind == NumberKind::kOutOfRange) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(line, column), "'", field, "' is out of range"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Where(line, column), "'", field, "' is not a number"));
}

absl::StatusOr<float> ParseFloatField(absl::string_view field, int64_t line, int64_t column) {
  double value = 0;
  const NumberKind kind = ParseDouble(field, &value);
  if (kind != NumberKind::kNumber) return FieldError(line, column, field, kind);
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(line, column), field, " is not a finite number"));
  }
  const float narrowed = static_cast<float>(value);
  if (!std::isfinite(narrowed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(line, column), field, " is out of range for float32"));
  }
  return narrowed;
}

// Class indices: "3", "+3", "3.0" and "3e0" are all 3; "3.5" is an error.
absl::StatusOr<int64_t> ParseInt64Field(absl::string_view field, int64_t line, int64_t column) {
  const absl::string_view digits = StripPlus(field);
  const char* end = digits.data() + digits.size();
  int64_t integer = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), end, integer);
  if (!digits.empty() && ptr == end) {
    if (ec == std::errc()) return integer;
    if (ec == std::errc::result_out_of_range) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(line, column), field, " is out of range for int64"));
    }
  }
  double value = 0;
  const NumberKind kind = ParseDouble(field, &value);
  if (kind != NumberKind::kNumber) return FieldError(line, column, field, kind);
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(line, column), field, " is not a finite number"));
  }
  if (value != std::trunc(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(line, column), field, " is not an integer (int64 targets are class indices)"));
  }
  // [-2^63, 2^63): both bounds are exact doubles.
  if (value < -9223372036854775808.0 || value >= 9223372036854775808.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(line, column), field, " is out of range for int64"));
  }
  return static_cast<int64_t>(value);
}

}  // namespace

absl::StatusOr<Table> ParseCsv(std::string_view std_text, const CsvOptions& options) {
  // Debian's Abseil has its own absl::string_view (not std::string_view): convert once.
  const absl::string_view text(std_text.data(), std_text.size());
  TRAINERD_RETURN_IF_ERROR(CheckTargetColumns(options.target_columns, options.target_dtype));
  const size_t target_columns = static_cast<size_t>(options.target_columns);

  Table table;
  table.target_dtype = options.target_dtype;
  size_t width = 0;        // columns of the first non-blank line; 0 until it is seen
  int64_t width_line = 0;  // that line's number
  std::vector<absl::string_view> fields;

  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;

    fields.clear();
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      fields.push_back(absl::StripAsciiWhitespace(field));
    }

    if (width == 0) {
      width = fields.size();
      width_line = line_number;
      if (width <= target_columns) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_number, " has ", Columns(width), "; with ", Columns(target_columns),
            " of targets a row needs at least ", target_columns + 1));
      }
      // A header is a first line with a field that is neither a number nor empty: pandas writes
      // an empty first header field for the index, and an empty field in a data row is an error.
      bool is_header = false;
      for (absl::string_view field : fields) {
        double ignored = 0;
        if (!field.empty() && ParseDouble(field, &ignored) == NumberKind::kNotANumber) {
          is_header = true;
        }
      }
      if (is_header) continue;
    } else if (fields.size() != width) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, " has ",
                                                     Columns(fields.size()), "; line ", width_line,
                                                     " has ", width));
    }

    const size_t feature_columns = width - target_columns;
    for (size_t c = options.skip_first_column ? 1 : 0; c < width; ++c) {
      const int64_t column = static_cast<int64_t>(c) + 1;
      if (c < feature_columns || options.target_dtype == TargetDType::kFloat32) {
        TRAINERD_ASSIGN_OR_RETURN(float value, ParseFloatField(fields[c], line_number, column));
        (c < feature_columns ? table.features : table.targets_f32).push_back(value);
      } else {
        TRAINERD_ASSIGN_OR_RETURN(int64_t value, ParseInt64Field(fields[c], line_number, column));
        table.targets_i64.push_back(value);
      }
    }
    ++table.rows;
  }

  if (table.rows == 0) return absl::InvalidArgumentError("no data rows");
  const size_t skipped = options.skip_first_column ? 1 : 0;
  if (width - target_columns <= skipped) {
    return absl::InvalidArgumentError(
        absl::StrCat("without its first column a row has no feature columns (", Columns(width),
                     ", ", Columns(target_columns), " of targets)"));
  }
  table.feature_shape = {static_cast<int64_t>(width - target_columns - skipped)};
  if (options.target_dtype == TargetDType::kFloat32) {
    table.target_shape = {static_cast<int64_t>(target_columns)};
  }
  return table;
}

CsvLayout InspectCsv(std::string_view std_text) {
  const absl::string_view text(std_text.data(), std_text.size());
  CsvLayout layout;
  std::vector<std::string> header;
  bool first_line = true;
  bool whole_first = true;     // every first-column value a whole number
  bool integer_last = true;    // every last-column field written as a whole number >= 0
  std::vector<double> firsts;
  std::vector<int64_t> labels;
  size_t width = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<absl::string_view> fields;
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      fields.push_back(absl::StripAsciiWhitespace(field));
    }
    if (first_line) {
      first_line = false;
      width = fields.size();
      bool is_header = false;
      for (absl::string_view field : fields) {
        double ignored = 0;
        if (!field.empty() && ParseDouble(field, &ignored) == NumberKind::kNotANumber) {
          is_header = true;
        }
      }
      if (is_header) {
        for (absl::string_view field : fields) header.emplace_back(field);
        continue;
      }
    }
    if (fields.size() != width || width < 2) return layout;  // ParseCsv says what is wrong
    double first = 0;
    if (ParseDouble(fields.front(), &first) != NumberKind::kNumber || !std::isfinite(first) ||
        first != std::trunc(first)) {
      whole_first = false;
    } else {
      firsts.push_back(first);
    }
    // "3" or "+3": the text of a whole number, as pandas writes an integer column.
    const absl::string_view last = StripPlus(fields.back());
    int64_t label = 0;
    const auto [ptr, ec] = std::from_chars(last.data(), last.data() + last.size(), label);
    if (last.empty() || last.front() == '-' || ec != std::errc() ||
        ptr != last.data() + last.size()) {
      integer_last = false;
    } else if (labels.size() <= 64) {
      if (std::find(labels.begin(), labels.end(), label) == labels.end()) labels.push_back(label);
    }
    ++layout.rows;
  }
  if (layout.rows == 0) return layout;
  const bool unnamed_first =
      !header.empty() &&
      (header.front().empty() ||
       (absl::StartsWith(header.front(), "Unnamed: ") && header.front().size() > 9 &&
        std::all_of(header.front().begin() + 9, header.front().end(),
                    [](char c) { return c >= '0' && c <= '9'; })));
  if (unnamed_first && width >= 3 && whole_first) {
    std::sort(firsts.begin(), firsts.end());
    if (std::adjacent_find(firsts.begin(), firsts.end()) == firsts.end()) {
      layout.index_column = true;
      layout.index_max = static_cast<int64_t>(firsts.back());
    }
  }
  const size_t features = width - 1 - (layout.index_column ? 1 : 0);
  layout.class_targets = integer_last && features >= 1;
  if (!header.empty()) layout.target_name = header.back();
  std::sort(labels.begin(), labels.end());
  if (labels.size() > 9) labels.resize(9);
  layout.labels = std::move(labels);
  return layout;
}

absl::StatusOr<Table> ReadCsvFile(const std::string& path, const CsvOptions& options) {
  TRAINERD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  absl::StatusOr<Table> table = ParseCsv(text, options);
  if (!table.ok()) {
    return absl::Status(table.status().code(), absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

}  // namespace trainerd
