#include "server/engine/distributed/data_parallel.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/engine/distributed/collectives.h"

namespace trainerd::engine {
namespace {

// RankComms on a CpuGroup: the step's gradients rows-weighted in one all-reduce, the epoch's
// values summed in another.
class GroupRankComms final : public RankComms {
 public:
  explicit GroupRankComms(CpuGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }
  void Exchange(const std::vector<torch::Tensor>& gradients, int64_t rows) override {
    std::vector<double> votes = {vote_.cancel ? 1.0 : 0.0, vote_.interrupt ? 1.0 : 0.0};
    Check(group_.AllReduceRowWeightedMean(gradients, rows, &votes));
    agreed_ = StopVote{votes[0] > 0, votes[1] > 0};
  }
  void VoteStop(StopVote vote) override { vote_ = vote; }
  StopVote agreed_stop() const override { return agreed_; }
  void AllReduceSum(torch::Tensor& values) override { Check(group_.AllReduceSum(values)); }

 private:
  static void Check(const absl::Status& status) {
    if (!status.ok()) throw std::runtime_error(std::string(status.message()));
  }
  CpuGroup& group_;
  StopVote vote_;
  StopVote agreed_;
};

// A failure that only says the rank lost the others (they left, or timed out).
bool LostTheOthers(const std::string& error) {
  return absl::StrContains(error, "all-reduce failed") ||
         absl::StrContains(error, "ranks joined within");
}

std::atomic<uint64_t> next_group{0};

}  // namespace

TrainingOutcome RunDataParallel(const TrainingRun& run, absl::Duration timeout) {
  const int world = run.spec.replicas;
  TrainingOutcome failed;
  failed.state = JobState::kFailed;
  if (world < 2) {
    failed.error = "a data-parallel job has at least 2 ranks";
    return failed;
  }
  if (const std::string why = DataParallelUnsupported(run); !why.empty()) {
    failed.error = absl::StrCat("this job cannot train as ranks: ", why);
    return failed;
  }
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, world, timeout);
  if (!host.ok()) {
    failed.error = std::string(host.status().message());
    return failed;
  }
  // The group's prefix: unique in this process (one store per job, but a clear name in errors).
  const std::string prefix =
      absl::StrCat("job-", run.spec.dataset, "-", next_group.fetch_add(1), "/1");
  std::vector<TrainingOutcome> outcomes(static_cast<size_t>(world));
  auto rank_main = [&](int rank) {
    GroupOptions options;
    options.store_port = (*host)->port();
    options.prefix = prefix;
    options.rank = rank;
    options.world_size = world;
    options.timeout = timeout;
    absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(options);
    if (!group.ok()) {
      outcomes[rank].state = JobState::kFailed;
      outcomes[rank].error = std::string(group.status().message());
      return;
    }
    GroupRankComms comms(**group);
    outcomes[rank] = RunRank(run, comms);
    // The group goes here: a rank that ended early closes its connections, and the others' next
    // collective fails at once instead of waiting for the timeout.
  };
  std::vector<std::thread> threads;
  for (int rank = 1; rank < world; ++rank) threads.emplace_back(rank_main, rank);
  rank_main(0);
  for (std::thread& t : threads) t.join();

  TrainingOutcome outcome = std::move(outcomes[0]);
  if (outcome.state == JobState::kFailed && LostTheOthers(outcome.error)) {
    for (int rank = 1; rank < world; ++rank) {
      const TrainingOutcome& other = outcomes[rank];
      if (other.state == JobState::kFailed && !LostTheOthers(other.error)) {
        outcome.error = absl::StrCat("rank ", rank, ": ", other.error);
        break;
      }
    }
  }
  return outcome;
}

}  // namespace trainerd::engine
