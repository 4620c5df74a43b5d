// Training through the Engine on the CPU: the seed question's regression converges, the host
// transfers are counted exactly, a seed reproduces a run bit for bit, a diverging run fails with a
// sentence, and a cross-entropy classifier learns.
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::EventRecorder;
using test_support::FindParameter;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class EngineTrainingTest : public EngineFixture {};

TEST_F(EngineTrainingTest, SeedJobConvergesToTheLineItWasDrawnFrom) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, SeedSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();

  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  const ParameterValues* weight = FindParameter(*job, "0.weight");
  const ParameterValues* bias = FindParameter(*job, "0.bias");
  ASSERT_NE(weight, nullptr);
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(weight->shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(bias->shape, (std::vector<int64_t>{1}));
  ASSERT_THAT(weight->values, SizeIs(1));
  ASSERT_THAT(bias->values, SizeIs(1));
  EXPECT_NEAR(weight->values[0], 2.0, 0.05);
  EXPECT_NEAR(bias->values[0], 1.0, 0.05);
  ASSERT_THAT(job->epochs, SizeIs(100));
  EXPECT_LT(job->final_loss, 0.02);
  EXPECT_EQ(job->final_loss, job->epochs.back().loss);
  EXPECT_EQ(job->steps, 100 * 50);  // 800 rows in batches of 16
  EXPECT_EQ(job->parameter_count, 2);
}

// A spec without a loss gets the one its targets call for: cross_entropy for int64 class
// indices (which mse would refuse), mse for float32 values; the job's spec says which.
TEST_F(EngineTrainingTest, WithoutALossTheTargetsChooseIt) {
  ASSERT_TRUE(Upload(*engine_, "clusters", test_support::ClustersTable()).ok());
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec classes = SeedSpec("clusters");
  classes.model = "linear:3";
  classes.epochs = 3;
  classes.loss_from_targets = true;
  absl::StatusOr<JobSnapshot> classified = RunJob(*engine_, classes);
  ASSERT_TRUE(classified.ok()) << classified.status();
  EXPECT_EQ(classified->state, JobState::kSucceeded) << classified->error;
  EXPECT_EQ(classified->spec.loss, LossKind::kCrossEntropy);
  EXPECT_FALSE(classified->spec.loss_from_targets);
  ASSERT_TRUE(classified->epochs.back().loss > 0);

  JobSpec values = SeedSpec("seed");
  values.epochs = 3;
  values.loss = LossKind::kCrossEntropy;  // overridden: loss_from_targets says none was named
  values.loss_from_targets = true;
  absl::StatusOr<JobSnapshot> regressed = RunJob(*engine_, values);
  ASSERT_TRUE(regressed.ok()) << regressed.status();
  EXPECT_EQ(regressed->state, JobState::kSucceeded) << regressed->error;
  EXPECT_EQ(regressed->spec.loss, LossKind::kMse);

  // A loss that was named is kept, and checked as before.
  JobSpec named = SeedSpec("clusters");
  named.model = "linear:3";
  absl::StatusOr<JobSnapshot> refused = engine_->SubmitJob(named, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("loss mse needs float32 targets"));
}

// The device report's peak memory on the CPU is the job's own tensors, measured: at least the
// parameters, their gradients and Adam's two moments, the same for the same job, and nothing like
// the process's growth (the dataset, resident before, is not the job's).
TEST_F(EngineTrainingTest, CpuPeakMemoryIsTheJobsOwnTensors) {
  ASSERT_TRUE(Upload(*engine_, "wide", test_support::RandomTable(512, 64)).ok());
  JobSpec spec = SeedSpec("wide");
  spec.model = "linear:256,relu,linear:1";
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 1e-3;
  spec.batch_size = 64;
  spec.epochs = 3;
  const int64_t parameters = 64 * 256 + 256 + 256 + 1;
  std::vector<int64_t> peaks;
  for (int run = 0; run < 2; ++run) {
    absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
    ASSERT_EQ(job->parameter_count, parameters);
    peaks.push_back(job->report.peak_memory_bytes);
  }
  // Parameters, gradients, exp_avg and exp_avg_sq: four float32 copies.
  EXPECT_GE(peaks[0], 4 * 4 * parameters);
  // Plus a batch's activations (64 x 256 floats a few times over) and small scratch; well under
  // the dataset's 512 x 65 floats plus everything the process holds.
  EXPECT_LT(peaks[0], 4 * 4 * parameters + 16 * 64 * 256 * 4 + (1 << 20));
  EXPECT_EQ(peaks[0], peaks[1]);
}

TEST_F(EngineTrainingTest, EpochsAreNumberedFromOneWithGrowingElapsedTime) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_THAT(job->epochs, SizeIs(5));
  for (size_t i = 0; i < job->epochs.size(); ++i) {
    EXPECT_EQ(job->epochs[i].epoch, static_cast<int32_t>(i + 1));
    if (i > 0) {
      EXPECT_GE(job->epochs[i].elapsed_seconds, job->epochs[i - 1].elapsed_seconds);
    }
  }
  EXPECT_GE(job->wall_seconds, job->epochs.back().elapsed_seconds);
  EXPECT_GT(job->samples_per_second, 0.0);
  EXPECT_LE(job->start_time, job->end_time);
}

TEST_F(EngineTrainingTest, SmallModelSyncsOncePerEpochPlusOneParameterReadBack) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 7;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->host_syncs, 7 + 1);
  EXPECT_THAT(job->parameters, SizeIs(2));
}

TEST_F(EngineTrainingTest, LargeModelSyncsOncePerEpochAndReportsNoParameters) {
  ASSERT_TRUE(
      Upload(*engine_, "wide", test_support::RandomTable(/*rows=*/64, /*features=*/32)).ok());
  JobSpec spec = SeedSpec("wide");
  spec.model = "linear:64,relu,linear:1";
  spec.learning_rate = 0.01;
  spec.epochs = 3;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->host_syncs, 3);
  EXPECT_THAT(job->parameters, IsEmpty());
  // 32 * 64 + 64 weights and biases into the hidden layer, 64 + 1 out of it.
  EXPECT_EQ(job->parameter_count, 2177);
  absl::StatusOr<ModelSpec> model = ParseModelSpec(spec.model);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(CountParameters(*model, {32}).value_or(-1), job->parameter_count);
  EXPECT_GT(job->parameter_count, kMaxReportedParameters);
}

TEST_F(EngineTrainingTest, SameSeedReproducesLossesBitForBit) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 10;

  absl::StatusOr<JobSnapshot> first = RunJob(*engine_, spec);
  absl::StatusOr<JobSnapshot> second = RunJob(*engine_, spec);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  ASSERT_THAT(Losses(*first), SizeIs(10));
  EXPECT_EQ(Losses(*first), Losses(*second));  // exact, not near
  ASSERT_THAT(first->parameters, SizeIs(2));
  ASSERT_THAT(second->parameters, SizeIs(2));
  EXPECT_EQ(first->parameters[0].values, second->parameters[0].values);
  EXPECT_EQ(first->parameters[1].values, second->parameters[1].values);
}

TEST_F(EngineTrainingTest, DifferentSeedGivesDifferentLosses) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 10;
  JobSpec other = spec;
  other.seed = 43;

  absl::StatusOr<JobSnapshot> first = RunJob(*engine_, spec);
  absl::StatusOr<JobSnapshot> second = RunJob(*engine_, other);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  ASSERT_THAT(Losses(*first), SizeIs(10));
  ASSERT_THAT(Losses(*second), SizeIs(10));
  EXPECT_NE(Losses(*first)[0], Losses(*second)[0]);
  EXPECT_NE(Losses(*first), Losses(*second));
}

TEST_F(EngineTrainingTest, UnshuffledJobIsReproducibleToo) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;
  spec.shuffle = false;

  absl::StatusOr<JobSnapshot> first = RunJob(*engine_, spec);
  absl::StatusOr<JobSnapshot> second = RunJob(*engine_, spec);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  EXPECT_EQ(first->state, JobState::kSucceeded) << first->error;
  ASSERT_THAT(Losses(*first), SizeIs(5));
  EXPECT_EQ(Losses(*first), Losses(*second));
}

TEST_F(EngineTrainingTest, DivergingJobFailsNamingTheLossAndTheEpoch) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.learning_rate = 1e6;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_THAT(job->error, HasSubstr("loss became"));
  EXPECT_THAT(job->error, HasSubstr("at epoch"));
  EXPECT_LT(job->epochs.size(), 100u);
}

TEST_F(EngineTrainingTest, FailedJobStaysFailedAfterItEnds) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.learning_rate = 1e6;
  // Behind a blocker, so that the subscription certainly sees the whole stream.
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(test_support::BlockerSpec("seed"));
  absl::StatusOr<JobSnapshot> queued = engine_->SubmitJob(spec);
  ASSERT_TRUE(blocker.ok() && queued.ok());
  auto recorder = std::make_shared<EventRecorder>();
  absl::StatusOr<JobSnapshot> at_subscribe = engine_->SubscribeJob(queued->id, recorder);
  ASSERT_TRUE(at_subscribe.ok()) << at_subscribe.status();
  ASSERT_EQ(at_subscribe->state, JobState::kQueued);
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  std::optional<JobSnapshot> ended = recorder->WaitForTerminal();
  ASSERT_TRUE(ended.has_value());
  ASSERT_EQ(ended->state, JobState::kFailed);

  // Neither a cancel nor the engine's shutdown touches a job that already ended.
  EXPECT_EQ(engine_->CancelJob(queued->id).status().code(), absl::StatusCode::kFailedPrecondition);
  engine_->Shutdown();

  absl::StatusOr<JobSnapshot> after = engine_->GetJob(queued->id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state, JobState::kFailed);
  EXPECT_EQ(after->error, ended->error);
  EXPECT_EQ(after->end_time, ended->end_time);
  const std::vector<JobEvent> events = recorder->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, JobEvent::Kind::kState);
  EXPECT_EQ(events.back().job.state, JobState::kFailed);
  int terminal_events = 0;
  for (const JobEvent& event : events) {
    if (event.kind == JobEvent::Kind::kState && IsTerminal(event.job.state)) ++terminal_events;
  }
  EXPECT_EQ(terminal_events, 1);
}

TEST_F(EngineTrainingTest, CrossEntropyClassifierLearnsSeparatedClusters) {
  ASSERT_TRUE(Upload(*engine_, "clusters", test_support::ClustersTable()).ok());
  JobSpec spec;
  spec.dataset = "clusters";
  spec.model = "linear:16,relu,linear:3";
  spec.loss = LossKind::kCrossEntropy;
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.01;
  spec.batch_size = 32;
  spec.epochs = 30;
  spec.seed = 1;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->epochs, SizeIs(30));
  EXPECT_LT(job->final_loss, 0.1);
  EXPECT_LT(job->epochs.back().loss, job->epochs.front().loss);
  // 2 * 16 + 16 + 16 * 3 + 3 values: small enough to be reported.
  EXPECT_EQ(job->parameter_count, 99);
  EXPECT_NE(FindParameter(*job, "2.weight"), nullptr);
}

}  // namespace
}  // namespace trainerd::engine
