// Asynchronous successive halving over a sweep's members (ASHA: Li et al., "A System for
// Massively Parallel Hyperparameter Tuning", 2020), with Ray Tune's ASHAScheduler's rule: at each
// rung (min_epochs * reduction_factor^k epochs, below the spec's epochs) a member is compared
// with the members that reached that rung before it, and stops there when its metric is behind
// their cutoff, the quantile that keeps the best 1/reduction_factor (numpy's linear percentile).
// The first member at a rung always goes on. Members never wait for each other: the decision is
// made when a member reaches the rung, from what is known then.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// The cutoff of `values` (lower is better) that keeps the best 1/reduction_factor: their
// (100 / reduction_factor)-th percentile, interpolated linearly between order statistics as
// numpy.percentile does. `values` must not be empty.
double HalvingCutoff(std::vector<double> values, int32_t reduction_factor);

// One sweep's rungs; thread-safe (its members report from their own workers).
class SweepRungs {
 public:
  explicit SweepRungs(HalvingSpec spec) : spec_(spec) {}

  // Whether `epoch` is a rung of a member that trains `epochs` epochs.
  bool IsRung(int32_t epoch, int32_t epochs) const;

  // Member `member` reached `epoch` with `metric` (lower is better; `metric_name` names it in the
  // reason): nullopt to go on, or why it stops here. Not a rung: nullopt. A member reaching a
  // rung twice (taken up again) keeps its first value.
  std::optional<std::string> Reached(const std::string& member, int32_t epoch, int32_t epochs,
                                     double metric, const std::string& metric_name);
  // What a member reached before a restart (its recorded epochs): kept as Reached keeps it, with
  // no decision (one was made then). Not a rung: nothing.
  void Record(const std::string& member, int32_t epoch, int32_t epochs, double metric);

 private:
  const HalvingSpec spec_;
  absl::Mutex mu_;
  // Per rung epoch, each member's metric there, in the order they arrived.
  std::map<int32_t, std::map<std::string, double>> recorded_ ABSL_GUARDED_BY(mu_);
};

// The metric halving compares for a job's epoch (lower is better) and its name: the validation
// loss; with early_stop_metric accuracy, one minus the validation accuracy; without validation,
// the training loss.
std::pair<double, std::string> HalvingMetric(const JobSpec& spec, const EpochResult& epoch);

}  // namespace trainerd::engine
