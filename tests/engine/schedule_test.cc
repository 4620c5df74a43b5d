// Tests for the learning-rate schedules of server/engine/training/optimizer.h: each kind's rates
// against PyTorch's own scheduler (the expected numbers are printed by
// tests/engine/testdata/schedule_rates.py, which steps torch.optim.lr_scheduler's classes), the
// checks that refuse a schedule's option given to another, and jobs that train under a per-step
// schedule and under plateau, resumed from a checkpoint midway.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

JobSpec ScheduleSpecFor(ScheduleKind kind, double lr, int32_t epochs) {
  JobSpec spec;
  spec.dataset = "d";
  spec.model = "linear:1";
  spec.optimizer = OptimizerKind::kSgd;
  spec.learning_rate = lr;
  spec.batch_size = 1;
  spec.epochs = epochs;
  spec.schedule.kind = kind;
  return spec;
}

// The rate of each of the job's units (epochs, or steps when per step), `steps_per_epoch` steps
// an epoch; `losses` feed plateau one per epoch.
std::vector<double> Rates(const JobSpec& spec, int64_t steps_per_epoch,
                          const std::vector<double>& losses = {}) {
  LearningRateSchedule schedule(spec, steps_per_epoch);
  std::vector<double> rates;
  int64_t step = 0;
  for (int32_t epoch = 1; epoch <= spec.epochs; ++epoch) {
    for (int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
      if (s == 0 || schedule.per_step()) rates.push_back(schedule.Rate(epoch, step));
    }
    if (!losses.empty()) schedule.EndEpoch(losses[epoch - 1]);
  }
  return rates;
}

void ExpectRates(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::fabs(want[i]))) << "unit " << i;
  }
}

TEST(ScheduleRatesTest, MultiStepAsMultiStepLR) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kMultiStep, 1.0, 8);
  spec.schedule.milestones = {2, 5};
  spec.schedule.gamma = 0.5;
  ExpectRates(Rates(spec, 3), {1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25});
}

TEST(ScheduleRatesTest, ExponentialAsExponentialLR) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kExponential, 0.5, 5);
  spec.schedule.gamma = 0.9;
  ExpectRates(Rates(spec, 2), {0.5, 0.45, 0.405, 0.36450000000000005, 0.32805000000000006});
}

TEST(ScheduleRatesTest, CosineRestartsAsCosineAnnealingWarmRestarts) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kCosineWarmRestarts, 1.0, 12);
  spec.schedule.t_0 = 3;
  spec.schedule.t_mult = 2;
  spec.schedule.min_learning_rate = 0.1;
  ExpectRates(Rates(spec, 1),
              {1.0, 0.775, 0.3250000000000001, 1.0, 0.9397114317029974, 0.775, 0.55,
               0.3250000000000001, 0.16028856829700258, 1.0, 0.9846666218300807,
               0.9397114317029974});
  JobSpec plain = ScheduleSpecFor(ScheduleKind::kCosineWarmRestarts, 1.0, 5);
  plain.schedule.t_0 = 2;
  ExpectRates(Rates(plain, 1), {1.0, 0.5, 1.0, 0.5, 1.0});
}

TEST(ScheduleRatesTest, CosineRestartsWithAHugeMultiplierNeverOverflows) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kCosineWarmRestarts, 1.0, 4);
  spec.schedule.t_0 = std::numeric_limits<int32_t>::max();
  spec.schedule.t_mult = std::numeric_limits<int32_t>::max();
  spec.schedule.per_step = true;
  LearningRateSchedule schedule(spec, int64_t{1} << 40);
  const double pi = std::acos(-1.0);
  const double t_0 = std::numeric_limits<int32_t>::max();
  // Past the first cycle, into the second (t_0 * t_mult units long), far into the job.
  const int64_t step = (int64_t{1} << 41) + 5;
  const double t_cur = static_cast<double>(step) - t_0;
  EXPECT_NEAR(schedule.Rate(4, step), (1 + std::cos(pi * t_cur / (t_0 * t_0))) / 2, 1e-12);
}

TEST(ScheduleRatesTest, OneCycleAsOneCycleLRWithItsDefaultsEveryStep) {
  // OneCycleLR(max_lr=0.1, epochs=4, steps_per_epoch=5, cycle_momentum=False).
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kOneCycle, 0.1, 4);
  ExpectRates(Rates(spec, 5),
              {0.0040000000000000036, 0.013167184270002533, 0.037167184270002526,
               0.06683281572999747,   0.09083281572999748,  0.1,
               0.09874640062350874,   0.09504846320134738,  0.089091617757105,
               0.0811745653949763,    0.07169430017913009,  0.06112620219362893,
               0.0500002,             0.03887419780637107,  0.028306099820869922,
               0.0188258346050237,    0.010908782242895003, 0.004951936798652629,
               0.0012539993764912555, 4e-07});
}

TEST(ScheduleRatesTest, OneCycleThreePhasesLinear) {
  // OneCycleLR(max_lr=1, total_steps=10, pct_start=0.25, anneal_strategy='linear',
  // div_factor=10, final_div_factor=100, three_phase=True, cycle_momentum=False).
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kOneCycle, 1.0, 2);
  spec.schedule.pct_start = 0.25;
  spec.schedule.anneal_strategy = "linear";
  spec.schedule.div_factor = 10;
  spec.schedule.final_div_factor = 100;
  spec.schedule.three_phase = true;
  ExpectRates(Rates(spec, 5), {0.1, 0.7, 0.7, 0.09999999999999998, 0.0835, 0.067, 0.0505, 0.034,
                               0.0175, 0.0010000000000000009});
}

TEST(ScheduleRatesTest, PlateauAsReduceLROnPlateau) {
  // ReduceLROnPlateau(factor=0.5, patience=2, threshold=0.1, cooldown=1, min_lr=0.2).
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kPlateau, 1.0, 12);
  spec.validation_fraction = 0.2;
  spec.schedule.factor = 0.5;
  spec.schedule.patience = 2;
  spec.schedule.threshold = 0.1;
  spec.schedule.cooldown = 1;
  spec.schedule.min_learning_rate = 0.2;
  const std::vector<double> losses = {1.0, 0.95, 0.97, 0.96, 0.5, 0.5,
                                      0.5, 0.5,  0.5,  0.5,  0.5, 0.5};
  ExpectRates(Rates(spec, 4, losses),
              {1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25});
  // The floor: the next reduction would give 0.125; min_lr keeps 0.2.
  LearningRateSchedule schedule(spec, 1);
  for (double loss : losses) schedule.EndEpoch(loss);
  EXPECT_DOUBLE_EQ(schedule.plateau().rate, 0.2);
}

TEST(ScheduleRatesTest, PlateauDefaultsWaitTenBadEpochs) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kPlateau, 1.0, 14);
  spec.validation_fraction = 0.2;
  ExpectRates(Rates(spec, 1, std::vector<double>(14, 1.0)),
              {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.1, 0.1});
}

TEST(ScheduleRatesTest, PerStepCosineAfterWarmUpStepsAsLinearThenCosineAnnealing) {
  // SequentialLR(LinearLR(start_factor=1/4, total_iters=3), CosineAnnealingLR(T_max=7),
  // milestones=[3]) over 2 epochs of 5 steps.
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kCosine, 1.0, 2);
  spec.schedule.per_step = true;
  spec.schedule.warmup_steps = 3;
  ExpectRates(Rates(spec, 5), {0.25, 0.5, 0.75, 1.0, 0.9504844339512095, 0.8117449009293668,
                               0.6112604669781572, 0.38873953302184283, 0.18825509907063326,
                               0.04951556604879048});
}

TEST(ScheduleRatesTest, PerStepStepCountsSteps) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kStep, 1.0, 2);
  spec.schedule.per_step = true;
  spec.schedule.step_epochs = 4;
  spec.schedule.gamma = 0.5;
  ExpectRates(Rates(spec, 5), {1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25});
}

TEST(ScheduleRatesTest, EpochSchedulesKeepTheirRates) {
  JobSpec spec = ScheduleSpecFor(ScheduleKind::kCosine, 1.0, 5);
  spec.schedule.warmup_epochs = 1;
  // Warm-up 1/2, then CosineAnnealingLR(T_max=4) from epoch 2.
  const double pi = std::acos(-1.0);
  ExpectRates(Rates(spec, 7), {0.5, 1.0, (1 + std::cos(pi / 4)) / 2, 0.5,
                               (1 + std::cos(3 * pi / 4)) / 2});
}

// ---- checks ---------------------------------------------------------------------------------

absl::Status Check(const JobSpec& spec) { return CheckOptimizer(spec); }

TEST(ScheduleCheckTest, EachOptionBelongsToItsSchedules) {
  struct Case {
    ScheduleKind kind;
    void (*set)(ScheduleSpec&);
    const char* message;
  };
  const Case cases[] = {
      {ScheduleKind::kCosine, [](ScheduleSpec& s) { s.milestones = {2}; },
       "milestones applies to schedule multistep only; schedule cosine does not take it"},
      {ScheduleKind::kStep, [](ScheduleSpec& s) { s.t_0 = 2; },
       "t_0 applies to schedule cosine_restarts only; schedule step does not take it"},
      {ScheduleKind::kPlateau, [](ScheduleSpec& s) { s.pct_start = 0.2; },
       "pct_start applies to schedule onecycle only; schedule plateau does not take it"},
      {ScheduleKind::kOneCycle, [](ScheduleSpec& s) { s.patience = 3; },
       "plateau patience applies to schedule plateau only; schedule onecycle does not take it"},
      {ScheduleKind::kOneCycle, [](ScheduleSpec& s) { s.gamma = 0.5; },
       "gamma applies to schedules step, multistep and exponential; schedule onecycle"},
      {ScheduleKind::kExponential, [](ScheduleSpec& s) { s.min_learning_rate = 0.01; },
       "minimum learning rate applies to schedules cosine, cosine_restarts and plateau"},
      {ScheduleKind::kCosine, [](ScheduleSpec& s) { s.three_phase = true; },
       "three_phase applies to schedule onecycle only"},
      {ScheduleKind::kConstant, [](ScheduleSpec& s) { s.cooldown = 1; },
       "plateau cooldown applies to schedule plateau only"},
  };
  for (const Case& c : cases) {
    JobSpec spec = ScheduleSpecFor(c.kind, 0.1, 5);
    spec.validation_fraction = 0.2;
    if (c.kind == ScheduleKind::kStep) spec.schedule.step_epochs = 1;
    c.set(spec.schedule);
    const absl::Status status = Check(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(ScheduleCheckTest, RangesAndRequirementsAreSentences) {
  struct Case {
    ScheduleKind kind;
    void (*set)(JobSpec&);
    const char* message;
  };
  const Case cases[] = {
      {ScheduleKind::kMultiStep, [](JobSpec&) {}, "schedule multistep needs milestones"},
      {ScheduleKind::kMultiStep, [](JobSpec& s) { s.schedule.milestones = {3, 2}; },
       "milestones must be at least 1 and in ascending order; got 2 at position 2"},
      {ScheduleKind::kMultiStep, [](JobSpec& s) { s.schedule.milestones = {0}; },
       "milestones must be at least 1"},
      {ScheduleKind::kExponential, [](JobSpec& s) { s.schedule.gamma = 1.5; },
       "schedule exponential needs gamma in (0, 1]; got 1.5"},
      {ScheduleKind::kCosineWarmRestarts, [](JobSpec&) {},
       "schedule cosine_restarts needs t_0 of at least 1; got 0"},
      {ScheduleKind::kCosineWarmRestarts,
       [](JobSpec& s) {
         s.schedule.t_0 = 2;
         s.schedule.t_mult = 0;
       },
       "t_mult must be at least 1; got 0"},
      {ScheduleKind::kOneCycle, [](JobSpec& s) { s.schedule.pct_start = 1.5; },
       "pct_start must be in [0, 1]; got 1.5"},
      {ScheduleKind::kOneCycle, [](JobSpec& s) { s.schedule.anneal_strategy = "exp"; },
       "anneal_strategy must be cos or linear; got 'exp'"},
      {ScheduleKind::kOneCycle, [](JobSpec& s) { s.schedule.div_factor = 0; },
       "div_factor must be a positive number; got 0"},
      {ScheduleKind::kOneCycle, [](JobSpec& s) { s.schedule.warmup_epochs = 1; },
       "schedule onecycle takes no warm-up"},
      {ScheduleKind::kPlateau, [](JobSpec& s) { s.validation_fraction = 0; },
       "schedule plateau steps on the validation loss: it needs a validation fraction or a "
       "validation dataset"},
      {ScheduleKind::kPlateau, [](JobSpec& s) { s.schedule.per_step = true; },
       "schedule plateau steps once per epoch, on its validation loss; it cannot be per step"},
      {ScheduleKind::kPlateau, [](JobSpec& s) { s.schedule.factor = 1; },
       "plateau factor must be in (0, 1); got 1"},
      {ScheduleKind::kPlateau, [](JobSpec& s) { s.schedule.patience = -1; },
       "plateau patience must be at least 0; got -1"},
      {ScheduleKind::kPlateau, [](JobSpec& s) { s.schedule.threshold = 1; },
       "plateau threshold must be in [0, 1); got 1"},
      {ScheduleKind::kPlateau, [](JobSpec& s) { s.schedule.warmup_epochs = 2; },
       "schedule plateau takes no warm-up"},
      {ScheduleKind::kCosine, [](JobSpec& s) { s.schedule.warmup_steps = 2; },
       "warm-up steps need a per-step schedule"},
      {ScheduleKind::kCosine,
       [](JobSpec& s) {
         s.schedule.per_step = true;
         s.schedule.warmup_epochs = 2;
       },
       "a per-step schedule warms up by steps: use warm-up steps, not warm-up epochs"},
      {ScheduleKind::kCosineWarmRestarts,
       [](JobSpec& s) {
         s.schedule.t_0 = 2;
         s.schedule.min_learning_rate = 0.5;
       },
       "schedule cosine_restarts needs a minimum learning rate in [0, learning rate 0.1); got 0.5"},
  };
  for (const Case& c : cases) {
    JobSpec spec = ScheduleSpecFor(c.kind, 0.1, 5);
    spec.validation_fraction = 0.2;
    c.set(spec);
    const absl::Status status = Check(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(ScheduleCheckTest, EveryScheduleWithItsOptionsPasses) {
  JobSpec multistep = ScheduleSpecFor(ScheduleKind::kMultiStep, 0.1, 5);
  multistep.schedule.milestones = {1, 1, 3};
  multistep.schedule.per_step = true;
  multistep.schedule.warmup_steps = 2;
  EXPECT_TRUE(Check(multistep).ok()) << Check(multistep);
  JobSpec onecycle = ScheduleSpecFor(ScheduleKind::kOneCycle, 0.1, 5);
  onecycle.schedule.pct_start = 0.5;
  onecycle.schedule.anneal_strategy = "linear";
  onecycle.schedule.three_phase = true;
  EXPECT_TRUE(Check(onecycle).ok()) << Check(onecycle);
  JobSpec plateau = ScheduleSpecFor(ScheduleKind::kPlateau, 0.1, 5);
  plateau.validation_dataset = "val";
  plateau.schedule.factor = 0.5;
  plateau.schedule.patience = 0;
  plateau.schedule.cooldown = 2;
  plateau.schedule.min_learning_rate = 1.0;
  EXPECT_TRUE(Check(plateau).ok()) << Check(plateau);
}

// ---- jobs -----------------------------------------------------------------------------------

constexpr double kTolerance = 1e-6;

std::shared_ptr<Dataset> RandomDataset(int64_t rows) {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "random";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = rows;
  dataset->meta.device = "cpu";
  torch::manual_seed(5);
  dataset->features = torch::randn({rows, 4});
  dataset->targets = torch::randn({rows, 1});
  return dataset;
}

TrainingRun SmallJob(const std::shared_ptr<Dataset>& dataset, EngineKind engine) {
  TrainingRun run;
  run.spec.dataset = "random";
  run.spec.model = "linear:8,relu,linear:1";
  run.spec.optimizer = OptimizerKind::kSgd;
  run.spec.momentum = 0.9;
  run.spec.learning_rate = 0.05;
  run.spec.batch_size = 16;
  run.spec.epochs = 6;
  run.spec.seed = 11;
  run.spec.device = "cpu";
  run.spec.engine = engine;
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = dataset;
  return run;
}

struct Epochs {
  std::vector<double> losses;
  std::vector<double> rates;
};

// Runs `run` whole with a checkpoint every epoch, then again from its checkpoint of epoch 3:
// the resumed epochs must be the whole run's, rates and losses.
void ExpectResumesExactly(TrainingRun run, const std::string& dir) {
  ASSERT_TRUE(CheckOptimizer(run.spec).ok()) << CheckOptimizer(run.spec);
  run.spec.checkpoint_every = 1;
  run.checkpoint_dir = dir;
  Epochs whole;
  std::string third;
  run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
    whole.losses.push_back(e.loss);
    whole.rates.push_back(e.learning_rate);
  };
  run.on_checkpoint = [&](int32_t epoch, const std::string& file, int64_t) {
    if (epoch == 3) third = run.checkpoint_dir + "/" + file;
  };
  TrainingOutcome a = RunTraining(run);
  ASSERT_EQ(a.state, JobState::kSucceeded) << a.error;
  ASSERT_EQ(whole.losses.size(), 6u);
  ASSERT_FALSE(third.empty());

  TrainingRun resumed = run;
  resumed.checkpoint_dir.clear();
  resumed.on_checkpoint = nullptr;
  resumed.resume_from = third;
  Epochs rest;
  resumed.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
    rest.losses.push_back(e.loss);
    rest.rates.push_back(e.learning_rate);
  };
  TrainingOutcome b = RunTraining(resumed);
  ASSERT_EQ(b.state, JobState::kSucceeded) << b.error;
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(rest.rates[i], whole.rates[3 + i]) << "epoch " << 4 + i;
    EXPECT_NEAR(rest.losses[i], whole.losses[3 + i],
                kTolerance * std::max(1.0, std::fabs(whole.losses[3 + i])))
        << "epoch " << 4 + i;
  }
}

TEST(ScheduleJobTest, APerStepScheduleReportsEachEpochsFirstRateAndResumesExactly) {
  // 64 rows in batches of 16: 4 steps an epoch, 24 in all.
  auto dataset = RandomDataset(64);
  for (EngineKind engine : {EngineKind::kLibTorch, EngineKind::kFused}) {
    SCOPED_TRACE(EngineKindName(engine));
    TrainingRun run = SmallJob(dataset, engine);
    run.spec.schedule.kind = ScheduleKind::kOneCycle;
    std::vector<double> rates;
    run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
      rates.push_back(e.learning_rate);
    };
    TrainingOutcome outcome = RunTraining(run);
    ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
    EXPECT_EQ(outcome.engine, EngineKindName(engine));
    LearningRateSchedule schedule(run.spec, 4);
    ASSERT_EQ(rates.size(), 6u);
    for (int32_t epoch = 1; epoch <= 6; ++epoch) {
      EXPECT_DOUBLE_EQ(rates[epoch - 1], schedule.Rate(epoch, (epoch - 1) * 4));
    }
    test_support::ScratchDir dir;
    TrainingRun again = SmallJob(dataset, engine);
    again.spec.schedule.kind = ScheduleKind::kOneCycle;
    ExpectResumesExactly(again, dir.path());
  }
}

TEST(ScheduleJobTest, PerStepAndPerEpochRatesTrainDifferently) {
  auto dataset = RandomDataset(64);
  auto last_loss = [&](bool per_step) {
    TrainingRun run = SmallJob(dataset, EngineKind::kLibTorch);
    run.spec.schedule.kind = ScheduleKind::kExponential;
    run.spec.schedule.gamma = 0.5;
    run.spec.schedule.per_step = per_step;
    TrainingOutcome outcome = RunTraining(run);
    EXPECT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
    return outcome.final_loss;
  };
  EXPECT_NE(last_loss(true), last_loss(false));
}

TEST(ScheduleJobTest, PlateauReducesOnTheValidationLossAndResumesWithItsState) {
  auto dataset = RandomDataset(80);
  for (EngineKind engine : {EngineKind::kLibTorch, EngineKind::kFused}) {
    SCOPED_TRACE(EngineKindName(engine));
    TrainingRun run = SmallJob(dataset, engine);
    run.spec.validation_fraction = 0.25;
    run.spec.schedule.kind = ScheduleKind::kPlateau;
    // An improvement must take a tenth off the best: random targets give few, so the rate
    // falls, with cooldowns between, and the resumed run needs every part of the state.
    run.spec.schedule.threshold = 0.1;
    run.spec.schedule.patience = 0;
    run.spec.schedule.cooldown = 1;
    run.spec.schedule.factor = 0.5;
    std::vector<double> rates;
    std::vector<double> val_losses;
    run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
      rates.push_back(e.learning_rate);
      val_losses.push_back(*e.validation_loss);
    };
    TrainingOutcome outcome = RunTraining(run);
    ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
    // The same rates as the schedule fed the reported validation losses.
    LearningRateSchedule schedule(run.spec, 1);
    ASSERT_EQ(rates.size(), 6u);
    for (size_t i = 0; i < rates.size(); ++i) {
      EXPECT_DOUBLE_EQ(rates[i], schedule.Rate(static_cast<int32_t>(i + 1), 0)) << i;
      schedule.EndEpoch(val_losses[i]);
    }
    EXPECT_LT(rates.back(), rates.front());
    test_support::ScratchDir dir;
    TrainingRun again = run;
    again.on_epoch = nullptr;
    ExpectResumesExactly(again, dir.path());
  }
}

TEST(ScheduleJobTest, WarmUpStepsBeyondTheJobsStepsFailTheJobWithTheCount) {
  TrainingRun run = SmallJob(RandomDataset(64), EngineKind::kLibTorch);
  run.spec.epochs = 2;
  run.spec.schedule.per_step = true;
  run.spec.schedule.warmup_steps = 8;
  TrainingOutcome outcome = RunTraining(run);
  EXPECT_EQ(outcome.state, JobState::kFailed);
  EXPECT_THAT(outcome.error,
              HasSubstr("warm-up steps (8) must be fewer than the job's steps (8: 2 epochs of 4)"));
}

}  // namespace
}  // namespace trainerd::engine
