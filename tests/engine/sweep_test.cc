// Sweeps: RunPackedTraining (server/engine/trainer.h) against the same jobs run alone, member by
// member, on both paths; a member that fails or is cancelled ends alone; and Engine::SubmitSweep's
// product, its checks and its packed members through the real queue.
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::ClustersTable;
using test_support::EngineFixture;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::HasSubstr;

// 96 rows of 4 standard-normal features; 3 classes from the features (so that training learns).
std::shared_ptr<const Dataset> ClassDataset() {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "classes";
  dataset->meta.feature_shape = {4};
  dataset->meta.rows = 96;
  dataset->meta.device = "cpu";
  torch::manual_seed(3);
  dataset->features = torch::randn({96, 4});
  dataset->targets = (dataset->features.select(1, 0) > 0).to(torch::kInt64) +
                     (dataset->features.select(1, 1) > 0.5).to(torch::kInt64);
  return dataset;
}

// A member of a sweep over ClassDataset(): an MLP with validation and shuffling.
TrainingRun Member(const std::shared_ptr<const Dataset>& dataset, EngineKind engine,
                   OptimizerKind optimizer, double lr, uint64_t seed) {
  TrainingRun run;
  run.spec.dataset = "classes";
  run.spec.model = "linear:16,tanh,linear:3";
  run.spec.loss = LossKind::kCrossEntropy;
  run.spec.optimizer = optimizer;
  run.spec.learning_rate = lr;
  run.spec.momentum = optimizer == OptimizerKind::kSgd ? 0.9 : 0.0;
  run.spec.batch_size = 10;  // 77 training rows: a short last batch
  run.spec.epochs = 4;
  run.spec.validation_fraction = 0.2;
  run.spec.seed = seed;
  run.spec.device = "cpu";
  run.spec.engine = engine;
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = dataset;
  return run;
}

struct Recorded {
  std::vector<double> losses;
  std::vector<double> validation_losses;
};

// Runs `runs` as one pack; every member's epochs (through its own callback) and outcome.
std::vector<TrainingOutcome> RunPack(std::vector<TrainingRun>& runs, std::vector<Recorded>& seen,
                                     std::vector<size_t>* delivery_order = nullptr) {
  seen.assign(runs.size(), Recorded{});
  std::vector<const TrainingRun*> pointers;
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].on_epoch = [&seen, i](const EpochResult& e, int64_t, int64_t) {
      seen[i].losses.push_back(e.loss);
      seen[i].validation_losses.push_back(e.validation_loss.value_or(-1));
    };
    pointers.push_back(&runs[i]);
  }
  std::vector<TrainingOutcome> outcomes(runs.size());
  RunPackedTraining(pointers, [&](size_t i, TrainingOutcome outcome) {
    if (delivery_order != nullptr) delivery_order->push_back(i);
    outcomes[i] = std::move(outcome);
  });
  return outcomes;
}

TEST(PackedTrainingTest, EveryMemberEqualsTheSameJobRunAlone) {
  const auto dataset = ClassDataset();
  for (EngineKind engine : {EngineKind::kFused, EngineKind::kLibTorch}) {
    for (OptimizerKind optimizer : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
      SCOPED_TRACE(EngineKindName(engine));
      SCOPED_TRACE(static_cast<int>(optimizer));
      std::vector<TrainingRun> runs;
      for (double lr : {0.05, 0.01}) {
        for (uint64_t seed : {1u, 2u}) runs.push_back(Member(dataset, engine, optimizer, lr, seed));
      }
      std::vector<Recorded> packed;
      std::vector<TrainingOutcome> outcomes = RunPack(runs, packed);
      ASSERT_EQ(outcomes.size(), 4u);
      std::set<double> finals;
      for (size_t i = 0; i < runs.size(); ++i) {
        ASSERT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
        // Members off the fused path train stacked: one batched step for all of them.
        EXPECT_EQ(outcomes[i].engine, engine == EngineKind::kFused ? "fused" : "libtorch-stacked");
        EXPECT_EQ(outcomes[i].epochs_done, 4);
        EXPECT_EQ(outcomes[i].steps, 4 * 8);       // 77 training rows in batches of 10
        EXPECT_EQ(outcomes[i].host_syncs, 4 + 1);  // one per epoch, one read-back of the model
        EXPECT_FALSE(outcomes[i].model_archive.empty());
        // The same job alone: the same generator draws and arithmetic, so the same values.
        TrainingRun alone = runs[i];
        std::vector<double> losses;
        std::vector<double> validation;
        alone.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
          losses.push_back(e.loss);
          validation.push_back(e.validation_loss.value_or(-1));
        };
        TrainingOutcome solo = RunTraining(alone);
        ASSERT_EQ(solo.state, JobState::kSucceeded) << solo.error;
        ASSERT_EQ(packed[i].losses.size(), 4u);
        for (size_t e = 0; e < losses.size(); ++e) {
          EXPECT_NEAR(packed[i].losses[e], losses[e], 1e-6 * std::fabs(losses[e]))
              << "member " << i << " epoch " << e + 1;
          EXPECT_NEAR(packed[i].validation_losses[e], validation[e],
                      1e-6 * std::fabs(validation[e]));
        }
        ASSERT_EQ(outcomes[i].parameters.size(), solo.parameters.size());
        for (size_t p = 0; p < solo.parameters.size(); ++p) {
          ASSERT_EQ(outcomes[i].parameters[p].values.size(), solo.parameters[p].values.size());
          for (size_t v = 0; v < solo.parameters[p].values.size(); ++v) {
            EXPECT_NEAR(outcomes[i].parameters[p].values[v], solo.parameters[p].values[v], 1e-5)
                << solo.parameters[p].name;
          }
        }
        finals.insert(outcomes[i].final_loss);
      }
      // The members really differ (learning rate and seed reach their own model).
      EXPECT_EQ(finals.size(), 4u);
    }
  }
}

// A regression dataset for the losses that take float targets: 96 rows, 4 features, 2 outputs;
// targets in [0, 1] so that bce_with_logits takes them too.
std::shared_ptr<const Dataset> RegressionDataset() {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "regression";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {2};
  dataset->meta.rows = 96;
  dataset->meta.device = "cpu";
  torch::manual_seed(5);
  dataset->features = torch::randn({96, 4});
  dataset->targets = torch::sigmoid(dataset->features.narrow(1, 0, 2) * 1.5 + 0.2);
  return dataset;
}

// Runs the members stacked (engine libtorch) and each alone; expects the same losses and
// parameters within float32 tolerance (a batched product sums in another order than addmm; the
// parameters get more room: rmsprop's division by a root mean square amplifies those last bits
// where a gradient is near zero; `parameter_scale` widens theirs further).
void ExpectStackedEqualsAlone(std::vector<TrainingRun> runs, double parameter_scale = 1) {
  constexpr double kTolerance = 2e-4;
  const double kParameterTolerance = 1e-3 * parameter_scale;
  std::vector<Recorded> packed;
  std::vector<TrainingOutcome> outcomes = RunPack(runs, packed);
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("member ", i));
    ASSERT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
    EXPECT_EQ(outcomes[i].engine, "libtorch-stacked");
    TrainingRun alone = runs[i];
    std::vector<double> losses;
    alone.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { losses.push_back(e.loss); };
    TrainingOutcome solo = RunTraining(alone);
    ASSERT_EQ(solo.state, JobState::kSucceeded) << solo.error;
    EXPECT_EQ(solo.engine, "libtorch");
    ASSERT_EQ(packed[i].losses.size(), losses.size());
    for (size_t e = 0; e < losses.size(); ++e) {
      EXPECT_NEAR(packed[i].losses[e], losses[e], kTolerance * std::max(1.0, std::fabs(losses[e])))
          << "epoch " << e + 1;
    }
    ASSERT_EQ(outcomes[i].parameters.size(), solo.parameters.size());
    for (size_t p = 0; p < solo.parameters.size(); ++p) {
      for (size_t v = 0; v < solo.parameters[p].values.size(); ++v) {
        const double want = solo.parameters[p].values[v];
        EXPECT_NEAR(outcomes[i].parameters[p].values[v], want,
                    kParameterTolerance * std::max(1.0, std::fabs(want)))
            << solo.parameters[p].name << "[" << v << "]";
      }
    }
  }
}

TEST(StackedPathTest, EveryOptimizerWithMixedMomentaAndDecaysEqualsTheJobsAlone) {
  const auto dataset = ClassDataset();
  struct Case {
    OptimizerKind optimizer;
    bool nesterov;
  };
  for (const Case& c : {Case{OptimizerKind::kSgd, false}, Case{OptimizerKind::kSgd, true},
                        Case{OptimizerKind::kAdam, false}, Case{OptimizerKind::kAdamW, false},
                        Case{OptimizerKind::kRmsprop, false}}) {
    const OptimizerKind optimizer = c.optimizer;
    SCOPED_TRACE(absl::StrCat(OptimizerKindName(optimizer), c.nesterov ? " nesterov" : ""));
    std::vector<TrainingRun> runs;
    for (int m = 0; m < 4; ++m) {
      TrainingRun run = Member(dataset, EngineKind::kLibTorch, optimizer, 0.02 + 0.01 * m, 10 + m);
      run.spec.model = "linear:8,relu,linear:8,gelu,linear:3";
      run.model = *ParseModelSpec(run.spec.model);
      // Members differ in momentum (0 for some: no buffer in their own optimizer; nesterov needs
      // one in all) and in weight decay.
      const bool momentum =
          optimizer == OptimizerKind::kSgd || optimizer == OptimizerKind::kRmsprop;
      run.spec.momentum = !momentum ? 0.0 : m % 2 == 1 ? 0.8 : c.nesterov ? 0.5 : 0.0;
      run.spec.nesterov = c.nesterov;  // one setting for the pack
      if (m >= 2) run.spec.weight_decay = 0.01 * m;
      run.spec.clip_grad_norm = 0.5;  // each member's own norm is clipped
      // rmsprop steps by grad / (sqrt(mean of grad^2) + eps): with the default eps of 1e-8, a
      // weight whose gradient is only rounding noise (a unit relu nearly silences) moves by a
      // whole learning rate either way, so the two summation orders part by whole steps (0.07
      // in a weight after four epochs on one validation split). An eps of 1e-3 keeps noise-sized
      // gradients noise-sized and still tests the arithmetic; momentum 0.8 still carries such
      // normalised steps along, so its members' weights agree to 1e-2 (6.7e-3 seen) while every
      // epoch's loss agrees to 2e-4. A wrong step (a missing decay, a buffer of another member)
      // moves the first epoch's loss by far more.
      if (optimizer == OptimizerKind::kRmsprop) run.spec.eps = 1e-3;
      runs.push_back(std::move(run));
    }
    ExpectStackedEqualsAlone(std::move(runs), optimizer == OptimizerKind::kRmsprop ? 10 : 1);
  }
}

TEST(StackedPathTest, EveryLossAndActivationEqualsTheJobsAlone) {
  const auto regression = RegressionDataset();
  for (LossKind loss :
       {LossKind::kMse, LossKind::kL1, LossKind::kHuber, LossKind::kBceWithLogits}) {
    SCOPED_TRACE(static_cast<int>(loss));
    std::vector<TrainingRun> runs;
    for (int m = 0; m < 3; ++m) {
      TrainingRun run = Member(regression, EngineKind::kLibTorch, OptimizerKind::kSgd, 0.05, m + 1);
      run.spec.model = "linear:6,tanh,linear:6,sigmoid,linear:2";
      run.model = *ParseModelSpec(run.spec.model);
      run.spec.loss = loss;
      run.spec.huber_delta = 0.3;
      run.spec.learning_rate = 0.05 * (m + 1);
      runs.push_back(std::move(run));
    }
    ExpectStackedEqualsAlone(std::move(runs));
  }
  // Cross-entropy with label smoothing, a cosine schedule with warm-up, and no shuffle.
  const auto classes = ClassDataset();
  std::vector<TrainingRun> runs;
  for (int m = 0; m < 3; ++m) {
    TrainingRun run =
        Member(classes, EngineKind::kLibTorch, OptimizerKind::kAdam, 0.01 * (m + 1), 3);
    run.spec.label_smoothing = 0.1;
    run.spec.schedule.kind = ScheduleKind::kCosine;
    run.spec.schedule.warmup_epochs = 1;
    run.spec.shuffle = false;
    runs.push_back(std::move(run));
  }
  ExpectStackedEqualsAlone(std::move(runs));
}

// A stacked member's checkpoint holds its own model and LibTorch optimizer state: the member's job
// taken up alone from it goes on as the pack would have.
TEST(StackedPathTest, AMembersCheckpointResumesAloneWhereThePackWas) {
  test_support::ScratchDir dir;
  const auto dataset = ClassDataset();
  for (OptimizerKind optimizer :
       {OptimizerKind::kSgd, OptimizerKind::kAdamW, OptimizerKind::kRmsprop}) {
    SCOPED_TRACE(static_cast<int>(optimizer));
    std::vector<TrainingRun> runs;
    for (int m = 0; m < 2; ++m) {
      TrainingRun run = Member(dataset, EngineKind::kLibTorch, optimizer, 0.02 * (m + 1), 7 + m);
      run.spec.epochs = 6;
      run.spec.checkpoint_every = 3;
      run.spec.momentum = optimizer == OptimizerKind::kAdamW ? 0.0 : 0.5 * m;
      run.checkpoint_dir = absl::StrCat(dir.path(), "/", static_cast<int>(optimizer), "-", m);
      runs.push_back(std::move(run));
    }
    std::vector<std::string> third(2);
    for (size_t i = 0; i < runs.size(); ++i) {
      runs[i].on_checkpoint = [&third, &runs, i](int32_t epoch, const std::string& file, int64_t) {
        if (epoch == 3) third[i] = runs[i].checkpoint_dir + "/" + file;
      };
    }
    std::vector<Recorded> packed;
    std::vector<TrainingOutcome> outcomes = RunPack(runs, packed);
    for (size_t i = 0; i < runs.size(); ++i) {
      ASSERT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
      ASSERT_FALSE(third[i].empty());
      TrainingRun resumed = runs[i];
      resumed.checkpoint_dir.clear();
      resumed.on_checkpoint = nullptr;
      resumed.resume_from = third[i];
      std::vector<double> rest;
      resumed.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { rest.push_back(e.loss); };
      TrainingOutcome b = RunTraining(resumed);
      ASSERT_EQ(b.state, JobState::kSucceeded) << b.error;
      ASSERT_EQ(rest.size(), 3u);
      for (size_t e = 0; e < 3; ++e) {
        EXPECT_NEAR(rest[e], packed[i].losses[3 + e], 2e-4 * std::max(1.0, packed[i].losses[3 + e]))
            << "member " << i << " epoch " << 4 + e;
      }
    }
  }
}

TEST(StackedPathTest, AMemberThatDivergesOrIsCancelledEndsAloneWhileTheStackGoesOn) {
  const auto dataset = ClassDataset();
  std::vector<TrainingRun> runs;
  std::atomic<bool> cancel{false};
  runs.push_back(Member(dataset, EngineKind::kLibTorch, OptimizerKind::kSgd, 0.05, 1));
  runs.push_back(Member(dataset, EngineKind::kLibTorch, OptimizerKind::kSgd,
                        std::numeric_limits<double>::infinity(), 1));
  runs.push_back(Member(dataset, EngineKind::kLibTorch, OptimizerKind::kSgd, 0.02, 2));
  runs.push_back(Member(dataset, EngineKind::kLibTorch, OptimizerKind::kSgd, 0.01, 3));
  runs[2].cancel = &cancel;
  std::vector<const TrainingRun*> pointers;
  std::vector<Recorded> seen(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].on_epoch = [&, i](const EpochResult& e, int64_t, int64_t) {
      seen[i].losses.push_back(e.loss);
      if (i == 2 && e.epoch == 1) cancel.store(true);
    };
    pointers.push_back(&runs[i]);
  }
  std::vector<TrainingOutcome> outcomes(runs.size());
  RunPackedTraining(pointers, [&](size_t i, TrainingOutcome o) { outcomes[i] = std::move(o); });
  EXPECT_EQ(outcomes[1].state, JobState::kFailed);
  EXPECT_THAT(outcomes[1].error, HasSubstr("loss became NaN at epoch 1"));
  EXPECT_EQ(outcomes[2].state, JobState::kCancelled);
  EXPECT_EQ(seen[2].losses.size(), 1u);
  for (size_t i : {0u, 3u}) {
    ASSERT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
    TrainingRun alone = runs[i];
    alone.on_epoch = nullptr;
    alone.cancel = nullptr;
    TrainingOutcome solo = RunTraining(alone);
    EXPECT_NEAR(outcomes[i].final_loss, solo.final_loss, 2e-4 * solo.final_loss) << i;
  }
}

TEST(PackedTrainingTest, AMemberThatDivergesFailsAloneAndTheOthersGoOn) {
  const auto dataset = ClassDataset();
  std::vector<TrainingRun> runs;
  runs.push_back(Member(dataset, EngineKind::kAuto, OptimizerKind::kSgd, 0.05, 1));
  // An infinite step: its weights become infinite, its loss NaN in the first epoch.
  runs.push_back(Member(dataset, EngineKind::kAuto, OptimizerKind::kSgd,
                        std::numeric_limits<double>::infinity(), 1));
  runs.push_back(Member(dataset, EngineKind::kAuto, OptimizerKind::kSgd, 0.01, 1));
  std::vector<Recorded> seen;
  std::vector<size_t> order;
  std::vector<TrainingOutcome> outcomes = RunPack(runs, seen, &order);

  EXPECT_EQ(outcomes[1].state, JobState::kFailed);
  EXPECT_THAT(outcomes[1].error, HasSubstr("at epoch 1"));
  EXPECT_THAT(outcomes[1].error, HasSubstr("loss became NaN"));
  EXPECT_TRUE(seen[1].losses.empty());
  // It ended first, when its epoch's values arrived, not with the pack.
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order.front(), 1u);
  for (size_t i : {0u, 2u}) {
    ASSERT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
    TrainingRun alone = runs[i];
    alone.on_epoch = nullptr;
    TrainingOutcome solo = RunTraining(alone);
    EXPECT_DOUBLE_EQ(outcomes[i].final_loss, solo.final_loss) << "member " << i;
    EXPECT_EQ(seen[i].losses.size(), 4u);
  }
}

TEST(PackedTrainingTest, CancellingOneMemberLeavesTheOthersRunning) {
  const auto dataset = ClassDataset();
  std::vector<TrainingRun> runs;
  std::atomic<bool> cancel{false};
  for (double lr : {0.05, 0.02, 0.01}) {
    runs.push_back(Member(dataset, EngineKind::kAuto, OptimizerKind::kAdam, lr, 4));
  }
  runs[1].cancel = &cancel;
  std::vector<const TrainingRun*> pointers;
  std::vector<int> epochs(3, 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].on_epoch = [&, i](const EpochResult& e, int64_t, int64_t) {
      ++epochs[i];
      if (i == 1 && e.epoch == 2) cancel.store(true);  // as CancelJob would, between epochs
    };
    pointers.push_back(&runs[i]);
  }
  std::vector<TrainingOutcome> outcomes(3);
  std::vector<size_t> order;
  RunPackedTraining(pointers, [&](size_t i, TrainingOutcome outcome) {
    order.push_back(i);
    outcomes[i] = std::move(outcome);
  });
  EXPECT_EQ(outcomes[1].state, JobState::kCancelled);
  EXPECT_EQ(outcomes[1].epochs_done, 2);
  EXPECT_EQ(epochs[1], 2);
  EXPECT_EQ(order.front(), 1u);
  for (size_t i : {0u, 2u}) {
    EXPECT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
    EXPECT_EQ(epochs[i], 4);
  }
}

TEST(PackedTrainingTest, EarlyStoppedMemberEndsBeforeThePack) {
  const auto dataset = ClassDataset();
  std::vector<TrainingRun> runs;
  runs.push_back(Member(dataset, EngineKind::kAuto, OptimizerKind::kSgd, 0.05, 1));
  runs.push_back(Member(dataset, EngineKind::kAuto, OptimizerKind::kSgd, 0.05, 2));
  for (TrainingRun& run : runs) run.spec.epochs = 30;
  // Member 0 stops as soon as its validation loss fails to improve once; member 1 never stops.
  runs[0].spec.early_stop_patience = 1;
  runs[0].spec.learning_rate = 5.0;  // jumps around: its validation loss soon gets worse
  std::vector<Recorded> seen;
  std::vector<size_t> order;
  std::vector<TrainingOutcome> outcomes = RunPack(runs, seen, &order);
  ASSERT_EQ(outcomes[0].state, JobState::kSucceeded) << outcomes[0].error;
  ASSERT_TRUE(outcomes[0].stopped_early);
  EXPECT_LT(outcomes[0].epochs_done, 30);
  EXPECT_EQ(order.front(), 0u);
  TrainingRun alone = runs[0];
  alone.on_epoch = nullptr;
  TrainingOutcome solo = RunTraining(alone);
  EXPECT_EQ(solo.epochs_done, outcomes[0].epochs_done);
  EXPECT_EQ(outcomes[1].epochs_done, 30);
}

TEST(PackedTrainingTest, JobsThatCannotShareAPackSayWhy) {
  const auto dataset = ClassDataset();
  TrainingRun a = Member(dataset, EngineKind::kAuto, OptimizerKind::kSgd, 0.05, 1);
  TrainingRun b = a;
  EXPECT_EQ(PackUnsupported(a, b), "");
  b.spec.batch_size = 20;
  EXPECT_THAT(PackUnsupported(a, b), HasSubstr("batch size"));
  b = a;
  b.dataset = ClassDataset();
  EXPECT_THAT(PackUnsupported(a, b), HasSubstr("different datasets"));
  b = a;
  b.spec.clip_grad_norm = 1.0;
  EXPECT_THAT(PackUnsupported(a, b), HasSubstr("differ in more than"));
  b = a;
  b.spec.learning_rate = 0.5;
  b.spec.momentum = 0.3;
  b.spec.weight_decay = 0.1;
  b.spec.seed = 99;
  EXPECT_EQ(PackUnsupported(a, b), "");  // what a sweep varies
  b = a;
  b.resume_from = "/nowhere/epoch-1.pt";
  EXPECT_THAT(PackUnsupported(a, b), HasSubstr("trains alone"));
}

class SweepTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
  static JobSpec Base() {
    JobSpec spec = SeedSpec("seed");
    spec.epochs = 5;
    return spec;
  }
};

TEST_F(SweepTest, TheProductRunsAsOnePackAndEachMemberEqualsItsJobAlone) {
  SweepAxes axes;
  axes.learning_rates = {0.1, 0.03};
  axes.momenta = {0.0, 0.5};
  axes.seeds = {1, 2, 3};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(Base(), axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_THAT(sweep->id, ::testing::StartsWith("sweep-"));
  ASSERT_EQ(sweep->members.size(), 12u);
  // Product order: learning rates outermost, seeds innermost.
  EXPECT_EQ(sweep->members[0].spec.learning_rate, 0.1);
  EXPECT_EQ(sweep->members[0].spec.momentum, 0.0);
  EXPECT_EQ(*sweep->members[0].spec.seed, 1u);
  EXPECT_EQ(*sweep->members[1].spec.seed, 2u);
  EXPECT_EQ(sweep->members[3].spec.momentum, 0.5);
  EXPECT_EQ(sweep->members[6].spec.learning_rate, 0.03);
  EXPECT_EQ(*sweep->members[11].spec.seed, 3u);
  std::set<std::string> ids;
  for (const JobSnapshot& member : sweep->members) {
    EXPECT_EQ(member.state, JobState::kQueued);
    EXPECT_EQ(member.sweep_id, sweep->id);
    ids.insert(member.id);
  }
  EXPECT_EQ(ids.size(), 12u);

  std::vector<JobSnapshot> ended;
  for (const JobSnapshot& member : sweep->members) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, member.id);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
    EXPECT_EQ(job->report.packed_members, 12);
    EXPECT_EQ(job->epochs.size(), 5u);
    EXPECT_EQ(job->sweep_id, sweep->id);
    ASSERT_TRUE(engine_->ModelArchivePath(job->id).ok());
    ended.push_back(*job);
  }
  // Two members run alone, as plain jobs, give the same losses.
  for (size_t i : {4u, 9u}) {
    JobSpec alone = ended[i].spec;
    absl::StatusOr<JobSnapshot> solo = RunJob(*engine_, alone);
    ASSERT_TRUE(solo.ok());
    ASSERT_EQ(solo->state, JobState::kSucceeded);
    EXPECT_EQ(solo->report.packed_members, 0);
    EXPECT_EQ(Losses(*solo), Losses(ended[i])) << "member " << i;
  }
}

// Points: members one by one (a random search), in order, each value unset keeping the spec's;
// packed as a product's members are, and each equal to its job alone.
TEST_F(SweepTest, PointsGiveExactlyTheirMembersInOrderPackedAndEachEqualsItsJobAlone) {
  JobSpec base = Base();
  base.weight_decay = 0.001;
  SweepAxes axes;
  axes.points = {SweepPoint{0.07, 0.3, std::nullopt, 11}, SweepPoint{std::nullopt, 0.0, 0.01, 5},
                 SweepPoint{0.02, std::nullopt, 0.0, std::nullopt}};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_EQ(sweep->members.size(), 3u);
  EXPECT_EQ(sweep->members[0].spec.learning_rate, 0.07);
  EXPECT_EQ(sweep->members[0].spec.momentum, 0.3);
  EXPECT_EQ(sweep->members[0].spec.weight_decay, 0.001);
  EXPECT_EQ(*sweep->members[0].spec.seed, 11u);
  EXPECT_EQ(sweep->members[1].spec.learning_rate, base.learning_rate);
  EXPECT_EQ(sweep->members[1].spec.weight_decay, 0.01);
  EXPECT_EQ(sweep->members[2].spec.momentum, base.momentum);
  EXPECT_EQ(sweep->members[2].spec.seed, base.seed);
  for (size_t i = 0; i < 3; ++i) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, sweep->members[i].id);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
    EXPECT_EQ(job->report.packed_members, 3);
    absl::StatusOr<JobSnapshot> solo = RunJob(*engine_, job->spec);
    ASSERT_TRUE(solo.ok());
    EXPECT_EQ(Losses(*solo), Losses(*job)) << "member " << i;
  }
}

TEST_F(SweepTest, WithoutSeedsEveryMemberSharesOneSeed) {
  JobSpec base = Base();
  base.seed.reset();
  SweepAxes axes;
  axes.learning_rates = {0.1, 0.05, 0.01};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_EQ(sweep->members.size(), 3u);
  ASSERT_TRUE(sweep->members[0].spec.seed.has_value());
  for (const JobSnapshot& member : sweep->members) {
    EXPECT_EQ(member.spec.seed, sweep->members[0].spec.seed);
  }
  for (const JobSnapshot& member : sweep->members)
    ASSERT_TRUE(WaitForEnd(*engine_, member.id).ok());
}

TEST_F(SweepTest, HostileSweepsAreRefusedWithTheirReason) {
  SweepAxes axes;
  axes.learning_rates = std::vector<double>(257, 0.1);
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(Base(), axes);
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sweep.status().message(), HasSubstr("257 values; at most 256"));

  axes.learning_rates = std::vector<double>(16, 0.1);
  axes.seeds = std::vector<uint64_t>(17, 1);
  sweep = engine_->SubmitSweep(Base(), axes);
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sweep.status().message(), HasSubstr("more than 256 members"));

  // One bad member refuses the whole sweep, naming it; nothing is queued.
  axes.learning_rates = {0.1, -1.0};
  axes.seeds = {7};
  sweep = engine_->SubmitSweep(Base(), axes);
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sweep.status().message(), HasSubstr("sweep member 2 (learning rate -1"));
  absl::StatusOr<JobPage> page = engine_->ListJobs();
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->jobs.empty());

  JobSpec torchscript = Base();
  torchscript.torchscript = "PK not really a module";
  sweep = engine_->SubmitSweep(torchscript, SweepAxes{});
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sweep.status().message(), HasSubstr("text spec"));

  JobSpec missing = Base();
  missing.dataset = "nope";
  sweep = engine_->SubmitSweep(missing, SweepAxes{});
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kNotFound);
}

// Values in the lists are checked as a job's own are: NaN, infinite and out-of-range values refuse
// the whole sweep naming the member; nothing is queued.
TEST_F(SweepTest, NanInfiniteAndNegativeListValuesRefuseTheSweep) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    SweepAxes axes;
    std::string member;
  };
  std::vector<Case> cases;
  cases.push_back({SweepAxes{{0.1, nan}, {}, {}, {}, {}}, "sweep member 2 (learning rate nan"});
  cases.push_back({SweepAxes{{inf}, {}, {}, {}, {}}, "sweep member 1 (learning rate inf"});
  cases.push_back({SweepAxes{{}, {0.5, inf}, {}, {}, {}}, "sweep member 2"});
  cases.push_back({SweepAxes{{}, {-0.5}, {}, {}, {}}, "sweep member 1"});
  cases.push_back({SweepAxes{{}, {}, {0.0, -1.0}, {}, {}}, "sweep member 2"});
  cases.push_back({SweepAxes{{}, {}, {nan}, {}, {}}, "sweep member 1"});
  cases.push_back(
      {SweepAxes{{}, {}, {}, {}, {SweepPoint{0.1, {}, {}, 1}, SweepPoint{nan, {}, {}, 2}}},
       "sweep member 2 (learning rate nan"});
  cases.push_back(
      {SweepAxes{{0.1}, {}, {}, {}, {SweepPoint{0.1, {}, {}, 1}}}, "lists (a product) or points"});
  cases.push_back({SweepAxes{{}, {}, {}, {}, std::vector<SweepPoint>(257)}, "257 points"});
  for (const Case& c : cases) {
    absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(Base(), c.axes);
    EXPECT_EQ(sweep.status().code(), absl::StatusCode::kInvalidArgument) << c.member;
    EXPECT_THAT(sweep.status().message(), HasSubstr(c.member));
  }
  // The largest seeds are ordinary seeds.
  SweepAxes seeds;
  seeds.seeds = {0, std::numeric_limits<uint64_t>::max()};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(Base(), seeds);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(*sweep->members[1].spec.seed, std::numeric_limits<uint64_t>::max());
  for (const JobSnapshot& member : sweep->members) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, member.id);
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  }
  absl::StatusOr<JobPage> page = engine_->ListJobs();
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs.size(), 2u);  // only the seeds' sweep was queued
}

TEST_F(SweepTest, TheQueueBoundCountsEveryMember) {
  EngineOptions options = Options();
  options.max_queued_jobs = 3;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);  // the dataset is still there
  SweepAxes axes;
  axes.seeds = {1, 2, 3, 4};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(Base(), axes);
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(sweep.status().message(), HasSubstr("--max_queued_jobs"));
  axes.seeds = {1, 2, 3};
  sweep = engine_->SubmitSweep(Base(), axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  for (const JobSnapshot& member : sweep->members)
    ASSERT_TRUE(WaitForEnd(*engine_, member.id).ok());
}

TEST_F(SweepTest, CancellingAMemberOfARunningSweepLeavesTheOthers) {
  JobSpec base = Base();
  base.epochs = 1000000;  // runs until cancelled
  SweepAxes axes;
  axes.seeds = {1, 2};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  const std::string first = sweep->members[0].id;
  const std::string second = sweep->members[1].id;
  // Wait until both run.
  for (int i = 0; i < 600; ++i) {
    absl::StatusOr<JobSnapshot> a = engine_->GetJob(first);
    absl::StatusOr<JobSnapshot> b = engine_->GetJob(second);
    if (a.ok() && b.ok() && a->epochs_completed > 0 && b->epochs_completed > 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(engine_->CancelJob(first).ok());
  absl::StatusOr<JobSnapshot> cancelled = WaitForEnd(*engine_, first);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  absl::StatusOr<JobSnapshot> other = engine_->GetJob(second);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->state, JobState::kRunning);
  const int32_t epochs = other->epochs_completed;
  // It goes on training after its sibling ended.
  for (int i = 0; i < 600; ++i) {
    other = engine_->GetJob(second);
    if (other->epochs_completed > epochs + 2) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT(other->epochs_completed, epochs + 2);
  ASSERT_TRUE(engine_->CancelJob(second).ok());
  ASSERT_TRUE(WaitForEnd(*engine_, second).ok());
}

}  // namespace
}  // namespace trainerd::engine
