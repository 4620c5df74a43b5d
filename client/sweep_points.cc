// `trainctl sweep --points FILE`: a sweep's members one by one (SubmitSweepRequest.points), read
// from a small CSV file whose header names the columns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
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
#include "client/cli_internal.h"
#include "client/requests.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainerd::client {
namespace {

// The swept columns, each a field of SweepPoint of its own.
constexpr const char* kPointFlags[] = {"lr", "momentum", "weight-decay", "seed"};

// Submit's flags a member may not vary: its data, its validation rows, where it runs, and what
// is the sweep's own (a module, the request, the watch).
constexpr const char* kSweepOwnFlags[] = {"dataset",
                                          "validation-fraction",
                                          "validation-dataset",
                                          "validation-split-seed",
                                          "device",
                                          "nodes",
                                          "replicas",
                                          "torchscript",
                                          "request-id",
                                          "watch",
                                          "points"};

// The flag a header cell names: a swept flag or its field name (learning_rate, weight_decay), or
// any other of submit's flags that take a value (model, batch-size, epochs, optimizer, ...), in
// any case, '_' for '-'; "" when it names none.
std::string PointColumn(absl::string_view cell) {
  std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(cell));
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  if (name == "learning-rate") return "lr";
  for (const char* flag : kPointFlags) {
    if (name == flag) return flag;
  }
  for (const char* flag : kSweepOwnFlags) {
    if (name == flag) return "";
  }
  for (const FlagSpec& flag : SubmitFlags()) {
    if (flag.name == name && !flag.value_name.empty()) return name;
  }
  return "";
}

// A line's cells: split at commas outside double quotes (a model spec's commas are quoted:
// "linear:64,relu,linear:10"); "" inside quotes is one quote. nullopt for an unclosed quote.
std::optional<std::vector<std::string>> SplitCells(absl::string_view line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"') {
      if (quoted && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back().push_back('"');
        ++i;
      } else {
        quoted = !quoted;
      }
    } else if (c == ',' && !quoted) {
      cells.emplace_back();
    } else {
      cells.back().push_back(c);
    }
  }
  if (quoted) return std::nullopt;
  return cells;
}

bool IsSweptFlag(absl::string_view flag) {
  return std::find(std::begin(kPointFlags), std::end(kPointFlags), flag) != std::end(kPointFlags);
}

// The paths (FieldMask) of the fields in which `member` differs from `sweep`, leaves only (a
// message field by its fields), but for the four a SweepPoint carries of its own.
void DifferingPaths(const google::protobuf::Message& member, const google::protobuf::Message& sweep,
                    const std::string& prefix, std::vector<std::string>* paths) {
  using google::protobuf::FieldDescriptor;
  using google::protobuf::util::FieldMaskUtil;
  const google::protobuf::Descriptor* type = member.GetDescriptor();
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    const std::string path = prefix + field->name();
    if (path == "seed" || path == "optimizer.learning_rate" || path == "optimizer.momentum" ||
        path == "optimizer.weight_decay") {
      continue;
    }
    const google::protobuf::Reflection* reflection = member.GetReflection();
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated()) {
      DifferingPaths(reflection->GetMessage(member, field), reflection->GetMessage(sweep, field),
                     path + ".", paths);
      continue;
    }
    // The field alone of each, compared as messages (a repeated field element by element).
    std::unique_ptr<google::protobuf::Message> a(member.New());
    std::unique_ptr<google::protobuf::Message> b(sweep.New());
    google::protobuf::FieldMask mask;
    mask.add_paths(field->name());
    FieldMaskUtil::MergeMessageTo(member, mask, FieldMaskUtil::MergeOptions(), a.get());
    FieldMaskUtil::MergeMessageTo(sweep, mask, FieldMaskUtil::MergeOptions(), b.get());
    if (!google::protobuf::util::MessageDifferencer::Equals(*a, *b)) paths->push_back(path);
  }
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
    const std::string where = absl::StrCat("--points: line ", line_number, ": ");
    const std::optional<std::vector<std::string>> split = SplitCells(line);
    if (!split.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "a quote is not closed"));
    }
    const std::vector<std::string>& cells = *split;
    if (columns.empty()) {
      for (absl::string_view cell : cells) {
        const std::string flag = PointColumn(cell);
        if (flag.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where,
              "the header names columns lr, momentum, weight-decay, seed and submit's other "
              "flags that take a value (model, batch-size, epochs, optimizer, ...) but those of "
              "the data and placement, not '",
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
      if (!IsSweptFlag(flag)) {
        // Checked as submit's flag, with the member's others (SweepPointsRequestFromFlags).
        row.flags[flag] = value;
        continue;
      }
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
  std::vector<v1::JobSpec> member_specs;
  for (const SweepPointRow& row : rows) {
    Invocation member = spec_flags;
    for (const auto& [flag, value] : row.flags) member.flags[flag] = value;
    absl::StatusOr<v1::JobSpec> checked = JobSpecFromFlags(member);
    if (!checked.ok()) {
      return absl::Status(checked.status().code(), absl::StrCat("--points: line ", row.line, ": ",
                                                                checked.status().message()));
    }
    member_specs.push_back(*std::move(checked));
  }
  // The spec: the flags, with the first member's value for each column every member sets (no
  // member takes the flag's value then, and it may not suit the other flags: --min-lr 0.05 with
  // every member's rate above it and the default 0.01 below). A check ties one swept value to
  // flags that are not swept, and each member passed, so this spec passes too.
  Invocation spec_invocation = spec_flags;
  for (const auto& [flag, value] : rows.front().flags) {
    if (!IsSweptFlag(flag)) continue;  // a member's own spec carries it
    const bool everyone = std::all_of(rows.begin(), rows.end(), [&](const SweepPointRow& row) {
      return row.flags.count(flag) > 0;
    });
    if (everyone) spec_invocation.flags[flag] = value;
  }
  TRAINERD_ASSIGN_OR_RETURN(*request.mutable_spec(), JobSpecFromFlags(spec_invocation));
  // A member with other columns carries its spec, and the fields in which it differs from the
  // sweep's (SweepPoint.fields).
  for (size_t i = 0; i < rows.size(); ++i) {
    v1::SweepPoint* point = request.add_points();
    *point = std::move(rows[i].point);
    std::vector<std::string> paths;
    DifferingPaths(member_specs[i], request.spec(), "", &paths);
    if (paths.empty()) continue;
    *point->mutable_spec() = member_specs[i];
    for (const std::string& path : paths) point->mutable_fields()->add_paths(path);
  }
  return request;
}

}  // namespace trainerd::client
