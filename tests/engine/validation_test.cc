// Validation and early stopping through the Engine on the CPU: a held-out fraction or a second
// dataset is evaluated every epoch (loss, and accuracy for class losses) within the epoch's one
// host transfer; early stopping ends a job whose validation loss stops improving; Submit refuses
// validation options that cannot work, with a sentence.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::BlockerSpec;
using test_support::ClassTable;
using test_support::ClustersTable;
using test_support::EngineFixture;
using test_support::EventRecorder;
using test_support::RandomTable;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// `rows` rows of `features` features in `classes` Gaussian clusters: each class's centre has
// standard-normal coordinates times `centre_spread`, each row is its centre plus standard-normal
// noise. With 16 features and centre_spread 1.5 the centres lie about 8.5 apart against unit
// noise, so a small MLP can separate them almost perfectly. Classes cycle 0, 1, ... in turn.
Table GaussianClassesTable(int64_t rows, int64_t features, int64_t classes, uint32_t seed,
                           float centre_spread = 1.5f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centres;
  for (int64_t i = 0; i < classes * features; ++i) centres.push_back(centre_spread * normal(gen));
  Table table;
  table.feature_shape = {features};
  table.target_shape = {};
  table.target_dtype = TargetDType::kInt64;
  table.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = r % classes;
    for (int64_t f = 0; f < features; ++f) {
      table.features.push_back(centres[label * features + f] + normal(gen));
    }
    table.targets_i64.push_back(label);
  }
  return table;
}

// The three-cluster classifier: linear:3, cross_entropy, adam lr 0.05, batch 32, seed 42.
JobSpec ClusterSpec(const std::string& dataset) {
  JobSpec spec = SeedSpec(dataset);
  spec.model = "linear:3";
  spec.loss = LossKind::kCrossEntropy;
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.05;
  spec.batch_size = 32;
  spec.epochs = 10;
  return spec;
}

class ValidationTest : public EngineFixture {};

TEST_F(ValidationTest, FractionReportsValidationLossAndAccuracyEveryEpoch) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  JobSpec spec = ClusterSpec("clusters");
  spec.validation_fraction = 0.2;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->epochs, SizeIs(10));
  for (const EpochResult& epoch : job->epochs) {
    ASSERT_TRUE(epoch.validation_loss.has_value()) << "epoch " << epoch.epoch;
    ASSERT_TRUE(epoch.validation_accuracy.has_value()) << "epoch " << epoch.epoch;
    EXPECT_TRUE(std::isfinite(*epoch.validation_loss));
    EXPECT_GE(*epoch.validation_loss, 0.0);
    EXPECT_GE(*epoch.validation_accuracy, 0.0);
    EXPECT_LE(*epoch.validation_accuracy, 1.0);
  }
  // 60 of 300 rows are held out; the accuracy is a count of them over 60.
  const double correct = *job->epochs.back().validation_accuracy * 60;
  EXPECT_NEAR(correct, std::round(correct), 1e-9);
  // Well separated clusters: the held-out rows are classified correctly and their loss fell.
  EXPECT_GE(*job->epochs.back().validation_accuracy, 0.95);
  EXPECT_LT(*job->epochs.back().validation_loss, *job->epochs.front().validation_loss);
  EXPECT_FALSE(job->stopped_early);
}

TEST_F(ValidationTest, RegressionReportsValidationLossButNoAccuracy) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 20;
  spec.validation_fraction = 0.25;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->epochs, SizeIs(20));
  for (const EpochResult& epoch : job->epochs) {
    ASSERT_TRUE(epoch.validation_loss.has_value());
    EXPECT_FALSE(epoch.validation_accuracy.has_value());
  }
  // The noise has variance 0.01: a fitted line's held-out loss is close to it.
  EXPECT_LT(*job->epochs.back().validation_loss, 0.02);
}

TEST_F(ValidationTest, WithoutValidationEpochsCarryNoValidationNumbers) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 2;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_THAT(job->epochs, SizeIs(2));
  for (const EpochResult& epoch : job->epochs) {
    EXPECT_FALSE(epoch.validation_loss.has_value());
    EXPECT_FALSE(epoch.validation_accuracy.has_value());
  }
}

// The split is torch.randperm(rows, generator=torch.Generator().manual_seed(seed)), its last
// round(f * rows) rows held out, whatever the device: with it a caller evaluates the trained model
// on exactly the rows the daemon validated on. The model's loss there is the last epoch's
// validation loss.
TEST_F(ValidationTest, HeldOutRowsAreTheLastOfTheSeedsCpuPermutation) {
  const Table table = SeedTable(/*rows=*/800);
  ASSERT_TRUE(Upload(*engine_, "seed", table).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 4;
  spec.validation_fraction = 0.25;
  spec.seed = 1234567890123ull;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  const ParameterValues* weight = test_support::FindParameter(*job, "0.weight");
  const ParameterValues* bias = test_support::FindParameter(*job, "0.bias");
  ASSERT_NE(weight, nullptr);
  ASSERT_NE(bias, nullptr);

  at::Generator gen = at::detail::createCPUGenerator(*spec.seed);
  const torch::Tensor split = torch::randperm(800, gen, torch::kLong);
  const int64_t held_out = HeldOutRows(0.25, 800);
  ASSERT_EQ(held_out, 200);
  double sum = 0;
  for (int64_t i = 800 - held_out; i < 800; ++i) {
    const int64_t row = split[i].item<int64_t>();
    const double prediction = weight->values[0] * table.features[row] + bias->values[0];
    const double error = prediction - table.targets_f32[row];
    sum += error * error;
  }
  ASSERT_TRUE(job->epochs.back().validation_loss.has_value());
  EXPECT_NEAR(sum / held_out, *job->epochs.back().validation_loss, 1e-6);
  // Any other 200 rows give another loss: the first 200 of the permutation (which trained).
  double other = 0;
  for (int64_t i = 0; i < held_out; ++i) {
    const int64_t row = split[i].item<int64_t>();
    const double error =
        weight->values[0] * table.features[row] + bias->values[0] - table.targets_f32[row];
    other += error * error;
  }
  EXPECT_GT(std::abs(other / held_out - *job->epochs.back().validation_loss), 1e-5);
}

TEST_F(ValidationTest, HeldOutRowsAreNotTrainedOn) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(/*rows=*/800)).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 3;
  spec.validation_fraction = 0.25;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  // 600 training rows in batches of 16: 38 steps per epoch (the last one of 8 rows), not 50.
  EXPECT_EQ(job->steps, 3 * 38);
}

TEST_F(ValidationTest, HostSyncsStayOnePerEpochWithValidationTurnedOn) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  JobSpec spec = ClusterSpec("clusters");
  spec.epochs = 7;
  spec.validation_fraction = 0.2;
  auto recorder = std::make_shared<EventRecorder>();

  absl::StatusOr<JobSnapshot> queued = engine_->SubmitJob(spec);
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_TRUE(engine_->SubscribeJob(queued->id, recorder).ok());
  std::optional<JobSnapshot> job = recorder->WaitForTerminal();
  ASSERT_TRUE(job.has_value());

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->epochs, SizeIs(7));
  ASSERT_TRUE(job->epochs.back().validation_accuracy.has_value());
  // 9 parameters: one transfer per epoch (training loss, validation loss and accuracy together)
  // plus the parameter read-back.
  EXPECT_EQ(job->parameter_count, 9);
  EXPECT_EQ(job->host_syncs, 7 + 1);
}

TEST_F(ValidationTest, HostSyncsStayOnePerEpochWithAValidationDataset) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  ASSERT_TRUE(Upload(*engine_, "clusters-val", ClustersTable(/*rows=*/90, /*seed=*/4)).ok());
  JobSpec spec = ClusterSpec("clusters");
  spec.epochs = 5;
  spec.validation_dataset = "clusters-val";

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->host_syncs, 5 + 1);
}

TEST_F(ValidationTest, MlpClassifierOnTenSyntheticClassesReaches95PercentValidationAccuracy) {
  ASSERT_TRUE(Upload(*engine_, "blobs",
                     GaussianClassesTable(/*rows=*/2000, /*features=*/16, /*classes=*/10,
                                          /*seed=*/11))
                  .ok());
  JobSpec spec = SeedSpec("blobs");
  spec.model = "linear:64,relu,linear:10";
  spec.loss = LossKind::kCrossEntropy;
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.01;
  spec.batch_size = 64;
  spec.epochs = 10;
  spec.validation_fraction = 0.2;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->epochs, SizeIs(10));
  ASSERT_TRUE(job->epochs.back().validation_accuracy.has_value());
  EXPECT_GE(*job->epochs.back().validation_accuracy, 0.95);
  // 1,098 parameters: more than are read back, so exactly one transfer per epoch.
  EXPECT_EQ(job->parameter_count, 16 * 64 + 64 + 64 * 10 + 10);
  EXPECT_EQ(job->host_syncs, 10);
}

TEST_F(ValidationTest, SameSeedGivesTheSameSplitAndValidationLossesBitForBit) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  JobSpec spec = ClusterSpec("clusters");
  spec.epochs = 4;
  spec.validation_fraction = 0.3;

  absl::StatusOr<JobSnapshot> first = RunJob(*engine_, spec);
  absl::StatusOr<JobSnapshot> second = RunJob(*engine_, spec);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  ASSERT_THAT(first->epochs, SizeIs(4));
  ASSERT_THAT(second->epochs, SizeIs(4));
  for (size_t i = 0; i < first->epochs.size(); ++i) {
    EXPECT_EQ(first->epochs[i].loss, second->epochs[i].loss);
    EXPECT_EQ(first->epochs[i].validation_loss, second->epochs[i].validation_loss);
    EXPECT_EQ(first->epochs[i].validation_accuracy, second->epochs[i].validation_accuracy);
  }
}

TEST_F(ValidationTest, EarlyStoppingEndsAJobWhoseValidationLossStopsImproving) {
  // Pure-noise targets: a wide MLP overfits the training rows, and the held-out loss, which has
  // nothing to learn, soon stops improving.
  ASSERT_TRUE(Upload(*engine_, "noise", RandomTable(/*rows=*/200, /*features=*/4)).ok());
  JobSpec spec = SeedSpec("noise");
  spec.model = "linear:64,relu,linear:1";
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.01;
  spec.epochs = 300;
  spec.validation_fraction = 0.25;
  spec.early_stop_patience = 3;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_TRUE(job->stopped_early);
  EXPECT_TRUE(job->error.empty());
  const size_t done = job->epochs.size();
  ASSERT_GT(done, 3u);
  ASSERT_LT(done, 300u);
  // The last three epochs did not beat the best validation loss before them, and every earlier
  // run of three epochs did (or the job would have stopped there).
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i + 3 < done; ++i) best = std::min(best, *job->epochs[i].validation_loss);
  for (size_t i = done - 3; i < done; ++i) {
    EXPECT_GE(*job->epochs[i].validation_loss, best) << "epoch " << i + 1;
  }
  // 385 parameters are read back: still one transfer per finished epoch plus one.
  EXPECT_EQ(job->host_syncs, static_cast<int64_t>(done) + 1);
  EXPECT_EQ(job->final_loss, job->epochs.back().loss);
}

TEST_F(ValidationTest, ImprovingValidationLossRunsEveryPlannedEpoch) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;
  spec.validation_fraction = 0.25;
  spec.early_stop_patience = 2;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_THAT(job->epochs, SizeIs(5));
  EXPECT_FALSE(job->stopped_early);
}

TEST_F(ValidationTest, ValidationDatasetIsWhatTheModelIsValidatedOn) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  // The same clusters with every label moved on by one: a model that learned the training
  // clusters gets almost all of these wrong, which only happens if they are what it validates on.
  Table shifted = ClustersTable(/*rows=*/90, /*seed=*/4);
  for (int64_t& label : shifted.targets_i64) label = (label + 1) % 3;
  ASSERT_TRUE(Upload(*engine_, "shifted", shifted).ok());
  ASSERT_TRUE(Upload(*engine_, "clusters-val", ClustersTable(/*rows=*/90, /*seed=*/4)).ok());

  JobSpec spec = ClusterSpec("clusters");
  spec.validation_dataset = "shifted";
  absl::StatusOr<JobSnapshot> wrong = RunJob(*engine_, spec);
  spec.validation_dataset = "clusters-val";
  absl::StatusOr<JobSnapshot> right = RunJob(*engine_, spec);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  ASSERT_TRUE(right.ok()) << right.status();

  ASSERT_EQ(wrong->state, JobState::kSucceeded) << wrong->error;
  ASSERT_EQ(right->state, JobState::kSucceeded) << right->error;
  ASSERT_TRUE(wrong->epochs.back().validation_accuracy.has_value());
  ASSERT_TRUE(right->epochs.back().validation_accuracy.has_value());
  EXPECT_LE(*wrong->epochs.back().validation_accuracy, 0.05);
  EXPECT_GE(*right->epochs.back().validation_accuracy, 0.95);
  // A second dataset holds nothing out: all 300 rows train (10 steps of 32 per epoch).
  EXPECT_EQ(right->steps, 10 * 10);
  // Training saw the same rows in the same order either way.
  EXPECT_EQ(wrong->epochs.back().loss, right->epochs.back().loss);
}

TEST_F(ValidationTest, InfiniteValidationLossFailsTheJobNamingTheEpoch) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  // Finite features so large that the squared error overflows float32.
  Table huge = SeedTable(/*rows=*/50);
  for (float& x : huge.features) x = 1e30f;
  ASSERT_TRUE(Upload(*engine_, "huge", huge).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;
  spec.validation_dataset = "huge";

  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_THAT(job->error, HasSubstr("validation loss became infinite at epoch 1"));
  EXPECT_THAT(job->epochs, IsEmpty());
}

TEST_F(ValidationTest, DeletingADatasetThatAJobValidatesOnIsRefused) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  ASSERT_TRUE(Upload(*engine_, "seed-val", SeedTable(/*rows=*/100, /*seed=*/5)).ok());
  JobSpec spec = BlockerSpec("seed");
  spec.validation_dataset = "seed-val";
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();

  absl::Status deleted = engine_->DeleteDataset("seed-val");

  EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition) << deleted;
  EXPECT_THAT(deleted.message(), HasSubstr(job->id));
  ASSERT_TRUE(engine_->CancelJob(job->id).ok());
}

// --- Submit ---

// Datasets "seed" (64 rows, float32 targets, 1 feature) and "classes" (20 rows, int64 targets
// 0..9, 2 features).
class ValidationSubmitTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(/*rows=*/64)).ok());
    ASSERT_TRUE(Upload(*engine_, "classes", ClassTable(/*rows=*/20, 0, 9)).ok());
  }

  JobSpec ClassSpec() const {
    JobSpec spec = SeedSpec("classes");
    spec.model = "linear:10";
    spec.loss = LossKind::kCrossEntropy;
    return spec;
  }

  // Submits `spec`, expects INVALID_ARGUMENT (or `code`) and returns the message.
  std::string Rejection(const JobSpec& spec,
                        absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
    EXPECT_EQ(job.status().code(), code) << job.status();
    EXPECT_THAT(engine_->ListJobs()->jobs, IsEmpty());
    return std::string(job.status().message());
  }
};

TEST_F(ValidationSubmitTest, FractionOutsideZeroToOneIsRefused) {
  JobSpec spec = SeedSpec("seed");
  for (double f : {-0.1, 1.0, 1.5, std::nan("")}) {
    spec.validation_fraction = f;
    EXPECT_THAT(Rejection(spec), HasSubstr("validation fraction must be in [0, 1)")) << f;
  }
}

TEST_F(ValidationSubmitTest, FractionThatHoldsOutNoRowsIsRefused) {
  JobSpec spec = SeedSpec("seed");
  spec.validation_fraction = 0.001;  // round(0.064) = 0 of 64 rows
  EXPECT_EQ(Rejection(spec),
            "validation fraction 0.001 of dataset 'seed' (64 rows) holds out no rows; use a "
            "larger fraction");
}

TEST_F(ValidationSubmitTest, FractionThatLeavesNoTrainingRowsIsRefused) {
  JobSpec spec = SeedSpec("seed");
  spec.validation_fraction = 0.999;  // round(63.94) = 64 of 64 rows
  EXPECT_EQ(Rejection(spec),
            "validation fraction 0.999 of dataset 'seed' (64 rows) leaves no rows to train on; "
            "use a smaller fraction");
}

TEST_F(ValidationSubmitTest, FractionAndValidationDatasetTogetherAreRefused) {
  ASSERT_TRUE(Upload(*engine_, "seed-val", SeedTable(/*rows=*/16, /*seed=*/5)).ok());
  JobSpec spec = SeedSpec("seed");
  spec.validation_fraction = 0.2;
  spec.validation_dataset = "seed-val";
  EXPECT_EQ(Rejection(spec),
            "give either a validation fraction (0.2) or a validation dataset ('seed-val'), not "
            "both");
}

TEST_F(ValidationSubmitTest, PatienceWithoutValidationIsRefused) {
  JobSpec spec = SeedSpec("seed");
  spec.early_stop_patience = 5;
  EXPECT_EQ(Rejection(spec),
            "early stopping (patience 5) watches the validation loss; give a validation fraction "
            "or a validation dataset");
}

TEST_F(ValidationSubmitTest, NegativePatienceIsRefused) {
  JobSpec spec = SeedSpec("seed");
  spec.validation_fraction = 0.25;
  spec.early_stop_patience = -1;
  EXPECT_THAT(Rejection(spec), HasSubstr("early stop patience must be 0 (off)"));
}

TEST_F(ValidationSubmitTest, UnknownValidationDatasetIsNotFound) {
  JobSpec spec = SeedSpec("seed");
  spec.validation_dataset = "nope";
  // It names the datasets the caller may use.
  EXPECT_EQ(Rejection(spec, absl::StatusCode::kNotFound),
            "validation dataset 'nope' not found (the datasets you can use: classes, seed)");
}

TEST_F(ValidationSubmitTest, ValidationDatasetWithOtherFeaturesIsRefused) {
  ASSERT_TRUE(Upload(*engine_, "wide", RandomTable(/*rows=*/16, /*features=*/3)).ok());
  JobSpec spec = SeedSpec("seed");
  spec.validation_dataset = "wide";
  EXPECT_EQ(Rejection(spec),
            "validation dataset 'wide' has 3 features per row; dataset 'seed' has 1");
}

TEST_F(ValidationSubmitTest, ValidationDatasetWithOtherTargetDtypeIsRefused) {
  ASSERT_TRUE(Upload(*engine_, "classes-f", RandomTable(/*rows=*/16, /*features=*/2)).ok());
  JobSpec spec = ClassSpec();
  spec.validation_dataset = "classes-f";
  EXPECT_EQ(Rejection(spec),
            "validation dataset 'classes-f' has 1 float32 targets per row; dataset 'classes' "
            "has scalar int64 targets");
}

TEST_F(ValidationSubmitTest, ValidationClassIndicesBeyondTheOutputsAreRefused) {
  ASSERT_TRUE(Upload(*engine_, "classes-12", ClassTable(/*rows=*/24, 0, 11)).ok());
  JobSpec spec = ClassSpec();
  spec.validation_dataset = "classes-12";
  EXPECT_THAT(Rejection(spec), HasSubstr("dataset 'classes-12' has class indices 0..11"));
}

TEST_F(ValidationSubmitTest, ValidFractionIsAcceptedAndKeptInTheSpec) {
  JobSpec spec = SeedSpec("seed");
  spec.validation_fraction = 0.25;
  spec.early_stop_patience = 3;
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.validation_fraction, 0.25);
  EXPECT_EQ(job->spec.early_stop_patience, 3);
  EXPECT_FALSE(job->stopped_early);
}

}  // namespace
}  // namespace trainerd::engine
