// trainctl's views of jobs (client/output.h): the table of `job list`, the key-value view of
// `job get` (its spec described in words, the parameters, the checkpoints), and the lines of
// `job watch` (one per epoch, then the outcome).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/output.h"
#include "client/view_cells.h"
#include "common/table.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {
namespace {

// Longer model specs are cut in `job list` (`job get` shows them whole).
constexpr size_t kMaxModelColumn = 40;

// A fraction in [0, 1] as a percentage with two decimals, e.g. "97.25%".
std::string FormatAccuracy(double accuracy) { return absl::StrFormat("%.2f%%", 100.0 * accuracy); }

bool HasValidation(const v1::JobSpec& spec) {
  return spec.validation_fraction() > 0 || !spec.validation_dataset().empty();
}

// "dataset 'iris-test'", or a held-out fraction with the rule that recovers its rows (jobs.proto,
// JobSpec.validation_fraction), so that the trained model can be evaluated on them elsewhere.
std::string ValidationDescription(const v1::JobSpec& spec) {
  if (!spec.validation_dataset().empty()) {
    return absl::StrCat("dataset '", spec.validation_dataset(), "'");
  }
  return absl::StrFormat(
      "%g%% of dataset '%s' held out: the last round(%g * rows) of "
      "torch.randperm(rows, generator=torch.Generator().manual_seed(%d)), halves rounded away "
      "from zero",
      100.0 * spec.validation_fraction(), spec.dataset(), spec.validation_fraction(), spec.seed());
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
  if (optimizer.amsgrad()) absl::StrAppend(&text, ", amsgrad");
  if (optimizer.centered()) absl::StrAppend(&text, ", centered");
  if (optimizer.has_momentum_decay()) {
    absl::StrAppend(&text, absl::StrFormat(", momentum decay %g", optimizer.momentum_decay()));
  }
  if (optimizer.decoupled_weight_decay()) absl::StrAppend(&text, ", decoupled weight decay");
  if (optimizer.has_lr_decay()) {
    absl::StrAppend(&text, absl::StrFormat(", lr decay %g", optimizer.lr_decay()));
  }
  if (optimizer.has_initial_accumulator_value()) {
    absl::StrAppend(
        &text, absl::StrFormat(", initial accumulator %g", optimizer.initial_accumulator_value()));
  }
  if (optimizer.weight_decay_exclude_bias_and_norm()) {
    absl::StrAppend(&text, ", no weight decay on biases and norms");
  }
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
  // A weight list: its values, the first few of a long one.
  auto weights = [&text](const char* name, const google::protobuf::RepeatedField<double>& values) {
    if (values.empty()) return;
    constexpr int kShown = 8;
    absl::StrAppend(&text, ", ", name, " ");
    for (int i = 0; i < values.size() && i < kShown; ++i) {
      absl::StrAppend(&text, i == 0 ? "" : ",", absl::StrFormat("%g", values[i]));
    }
    if (values.size() > kShown) absl::StrAppend(&text, ",... (", values.size(), " values)");
  };
  weights("class weights", spec.class_weights());
  if (spec.has_ignore_index()) absl::StrAppend(&text, ", ignore index ", spec.ignore_index());
  weights("pos_weight", spec.pos_weight());
  return text;
}

// "1 epoch", "5 epochs".
std::string Epochs(int32_t count) { return absl::StrCat(count, count == 1 ? " epoch" : " epochs"); }

bool HasSchedule(const v1::JobSpec& spec) {
  const v1::Schedule& schedule = spec.schedule();
  return (schedule.kind() != v1::Schedule::KIND_UNSPECIFIED &&
          schedule.kind() != v1::Schedule::CONSTANT) ||
         schedule.warmup_epochs() > 0 || schedule.warmup_steps() > 0 || schedule.per_step();
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
  const bool per_step = schedule.per_step() || schedule.kind() == v1::Schedule::ONE_CYCLE;
  // "3 epochs", or "3 steps" for a per-step schedule.
  auto units = [per_step](int64_t count) {
    return per_step ? absl::StrCat(count, count == 1 ? " step" : " steps")
                    : Epochs(static_cast<int32_t>(count));
  };
  const double gamma = schedule.gamma() == 0 ? 0.1 : schedule.gamma();
  std::string text;
  switch (schedule.kind()) {
    case v1::Schedule::STEP:
      text = absl::StrFormat("step, times %g every %s", gamma, units(schedule.step_epochs()));
      break;
    case v1::Schedule::MULTI_STEP:
      text = absl::StrFormat("multistep, times %g after %s %s", gamma,
                             per_step ? "steps" : "epochs",
                             absl::StrJoin(schedule.milestones(), ", "));
      break;
    case v1::Schedule::EXPONENTIAL:
      text = absl::StrFormat("exponential, times %g every %s", gamma, per_step ? "step" : "epoch");
      break;
    case v1::Schedule::COSINE:
      text = absl::StrFormat("cosine towards %g", schedule.min_learning_rate());
      break;
    case v1::Schedule::COSINE_WARM_RESTARTS:
      text = absl::StrFormat("cosine restarts towards %g, first cycle %s, times %d",
                             schedule.min_learning_rate(), units(schedule.t_0()),
                             schedule.has_t_mult() ? schedule.t_mult() : 1);
      break;
    case v1::Schedule::ONE_CYCLE:
      text = absl::StrFormat(
          "onecycle, %s, pct_start %g, div_factor %g, final_div_factor %g%s",
          schedule.anneal_strategy().empty() ? "cos" : schedule.anneal_strategy(),
          schedule.has_pct_start() ? schedule.pct_start() : 0.3,
          schedule.has_div_factor() ? schedule.div_factor() : 25.0,
          schedule.has_final_div_factor() ? schedule.final_div_factor() : 1e4,
          schedule.three_phase() ? ", three phases" : "");
      break;
    case v1::Schedule::REDUCE_ON_PLATEAU:
      text = absl::StrFormat(
          "plateau, times %g after %s without improvement (threshold %g), cooldown %s, "
          "min %g",
          schedule.has_factor() ? schedule.factor() : 0.1,
          Epochs(schedule.has_patience() ? schedule.patience() : 10),
          schedule.has_threshold() ? schedule.threshold() : 1e-4, Epochs(schedule.cooldown()),
          schedule.min_learning_rate());
      break;
    default:
      text = "constant";
      break;
  }
  if (per_step) absl::StrAppend(&text, ", per step");
  if (schedule.warmup_epochs() > 0) {
    absl::StrAppend(&text, ", warm-up ", Epochs(schedule.warmup_epochs()));
  }
  if (schedule.warmup_steps() > 0) {
    absl::StrAppend(&text, ", warm-up ", units(schedule.warmup_steps()));
  }
  if (job.epochs_size() > 0) {
    const v1::EpochResult& last = job.epochs(job.epochs_size() - 1);
    absl::StrAppend(&text,
                    absl::StrFormat("; lr %g %s epoch %d", last.learning_rate(),
                                    per_step ? "at the start of" : "in", last.epoch()));
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
  if (spec.drop_last()) lines.push_back({"drop last", "yes (a short last batch is dropped)"});
  if (spec.gradient_accumulation_steps() > 1) {
    lines.push_back({"accumulation", absl::StrCat(spec.gradient_accumulation_steps(),
                                                  " batches per optimizer step")});
  }
  if (HasValidation(spec)) lines.push_back({"validation", ValidationDescription(spec)});
  if (spec.early_stop_patience() > 0) {
    std::string patience = absl::StrCat(spec.early_stop_patience(), " epochs");
    if (spec.early_stop_metric() == v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY) {
      absl::StrAppend(&patience, " on val accuracy");
    }
    if (spec.early_stop_min_delta() > 0) {
      absl::StrAppend(&patience, absl::StrFormat(", min delta %g", spec.early_stop_min_delta()));
    }
    if (job.stopped_early()) absl::StrAppend(&patience, " (stopped early)");
    lines.push_back({"early stopping", patience});
  }
  if (spec.halving().min_epochs() > 0) {
    lines.push_back(
        {"halving",
         absl::StrCat("rungs at ", spec.halving().min_epochs(), " epochs and each x",
                      spec.halving().reduction_factor(), " (its sweep's members compared there)")});
  }
  if (!job.stop_reason().empty()) lines.push_back({"stopped", job.stop_reason()});
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
  // A data-parallel job: the per-rank batch, the global one, and where each rank ran.
  if (spec.replicas() > 1) {
    lines.push_back({"batch size", absl::StrCat(spec.batch_size(), " per rank, ",
                                                job.global_batch_size(), " global")});
    std::vector<std::string> placed;
    for (const v1::RankPlacement& rank : job.ranks()) {
      placed.push_back(absl::StrCat(rank.rank(), ": ", rank.device(), " on ", rank.node()));
    }
    lines.push_back({"ranks", placed.empty() ? absl::StrCat(spec.replicas(), " (not started)")
                                             : absl::StrCat(spec.replicas(), " (",
                                                            absl::StrJoin(placed, ", "), ")")});
  } else {
    lines.push_back({"batch size", absl::StrCat(spec.batch_size())});
    // A sweep's member that trains on a peer: the peer, and its job's id there once it took it.
    if (spec.nodes_size() == 1 && job.ranks_size() > 0 && !job.ranks(0).job_id().empty()) {
      lines.push_back({"on peer", absl::StrCat(spec.nodes(0), " as ", job.ranks(0).job_id())});
    }
  }
  lines.insert(lines.end(), {
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
  // The best validation epoch (with its numbers) and the epoch the trained model is from.
  if (job.best_epoch() > 0) {
    std::string best = absl::StrCat("epoch ", job.best_epoch());
    if (job.best_epoch() <= job.epochs_size()) {
      const v1::EpochResult& e = job.epochs(job.best_epoch() - 1);
      absl::StrAppend(&best, ", val loss ", FormatLoss(e.validation_loss()));
      if (e.has_validation_accuracy()) {
        absl::StrAppend(&best, ", val accuracy ", FormatAccuracy(e.validation_accuracy()));
      }
    }
    lines.push_back({"best epoch", best});
  }
  if (job.model_epoch() > 0) {
    lines.push_back(
        {"model from", absl::StrCat("epoch ", job.model_epoch(),
                                    job.model_epoch() == job.best_epoch() ? " (the best)"
                                    : job.model_epoch() == EpochsCompleted(job) ? " (the last)"
                                                                                   : "")});
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
  if (!job.request_id().empty()) lines.push_back({"request id", job.request_id()});
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
      if (job.model_epoch() > 0 && job.model_epoch() == job.best_epoch()) {
        absl::StrAppend(&text, ", model from the best epoch (", job.model_epoch(), ")");
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
