// Tests for server/engine/trainer.h: RunTraining on tensors built in the test, without the
// Engine's queue, to pin down step counts, the per-epoch callback and cancellation.
#include "server/engine/training/trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/member_loop.h"

namespace trainerd::engine {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// GatherRows gives index_select's rows, bit for bit, whatever the row's width and alignment.
TEST(GatherRowsTest, MatchesIndexSelect) {
  torch::manual_seed(3);
  const torch::Tensor order = torch::randperm(50, torch::kInt64);
  std::vector<torch::Tensor> sources = {
      torch::randn({50, 1}),                                        // 4-byte rows
      torch::randn({50, 3}),                                        // 12-byte rows
      torch::randn({50, 2, 2}),                                     // 16-byte rows, 3 dims
      torch::randint(0, 10, {50}, torch::kInt64),                   // class indices
      torch::randint(0, 255, {50, 3}, torch::kUInt8),               // 3-byte rows
      torch::randn({51, 2}).narrow(/*dim=*/0, 1, 50),               // 8-byte rows, 8-byte offset
      torch::randn({101}).narrow(/*dim=*/0, 1, 100).view({50, 2}),  // 4-aligned 8-byte rows
  };
  for (const torch::Tensor& source : sources) {
    const torch::Tensor got = trainer_internal::GatherRows(source, order);
    const torch::Tensor want = source.index_select(/*dim=*/0, order);
    EXPECT_EQ(got.sizes(), want.sizes());
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_TRUE(torch::equal(got, want)) << source.sizes();
  }
  // A part of the order, as a chunk takes it.
  const torch::Tensor part = order.narrow(/*dim=*/0, 10, 16);
  EXPECT_TRUE(torch::equal(trainer_internal::GatherRows(sources[0], part),
                           sources[0].index_select(0, part)));
  // An index out of range is index_select's error, not a read past the data.
  EXPECT_THROW(trainer_internal::GatherRows(sources[0], torch::tensor({0, 50}, torch::kInt64)),
               c10::Error);
  EXPECT_THROW(trainer_internal::GatherRows(sources[0], torch::tensor({-1}, torch::kInt64)),
               c10::Error);
}

// `rows` rows of x = 0, 1, ... with y = 2x; resident on the CPU.
std::shared_ptr<const Dataset> LineDataset(int64_t rows) {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "line";
  dataset->meta.feature_shape = {1};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = rows;
  dataset->meta.device = "cpu";
  dataset->features = torch::arange(rows, torch::kFloat32).view({rows, 1}) / rows;
  dataset->targets = dataset->features * 2;
  return dataset;
}

TrainingRun LineRun(int64_t rows, int64_t batch_size, int32_t epochs) {
  TrainingRun run;
  run.spec.dataset = "line";
  run.spec.model = "linear:1";
  run.spec.learning_rate = 0.1;
  run.spec.batch_size = batch_size;
  run.spec.epochs = epochs;
  run.spec.seed = 5;
  run.spec.device = "cpu";
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = LineDataset(rows);
  return run;
}

TEST(TrainerTest, PartialLastBatchCountsAsAStep) {
  TrainingRun run = LineRun(/*rows=*/10, /*batch_size=*/4, /*epochs=*/3);

  TrainingOutcome outcome = RunTraining(run);

  ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  EXPECT_EQ(outcome.steps, 3 * 3);  // batches of 4, 4 and 2
  EXPECT_EQ(outcome.epochs_done, 3);
}

TEST(TrainerTest, BatchLargerThanDatasetIsOneStepPerEpoch) {
  TrainingRun run = LineRun(/*rows=*/10, /*batch_size=*/1000, /*epochs=*/4);

  TrainingOutcome outcome = RunTraining(run);

  ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  EXPECT_EQ(outcome.steps, 4);
}

TEST(TrainerTest, OnEpochSeesRunningStepAndSyncCounts) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/4, /*epochs=*/3);
  std::vector<int32_t> epochs;
  std::vector<int64_t> steps;
  std::vector<int64_t> syncs;
  std::vector<double> losses;
  run.on_epoch = [&](const EpochResult& epoch, int64_t step_count, int64_t host_syncs) {
    epochs.push_back(epoch.epoch);
    losses.push_back(epoch.loss);
    steps.push_back(step_count);
    syncs.push_back(host_syncs);
  };

  TrainingOutcome outcome = RunTraining(run);

  ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  EXPECT_THAT(epochs, ElementsAre(1, 2, 3));
  EXPECT_THAT(steps, ElementsAre(2, 4, 6));
  EXPECT_THAT(syncs, ElementsAre(1, 2, 3));  // exactly one transfer per epoch
  EXPECT_EQ(outcome.host_syncs, 3 + 1);      // and one parameter read-back
  EXPECT_EQ(outcome.final_loss, losses.back());
}

TEST(TrainerTest, CancelFlagSetBeforeStartEndsCancelledWithoutSteps) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/4, /*epochs=*/3);
  std::atomic<bool> cancel{true};
  run.cancel = &cancel;
  int epochs_reported = 0;
  run.on_epoch = [&](const EpochResult&, int64_t, int64_t) { ++epochs_reported; };

  TrainingOutcome outcome = RunTraining(run);

  EXPECT_EQ(outcome.state, JobState::kCancelled);
  EXPECT_EQ(outcome.steps, 0);
  EXPECT_EQ(outcome.epochs_done, 0);
  EXPECT_EQ(epochs_reported, 0);
  EXPECT_THAT(outcome.parameters, IsEmpty());
  EXPECT_EQ(outcome.error, "");
}

TEST(TrainerTest, CancelFromOnEpochStopsBeforeTheNextEpoch) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/4, /*epochs=*/50);
  std::atomic<bool> cancel{false};
  run.cancel = &cancel;
  run.on_epoch = [&](const EpochResult& epoch, int64_t, int64_t) {
    if (epoch.epoch == 2) cancel.store(true);
  };

  TrainingOutcome outcome = RunTraining(run);

  EXPECT_EQ(outcome.state, JobState::kCancelled);
  EXPECT_EQ(outcome.epochs_done, 2);
  EXPECT_EQ(outcome.steps, 2 * 2);
  EXPECT_EQ(outcome.host_syncs, 2);  // no parameter read-back for a cancelled job
}

TEST(TrainerTest, LibTorchErrorBecomesFailedWithASentence) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/4, /*epochs=*/2);
  // A model that does not fit the features: CheckJobSpec would refuse it; RunTraining must not
  // throw either.
  run.model = *ParseModelSpec("linear:3");

  TrainingOutcome outcome = RunTraining(run);

  EXPECT_EQ(outcome.state, JobState::kFailed);
  EXPECT_THAT(outcome.error, ::testing::StartsWith("training failed at epoch 1: "));
  EXPECT_THAT(outcome.error, ::testing::Not(::testing::HasSubstr("\n")));
}

TEST(TrainerTest, ReportsParametersInSequentialOrder) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/4, /*epochs=*/1);
  run.model = *ParseModelSpec("linear:3,tanh,linear:1");

  TrainingOutcome outcome = RunTraining(run);

  ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  ASSERT_THAT(outcome.parameters, SizeIs(4));
  EXPECT_EQ(outcome.parameters[0].name, "0.weight");
  EXPECT_EQ(outcome.parameters[1].name, "0.bias");
  EXPECT_EQ(outcome.parameters[2].name, "2.weight");
  EXPECT_EQ(outcome.parameters[3].name, "2.bias");
  EXPECT_EQ(outcome.parameters[2].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_THAT(outcome.parameters[2].values, SizeIs(3));
  EXPECT_EQ(outcome.parameter_count, 3 + 3 + 3 + 1);
}

TEST(TrainerTest, ClippingAndScheduleKeepOneHostSyncPerEpoch) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/2, /*epochs=*/4);
  run.spec.optimizer = OptimizerKind::kAdamW;
  run.spec.schedule.kind = ScheduleKind::kCosine;
  run.spec.schedule.warmup_epochs = 1;
  run.spec.clip_grad_norm = 0.01;  // small enough to clip every step
  std::vector<int64_t> syncs;
  run.on_epoch = [&](const EpochResult&, int64_t, int64_t host_syncs) {
    syncs.push_back(host_syncs);
  };

  TrainingOutcome outcome = RunTraining(run);

  ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  EXPECT_THAT(syncs, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(outcome.host_syncs, 4 + 1);
}

TEST(TrainerTest, EachEpochReportsItsScheduledLearningRate) {
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/4, /*epochs=*/5);
  run.spec.learning_rate = 0.2;
  run.spec.schedule.kind = ScheduleKind::kStep;
  run.spec.schedule.step_epochs = 2;
  run.spec.schedule.gamma = 0.5;
  run.spec.schedule.warmup_epochs = 1;
  std::vector<double> rates;
  run.on_epoch = [&](const EpochResult& epoch, int64_t, int64_t) {
    rates.push_back(epoch.learning_rate);
  };

  TrainingOutcome outcome = RunTraining(run);

  ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  EXPECT_THAT(rates, ElementsAre(DoubleEq(0.1), DoubleEq(0.2), DoubleEq(0.2), DoubleEq(0.1),
                                 DoubleEq(0.1)));
}

// The parameters of `run` after training, flattened.
std::vector<float> TrainedValues(const TrainingRun& run) {
  TrainingOutcome outcome = RunTraining(run);
  EXPECT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  std::vector<float> values;
  for (const auto& p : outcome.parameters) {
    values.insert(values.end(), p.values.begin(), p.values.end());
  }
  return values;
}

TEST(TrainerTest, ClippingBoundsTheUpdateOfAStep) {
  // One sgd step of the whole batch: the update is lr * g with ||g|| clipped to 1e-3.
  TrainingRun run = LineRun(/*rows=*/8, /*batch_size=*/8, /*epochs=*/1);
  run.spec.learning_rate = 1e-30;  // as good as untrained: the initial parameters
  const std::vector<float> initial = TrainedValues(run);
  run.spec.learning_rate = 1.0;
  const std::vector<float> unclipped = TrainedValues(run);
  run.spec.clip_grad_norm = 1e-3;
  const std::vector<float> clipped = TrainedValues(run);

  auto distance = [&](const std::vector<float>& values) {
    double sum = 0;
    for (size_t i = 0; i < values.size(); ++i) sum += std::pow(values[i] - initial[i], 2);
    return std::sqrt(sum);
  };
  EXPECT_GT(distance(unclipped), 1e-2);
  EXPECT_NEAR(distance(clipped), 1e-3, 1e-5);
}

}  // namespace
}  // namespace trainerd::engine
