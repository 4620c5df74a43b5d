// trainctl's views of sweeps (client/output.h): the members `sweep` submitted, and the table and
// summary line of `sweep --watch`, the members sorted by loss.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/output.h"
#include "client/view_cells.h"
#include "google/protobuf/repeated_field.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {
namespace {

// The last epoch's validation loss, "-" when the job has none (no validation, or a listing's
// basic view without the epochs).
std::string LastValidationLoss(const v1::Job& job) {
  if (job.epochs_size() == 0 || !job.epochs(job.epochs_size() - 1).has_validation_loss()) {
    return "-";
  }
  return FormatLoss(job.epochs(job.epochs_size() - 1).validation_loss());
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

}  // namespace trainerd::client
