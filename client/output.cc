// Text and JSON views of trainerd's messages for trainctl.
#include "client/output.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/progress_bar.h"
#include "common/table.h"
#include "google/protobuf/util/json_util.h"

namespace trainerd::client {
namespace {

// Longer model specs are cut in `job list` (`job get` shows them whole).
constexpr size_t kMaxModelColumn = 40;

std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

// "4 float32", "scalar int64".
std::string TensorDescription(const google::protobuf::RepeatedField<int64_t>& shape,
                              v1::DType dtype) {
  return absl::StrCat(ShapeToString(ToVector(shape)), " ", DTypeName(dtype));
}

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

std::string JobDevice(const v1::Job& job) {
  std::string device = OrDash(job.device().empty() ? job.spec().device() : job.device());
  // Chosen by device auto: the estimates it was chosen from, e.g. "cpu (auto: cpu 0.02 s,
  // cuda:0 0.31 s)".
  if (job.device_estimates_size() > 0) {
    std::vector<std::string> estimates;
    for (const v1::DeviceEstimate& e : job.device_estimates()) {
      estimates.push_back(absl::StrFormat("%s %.3g s", e.device(), e.job_seconds()));
    }
    absl::StrAppend(&device, " (auto: ", absl::StrJoin(estimates, ", "), ")");
  }
  return device;
}

// Epochs finished: a listing's basic view carries the count without the epochs themselves.
int32_t EpochsCompleted(const v1::Job& job) {
  return std::max(job.epochs_completed(), job.epochs_size());
}

std::string EpochProgress(const v1::Job& job) {
  return absl::StrCat(EpochsCompleted(job), "/", job.spec().epochs());
}

std::string JobLoss(const v1::Job& job) {
  return EpochsCompleted(job) > 0 || job.final_loss() != 0 ? FormatLoss(job.final_loss()) : "-";
}

// The last epoch's validation loss, "-" when the job has none (no validation, or a listing's
// basic view without the epochs).
std::string LastValidationLoss(const v1::Job& job) {
  if (job.epochs_size() == 0 || !job.epochs(job.epochs_size() - 1).has_validation_loss()) {
    return "-";
  }
  return FormatLoss(job.epochs(job.epochs_size() - 1).validation_loss());
}

// A sweep member's swept values as table cells: "-" for a momentum its optimizer ignores and for
// an unset weight decay or seed.
std::string SweptLearningRate(const v1::Job& job) {
  return absl::StrFormat("%g", job.spec().optimizer().learning_rate());
}
std::string SweptMomentum(const v1::Job& job) {
  const v1::OptimizerKind kind = job.spec().optimizer().kind();
  if (kind != v1::OPTIMIZER_KIND_SGD && kind != v1::OPTIMIZER_KIND_RMSPROP) return "-";
  return absl::StrFormat("%g", job.spec().optimizer().momentum());
}
std::string SweptWeightDecay(const v1::Job& job) {
  if (!job.spec().optimizer().has_weight_decay()) return "-";
  return absl::StrFormat("%g", job.spec().optimizer().weight_decay());
}
std::string SweptSeed(const v1::Job& job) {
  return job.spec().has_seed() ? absl::StrCat(job.spec().seed()) : "-";
}

// A fraction in [0, 1] as a percentage with two decimals, e.g. "97.25%".
std::string FormatAccuracy(double accuracy) { return absl::StrFormat("%.2f%%", 100.0 * accuracy); }

bool HasValidation(const v1::JobSpec& spec) {
  return spec.validation_fraction() > 0 || !spec.validation_dataset().empty();
}

// "20% of dataset 'iris' (fixed split)" or "dataset 'iris-test'".
std::string ValidationDescription(const v1::JobSpec& spec) {
  if (!spec.validation_dataset().empty()) {
    return absl::StrCat("dataset '", spec.validation_dataset(), "'");
  }
  return absl::StrFormat("%g%% of dataset '%s' (held out, split by the seed)",
                         100.0 * spec.validation_fraction(), spec.dataset());
}

std::string OptimizerDescription(const v1::Optimizer& optimizer) {
  std::string text = absl::StrCat(OptimizerName(optimizer.kind()), ", lr ",
                                  absl::StrFormat("%g", optimizer.learning_rate()));
  if (optimizer.kind() == v1::OPTIMIZER_KIND_SGD || optimizer.momentum() != 0) {
    absl::StrAppend(&text, ", momentum ", absl::StrFormat("%g", optimizer.momentum()));
  }
  if (optimizer.nesterov()) absl::StrAppend(&text, " (nesterov)");
  if (optimizer.has_weight_decay()) {
    absl::StrAppend(&text, ", weight decay ", absl::StrFormat("%g", optimizer.weight_decay()));
  }
  if (optimizer.has_beta1())
    absl::StrAppend(&text, absl::StrFormat(", beta1 %g", optimizer.beta1()));
  if (optimizer.has_beta2())
    absl::StrAppend(&text, absl::StrFormat(", beta2 %g", optimizer.beta2()));
  if (optimizer.has_eps()) absl::StrAppend(&text, absl::StrFormat(", eps %g", optimizer.eps()));
  if (optimizer.has_alpha())
    absl::StrAppend(&text, absl::StrFormat(", alpha %g", optimizer.alpha()));
  return text;
}

std::string LossDescription(const v1::JobSpec& spec) {
  std::string text = LossName(spec.loss());
  if (spec.loss() == v1::LOSS_HUBER) {
    absl::StrAppend(
        &text, absl::StrFormat(", delta %g", spec.huber_delta() == 0 ? 1.0 : spec.huber_delta()));
  }
  if (spec.label_smoothing() != 0) {
    absl::StrAppend(&text, absl::StrFormat(", label smoothing %g", spec.label_smoothing()));
  }
  return text;
}

// "1 epoch", "5 epochs".
std::string Epochs(int32_t count) { return absl::StrCat(count, count == 1 ? " epoch" : " epochs"); }

bool HasSchedule(const v1::JobSpec& spec) {
  const v1::Schedule& schedule = spec.schedule();
  return schedule.kind() == v1::Schedule::STEP || schedule.kind() == v1::Schedule::COSINE ||
         schedule.warmup_epochs() > 0;
}

// "cosine to 0.0001, warm-up 5 epochs; lr 0.0095 in epoch 7".
// "bf16 (autocast)", or for fp16 "fp16 (autocast, loss scale 32768, 3 steps skipped)" with the
// last epoch's scale and the skips of all epochs.
std::string PrecisionDescription(const v1::Job& job) {
  if (job.spec().precision() == v1::PRECISION_BF16) return "bf16 (autocast)";
  std::string text = "fp16 (autocast, loss scaling";
  if (job.epochs_size() > 0 && job.epochs(job.epochs_size() - 1).has_loss_scale()) {
    int64_t skipped = 0;
    for (const v1::EpochResult& epoch : job.epochs()) skipped += epoch.skipped_steps();
    absl::StrAppend(&text, absl::StrFormat(": scale %g, %d %s skipped",
                                           job.epochs(job.epochs_size() - 1).loss_scale(), skipped,
                                           skipped == 1 ? "step" : "steps"));
  }
  return text + ")";
}

std::string ScheduleDescription(const v1::Job& job) {
  const v1::Schedule& schedule = job.spec().schedule();
  std::string text;
  switch (schedule.kind()) {
    case v1::Schedule::STEP:
      text =
          absl::StrFormat("step, times %g every %s", schedule.gamma() == 0 ? 0.1 : schedule.gamma(),
                          Epochs(schedule.step_epochs()));
      break;
    case v1::Schedule::COSINE:
      text = absl::StrFormat("cosine to %g", schedule.min_learning_rate());
      break;
    default:
      text = "constant";
      break;
  }
  if (schedule.warmup_epochs() > 0) {
    absl::StrAppend(&text, ", warm-up ", Epochs(schedule.warmup_epochs()));
  }
  if (job.epochs_size() > 0) {
    const v1::EpochResult& last = job.epochs(job.epochs_size() - 1);
    absl::StrAppend(&text,
                    absl::StrFormat("; lr %g in epoch %d", last.learning_rate(), last.epoch()));
  }
  return text;
}

std::string ParameterLine(const v1::Parameter& parameter) {
  std::vector<std::string> values;
  const int shown = std::min(parameter.values_size(), kShownParameterValues);
  for (int i = 0; i < shown; ++i) values.push_back(absl::StrFormat("%.6g", parameter.values(i)));
  std::string text =
      absl::StrCat("  ", parameter.name(), " [", ShapeToString(ToVector(parameter.shape())),
                   "]: ", absl::StrJoin(values, ", "));
  if (parameter.values_size() > shown) {
    absl::StrAppend(&text, ", ... (", parameter.values_size(), " values; all with -o json)");
  }
  return text;
}

// A fraction (0..1) as a percentage: "34.5%" (report) or "35%" (tables).
std::string Percent(double fraction, int decimals) {
  return absl::StrFormat("%.*f%%", decimals, 100.0 * fraction);
}

// Microseconds for the diagnose table: "4.2 µs", "-" for 0 (nothing measured, or the CPU's sync,
// which has no queue to wait for).
std::string Microseconds(double seconds) {
  if (seconds <= 0 || !std::isfinite(seconds)) return "-";
  return absl::StrFormat("%.1f µs", seconds * 1e6);
}

// Cuts `text` to `width` columns, ending in "..." when cut. Names only (ASCII in practice).
std::string Truncate(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return absl::StrCat(text.substr(0, width - 3), "...");
}

// Model names of CPUs run long ("AMD EPYC 7763 64-Core Processor"); the tables cut them so that a
// row stays within about 100 columns. -o json has them whole.
constexpr size_t kMaxDeviceNameColumn = 24;
constexpr size_t kMaxDiagnoseNameColumn = 22;  // its other columns are wider
// Dataset names are listed in `devices` only while they fit this many columns.
constexpr size_t kMaxDatasetNames = 24;
// Cells inside the epoch bar of `top`.
constexpr int kTopBarWidth = 20;

}  // namespace

TextTable::TextTable(std::vector<std::string> headers) { rows_.push_back(std::move(headers)); }

void TextTable::AddRow(std::vector<std::string> cells) {
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
    absl::StrAppend(&text, key, ":", std::string(width - DisplayWidth(key) + 2, ' '), value, "\n");
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

// The device, and "(on disk)" when the dataset is not resident now (it loads when used).
std::string DatasetWhere(const v1::Dataset& dataset) {
  std::string where = OrDash(dataset.device());
  if (dataset.location() == v1::DATASET_LOCATION_DISK) absl::StrAppend(&where, " (on disk)");
  if (dataset.location() == v1::DATASET_LOCATION_HOST) absl::StrAppend(&where, " (in host memory)");
  return where;
}

std::string DatasetListTable(const v1::ListDatasetsResponse& response, TableOptions options) {
  std::vector<std::string> headers = {"NAME", "ROWS",   "FEATURES", "TARGETS",
                                      "SIZE", "DEVICE", "CREATED"};
  if (options.wide) headers.insert(headers.end(), {"OWNER", "SHA256"});
  TextTable table(std::move(headers));
  for (const v1::Dataset& dataset : response.datasets()) {
    std::vector<std::string> row = {
        dataset.name(),
        absl::StrCat(dataset.row_count()),
        ShapeToString(ToVector(dataset.feature_shape())),
        TensorDescription(dataset.target_shape(), dataset.target_dtype()),
        FormatBytes(dataset.size_bytes()),
        DatasetWhere(dataset),
        FormatTimestamp(dataset.create_time())};
    if (options.wide) row.insert(row.end(), {OrDash(dataset.owner()), OrDash(dataset.sha256())});
    table.AddRow(std::move(row));
  }
  return table.Render(options.headers);
}

std::string DatasetDetails(const v1::Dataset& dataset) {
  std::string targets = TensorDescription(dataset.target_shape(), dataset.target_dtype());
  if (dataset.target_dtype() == v1::DTYPE_INT64) {
    absl::StrAppend(&targets, " (classes ", dataset.target_min(), "..", dataset.target_max(), ")");
  }
  std::vector<std::pair<std::string, std::string>> lines = {
      {"name", dataset.name()},
      {"rows", absl::StrCat(dataset.row_count())},
      {"features", absl::StrCat(ShapeToString(ToVector(dataset.feature_shape())), " float32")},
      {"targets", targets},
      {"size", dataset.size_bytes() < 1024 ? FormatBytes(dataset.size_bytes())
                                           : absl::StrCat(FormatBytes(dataset.size_bytes()), " (",
                                                          dataset.size_bytes(), " bytes)")},
      {"sha256", OrDash(dataset.sha256())},
      {"device", DatasetWhere(dataset)},
      {"created", FormatTimestamp(dataset.create_time())},
  };
  // Only a daemon with authentication records who uploaded it.
  if (!dataset.owner().empty()) lines.push_back({"owner", dataset.owner()});
  if (dataset.shared()) lines.push_back({"shared", "yes: other tenants' jobs may train on it"});
  return KeyValueLines(lines);
}

std::string JobListTable(const v1::ListJobsResponse& response, TableOptions options) {
  std::vector<std::string> headers = {"ID",     "STATE", "DATASET", "MODEL",
                                      "EPOCHS", "LOSS",  "DEVICE",  "CREATED"};
  if (options.wide) {
    headers.insert(headers.end(), {"LOSS FN", "OPTIMIZER", "LR", "ENGINE", "SWEEP", "OWNER"});
  }
  TextTable table(std::move(headers));
  for (const v1::Job& job : response.jobs()) {
    std::string model = job.spec().model();
    if (!options.wide && model.size() > kMaxModelColumn)
      model = absl::StrCat(model.substr(0, kMaxModelColumn - 3), "...");
    // A record the daemon cannot read shows as such; its other columns are empty.
    std::vector<std::string> row = {job.id(),
                                    job.record_damaged().empty()
                                        ? JobStateName(job.state())
                                        : absl::StrCat(JobStateName(job.state()), " (DAMAGED)"),
                                    job.spec().dataset(),
                                    model,
                                    EpochProgress(job),
                                    JobLoss(job),
                                    JobDevice(job),
                                    FormatTimestamp(job.create_time())};
    if (options.wide) {
      row.insert(row.end(),
                 {LossName(job.spec().loss()), OptimizerName(job.spec().optimizer().kind()),
                  SweptLearningRate(job), OrDash(job.report().engine()), OrDash(job.sweep_id()),
                  OrDash(job.owner())});
    }
    table.AddRow(std::move(row));
  }
  return table.Render(options.headers);
}

std::string JobDetails(const v1::Job& job) {
  const v1::JobSpec& spec = job.spec();
  std::vector<std::pair<std::string, std::string>> lines = {
      {"id", job.id()},
      {"state", JobStateName(job.state())},
  };
  if (!job.error().empty()) lines.push_back({"error", job.error()});
  if (!job.record_damaged().empty()) lines.push_back({"record", job.record_damaged()});
  if (!job.checkpoint_error().empty()) {
    lines.push_back({"checkpoint", absl::StrCat(job.checkpoint_error(), " (the job went on)")});
  }
  if (!job.owner().empty()) lines.push_back({"owner", job.owner()});
  if (!job.sweep_id().empty()) lines.push_back({"sweep", job.sweep_id()});
  std::string model = spec.model();
  if (job.parameter_count() > 0)
    absl::StrAppend(&model, " (", job.parameter_count(), " parameters)");
  lines.insert(lines.end(), {
                                {"dataset", spec.dataset()},
                                {"model", model},
                                {"loss", LossDescription(spec)},
                                {"optimizer", OptimizerDescription(spec.optimizer())},
                            });
  // Shown only when set, so that a plain job's view stays short.
  if (HasSchedule(spec)) lines.push_back({"schedule", ScheduleDescription(job)});
  if (spec.clip_grad_norm() > 0) {
    lines.push_back({"clip grad norm", absl::StrFormat("%g", spec.clip_grad_norm())});
  }
  if (HasValidation(spec)) lines.push_back({"validation", ValidationDescription(spec)});
  if (spec.early_stop_patience() > 0) {
    std::string patience = absl::StrCat(spec.early_stop_patience(), " epochs");
    if (job.stopped_early()) absl::StrAppend(&patience, " (stopped early)");
    lines.push_back({"early stopping", patience});
  }
  if (spec.precision() == v1::PRECISION_BF16 || spec.precision() == v1::PRECISION_FP16) {
    lines.push_back({"precision", PrecisionDescription(job)});
  }
  if (spec.checkpoint_every() > 0) {
    lines.push_back({"checkpoints", absl::StrCat("every ", spec.checkpoint_every(), " epochs, ",
                                                 job.checkpoints_size(), " written")});
  }
  if (spec.priority() == v1::JOB_PRIORITY_HIGH) lines.push_back({"priority", "high"});
  if (spec.priority() == v1::JOB_PRIORITY_LOW) lines.push_back({"priority", "low"});
  if (spec.engine() == v1::ENGINE_FUSED) lines.push_back({"engine", "fused"});
  if (spec.engine() == v1::ENGINE_LIBTORCH) lines.push_back({"engine", "libtorch"});
  lines.insert(lines.end(), {
                                {"batch size", absl::StrCat(spec.batch_size())},
                                {"shuffle", spec.has_shuffle() && !spec.shuffle() ? "no" : "yes"},
                                {"seed", spec.has_seed() ? absl::StrCat(spec.seed()) : "-"},
                                {"device", JobDevice(job)},
                                {"epochs", EpochProgress(job)},
                                {"final loss", JobLoss(job)},
                            });
  // The last epoch's validation numbers, when the job validates and has finished an epoch.
  if (job.epochs_size() > 0 && job.epochs(job.epochs_size() - 1).has_validation_loss()) {
    const v1::EpochResult& last = job.epochs(job.epochs_size() - 1);
    lines.push_back({"val loss", FormatLoss(last.validation_loss())});
    if (last.has_validation_accuracy()) {
      lines.push_back({"val accuracy", FormatAccuracy(last.validation_accuracy())});
    }
  }
  lines.insert(lines.end(), {
                                {"wall time", absl::StrFormat("%.2f s", job.wall_seconds())},
                                {"steps", absl::StrCat(job.steps())},
                                {"samples/s", absl::StrFormat("%.1f", job.samples_per_second())},
                                {"host syncs", absl::StrCat(job.host_syncs())},
                                {"created", FormatTimestamp(job.create_time())},
                                {"started", FormatTimestamp(job.start_time())},
                                {"ended", FormatTimestamp(job.end_time())},
                            });
  // Taken up again after the daemon stopped (a crash, a drain): how often, and the last time.
  if (job.restarts_size() > 0) {
    const v1::JobRestart& last = job.restarts(job.restarts_size() - 1);
    lines.push_back(
        {"restarts",
         absl::StrCat(job.restarts_size(), " (last ", FormatTimestamp(last.time()),
                      last.from_epoch() > 0
                          ? absl::StrCat(", from the checkpoint of epoch ", last.from_epoch())
                          : std::string(", from the start"),
                      ")")});
  }
  if (job.parameters_size() == 0) {
    lines.push_back({"parameters", job.parameter_count() > 0 && IsTerminal(job.state())
                                       ? "not reported (more than 1,000 values)"
                                       : "-"});
  } else {
    lines.push_back({"parameters", ""});
  }
  std::string text = KeyValueLines(lines);
  // The "parameters:" line has no value; drop the alignment spaces that follow it.
  if (job.parameters_size() > 0) {
    size_t end = text.find_last_not_of(" \n");
    text.resize(end + 1);
    text.push_back('\n');
    for (const v1::Parameter& parameter : job.parameters()) {
      absl::StrAppend(&text, ParameterLine(parameter), "\n");
    }
  }
  // One line per checkpoint, after everything else: a long job can have many.
  if (job.checkpoints_size() > 0) {
    absl::StrAppend(&text, "checkpoint files:\n");
    for (const v1::Checkpoint& checkpoint : job.checkpoints()) {
      absl::StrAppend(&text, absl::StrFormat("  epoch %d  %s  (%d bytes)\n", checkpoint.epoch(),
                                             checkpoint.path(), checkpoint.size_bytes()));
    }
  }
  // Last, so that the verdict ends the view where the eye lands.
  if (job.has_report()) absl::StrAppend(&text, DeviceReportSection(job.report()));
  return text;
}

std::string SweepSubmitTable(const v1::SubmitSweepResponse& response, TableOptions options) {
  TextTable table({"ID", "LR", "MOMENTUM", "WEIGHT DECAY", "SEED", "STATE"});
  for (const v1::Job& job : response.members()) {
    table.AddRow({job.id(), SweptLearningRate(job), SweptMomentum(job), SweptWeightDecay(job),
                  SweptSeed(job), JobStateName(job.state())});
  }
  return absl::StrCat(response.sweep_id(), "\n", table.Render(options.headers));
}

std::string SweepWatchTable(const google::protobuf::RepeatedPtrField<v1::Job>& members,
                            int max_members) {
  std::vector<const v1::Job*> order;
  for (const v1::Job& job : members) order.push_back(&job);
  // Members without an epoch have no loss yet (final_loss is 0 until the first), and a NaN loss
  // (a diverged member) compares with nothing: both go after every real loss.
  auto rank = [](const v1::Job* job) {
    if (EpochsCompleted(*job) == 0) return 2;
    return std::isnan(job->final_loss()) ? 1 : 0;
  };
  std::stable_sort(order.begin(), order.end(), [&](const v1::Job* a, const v1::Job* b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return rank(a) == 0 && a->final_loss() < b->final_loss();
  });
  const size_t shown =
      max_members > 0 ? std::min(order.size(), static_cast<size_t>(max_members)) : order.size();
  TextTable table({"ID", "LR", "MOMENTUM", "WD", "SEED", "STATE", "EPOCH", "LOSS", "VAL LOSS"});
  for (size_t i = 0; i < shown; ++i) {
    const v1::Job& job = *order[i];
    table.AddRow({job.id(), SweptLearningRate(job), SweptMomentum(job), SweptWeightDecay(job),
                  SweptSeed(job), JobStateName(job.state()), EpochProgress(job), JobLoss(job),
                  LastValidationLoss(job)});
  }
  std::string text = table.Render();
  if (shown < order.size()) {
    absl::StrAppend(&text, "... and ", order.size() - shown, " more\n");
  }
  return text;
}

std::string SweepSummaryLine(const google::protobuf::RepeatedPtrField<v1::Job>& members) {
  int succeeded = 0;
  int failed = 0;
  int cancelled = 0;
  const v1::Job* best = nullptr;
  for (const v1::Job& job : members) {
    if (job.state() == v1::JOB_STATE_FAILED) ++failed;
    if (job.state() == v1::JOB_STATE_CANCELLED) ++cancelled;
    if (job.state() != v1::JOB_STATE_SUCCEEDED) continue;
    ++succeeded;
    // The first of equal losses, as in the table; a NaN loss is never the best.
    if (!std::isnan(job.final_loss()) &&
        (best == nullptr || job.final_loss() < best->final_loss())) {
      best = &job;
    }
  }
  std::string text =
      absl::StrFormat("%d succeeded, %d failed, %d cancelled; ", succeeded, failed, cancelled);
  if (best == nullptr) return absl::StrCat(text, "no member succeeded");
  return absl::StrCat(text, "best ", best->id(), ", loss ", FormatLoss(best->final_loss()));
}

std::string EpochLine(const v1::EpochResult& epoch, int32_t planned_epochs) {
  std::string text = absl::StrCat("epoch ", epoch.epoch());
  if (planned_epochs > 0) absl::StrAppend(&text, "/", planned_epochs);
  absl::StrAppend(&text, "  loss ", FormatLoss(epoch.loss()));
  if (epoch.has_validation_loss()) {
    absl::StrAppend(&text, "  val_loss ", FormatLoss(epoch.validation_loss()));
  }
  if (epoch.has_validation_accuracy()) {
    absl::StrAppend(&text, "  val_acc ", FormatAccuracy(epoch.validation_accuracy()));
  }
  if (epoch.has_loss_scale()) {
    absl::StrAppend(&text, absl::StrFormat("  scale %g", epoch.loss_scale()));
    if (epoch.skipped_steps() > 0) absl::StrAppend(&text, "  skipped ", epoch.skipped_steps());
  }
  return text;
}

std::string JobOutcomeLine(const v1::Job& job) {
  std::string text = absl::StrCat("job ", job.id(), " ", JobStateName(job.state()));
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      absl::StrAppend(&text, absl::StrFormat(" in %.2f s, final loss ", job.wall_seconds()),
                      FormatLoss(job.final_loss()));
      if (job.stopped_early()) {
        absl::StrAppend(&text, " (stopped early after ", EpochProgress(job), " epochs)");
      }
      break;
    case v1::JOB_STATE_FAILED:
      if (!job.error().empty()) absl::StrAppend(&text, ": ", job.error());
      break;
    case v1::JOB_STATE_CANCELLED:
      absl::StrAppend(&text, " after ", EpochProgress(job), " epochs");
      break;
    default:
      break;
  }
  return text;
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
    case v1::DeviceReport::BOUND_UNSPECIFIED:
      return "-";
    default:
      return absl::StrCat("unknown(", static_cast<int>(bound), ")");
  }
}

std::string DeviceReportSection(const v1::DeviceReport& report) {
  // A report the daemon never filled in (a job still queued) would be all zeros: say nothing.
  if (report.ByteSizeLong() == 0) return "";
  const double times[] = {report.queue_seconds(), report.data_seconds(), report.compute_seconds(),
                          report.host_transfer_seconds()};
  const char* const names[] = {"queue", "data", "compute", "host transfer"};
  double total = 0;
  for (const double seconds : times) total += seconds;
  std::vector<std::pair<std::string, std::string>> lines;
  for (int i = 0; i < 4; ++i) {
    std::string value = absl::StrFormat("%.2f s", times[i]);
    if (total > 0) absl::StrAppend(&value, " (", Percent(times[i] / total, 1), ")");
    lines.push_back({names[i], value});
  }
  if (report.has_utilization_average() || report.has_utilization_peak()) {
    std::vector<std::string> parts;
    if (report.has_utilization_average()) {
      parts.push_back(absl::StrCat("average ", Percent(report.utilization_average(), 1)));
    }
    if (report.has_utilization_peak()) {
      parts.push_back(absl::StrCat("peak ", Percent(report.utilization_peak(), 1)));
    }
    lines.push_back({"utilization", absl::StrJoin(parts, ", ")});
  }
  lines.push_back({"peak memory",
                   report.peak_memory_bytes() > 0 ? FormatBytes(report.peak_memory_bytes()) : "-"});
  lines.push_back({"steps/s", absl::StrFormat("%.1f", report.steps_per_second())});
  if (!report.engine().empty()) {
    lines.push_back({"engine", report.engine_reason().empty()
                                   ? report.engine()
                                   : absl::StrCat(report.engine(),
                                                  " (not fused: ", report.engine_reason(), ")")});
  }
  if (report.intra_op_threads() > 0) {
    lines.push_back({"threads", absl::StrCat(report.intra_op_threads(), " intra-op")});
  }
  // A TorchScript job trains in a sandboxed worker process: what starting it cost.
  if (report.worker_start_seconds() > 0) {
    lines.push_back({"worker start",
                     absl::StrFormat("%.3f s (a sandboxed process of its own)",
                                     report.worker_start_seconds())});
  }
  // A sweep member trained in a pack: the times and speeds above are the pack's.
  if (report.packed_members() > 0) {
    lines.push_back(
        {"packed", absl::StrCat(report.packed_members(), " sweep members trained as one model")});
  }
  lines.push_back({"host syncs", absl::StrCat(report.host_syncs())});
  lines.push_back({"host→device", FormatBytes(report.host_to_device_bytes())});
  // FLOPs are unknown (0) for TorchScript modules; a dash says so rather than "0 FLOP".
  if (report.flops_per_step() > 0) {
    lines.push_back({"FLOPs/step", FormatSi(report.flops_per_step(), "FLOP")});
    std::string achieved = FormatSi(report.achieved_flops_per_second(), "FLOP/s");
    if (report.has_peak_fraction()) {
      absl::StrAppend(&achieved, " (", Percent(report.peak_fraction(), 1), " of measured peak)");
    }
    lines.push_back({"achieved", achieved});
  } else {
    lines.push_back({"FLOPs/step", "- (unknown for this model)"});
  }
  if (report.has_overhead_fraction()) {
    lines.push_back(
        {"overhead", absl::StrCat(Percent(report.overhead_fraction(), 1), " of step time")});
  }
  std::string text = "report:\n";
  for (absl::string_view line : absl::StrSplit(KeyValueLines(lines), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&text, "  ", line, "\n");
  }
  // The verdict carries its own bound ("launch-bound: ..."); the bound alone is the fallback.
  if (!report.verdict().empty()) {
    absl::StrAppend(&text, "verdict:  ", report.verdict(), "\n");
  } else if (report.bound() != v1::DeviceReport::BOUND_UNSPECIFIED) {
    absl::StrAppend(&text, "verdict:  ", BoundName(report.bound()), "\n");
  }
  return text;
}

std::string DeviceListTable(const v1::ListDevicesResponse& response, TableOptions options) {
  std::vector<std::string> headers = {"DEVICE",   "NAME",    "UTIL",  "MEMORY",
                                      "DATASETS", "RUNNING", "QUEUED"};
  if (options.wide) headers.push_back("UNUSABLE BECAUSE");
  TextTable table(std::move(headers));
  for (const v1::DeviceStatus& device : response.devices()) {
    std::string memory = "-";
    if (device.memory_total_bytes() > 0) {
      memory = absl::StrCat(FormatBytes(device.memory_used_bytes()), "/",
                            FormatBytes(device.memory_total_bytes()));
    } else if (device.memory_used_bytes() > 0) {
      memory = FormatBytes(device.memory_used_bytes());
    }
    std::string datasets = "-";
    if (device.datasets_size() > 0) {
      datasets = absl::StrCat(device.datasets_size(), ", ", FormatBytes(device.dataset_bytes()));
      const std::string names = absl::StrJoin(device.datasets(), ",");
      if (names.size() <= kMaxDatasetNames) absl::StrAppend(&datasets, " (", names, ")");
    }
    // A GPU NVML sees but the daemon cannot use is marked; `-o json` carries the reason.
    std::vector<std::string> row = {
        absl::StrCat(device.device(), device.is_default() ? "*" : "",
                     device.unusable_reason().empty() ? "" : " (unusable)"),
        OrDash(options.wide ? device.name() : Truncate(device.name(), kMaxDeviceNameColumn)),
        device.has_utilization() ? Percent(device.utilization(), 0) : "-",
        memory,
        datasets,
        device.running_jobs_size() > 0 ? absl::StrJoin(device.running_jobs(), ",") : "-",
        absl::StrCat(device.queued_jobs())};
    if (options.wide) row.push_back(OrDash(device.unusable_reason()));
    table.AddRow(std::move(row));
  }
  return table.Render(options.headers);
}

std::string DiagnoseTable(const v1::DiagnoseResponse& response) {
  std::string measured = FormatTimestamp(response.measure_time());
  if (response.cached()) absl::StrAppend(&measured, " (cached; --refresh measures again)");
  std::vector<std::pair<std::string, std::string>> header = {
      {"libtorch",
       absl::StrCat(OrDash(response.libtorch_version()),
                    response.cuda_version().empty()
                        ? " (CPU-only build)"
                        : absl::StrCat(" (built with CUDA ", response.cuda_version(), ")"))},
  };
  if (!response.driver_version().empty()) {
    header.push_back({"driver", absl::StrCat("CUDA ", response.driver_version())});
  }
  header.push_back({"measured", measured});

  // A row per device rather than a block per device: rows let the devices be compared at a
  // glance. The units sit in the cells so that the headers stay short, and NAME is last (and cut)
  // because CPU model names are long; the figures keep their columns whatever the name.
  TextTable table({"DEVICE", "MEMORY", "MATMUL", "H2D", "LAUNCH", "SYNC", "UTIL", "SM", "NAME"});
  for (const v1::DeviceDiagnosis& device : response.devices()) {
    std::string matmul = "-";
    if (device.matmul_flops_per_second() > 0) {
      matmul = FormatSi(device.matmul_flops_per_second(), "FLOP/s");
      if (device.matmul_size() > 0) absl::StrAppend(&matmul, " n=", device.matmul_size());
    }
    table.AddRow(
        {device.device(),
         device.memory_total_bytes() > 0 ? FormatBytes(device.memory_total_bytes()) : "-", matmul,
         device.host_to_device_bytes_per_second() > 0
             ? absl::StrFormat("%.1f GB/s", device.host_to_device_bytes_per_second() / 1e9)
             : "-",
         Microseconds(device.launch_seconds()), Microseconds(device.sync_seconds()),
         device.has_utilization_during_matmul() ? Percent(device.utilization_during_matmul(), 0)
                                                : "-",
         device.has_sm_activity_during_matmul() ? Percent(device.sm_activity_during_matmul(), 0)
                                                : "-",
         OrDash(Truncate(device.name(), kMaxDiagnoseNameColumn))});
  }
  return absl::StrCat(
      KeyValueLines(header), "\n", table.Render(),
      "\nMATMUL: float32 n x n matrix product (2n^3 FLOPs); H2D: copies from pinned host memory\n"
      "(a memcpy on the cpu); LAUNCH: an empty kernel (the smallest op on the cpu); SYNC: one "
      "host\n"
      "synchronisation; UTIL, SM: utilization and SM activity during the matrix products.\n");
}

v1::ListJobsResponse RunningJobs(const v1::ListJobsResponse& response) {
  v1::ListJobsResponse running;
  for (const v1::Job& job : response.jobs()) {
    if (job.state() == v1::JOB_STATE_RUNNING) *running.add_jobs() = job;
  }
  return running;
}

std::string TopScreen(const v1::ListDevicesResponse& devices, const v1::ListJobsResponse& jobs) {
  std::string text = DeviceListTable(devices);
  const v1::ListJobsResponse running = RunningJobs(jobs);
  if (running.jobs_size() == 0) return absl::StrCat(text, "\nno running jobs\n");
  TextTable table({"JOB", "DEVICE", "EPOCH", "LOSS", "SAMPLES/S", "PROGRESS"});
  for (const v1::Job& job : running.jobs()) {
    const int32_t planned = job.spec().epochs();
    const double fraction =
        planned > 0 ? static_cast<double>(EpochsCompleted(job)) / static_cast<double>(planned)
                    : 0.0;
    table.AddRow({job.id(), JobDevice(job), EpochProgress(job),
                  // The full view's last epoch, else the summary's final loss.
                  job.epochs_size() > 0 ? FormatLoss(job.epochs(job.epochs_size() - 1).loss())
                                        : JobLoss(job),
                  absl::StrFormat("%.1f", job.samples_per_second()),
                  ProgressBar::Bar(fraction, kTopBarWidth)});
  }
  return absl::StrCat(text, "\n", table.Render());
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
