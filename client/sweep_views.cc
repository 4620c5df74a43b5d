// trainctl's views of sweeps (client/output.h): the members `sweep` submitted, and the table and
// summary line of `sweep --watch`, the members sorted by validation loss when they validate, else
// by training loss.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/output.h"
#include "client/view_cells.h"
#include "google/protobuf/repeated_field.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {
namespace {

// The last epoch's validation figures, when the job has them (not without validation, nor in a
// listing's basic view without the epochs).
std::optional<double> LastValidationLoss(const v1::Job& job) {
  if (job.epochs_size() == 0 || !job.epochs(job.epochs_size() - 1).has_validation_loss()) {
    return std::nullopt;
  }
  return job.epochs(job.epochs_size() - 1).validation_loss();
}

std::optional<double> LastValidationAccuracy(const v1::Job& job) {
  if (job.epochs_size() == 0 || !job.epochs(job.epochs_size() - 1).has_validation_accuracy()) {
    return std::nullopt;
  }
  return job.epochs(job.epochs_size() - 1).validation_accuracy();
}

std::string Percent(std::optional<double> fraction) {
  return fraction.has_value() ? absl::StrFormat("%.1f%%", *fraction * 100) : "-";
}

// Whether the members are ranked by their validation loss rather than their training loss: when
// any of them validates (a sweep's members share the spec but for the swept values). A training
// loss says how well a member fits its training rows; with held-out rows, how well it does on
// rows it never trained on is what tells the members apart.
bool RankByValidation(const google::protobuf::RepeatedPtrField<v1::Job>& members) {
  for (const v1::Job& job : members) {
    if (job.spec().validation_fraction() > 0 || !job.spec().validation_dataset().empty() ||
        LastValidationLoss(job).has_value()) {
      return true;
    }
  }
  return false;
}

// The figure members are ranked by: the last validation loss, or the final training loss; none
// before the first epoch (final_loss is 0 until then).
std::optional<double> RankedLoss(const v1::Job& job, bool by_validation) {
  if (EpochsCompleted(job) == 0) return std::nullopt;
  if (by_validation) return LastValidationLoss(job);
  return job.final_loss();
}

}  // namespace

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
  const bool by_validation = RankByValidation(members);
  std::vector<const v1::Job*> order;
  for (const v1::Job& job : members) order.push_back(&job);
  // Members with a real loss first, lowest first; then those whose loss is NaN (a diverged
  // member, which compares with nothing) or who have no validation loss yet; then those without
  // an epoch.
  auto rank = [&](const v1::Job* job) {
    if (EpochsCompleted(*job) == 0) return 2;
    const std::optional<double> loss = RankedLoss(*job, by_validation);
    return loss.has_value() && !std::isnan(*loss) ? 0 : 1;
  };
  std::stable_sort(order.begin(), order.end(), [&](const v1::Job* a, const v1::Job* b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return rank(a) == 0 && *RankedLoss(*a, by_validation) < *RankedLoss(*b, by_validation);
  });
  const size_t shown =
      max_members > 0 ? std::min(order.size(), static_cast<size_t>(max_members)) : order.size();
  // A search's members may differ in more than the four swept values: the model and the batch
  // size get columns when they do.
  bool models_differ = false;
  bool batches_differ = false;
  for (const v1::Job& job : members) {
    models_differ |= job.spec().model() != members.begin()->spec().model();
    batches_differ |= job.spec().batch_size() != members.begin()->spec().batch_size();
  }
  std::vector<std::string> headers = {"ID", "LR", "MOMENTUM", "WD", "SEED"};
  if (models_differ) headers.push_back("MODEL");
  if (batches_differ) headers.push_back("BATCH");
  headers.insert(headers.end(), {"STATE", "EPOCH", "LOSS", "VAL LOSS", "VAL ACC"});
  TextTable table(headers);
  for (size_t i = 0; i < shown; ++i) {
    const v1::Job& job = *order[i];
    const std::optional<double> validation_loss = LastValidationLoss(job);
    std::vector<std::string> row = {job.id(), SweptLearningRate(job), SweptMomentum(job),
                                    SweptWeightDecay(job), SweptSeed(job)};
    if (models_differ) row.push_back(job.spec().model());  // escaped by the table
    if (batches_differ) row.push_back(absl::StrCat(job.spec().batch_size()));
    // A member halving stopped says so where its state is.
    const bool at_rung = job.stopped_early() && absl::StrContains(job.stop_reason(), "rung");
    row.insert(row.end(), {at_rung ? absl::StrCat("STOPPED AT ", EpochsCompleted(job))
                                   : JobStateName(job.state()),
                           EpochProgress(job), JobLoss(job),
                           validation_loss.has_value() ? FormatLoss(*validation_loss) : "-",
                           Percent(LastValidationAccuracy(job))});
    table.AddRow(row);
  }
  std::string text = table.Render();
  if (shown < order.size()) {
    absl::StrAppend(&text, "... and ", order.size() - shown, " more\n");
  }
  return text;
}

std::string SweepSummaryLine(const google::protobuf::RepeatedPtrField<v1::Job>& members) {
  const bool by_validation = RankByValidation(members);
  int succeeded = 0;
  int failed = 0;
  int cancelled = 0;
  const v1::Job* best = nullptr;
  double best_loss = 0;
  for (const v1::Job& job : members) {
    if (job.state() == v1::JOB_STATE_FAILED) ++failed;
    if (job.state() == v1::JOB_STATE_CANCELLED) ++cancelled;
    if (job.state() != v1::JOB_STATE_SUCCEEDED) continue;
    ++succeeded;
    // The first of equal losses, as in the table; a NaN loss is never the best.
    const std::optional<double> loss = RankedLoss(job, by_validation);
    if (loss.has_value() && !std::isnan(*loss) && (best == nullptr || *loss < best_loss)) {
      best = &job;
      best_loss = *loss;
    }
  }
  std::string text =
      absl::StrFormat("%d succeeded, %d failed, %d cancelled; ", succeeded, failed, cancelled);
  int at_rungs = 0;
  int64_t saved = 0;
  for (const v1::Job& job : members) {
    if (!job.stopped_early() || !absl::StrContains(job.stop_reason(), "rung")) continue;
    ++at_rungs;
    saved += std::max<int64_t>(0, int64_t{job.spec().epochs()} - EpochsCompleted(job));
  }
  if (at_rungs > 0) {
    absl::StrAppend(&text, "halving stopped ", at_rungs, " at their rungs, ", saved,
                    " epochs not trained; ");
  }
  if (best == nullptr) {
    return absl::StrCat(text, succeeded == 0 ? "no member succeeded"
                                             : "no member that succeeded has a validation loss");
  }
  if (!by_validation) {
    return absl::StrCat(text, "best ", best->id(), " by training loss ",
                        FormatLoss(best->final_loss()), " (the members do not validate)");
  }
  absl::StrAppend(&text, "best ", best->id(), " by validation loss ", FormatLoss(best_loss));
  if (std::optional<double> accuracy = LastValidationAccuracy(*best)) {
    absl::StrAppend(&text, ", validation accuracy ", Percent(accuracy));
  }
  return absl::StrCat(text, " (training loss ", FormatLoss(best->final_loss()), ")");
}

}  // namespace trainerd::client
