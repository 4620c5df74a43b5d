// Cells that more than one of trainctl's views shows (client/view_cells.h).
#include "client/view_cells.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/output.h"
#include "google/protobuf/repeated_field.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {

std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

std::string JobDevice(const v1::Job& job) {
  // A sweep's member dealt to a peer trains there: its device there, and the peer.
  if (job.spec().replicas() <= 1 && job.spec().nodes_size() == 1) {
    const std::string there = job.ranks_size() > 0 ? job.ranks(0).device() : job.spec().device();
    return absl::StrCat(there.empty() ? "-" : there, " on ", job.spec().nodes(0));
  }
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

int32_t EpochsCompleted(const v1::Job& job) {
  return std::max(job.epochs_completed(), job.epochs_size());
}

std::string EpochProgress(const v1::Job& job) {
  return absl::StrCat(EpochsCompleted(job), "/", job.spec().epochs());
}

std::string JobLoss(const v1::Job& job) {
  return EpochsCompleted(job) > 0 || job.final_loss() != 0 ? FormatLoss(job.final_loss()) : "-";
}

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

}  // namespace trainerd::client
