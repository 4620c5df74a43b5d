// Successive halving's rungs and cutoff (halving.h).
#include "server/engine/jobs/halving.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainerd::engine {

double HalvingCutoff(std::vector<double> values, int32_t reduction_factor) {
  std::sort(values.begin(), values.end());
  const double position =
      (static_cast<double>(values.size()) - 1.0) * (1.0 / static_cast<double>(reduction_factor));
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(values.size() - 1, below + 1);
  const double fraction = position - static_cast<double>(below);
  return values[below] + (values[above] - values[below]) * fraction;
}

bool SweepRungs::IsRung(int32_t epoch, int32_t epochs) const {
  if (epoch >= epochs || spec_.min_epochs < 1 || spec_.reduction_factor < 2) return false;
  for (int64_t rung = spec_.min_epochs; rung < epochs; rung *= spec_.reduction_factor) {
    if (rung == epoch) return true;
    if (rung > epoch) return false;
  }
  return false;
}

std::optional<std::string> SweepRungs::Reached(const std::string& member, int32_t epoch,
                                               int32_t epochs, double metric,
                                               const std::string& metric_name) {
  if (!IsRung(epoch, epochs)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  std::map<std::string, double>& rung = recorded_[epoch];
  if (rung.count(member) > 0) return std::nullopt;  // taken up again: decided the first time
  std::vector<double> before;
  before.reserve(rung.size());
  for (const auto& [id, value] : rung) before.push_back(value);
  rung.emplace(member, std::isnan(metric) ? INFINITY : metric);
  if (before.empty()) return std::nullopt;
  const double cutoff = HalvingCutoff(before, spec_.reduction_factor);
  if (!(metric > cutoff)) return std::nullopt;
  return absl::StrFormat(
      "stopped at the rung of epoch %d: %s %.6g is behind the cutoff %.6g that keeps the best "
      "1/%d of the %d members there before it (successive halving)",
      epoch, metric_name, metric, cutoff, spec_.reduction_factor, before.size());
}

void SweepRungs::Record(const std::string& member, int32_t epoch, int32_t epochs, double metric) {
  if (!IsRung(epoch, epochs)) return;
  absl::MutexLock lock(&mu_);
  recorded_[epoch].emplace(member, std::isnan(metric) ? INFINITY : metric);
}

std::pair<double, std::string> HalvingMetric(const JobSpec& spec, const EpochResult& epoch) {
  if (spec.early_stop_metric == EarlyStopMetric::kValidationAccuracy &&
      epoch.validation_accuracy.has_value()) {
    return {1.0 - *epoch.validation_accuracy, "validation error (1 - accuracy)"};
  }
  if (epoch.validation_loss.has_value()) return {*epoch.validation_loss, "validation loss"};
  return {epoch.loss, "training loss"};
}

}  // namespace trainerd::engine
