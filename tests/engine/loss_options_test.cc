// Loss options through the Engine on the CPU: class weights, ignore_index and pos_weight train on
// the LibTorch path (engine auto says why), the validation loss is the plain loss whatever the
// training terms, ignored rows are left out of validation, and targets the dataset's range could
// not rule out fail the job when it starts, with a sentence.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::ClustersTable;
using test_support::EngineFixture;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::Upload;
using ::testing::HasSubstr;
using ::testing::SizeIs;

class LossOptionsJobTest : public EngineFixture {};

// A three-class job whose learning rate is too small to move any float32 weight: every variant
// below ends its epoch with the same model, so its validation figures must agree.
JobSpec FrozenClassJob(const std::string& dataset) {
  JobSpec spec = SeedSpec(dataset);
  spec.model = "linear:3";
  spec.loss = LossKind::kCrossEntropy;
  spec.learning_rate = 1e-30;
  spec.epochs = 1;
  spec.batch_size = 8;
  spec.validation_fraction = 0.25;
  return spec;
}

JobSnapshot Succeeded(Engine& engine, const JobSpec& spec) {
  absl::StatusOr<JobSnapshot> job = RunJob(engine, spec);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  return *std::move(job);
}

TEST_F(LossOptionsJobTest, ValidationLossIsThePlainLossWhateverTheTrainingTerms) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable(96)).ok());
  JobSpec plain = FrozenClassJob("clusters");
  plain.engine = EngineKind::kLibTorch;
  const JobSnapshot reference = Succeeded(*engine_, plain);
  ASSERT_THAT(reference.epochs, SizeIs(1));
  ASSERT_TRUE(reference.epochs[0].validation_loss.has_value());
  const double val_loss = *reference.epochs[0].validation_loss;
  const double train_loss = reference.epochs[0].loss;

  struct Variant {
    const char* name;
    double smoothing;
    std::vector<double> weights;
    EngineKind engine;
  };
  const std::vector<Variant> variants = {
      {"smoothing 0.2 on LibTorch", 0.2, {}, EngineKind::kLibTorch},
      {"smoothing 0.2 on the fused path", 0.2, {}, EngineKind::kFused},
      {"class weights", 0.0, {0.2, 1.0, 5.0}, EngineKind::kLibTorch},
      {"class weights and smoothing", 0.1, {3.0, 0.5, 1.0}, EngineKind::kAuto},
  };
  for (const Variant& v : variants) {
    JobSpec spec = plain;
    spec.label_smoothing = v.smoothing;
    spec.class_weights = v.weights;
    spec.engine = v.engine;
    const JobSnapshot job = Succeeded(*engine_, spec);
    ASSERT_THAT(job.epochs, SizeIs(1)) << v.name;
    // The training loss carries the terms; the validation loss and accuracy do not.
    EXPECT_GT(std::fabs(job.epochs[0].loss - train_loss), 1e-3 * train_loss) << v.name;
    ASSERT_TRUE(job.epochs[0].validation_loss.has_value()) << v.name;
    EXPECT_NEAR(*job.epochs[0].validation_loss, val_loss, 1e-6 * val_loss) << v.name;
    EXPECT_EQ(job.epochs[0].validation_accuracy, reference.epochs[0].validation_accuracy) << v.name;
  }
}

TEST_F(LossOptionsJobTest, LossOptionsLeaveTheFusedPathSayingWhy) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable(48)).ok());
  JobSpec spec = FrozenClassJob("clusters");
  spec.class_weights = {1.0, 2.0, 3.0};
  const JobSnapshot weighted = Succeeded(*engine_, spec);
  EXPECT_EQ(weighted.report.engine, "libtorch");
  EXPECT_EQ(weighted.report.engine_reason, "class_weights have no fused kernel");
  spec.class_weights.clear();
  spec.ignore_index = -100;
  const JobSnapshot ignoring = Succeeded(*engine_, spec);
  EXPECT_EQ(ignoring.report.engine, "libtorch");
  EXPECT_EQ(ignoring.report.engine_reason, "ignore_index has no fused kernel");
}

// The same training rows; validation on a dataset, and on the same dataset with rows of target
// -100 added: ignored, they change neither the validation loss nor the accuracy.
TEST_F(LossOptionsJobTest, IgnoredRowsAreLeftOutOfValidation) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable(48)).ok());
  const Table validation = ClustersTable(30, /*seed=*/7);
  ASSERT_TRUE(Upload(*engine_, "val", validation).ok());
  Table with_ignored = validation;
  for (int i = 0; i < 10; ++i) {
    with_ignored.features.push_back(100.0f * static_cast<float>(i));
    with_ignored.features.push_back(-50.0f);
    with_ignored.targets_i64.push_back(-100);
  }
  with_ignored.rows += 10;
  ASSERT_TRUE(Upload(*engine_, "val_ignoring", with_ignored).ok());

  JobSpec spec = FrozenClassJob("clusters");
  spec.validation_fraction = 0;
  spec.ignore_index = -100;
  spec.validation_dataset = "val";
  const JobSnapshot clean = Succeeded(*engine_, spec);
  spec.validation_dataset = "val_ignoring";
  const JobSnapshot ignoring = Succeeded(*engine_, spec);
  ASSERT_THAT(clean.epochs, SizeIs(1));
  ASSERT_THAT(ignoring.epochs, SizeIs(1));
  ASSERT_TRUE(clean.epochs[0].validation_loss.has_value());
  EXPECT_NEAR(*ignoring.epochs[0].validation_loss, *clean.epochs[0].validation_loss,
              1e-6 * *clean.epochs[0].validation_loss);
  EXPECT_EQ(ignoring.epochs[0].validation_accuracy, clean.epochs[0].validation_accuracy);
}

TEST_F(LossOptionsJobTest, IgnoredTrainingRowsAddNothing) {
  // Rows of target -100 between the classes' rows: with ignore_index they train nothing, so a job
  // with one batch per epoch takes the same steps as on the dataset without them.
  const Table clean = ClustersTable(24);
  Table with_ignored = clean;
  for (int i = 0; i < 8; ++i) {
    with_ignored.features.push_back(9.0f);
    with_ignored.features.push_back(static_cast<float>(i));
    with_ignored.targets_i64.push_back(-100);
  }
  with_ignored.rows += 8;
  ASSERT_TRUE(Upload(*engine_, "clean", clean).ok());
  ASSERT_TRUE(Upload(*engine_, "ignoring", with_ignored).ok());
  JobSpec spec = SeedSpec("clean");
  spec.model = "linear:3";
  spec.loss = LossKind::kCrossEntropy;
  spec.class_weights = {1.0, 2.0, 0.5};
  spec.ignore_index = -100;
  spec.learning_rate = 0.05;
  spec.epochs = 5;
  spec.batch_size = 64;  // one batch: the whole dataset
  spec.shuffle = false;
  const JobSnapshot a = Succeeded(*engine_, spec);
  spec.dataset = "ignoring";
  const JobSnapshot b = Succeeded(*engine_, spec);
  ASSERT_THAT(a.epochs, SizeIs(5));
  ASSERT_THAT(b.epochs, SizeIs(5));
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (size_t p = 0; p < a.parameters.size(); ++p) {
    ASSERT_EQ(a.parameters[p].values.size(), b.parameters[p].values.size());
    for (size_t i = 0; i < a.parameters[p].values.size(); ++i) {
      EXPECT_NEAR(a.parameters[p].values[i], b.parameters[p].values[i], 1e-5)
          << a.parameters[p].name << "[" << i << "]";
    }
  }
  // The epoch's loss is the batch's loss times its rows over the epoch's rows: the ignored rows
  // count in the rows (as `total += loss.item() * len(batch)` counts them), so here it is the
  // same batch loss.
  EXPECT_NEAR(b.epochs[0].loss, a.epochs[0].loss, 1e-6 * a.epochs[0].loss);
}

TEST_F(LossOptionsJobTest, NegativeTargetsThatAreNotIgnoredFailTheJobAtItsStart) {
  Table table = ClustersTable(24);
  table.targets_i64[0] = -100;
  table.targets_i64[1] = -3;  // between -100 and 0: the dataset's range cannot tell
  ASSERT_TRUE(Upload(*engine_, "odd", table).ok());
  JobSpec spec = FrozenClassJob("odd");
  spec.ignore_index = -100;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_THAT(job->error, HasSubstr("dataset 'odd' has 1 negative class target(s) that are not "
                                    "the ignore_index -100"));
  EXPECT_EQ(job->steps, 0);
}

TEST_F(LossOptionsJobTest, ValidationRowsAllIgnoredFailTheJobWithASentence) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable(24)).ok());
  Table ignored = ClustersTable(6);
  for (int64_t& t : ignored.targets_i64) t = -1;
  ASSERT_TRUE(Upload(*engine_, "unlabelled", ignored).ok());
  JobSpec spec = FrozenClassJob("clusters");
  spec.validation_fraction = 0;
  spec.validation_dataset = "unlabelled";
  spec.ignore_index = -1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_THAT(job->error, HasSubstr("every validation row's target is the ignore_index -1"));
}

TEST_F(LossOptionsJobTest, PosWeightTrainsAndValidatesPlain) {
  Table table = test_support::RandomTable(64, 4);
  for (float& t : table.targets_f32) t = t > 0 ? 1.0f : 0.0f;
  ASSERT_TRUE(Upload(*engine_, "binary", table).ok());
  JobSpec spec = SeedSpec("binary");
  spec.model = "linear:1";
  spec.loss = LossKind::kBceWithLogits;
  spec.learning_rate = 1e-30;
  spec.epochs = 1;
  spec.validation_fraction = 0.25;
  spec.engine = EngineKind::kLibTorch;
  const JobSnapshot plain = Succeeded(*engine_, spec);
  spec.pos_weight = {4.0};
  const JobSnapshot weighted = Succeeded(*engine_, spec);
  ASSERT_THAT(plain.epochs, SizeIs(1));
  ASSERT_THAT(weighted.epochs, SizeIs(1));
  EXPECT_GT(weighted.epochs[0].loss, plain.epochs[0].loss * 1.5);
  EXPECT_NEAR(*weighted.epochs[0].validation_loss, *plain.epochs[0].validation_loss,
              1e-6 * *plain.epochs[0].validation_loss);
}

}  // namespace
}  // namespace trainerd::engine
