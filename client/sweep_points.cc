// `trainctl sweep --points FILE`: a sweep's members one by one (SubmitSweepRequest.points), read
// from a small CSV file whose header names the columns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/requests.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace trainerd::client {
namespace {

// The columns a points file may have, by the flag each stands for.
constexpr const char* kPointFlags[] = {"lr", "momentum", "weight-decay", "seed"};

// The flag a header cell names: the flag itself, or its field name (learning_rate,
// weight_decay), in any case; "" when it names none.
std::string PointColumn(absl::string_view cell) {
  std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(cell));
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  if (name == "learning-rate") return "lr";
  for (const char* flag : kPointFlags) {
    if (name == flag) return flag;
  }
  return "";
}

// The file's bytes ("-": standard input), at most kMaxSweepPointsFileBytes.
absl::StatusOr<std::string> ReadPointsFile(const std::string& path) {
  std::string text;
  if (path == "-") {
    char block[1 << 14];
    while (std::cin.read(block, sizeof block) || std::cin.gcount() > 0) {
      text.append(block, static_cast<size_t>(std::cin.gcount()));
      if (static_cast<int64_t>(text.size()) > kMaxSweepPointsFileBytes) break;
    }
  } else {
    absl::StatusOr<std::string> read = ReadFileToString(path);
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrCat("--points: ", read.status().message()));
    }
    text = *std::move(read);
  }
  if (static_cast<int64_t>(text.size()) > kMaxSweepPointsFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--points: '", path, "' is larger than ", kMaxSweepPointsFileBytes,
                     " bytes (a sweep has at most ", kMaxSweepMembers, " members)"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::vector<SweepPointRow>> ParseSweepPoints(absl::string_view text) {
  std::vector<std::string> columns;  // the flag each column stands for
  std::vector<SweepPointRow> points;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also a \r before the \n
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    const std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    const std::string where = absl::StrCat("--points: line ", line_number, ": ");
    if (columns.empty()) {
      for (absl::string_view cell : cells) {
        const std::string flag = PointColumn(cell);
        if (flag.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "the header names columns lr, momentum, weight-decay and seed, not '",
              absl::StripAsciiWhitespace(cell), "'"));
        }
        if (std::find(columns.begin(), columns.end(), flag) != columns.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "column ", flag, " is named twice"));
        }
        columns.push_back(flag);
      }
      continue;
    }
    if (cells.size() != columns.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "has ", cells.size(),
                                                     " values; the header names ", columns.size(),
                                                     " (", absl::StrJoin(columns, ","), ")"));
    }
    if (points.size() == static_cast<size_t>(kMaxSweepMembers)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a sweep has at most ", kMaxSweepMembers, " members"));
    }
    SweepPointRow row;
    row.line = line_number;
    for (size_t i = 0; i < cells.size(); ++i) {
      const std::string value(absl::StripAsciiWhitespace(cells[i]));
      if (value.empty()) continue;  // the spec's value
      const std::string& flag = columns[i];
      if (flag == "seed") {
        uint64_t seed = 0;
        // SimpleAtoi would take "-1" as 2^64 - 1.
        if (absl::StartsWith(value, "-") || !absl::SimpleAtoi(value, &seed)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "seed '", value, "' is not a whole number in [0, 2^64)"));
        }
        row.point.set_seed(seed);
      } else {
        double number = 0;
        if (!absl::SimpleAtod(value, &number) || !std::isfinite(number)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, flag, " '", value, "' is not a number"));
        }
        if (flag == "lr") row.point.set_learning_rate(number);
        if (flag == "momentum") row.point.set_momentum(number);
        if (flag == "weight-decay") row.point.set_weight_decay(number);
      }
      row.flags[flag] = value;
    }
    points.push_back(std::move(row));
  }
  if (columns.empty()) {
    return absl::InvalidArgumentError(
        "--points: the file is empty (a header such as 'lr,seed', then a line per member)");
  }
  if (points.empty()) {
    return absl::InvalidArgumentError("--points: the file has a header but no members");
  }
  return points;
}

absl::StatusOr<v1::SubmitSweepRequest> SweepPointsRequestFromFlags(const Invocation& invocation) {
  for (const char* flag : kPointFlags) {
    if (invocation.Has(flag) && absl::StrContains(invocation.Get(flag), ',')) {
      return absl::InvalidArgumentError(
          absl::StrCat("--points gives each member's values: --", flag,
                       " takes one value with it (the members' default), not a list"));
    }
  }
  TRAINERD_ASSIGN_OR_RETURN(std::string text, ReadPointsFile(invocation.Get("points")));
  TRAINERD_ASSIGN_OR_RETURN(std::vector<SweepPointRow> rows, ParseSweepPoints(text));

  Invocation spec_flags = invocation;
  spec_flags.flags.erase("points");
  v1::SubmitSweepRequest request;
  // Each member's values as its flags over the others, checked as submit checks them (ranges,
  // --nesterov on the momentum, --min-lr below the rate), with the line in the message.
  for (const SweepPointRow& row : rows) {
    Invocation member = spec_flags;
    for (const auto& [flag, value] : row.flags) member.flags[flag] = value;
    const absl::Status checked = JobSpecFromFlags(member).status();
    if (!checked.ok()) {
      return absl::Status(checked.code(),
                          absl::StrCat("--points: line ", row.line, ": ", checked.message()));
    }
  }
  // The spec: the flags, with the first member's value for each column every member sets (no
  // member takes the flag's value then, and it may not suit the other flags: --min-lr 0.05 with
  // every member's rate above it and the default 0.01 below). A check ties one swept value to
  // flags that are not swept, and each member passed, so this spec passes too.
  Invocation spec_invocation = spec_flags;
  for (const auto& [flag, value] : rows.front().flags) {
    const bool everyone = std::all_of(rows.begin(), rows.end(), [&](const SweepPointRow& row) {
      return row.flags.count(flag) > 0;
    });
    if (everyone) spec_invocation.flags[flag] = value;
  }
  TRAINERD_ASSIGN_OR_RETURN(*request.mutable_spec(), JobSpecFromFlags(spec_invocation));
  for (SweepPointRow& row : rows) *request.add_points() = std::move(row.point);
  return request;
}

}  // namespace trainerd::client
