// The fused CPU path (server/engine/fused_path.h) against the LibTorch path: the same job on both
// must start from the same weights, shuffle the same rows and report the same losses and trained
// parameters within float32 tolerance, for every layer, loss and optimizer the fused path takes;
// checkpoints written by one path resume on the other; jobs it cannot take run on LibTorch and say
// why, and engine fused refuses them at Submit.
#include "server/engine/training/fused_path.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::ClustersTable;
using test_support::EngineFixture;
using test_support::Losses;
using test_support::RandomTable;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::Upload;
using ::testing::HasSubstr;

// Relative tolerance of a loss or parameter after a few epochs of float32 arithmetic summed in a
// different order (Eigen's products against MKL's).
constexpr double kTolerance = 2e-4;

class FusedPathTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "random", RandomTable(96, 4, 11)).ok());
    ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable(96)).ok());
  }

  static JobSpec Spec(const std::string& dataset, const std::string& model) {
    JobSpec spec = SeedSpec(dataset);
    spec.model = model;
    spec.learning_rate = 0.05;
    spec.epochs = 5;
    spec.batch_size = 16;
    spec.seed = 7;
    return spec;
  }

  // Runs `spec` on both paths and expects the same losses and parameters.
  void ExpectSameOnBothPaths(JobSpec spec) {
    spec.engine = EngineKind::kLibTorch;
    absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, spec);
    spec.engine = EngineKind::kFused;
    absl::StatusOr<JobSnapshot> fused = RunJob(*engine_, spec);
    ASSERT_TRUE(reference.ok() && fused.ok());
    ASSERT_EQ(reference->state, JobState::kSucceeded) << reference->error;
    ASSERT_EQ(fused->state, JobState::kSucceeded) << fused->error;
    EXPECT_EQ(reference->report.engine, "libtorch");
    EXPECT_EQ(fused->report.engine, "fused");
    const std::vector<double> want = Losses(*reference);
    const std::vector<double> got = Losses(*fused);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], kTolerance * std::max(1.0, std::fabs(want[i])))
          << "epoch " << i + 1 << " of " << spec.model;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (!reference->epochs[i].validation_loss) continue;
      ASSERT_TRUE(fused->epochs[i].validation_loss.has_value());
      EXPECT_NEAR(*fused->epochs[i].validation_loss, *reference->epochs[i].validation_loss,
                  kTolerance * std::max(1.0, std::fabs(*reference->epochs[i].validation_loss)));
      EXPECT_EQ(fused->epochs[i].validation_accuracy, reference->epochs[i].validation_accuracy);
    }
    ASSERT_EQ(fused->parameters.size(), reference->parameters.size());
    ASSERT_FALSE(reference->parameters.empty());
    for (size_t p = 0; p < reference->parameters.size(); ++p) {
      const ParameterValues& a = reference->parameters[p];
      const ParameterValues& b = fused->parameters[p];
      EXPECT_EQ(b.name, a.name);
      EXPECT_EQ(b.shape, a.shape);
      ASSERT_EQ(b.values.size(), a.values.size());
      for (size_t k = 0; k < a.values.size(); ++k) {
        EXPECT_NEAR(b.values[k], a.values[k], kTolerance * std::max(1.0f, std::fabs(a.values[k])))
            << a.name << "[" << k << "]";
      }
    }
    EXPECT_EQ(fused->steps, reference->steps);
    EXPECT_EQ(fused->host_syncs, reference->host_syncs);
  }
};

// Every activation with every optimizer (mse).
class FusedActivationOptimizerTest
    : public FusedPathTest,
      public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

TEST_P(FusedActivationOptimizerTest, MatchesLibTorch) {
  const auto& [activation, optimizer] = GetParam();
  JobSpec spec = Spec("random", "linear:8," + activation + ",linear:8," + activation + ",linear:1");
  if (optimizer == "sgd") {
    spec.optimizer = OptimizerKind::kSgd;
  } else if (optimizer == "sgd-momentum") {
    spec.optimizer = OptimizerKind::kSgd;
    spec.momentum = 0.9;
    spec.weight_decay = 0.01;
  } else if (optimizer == "sgd-nesterov") {
    spec.optimizer = OptimizerKind::kSgd;
    spec.momentum = 0.8;
    spec.nesterov = true;
  } else if (optimizer == "adam") {
    spec.optimizer = OptimizerKind::kAdam;
    spec.learning_rate = 0.01;
    spec.weight_decay = 0.001;
  } else if (optimizer == "adamw") {
    spec.optimizer = OptimizerKind::kAdamW;
    spec.learning_rate = 0.01;
  } else if (optimizer == "rmsprop") {
    spec.optimizer = OptimizerKind::kRmsprop;
    spec.learning_rate = 0.005;
  } else if (optimizer == "rmsprop-momentum") {
    spec.optimizer = OptimizerKind::kRmsprop;
    spec.learning_rate = 0.002;
    spec.momentum = 0.5;
    spec.weight_decay = 0.01;
  }
  ExpectSameOnBothPaths(spec);
}

INSTANTIATE_TEST_SUITE_P(All, FusedActivationOptimizerTest,
                         ::testing::Combine(::testing::Values("relu", "tanh", "sigmoid", "gelu"),
                                            ::testing::Values("sgd", "sgd-momentum", "sgd-nesterov",
                                                              "adam", "adamw", "rmsprop",
                                                              "rmsprop-momentum")),
                         [](const auto& info) {
                           std::string name =
                               std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST_F(FusedPathTest, ElementwiseLossesMatchLibTorch) {
  for (LossKind loss :
       {LossKind::kMse, LossKind::kL1, LossKind::kHuber, LossKind::kBceWithLogits}) {
    JobSpec spec = Spec("random", "linear:8,tanh,linear:1");
    spec.loss = loss;
    if (loss == LossKind::kHuber) spec.huber_delta = 0.5;
    spec.momentum = 0.9;
    SCOPED_TRACE(LossKindName(loss));
    ExpectSameOnBothPaths(spec);
  }
}

TEST_F(FusedPathTest, CrossEntropyWithLabelSmoothingValidationAndAccuracyMatchLibTorch) {
  JobSpec spec = Spec("clusters", "linear:16,relu,linear:3");
  spec.loss = LossKind::kCrossEntropy;
  spec.label_smoothing = 0.1;
  spec.validation_fraction = 0.25;
  ExpectSameOnBothPaths(spec);
}

TEST_F(FusedPathTest, ClippingSchedulesAndUnshuffledRowsMatchLibTorch) {
  JobSpec spec = Spec("random", "linear:16,gelu,linear:1");
  spec.learning_rate = 0.2;
  spec.clip_grad_norm = 0.5;  // active: the first gradients are far larger
  spec.schedule.kind = ScheduleKind::kCosine;
  spec.schedule.warmup_epochs = 1;
  spec.shuffle = false;
  spec.epochs = 6;
  ExpectSameOnBothPaths(spec);
}

TEST_F(FusedPathTest, TheSeedJobRunsFusedByDefaultWithTheLibTorchLosses) {
  ASSERT_TRUE(Upload(*engine_, "seed", test_support::SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 20;
  absl::StatusOr<JobSnapshot> fused = RunJob(*engine_, spec);  // engine auto
  spec.engine = EngineKind::kLibTorch;
  absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, spec);
  ASSERT_TRUE(fused.ok() && reference.ok());
  EXPECT_EQ(fused->report.engine, "fused");
  EXPECT_EQ(fused->report.engine_reason, "");
  EXPECT_EQ(reference->report.engine, "libtorch");
  EXPECT_EQ(reference->report.engine_reason, "");  // asked for
  // One epoch is one host transfer on either path; the read-back of the small model is one more.
  EXPECT_EQ(fused->host_syncs, 21);
  const std::vector<double> want = Losses(*reference);
  const std::vector<double> got = Losses(*fused);
  ASSERT_EQ(got.size(), 20u);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
}

// Adam's moments and step counts live in the same optimizer state objects on both paths: a job
// run on one path, whose checkpoint of epoch 3 is resumed on the other, ends as the whole run on
// the first did.
TEST(FusedCheckpointTest, ACheckpointOfOnePathResumesOnTheOther) {
  test_support::ScratchDir dir;
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "random";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = 96;
  dataset->meta.device = "cpu";
  torch::manual_seed(3);
  dataset->features = torch::randn({96, 4});
  dataset->targets = torch::randn({96, 1});
  for (EngineKind first : {EngineKind::kFused, EngineKind::kLibTorch}) {
    const EngineKind second =
        first == EngineKind::kFused ? EngineKind::kLibTorch : EngineKind::kFused;
    SCOPED_TRACE(EngineKindName(first));
    TrainingRun run;
    run.spec.dataset = "random";
    run.spec.model = "linear:8,relu,linear:1";
    run.spec.optimizer = OptimizerKind::kAdam;
    run.spec.learning_rate = 0.01;
    run.spec.batch_size = 16;
    run.spec.epochs = 6;
    run.spec.checkpoint_every = 3;
    run.spec.seed = 9;
    run.spec.device = "cpu";
    run.spec.engine = first;
    run.model = *ParseModelSpec(run.spec.model);
    run.dataset = dataset;
    run.checkpoint_dir = dir.path() + "/" + EngineKindName(first);
    std::vector<double> whole;
    std::string third;
    run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { whole.push_back(e.loss); };
    run.on_checkpoint = [&](int32_t epoch, const std::string& file, int64_t) {
      if (epoch == 3) third = run.checkpoint_dir + "/" + file;
    };
    TrainingOutcome a = RunTraining(run);
    ASSERT_EQ(a.state, JobState::kSucceeded) << a.error;
    EXPECT_EQ(a.engine, EngineKindName(first));
    ASSERT_EQ(whole.size(), 6u);
    ASSERT_FALSE(third.empty());

    TrainingRun resumed = run;
    resumed.spec.engine = second;
    resumed.checkpoint_dir.clear();
    resumed.on_checkpoint = nullptr;
    resumed.resume_from = third;
    std::vector<double> rest;
    resumed.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { rest.push_back(e.loss); };
    TrainingOutcome b = RunTraining(resumed);
    ASSERT_EQ(b.state, JobState::kSucceeded) << b.error;
    EXPECT_EQ(b.engine, EngineKindName(second));
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(rest[i], whole[3 + i], kTolerance * std::max(1.0, std::fabs(whole[3 + i])))
          << "epoch " << 4 + i;
    }
  }
}

TEST_F(FusedPathTest, JobsItCannotTakeRunOnLibTorchAndSayWhy) {
  JobSpec spec = Spec("random", "linear:8,batchnorm,relu,linear:1");
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.engine, "libtorch");
  EXPECT_THAT(job->report.engine_reason, HasSubstr("batchnorm"));

  spec.engine = EngineKind::kFused;
  absl::StatusOr<JobSnapshot> refused = engine_->SubmitJob(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("engine fused cannot run this job"));
  EXPECT_THAT(refused.status().message(), HasSubstr("batchnorm"));
}

TEST(FusedPathSlowerTest, LargeStepsAreLeftToLibTorchUnderEngineAuto) {
  const ModelSpec small = *ParseModelSpec("linear:64,relu,linear:64,relu,linear:3");
  EXPECT_EQ(FusedPathSlower(small, {2}, 32), "");  // 0.85 MFLOPs a step
  const ModelSpec wide = *ParseModelSpec("linear:256,relu,linear:256,relu,linear:10");
  // 3 x 2 x 256 x (64 x 256 + 256 x 256 + 256 x 10), and 3 x 256 x 256 x 2 for the relus:
  // 130.2 MFLOPs a step.
  EXPECT_EQ(FusedPathSlower(wide, {64}, 256),
            "130.2 MFLOPs a step, above the fused path's limit of 30: LibTorch's vectorised "
            "operators are as fast there");
}

TEST_F(FusedPathTest, EngineAutoLeavesALargeStepToLibTorchAndSaysWhy) {
  JobSpec spec = Spec("random", "linear:256,relu,linear:256,relu,linear:256,relu,linear:1");
  spec.batch_size = 64;
  spec.epochs = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.engine, "libtorch");
  EXPECT_THAT(job->report.engine_reason, HasSubstr("MFLOPs a step"));
  // Asked for, the fused path takes it all the same.
  spec.engine = EngineKind::kFused;
  job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.engine, "fused");
}

TEST(FusedPathUnsupportedTest, NamesTheFirstThingInTheWay) {
  JobSpec spec;
  spec.loss = LossKind::kMse;
  const torch::Device cpu(torch::kCPU);
  auto model = [](const std::string& text) {
    absl::StatusOr<ModelSpec> parsed = ParseModelSpec(text);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return parsed.ok() ? *parsed : ModelSpec{};
  };
  EXPECT_EQ(FusedPathUnsupported(spec, model("linear:64,relu,linear:1"), {2}, false, cpu), "");
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:1"), {2}, /*torchscript=*/true, cpu),
              HasSubstr("TorchScript"));
  EXPECT_THAT(
      FusedPathUnsupported(spec, model("linear:1"), {2}, false, torch::Device(torch::kCUDA, 0)),
      HasSubstr("cuda:0"));
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:1"), {2, 3}, false, cpu),
              HasSubstr("flat feature vectors"));
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:1"), {kFusedMaxWidth + 1}, false, cpu),
              HasSubstr("features"));
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:1024,relu,linear:1"), {2}, false, cpu),
              HasSubstr("linear:1024"));
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:8,dropout:0.5,linear:1"), {2}, false, cpu),
              HasSubstr("dropout:0.5 has no fused kernel"));
  spec.precision = Precision::kBf16;
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:1"), {2}, false, cpu),
              HasSubstr("mixed precision"));
  spec.precision = Precision::kFp32;
  spec.loss = LossKind::kNll;
  EXPECT_THAT(FusedPathUnsupported(spec, model("linear:3,logsoftmax"), {2}, false, cpu),
              HasSubstr("logsoftmax"));
}

// The fused path's update arithmetic covers sgd, adam, adamw and rmsprop with their original
// options; the rest are named, so that engine auto falls back to LibTorch and fused is refused.
TEST(FusedPathUnsupportedTest, NamesTheOptimizersAndOptionsItDoesNotRun) {
  const ModelSpec mlp = *ParseModelSpec("linear:8,relu,linear:1");
  const torch::Device cpu(torch::kCPU);
  auto why = [&](const JobSpec& spec) { return FusedPathUnsupported(spec, mlp, {2}, false, cpu); };
  JobSpec spec;
  spec.loss = LossKind::kMse;
  for (OptimizerKind kind :
       {OptimizerKind::kNAdam, OptimizerKind::kRAdam, OptimizerKind::kAdagrad}) {
    spec.optimizer = kind;
    EXPECT_EQ(why(spec), absl::StrCat("optimizer ", OptimizerKindName(kind),
                                      " runs on LibTorch's optimizers"));
  }
  spec.optimizer = OptimizerKind::kAdam;
  spec.amsgrad = true;
  EXPECT_EQ(why(spec), "amsgrad runs on LibTorch's optimizers");
  spec.amsgrad = false;
  spec.weight_decay = 0.1;
  spec.weight_decay_exclude_bias_and_norm = true;
  EXPECT_EQ(why(spec), "weight decay exclude bias and norm runs on LibTorch's optimizers");
  spec.weight_decay_exclude_bias_and_norm = false;
  EXPECT_EQ(why(spec), "");
  spec.optimizer = OptimizerKind::kRmsprop;
  spec.centered = true;
  EXPECT_EQ(why(spec), "centered rmsprop runs on LibTorch's optimizers");
}

}  // namespace
}  // namespace trainerd::engine
