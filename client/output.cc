// Text and JSON views of trainerd's messages for trainctl.
#include "client/output.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
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
  return OrDash(job.device().empty() ? job.spec().device() : job.device());
}

std::string EpochProgress(const v1::Job& job) {
  return absl::StrCat(job.epochs_size(), "/", job.spec().epochs());
}

std::string JobLoss(const v1::Job& job) {
  return job.epochs_size() > 0 || job.final_loss() != 0 ? FormatLoss(job.final_loss()) : "-";
}

// A fraction in [0, 1] as a percentage with two decimals, e.g. "97.25%".
std::string FormatAccuracy(double accuracy) {
  return absl::StrFormat("%.2f%%", 100.0 * accuracy);
}

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
                                           job.epochs(job.epochs_size() - 1).loss_scale(),
                                           skipped, skipped == 1 ? "step" : "steps"));
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

}  // namespace

TextTable::TextTable(std::vector<std::string> headers) { rows_.push_back(std::move(headers)); }

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(std::max(cells.size(), rows_[0].size()));
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string text;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&text, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return text;
}

std::string KeyValueLines(const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [key, value] : lines) width = std::max(width, key.size());
  std::string text;
  for (const auto& [key, value] : lines) {
    absl::StrAppend(&text, key, ":", std::string(width - key.size() + 2, ' '), value, "\n");
  }
  return text;
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

std::string DatasetListTable(const v1::ListDatasetsResponse& response) {
  TextTable table({"NAME", "ROWS", "FEATURES", "TARGETS", "SIZE", "DEVICE", "CREATED"});
  for (const v1::Dataset& dataset : response.datasets()) {
    table.AddRow({dataset.name(), absl::StrCat(dataset.row_count()),
                  ShapeToString(ToVector(dataset.feature_shape())),
                  TensorDescription(dataset.target_shape(), dataset.target_dtype()),
                  FormatBytes(dataset.size_bytes()), OrDash(dataset.device()),
                  FormatTimestamp(dataset.create_time())});
  }
  return table.Render();
}

std::string DatasetDetails(const v1::Dataset& dataset) {
  std::string targets = TensorDescription(dataset.target_shape(), dataset.target_dtype());
  if (dataset.target_dtype() == v1::DTYPE_INT64) {
    absl::StrAppend(&targets, " (classes ", dataset.target_min(), "..", dataset.target_max(), ")");
  }
  return KeyValueLines({
      {"name", dataset.name()},
      {"rows", absl::StrCat(dataset.row_count())},
      {"features", absl::StrCat(ShapeToString(ToVector(dataset.feature_shape())), " float32")},
      {"targets", targets},
      {"size", dataset.size_bytes() < 1024 ? FormatBytes(dataset.size_bytes())
                                           : absl::StrCat(FormatBytes(dataset.size_bytes()), " (",
                                                          dataset.size_bytes(), " bytes)")},
      {"sha256", OrDash(dataset.sha256())},
      {"device", OrDash(dataset.device())},
      {"created", FormatTimestamp(dataset.create_time())},
  });
}

std::string JobListTable(const v1::ListJobsResponse& response) {
  TextTable table({"ID", "STATE", "DATASET", "MODEL", "EPOCHS", "LOSS", "DEVICE", "CREATED"});
  for (const v1::Job& job : response.jobs()) {
    std::string model = job.spec().model();
    if (model.size() > kMaxModelColumn)
      model = absl::StrCat(model.substr(0, kMaxModelColumn - 3), "...");
    table.AddRow({job.id(), JobStateName(job.state()), job.spec().dataset(), model,
                  EpochProgress(job), JobLoss(job), JobDevice(job),
                  FormatTimestamp(job.create_time())});
  }
  return table.Render();
}

std::string JobDetails(const v1::Job& job) {
  const v1::JobSpec& spec = job.spec();
  std::vector<std::pair<std::string, std::string>> lines = {
      {"id", job.id()},
      {"state", JobStateName(job.state())},
  };
  if (!job.error().empty()) lines.push_back({"error", job.error()});
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
  return text;
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

}  // namespace trainerd::client
