// `make bench` (bench/run.sh): what a packed sweep member's values are against the same job run
// alone, and what the CPU's packs cost. Not a test: nothing is asserted.
//
// Drift: an MLP with two hidden layers of 256 on 1,024 rows of 64 features in 10 classes, batch 64,
// 10 epochs, at learning rates where training is sensitive (adam and rmsprop, 0.01 and 0.03). The
// job alone on the LibTorch path with one intra-op thread is the reference; each line is the
// relative difference of the epoch's loss from it at epochs 1, 5 and 10 under one change: the
// same job again, two intra-op threads, the fused path, a member of a pack in turn (the CPU's
// packs), a member of a stacked pack (a GPU's packs, here on the CPU through stack_on_cpu).
//
// Cost: 8 members packed in turn and stacked, for a member that takes the LibTorch path on the
// CPU by itself (two hidden layers of 256, batch 64 and 256) and a one-layer model forced onto
// it (batch 16): seconds for 3 epochs of 2,048 rows, median of 3, one intra-op thread.
//
// Prints two tables; with --json PATH also writes the figures there.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_spec.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {
namespace {

constexpr char kWide[] = "linear:256,relu,linear:256,relu,linear:10";

// `rows` rows of 64 standard-normal features; 10 classes from a noisy random linear teacher.
std::shared_ptr<const Dataset> Classes(int64_t rows) {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "classes";
  dataset->meta.feature_shape = {64};
  dataset->meta.rows = rows;
  dataset->meta.device = "cpu";
  torch::manual_seed(11);
  dataset->features = torch::randn({rows, 64});
  const torch::Tensor teacher = torch::randn({64, 10});
  dataset->targets =
      (dataset->features.mm(teacher) + 0.5 * torch::randn({rows, 10})).argmax(/*dim=*/1);
  return dataset;
}

TrainingRun Run(const std::shared_ptr<const Dataset>& dataset, const std::string& model,
                OptimizerKind optimizer, double lr, uint64_t seed, int64_t batch, int epochs) {
  TrainingRun run;
  run.spec.dataset = "classes";
  run.spec.model = model;
  run.spec.loss = LossKind::kCrossEntropy;
  run.spec.optimizer = optimizer;
  run.spec.learning_rate = lr;
  run.spec.batch_size = batch;
  run.spec.epochs = epochs;
  run.spec.seed = seed;
  run.spec.device = "cpu";
  run.spec.engine = EngineKind::kLibTorch;
  run.model = *ParseModelSpec(model);
  run.dataset = dataset;
  run.intra_op_threads = 1;
  return run;
}

std::vector<double> Alone(TrainingRun run) {
  std::vector<double> losses;
  run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { losses.push_back(e.loss); };
  const TrainingOutcome outcome = RunTraining(run);
  if (outcome.state != JobState::kSucceeded) std::fprintf(stderr, "%s\n", outcome.error.c_str());
  return losses;
}

// Each member's epochs.
std::vector<std::vector<double>> Packed(std::vector<TrainingRun> runs) {
  std::vector<std::vector<double>> losses(runs.size());
  std::vector<const TrainingRun*> pointers;
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].on_epoch = [&losses, i](const EpochResult& e, int64_t, int64_t) {
      losses[i].push_back(e.loss);
    };
    pointers.push_back(&runs[i]);
  }
  RunPackedTraining(pointers, [](size_t, TrainingOutcome outcome) {
    if (outcome.state != JobState::kSucceeded) {
      std::fprintf(stderr, "%s\n", outcome.error.c_str());
    }
  });
  return losses;
}

double Relative(const std::vector<double>& got, const std::vector<double>& want, size_t epoch) {
  if (epoch >= got.size() || epoch >= want.size()) return NAN;
  return std::fabs(got[epoch] - want[epoch]) / std::fabs(want[epoch]);
}

std::string Cell(double value) {
  if (std::isnan(value)) return "-";
  if (value == 0) return "0";
  if (value >= 1e-3) return absl::StrFormat("%.1f%%", 100 * value);
  return absl::StrFormat("%.0e", value);
}

double Seconds(const std::vector<TrainingRun>& runs) {
  const auto start = std::chrono::steady_clock::now();
  Packed(runs);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace
}  // namespace trainerd::engine

int main(int argc, char** argv) {
  using namespace trainerd::engine;
  std::string json_path;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  }
  std::string json = "{\"drift\": [";
  std::printf(
      "packed members against the job alone: relative difference of the loss at epochs "
      "1 / 5 / 10\n");
  std::printf("%-30s %-24s %-24s %-24s %-24s\n", "change", "adam 0.01", "adam 0.03", "rmsprop 0.01",
              "rmsprop 0.03");
  const auto dataset = Classes(1024);
  struct Case {
    OptimizerKind optimizer;
    double lr;
  };
  const std::vector<Case> cases = {{OptimizerKind::kAdam, 0.01},
                                   {OptimizerKind::kAdam, 0.03},
                                   {OptimizerKind::kRmsprop, 0.01},
                                   {OptimizerKind::kRmsprop, 0.03}};
  const std::vector<std::string> changes = {"the same again", "two intra-op threads",
                                            "the fused path", "a member in turn",
                                            "a member stacked"};
  std::vector<std::vector<std::string>> cells(changes.size());
  bool first_json = true;
  for (const Case& c : cases) {
    auto run = [&] { return Run(dataset, kWide, c.optimizer, c.lr, 1, 64, 10); };
    const std::vector<double> base = Alone(run());
    std::vector<std::vector<double>> got(changes.size());
    got[0] = Alone(run());
    TrainingRun threads = run();
    threads.intra_op_threads = 2;
    got[1] = Alone(threads);
    TrainingRun fused = run();
    fused.spec.engine = EngineKind::kFused;
    got[2] = Alone(fused);
    std::vector<TrainingRun> pack = {run(), Run(dataset, kWide, c.optimizer, c.lr / 2, 2, 64, 10)};
    got[3] = Packed(pack)[0];
    for (TrainingRun& member : pack) member.stack_on_cpu = true;
    got[4] = Packed(pack)[0];
    for (size_t k = 0; k < changes.size(); ++k) {
      const double e1 = Relative(got[k], base, 0), e5 = Relative(got[k], base, 4),
                   e10 = Relative(got[k], base, 9);
      cells[k].push_back(absl::StrCat(Cell(e1), " / ", Cell(e5), " / ", Cell(e10)));
      absl::StrAppend(
          &json, first_json ? "" : ", ",
          absl::StrFormat("{\"optimizer\": \"%s\", \"lr\": %g, \"change\": \"%s\", "
                          "\"epoch1\": %g, \"epoch5\": %g, \"epoch10\": %g}",
                          OptimizerKindName(c.optimizer), c.lr, changes[k], e1, e5, e10));
      first_json = false;
    }
  }
  for (size_t k = 0; k < changes.size(); ++k) {
    std::printf("%-30s", changes[k].c_str());
    for (const std::string& cell : cells[k]) std::printf(" %-24s", cell.c_str());
    std::printf("\n");
  }
  absl::StrAppend(&json, "], \"cost\": [");

  std::printf("\n8 members, 3 epochs of 2,048 rows, one intra-op thread: seconds (median of 3)\n");
  std::printf("%-48s %10s %10s\n", "model, batch", "in turn", "stacked");
  const auto rows = Classes(2048);
  struct Cost {
    const char* model;
    int64_t batch;
  };
  first_json = true;
  for (const Cost& c : {Cost{kWide, 256}, Cost{kWide, 64}, Cost{"linear:10", 16}}) {
    std::vector<double> in_turn, stacked;
    for (int round = 0; round < 3; ++round) {
      for (bool stack : {false, true}) {
        std::vector<TrainingRun> runs;
        for (int m = 0; m < 8; ++m) {
          runs.push_back(
              Run(rows, c.model, OptimizerKind::kAdam, 1e-3 * (m + 1), m + 1, c.batch, 3));
          runs.back().stack_on_cpu = stack;
        }
        (stack ? stacked : in_turn).push_back(Seconds(runs));
      }
    }
    const std::string name = absl::StrCat(c.model, ", ", c.batch);
    std::printf("%-48s %10.3f %10.3f\n", name.c_str(), Median(in_turn), Median(stacked));
    absl::StrAppend(&json, first_json ? "" : ", ",
                    absl::StrFormat("{\"model\": \"%s\", \"batch\": %d, \"in_turn_seconds\": %g, "
                                    "\"stacked_seconds\": %g}",
                                    c.model, c.batch, Median(in_turn), Median(stacked)));
    first_json = false;
  }
  absl::StrAppend(&json, "]}\n");
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}
