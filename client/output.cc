// The writers of trainctl's output (client/output.h): aligned tables and key-value lines, JSON
// and YAML, JSON string literals, and the formatting of single values (bytes, timestamps, losses,
// SI quantities, the names of enum values). The views of particular messages that use them are
// in dataset_views.cc, job_views.cc, sweep_views.cc and device_views.cc.
#include "client/output.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/safe_text.h"
#include "google/protobuf/util/json_util.h"

namespace trainerd::client {

TextTable::TextTable(std::vector<std::string> headers) { rows_.push_back(std::move(headers)); }

void TextTable::AddRow(std::vector<std::string> cells) {
  // A cell is one line of text, whatever the daemon sent: a name or an error with control
  // characters (a cursor move, a line break that starts a forged row) shows them escaped.
  for (std::string& cell : cells) cell = EscapeControls(cell);
  cells.resize(std::max(cells.size(), rows_[0].size()));
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render(bool headers) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], DisplayWidth(row[i]));
  }
  std::string text;
  for (size_t r = headers ? 0 : 1; r < rows_.size(); ++r) {
    const std::vector<std::string>& row = rows_[r];
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(widths[i] - DisplayWidth(row[i]) + 2, ' ');
    }
    absl::StrAppend(&text, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return text;
}

size_t DisplayWidth(absl::string_view text) {
  // UTF-8 continuation bytes (10xxxxxx) add no column; "µs" is two columns, not three.
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::string KeyValueLines(const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [key, value] : lines) width = std::max(width, DisplayWidth(key));
  std::string text;
  for (const auto& [key, value] : lines) {
    // One line each, as a cell of a table is.
    absl::StrAppend(&text, key, ":", std::string(width - DisplayWidth(key) + 2, ' '),
                    EscapeControls(value), "\n");
  }
  return text;
}

namespace {

// True when YAML would read `text` as a plain scalar of another type than a string, or not as
// the same string: it must be quoted.
bool NeedsQuotes(const std::string& text) {
  if (text.empty()) return true;
  static const char* const kWords[] = {"true", "false", "yes", "no", "on",
                                       "off",  "null",  "~",   "y",  "n"};
  const std::string lower = absl::AsciiStrToLower(text);
  for (const char* word : kWords) {
    if (lower == word) return true;
  }
  double number = 0;
  if (absl::SimpleAtod(text, &number) || lower == ".inf" || lower == "-.inf" || lower == ".nan") {
    return true;
  }
  // Indicators at the start, ": " or " #" inside, and outer spaces change a plain scalar.
  if (absl::StrContains("-?:,[]{}#&*!|>'\"%@`", text[0]) || text.back() == ' ' ||
      text.front() == ' ' || text.back() == ':' || absl::StrContains(text, ": ") ||
      absl::StrContains(text, " #")) {
    return true;
  }
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

// Emits a node of the JSON read by yaml-cpp (a JSON text is a YAML flow document), which keeps
// the objects' key order. A JSON string is a quoted scalar (tag "!"): it stays a string, quoted
// where YAML would read it otherwise; numbers, true, false and null are plain scalars, kept.
void EmitYaml(const YAML::Node& node, YAML::Emitter& out) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      if (node.size() == 0) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key << entry.first.Scalar() << YAML::Value;
        EmitYaml(entry.second, out);
      }
      out << YAML::EndMap;
      return;
    case YAML::NodeType::Sequence:
      if (node.size() == 0) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      out << YAML::BeginSeq;
      for (const YAML::Node& item : node) EmitYaml(item, out);
      out << YAML::EndSeq;
      return;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!" && NeedsQuotes(node.Scalar())) out << YAML::DoubleQuoted;
      out << node.Scalar();
      return;
    default:
      out << YAML::Null;
      return;
  }
}

}  // namespace

absl::StatusOr<std::string> JsonToYaml(absl::string_view json) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(json));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot print the answer as YAML: ", e.what()));
  }
  YAML::Emitter out;
  out.SetIndent(2);
  EmitYaml(root, out);
  if (!out.good()) {
    return absl::InternalError(
        absl::StrCat("cannot print the answer as YAML: ", out.GetLastError()));
  }
  return absl::StrCat(out.c_str(), "\n");
}

absl::StatusOr<std::string> ToYaml(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message, /*pretty=*/false);
  if (!json.ok()) return json.status();
  return JsonToYaml(*json);
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  google::protobuf::util::Status status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print the answer as JSON: ", std::string(status.message())));
  }
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatTimestamp(const google::protobuf::Timestamp& timestamp) {
  if (timestamp.seconds() == 0 && timestamp.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(timestamp.seconds()),
                          absl::LocalTimeZone());
}

std::string FormatLoss(double loss) {
  // Fixed six decimals read best for the usual range; tiny, huge and non-finite losses need
  // the exponent (or are NaN / inf, which %f prints as such too).
  // printf writes a NaN's sign bit ("-nan"), which means nothing to a reader.
  if (std::isnan(loss)) return "NaN";
  const double magnitude = std::fabs(loss);
  if (loss == 0 || (magnitude >= 1e-3 && magnitude < 1e6) || !std::isfinite(loss)) {
    return absl::StrFormat("%.6f", loss);
  }
  return absl::StrFormat("%.6e", loss);
}

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return "QUEUED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return absl::StrCat("UNKNOWN(", static_cast<int>(state), ")");
  }
}

std::string LossName(v1::Loss loss) {
  switch (loss) {
    case v1::LOSS_MSE:
      return "mse";
    case v1::LOSS_CROSS_ENTROPY:
      return "cross_entropy";
    case v1::LOSS_L1:
      return "l1";
    case v1::LOSS_HUBER:
      return "huber";
    case v1::LOSS_BCE_WITH_LOGITS:
      return "bce_with_logits";
    case v1::LOSS_NLL:
      return "nll";
    default:
      return absl::StrCat("unknown(", static_cast<int>(loss), ")");
  }
}

std::string OptimizerName(v1::OptimizerKind kind) {
  switch (kind) {
    case v1::OPTIMIZER_KIND_SGD:
      return "sgd";
    case v1::OPTIMIZER_KIND_ADAM:
      return "adam";
    case v1::OPTIMIZER_KIND_ADAMW:
      return "adamw";
    case v1::OPTIMIZER_KIND_RMSPROP:
      return "rmsprop";
    case v1::OPTIMIZER_KIND_NADAM:
      return "nadam";
    case v1::OPTIMIZER_KIND_RADAM:
      return "radam";
    case v1::OPTIMIZER_KIND_ADAGRAD:
      return "adagrad";
    default:
      return absl::StrCat("unknown(", static_cast<int>(kind), ")");
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_INT64:
      return "int64";
    default:
      return absl::StrCat("unknown(", static_cast<int>(dtype), ")");
  }
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string FormatSi(double value, absl::string_view unit) {
  if (!std::isfinite(value)) return "-";
  constexpr const char* kPrefixes[] = {"", "k", "M", "G", "T", "P"};
  int prefix = 0;
  double scaled = value;
  while (std::fabs(scaled) >= 999.5 && prefix < 5) {
    scaled /= 1000;
    ++prefix;
  }
  // Three significant digits: enough to compare, short enough for a table cell.
  const double magnitude = std::fabs(scaled);
  const int decimals = magnitude == 0 || magnitude >= 99.95 ? 0 : magnitude >= 9.995 ? 1 : 2;
  return absl::StrFormat("%.*f %s%s", decimals, scaled, kPrefixes[prefix], unit);
}

std::string BoundName(v1::DeviceReport::Bound bound) {
  switch (bound) {
    case v1::DeviceReport::LAUNCH_BOUND:
      return "launch-bound";
    case v1::DeviceReport::COMPUTE_BOUND:
      return "compute-bound";
    case v1::DeviceReport::TRANSFER_BOUND:
      return "transfer-bound";
    case v1::DeviceReport::DATA_BOUND:
      return "data-bound";
    case v1::DeviceReport::BALANCED:
      return "balanced";
    case v1::DeviceReport::COMMUNICATION_BOUND:
      return "communication-bound";
    case v1::DeviceReport::BOUND_UNSPECIFIED:
      return "-";
    default:
      return absl::StrCat("unknown(", static_cast<int>(bound), ")");
  }
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, absl::StrFormat("\\u%04x", static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace trainerd::client
