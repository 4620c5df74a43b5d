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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cli_internal.h"
#include "client/requests.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "google/protobuf/field_mask.pb.h"
#include "proto/message_paths.h"

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

// The file's bytes ("-": standard input), at most kMaxSweepPointsFileBytes; `flag` names it in
// messages.
absl::StatusOr<std::string> ReadPointsFile(const std::string& path,
                                           absl::string_view flag = "points") {
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
                          absl::StrCat("--", flag, ": ", read.status().message()));
    }
    text = *std::move(read);
  }
  if (static_cast<int64_t>(text.size()) > kMaxSweepPointsFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", path, "' is larger than ", kMaxSweepPointsFileBytes,
                     " bytes (a sweep has at most ", kMaxSweepMembers, " members)"));
  }
  return text;
}

// The value of the leaf field `path` of `spec` as SearchParameter's choices write it.
std::string FieldText(const google::protobuf::Message& spec, const std::string& path) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Message* message = &spec;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  const FieldDescriptor* field = nullptr;
  for (size_t i = 0; i < parts.size(); ++i) {
    field = message->GetDescriptor()->FindFieldByName(parts[i]);
    if (field == nullptr) return "";
    if (i + 1 < parts.size()) message = &message->GetReflection()->GetMessage(*message, field);
  }
  const google::protobuf::Reflection* r = message->GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrFormat("%.17g", r->GetDouble(*message, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrFormat("%.9g", r->GetFloat(*message, field));
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(*message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(*message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(*message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(*message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(*message, field) ? "true" : "false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return r->GetEnum(*message, field)->name();
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(*message, field);
    default:
      return "";
  }
}

}  // namespace

absl::StatusOr<v1::SubmitSweepRequest> SweepSearchRequestFromFlags(const Invocation& invocation) {
  if (invocation.Has("points")) {
    return absl::InvalidArgumentError("give either --points or --search, not both");
  }
  for (const char* flag : kPointFlags) {
    if (invocation.Has(flag) && absl::StrContains(invocation.Get(flag), ',')) {
      return absl::InvalidArgumentError(
          absl::StrCat("--search draws the members: --", flag,
                       " takes one value with it (the members' default), not a list"));
    }
  }
  if (!invocation.Has("trials")) {
    return absl::InvalidArgumentError("--search needs --trials N, the members to draw (1 to 256)");
  }
  TRAINERD_ASSIGN_OR_RETURN(const int64_t trials,
                            invocation.GetInt("trials", 0, 1, kMaxSweepMembers));
  TRAINERD_ASSIGN_OR_RETURN(const uint64_t seed, invocation.GetUint("search-seed", 0));
  TRAINERD_ASSIGN_OR_RETURN(std::string text, ReadPointsFile(invocation.Get("search"), "search"));
  Invocation spec_flags = invocation;
  for (const char* own : {"search", "trials", "search-seed"}) spec_flags.flags.erase(own);
  v1::SubmitSweepRequest request;
  TRAINERD_ASSIGN_OR_RETURN(*request.mutable_spec(), JobSpecFromFlags(spec_flags));
  v1::SearchSpace* space = request.mutable_search();
  space->set_trials(static_cast<int32_t>(trials));
  space->set_seed(seed);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    const std::string where = absl::StrCat("--search: line ", line_number, ": ");
    const std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string flag = words.empty() ? "" : PointColumn(words[0]);
    if (flag.empty() || words.size() < 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          "write FLAG KIND VALUES: a flag of submit's that takes a value (lr, batch-size, "
          "model, ...), then uniform LOW HIGH, log-uniform LOW HIGH, integer LOW HIGH, "
          "log-integer LOW HIGH or choice VALUE..."));
    }
    const std::string& kind = words[1];
    const std::vector<std::string> values(words.begin() + 2, words.end());
    const bool range =
        kind == "uniform" || kind == "log-uniform" || kind == "integer" || kind == "log-integer";
    if (!range && kind != "choice") {
      return absl::InvalidArgumentError(absl::StrCat(where, "'", kind, "' is no distribution"));
    }
    if (range && values.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(where, kind, " takes LOW and HIGH"));
    }
    // The field the flag sets: where a member with the flag at these values differs from the
    // sweep's spec; each value checked as submit checks the flag.
    std::vector<v1::JobSpec> members;
    std::vector<std::string> paths;
    for (const std::string& value : values) {
      Invocation member = spec_flags;
      member.flags[flag] = value;
      absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(member);
      if (!spec.ok()) {
        return absl::Status(spec.status().code(), absl::StrCat(where, spec.status().message()));
      }
      const std::vector<std::string> differ = proto::DifferingPaths(*spec, request.spec());
      for (const std::string& path : differ) {
        if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
      }
      members.push_back(*std::move(spec));
    }
    if (paths.size() != 1) {
      return absl::InvalidArgumentError(
          paths.empty() ? absl::StrCat(where, "no value of --", flag, " differs from the sweep's")
                        : absl::StrCat(where, "--", flag, " sets ", paths.size(), " fields (",
                                       absl::StrJoin(paths, ", "), "); search it with --points"));
    }
    v1::SearchParameter* parameter = space->add_parameters();
    parameter->set_field(paths.front());
    if (kind == "choice") {
      for (const v1::JobSpec& member : members) {
        parameter->mutable_choice()->add_values(FieldText(member, paths.front()));
      }
      continue;
    }
    if (kind == "integer" || kind == "log-integer") {
      int64_t low = 0;
      int64_t high = 0;
      if (!absl::SimpleAtoi(values[0], &low) || !absl::SimpleAtoi(values[1], &high)) {
        return absl::InvalidArgumentError(absl::StrCat(where, kind, " takes whole numbers"));
      }
      parameter->mutable_integer()->set_low(low);
      parameter->mutable_integer()->set_high(high);
      parameter->mutable_integer()->set_log(kind == "log-integer");
      continue;
    }
    double low = 0;
    double high = 0;
    if (!absl::SimpleAtod(values[0], &low) || !absl::SimpleAtod(values[1], &high)) {
      return absl::InvalidArgumentError(absl::StrCat(where, kind, " takes numbers"));
    }
    v1::Range* bounds =
        kind == "uniform" ? parameter->mutable_uniform() : parameter->mutable_log_uniform();
    bounds->set_low(low);
    bounds->set_high(high);
  }
  if (space->parameters_size() == 0) {
    return absl::InvalidArgumentError("--search: the file names no parameter");
  }
  return request;
}

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
    const std::vector<std::string> paths =
        proto::DifferingPaths(member_specs[i], request.spec(), proto::SweptPaths());
    if (paths.empty()) continue;
    *point->mutable_spec() = member_specs[i];
    for (const std::string& path : paths) point->mutable_fields()->add_paths(path);
  }
  return request;
}

}  // namespace trainerd::client
