// `make bench` (bench/run.sh): a data-parallel job's scaling on this machine's CPU. An MLP of a
// few widths trained as 2 and 4 ranks (RunRank through Gloo groups, ranks as threads, one
// intra-op thread each) against one rank with the same global batch (ranks x B rows a step of a
// 64-feature dataset), for per-rank batches B of 64 and 512: seconds per epoch, the speed-up, the
// scaling efficiency (speed-up / ranks) and the share of the ranks' time spent in collectives.
// A step's all-reduce costs the same whatever B; its compute grows with B: the table shows where
// ranks start to pay. Not a test: nothing is asserted. Prints a table; with --json PATH also
// writes the figures there.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/model_spec.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/distributed/collectives.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// RankComms on a CpuGroup that times its collectives.
class TimedComms final : public RankComms {
 public:
  explicit TimedComms(CpuGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }
  void Exchange(const std::vector<torch::Tensor>& gradients, int64_t rows) override {
    const auto start = Clock::now();
    std::vector<double> votes = {0.0, 0.0};  // nobody cancels a bench: the same bucket as a job's
    (void)group_.AllReduceRowWeightedMean(gradients, rows, &votes);
    seconds += Since(start);
  }
  void VoteStop(StopVote) override {}
  StopVote agreed_stop() const override { return {}; }
  void AllReduceSum(torch::Tensor& values) override {
    const auto start = Clock::now();
    (void)group_.AllReduceSum(values);
    seconds += Since(start);
  }
  double seconds = 0;

 private:
  CpuGroup& group_;
};

struct Row {
  int width;
  int64_t batch;
  int ranks;
  double epoch_seconds;
  double speedup;
  double collective_share;
};

constexpr int64_t kRows = 4096;
constexpr int64_t kFeatures = 64;
constexpr int kEpochs = 3;

TrainingRun MakeRun(const std::shared_ptr<const Dataset>& dataset, int width, int64_t batch,
                    int ranks) {
  TrainingRun run;
  run.spec.dataset = "bench";
  run.spec.model = absl::StrCat("linear:", width, ",relu,linear:", width, ",relu,linear:10");
  run.spec.loss = LossKind::kCrossEntropy;
  run.spec.optimizer = OptimizerKind::kSgd;
  run.spec.learning_rate = 0.01;
  run.spec.batch_size = batch;  // per rank; Measure gives one rank the global batch
  run.spec.epochs = kEpochs;
  run.spec.seed = 1;
  run.spec.device = "cpu";
  run.spec.engine = EngineKind::kLibTorch;
  run.spec.replicas = ranks;
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = dataset;
  run.intra_op_threads = 1;
  return run;
}

// Seconds per epoch and the ranks' mean share of time in collectives.
std::pair<double, double> Measure(const std::shared_ptr<const Dataset>& dataset, int width,
                                  int64_t batch, int ranks, int global_ranks) {
  TrainingRun run = MakeRun(dataset, width, batch, ranks);
  if (ranks == 1) run.spec.batch_size = batch * global_ranks;  // the same global batch
  run.spec.replicas = ranks;
  if (ranks == 1) {
    const auto start = Clock::now();
    const TrainingOutcome outcome = RunTraining(run);
    if (outcome.state != JobState::kSucceeded) std::fprintf(stderr, "%s\n", outcome.error.c_str());
    return {Since(start) / kEpochs, 0.0};
  }
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, ranks, absl::Seconds(60));
  if (!host.ok()) return {0, 0};
  std::vector<double> shares(ranks);
  const std::string prefix = absl::StrCat("bench-", width, "-", batch, "-", ranks);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      GroupOptions options;
      options.store_port = (*host)->port();
      options.store_secret = (*host)->secret();
      options.prefix = prefix;
      options.rank = rank;
      options.world_size = ranks;
      absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(options);
      if (!group.ok()) return;
      TimedComms comms(**group);
      const auto rank_start = Clock::now();
      const TrainingOutcome outcome = RunRank(run, comms);
      if (outcome.state != JobState::kSucceeded) {
        std::fprintf(stderr, "rank %d: %s\n", rank, outcome.error.c_str());
      }
      shares[rank] = comms.seconds / Since(rank_start);
    });
  }
  for (std::thread& t : threads) t.join();
  double share = 0;
  for (double s : shares) share += s / ranks;
  return {Since(start) / kEpochs, share};
}

}  // namespace
}  // namespace trainerd::engine

int main(int argc, char** argv) {
  using namespace trainerd::engine;  // NOLINT
  std::string json_path;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  }
  torch::set_num_threads(1);
  torch::manual_seed(5);
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "bench";
  dataset->meta.feature_shape = {kFeatures};
  dataset->meta.target_dtype = trainerd::TargetDType::kInt64;
  dataset->meta.rows = kRows;
  dataset->meta.device = "cpu";
  dataset->features = torch::randn({kRows, kFeatures});
  dataset->targets = torch::randint(0, 10, {kRows}, torch::kInt64);
  dataset->meta.target_min = 0;
  dataset->meta.target_max = 9;
  std::vector<Row> rows;
  std::printf(
      "data-parallel MLP (64 features, two hidden layers of WIDTH), 4096 rows, %d epochs,\n"
      "B rows per rank per step, one intra-op thread per rank, Gloo on loopback\n",
      kEpochs);
  std::printf("%6s %5s %6s %14s %14s %10s %11s %12s\n", "width", "B", "ranks", "1 rank s/ep",
              "N ranks s/ep", "speed-up", "efficiency", "collectives");
  for (int width : {256, 1024}) {
    for (int64_t batch : {int64_t{64}, int64_t{512}}) {
      for (int ranks : {2, 4}) {
        // One rank with the same global batch (ranks x B rows a step), then the ranks.
        const double one = Measure(dataset, width, batch, 1, ranks).first;
        const auto [many, share] = Measure(dataset, width, batch, ranks, ranks);
        const double speedup = many > 0 ? one / many : 0;
        rows.push_back({width, batch, ranks, many, speedup, share});
        std::printf("%6d %5lld %6d %14.4f %14.4f %9.2fx %10.0f%% %11.0f%%\n", width,
                    static_cast<long long>(batch), ranks, one, many, speedup, 100 * speedup / ranks,
                    100 * share);
        std::fflush(stdout);
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      out << absl::StrFormat(
          "  {\"width\": %d, \"batch\": %d, \"ranks\": %d, \"epoch_seconds\": %.6f, "
          "\"speedup\": %.4f, \"collective_share\": %.4f}%s\n",
          rows[i].width, rows[i].batch, rows[i].ranks, rows[i].epoch_seconds, rows[i].speedup,
          rows[i].collective_share, i + 1 < rows.size() ? "," : "");
    }
    out << "]\n";
  }
  return 0;
}
