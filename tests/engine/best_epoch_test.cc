// The best epoch kept (JobSpec::model_from): a job that validates hands back the weights of its
// best validation epoch (by early stopping's metric and min_delta) when it stops early or is asked
// to, the last epoch's otherwise, on every path (LibTorch, fused, a sweep's stacked members), and
// a job resumed from a checkpoint still hands back the best. The handed-back model is evaluated on
// the held-out rows (recovered as the documented split draws them) and compared with the
// validation loss the job recorded for that epoch.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/model.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

// 48 rows of 4 standard-normal features and a noisy target: a model much wider than the data
// fits the noise, so the validation loss turns up after a few epochs.
std::shared_ptr<const Dataset> MakeDataset() {
  constexpr int64_t kRows = 48;
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "best";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = kRows;
  dataset->meta.device = "cpu";
  at::Generator gen = at::detail::createCPUGenerator(7);
  dataset->features = torch::randn({kRows, 4}, gen);
  dataset->targets = dataset->features.narrow(1, 0, 1).sin() + 0.5 * torch::randn({kRows, 1}, gen);
  return dataset;
}

TrainingRun MakeRun(const std::shared_ptr<const Dataset>& dataset, EngineKind engine) {
  TrainingRun run;
  run.spec.dataset = "best";
  run.spec.model = "linear:64,relu,linear:64,relu,linear:1";
  run.spec.loss = LossKind::kMse;
  run.spec.optimizer = OptimizerKind::kSgd;
  run.spec.learning_rate = 0.05;
  run.spec.momentum = 0.9;
  run.spec.batch_size = 8;
  run.spec.epochs = 40;
  run.spec.seed = 11;
  run.spec.device = "cpu";
  run.spec.engine = engine;
  run.spec.validation_fraction = 0.25;
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = dataset;
  run.intra_op_threads = 1;
  return run;
}

struct Recorded {
  TrainingOutcome outcome;
  std::vector<EpochResult> epochs;
};

Recorded Train(TrainingRun run) {
  Recorded recorded;
  run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { recorded.epochs.push_back(e); };
  recorded.outcome = RunTraining(run);
  return recorded;
}

// The mean squared error of the handed-back model (its TorchScript archive, loaded as a user
// would) on the job's held-out rows: torch.randperm(rows, generator=Generator().manual_seed(seed))
// with the last HeldOutRows(fraction, rows) of it validating (jobs.proto, validation_fraction).
double HeldOutLoss(const TrainingRun& run, const TrainingOutcome& outcome) {
  std::istringstream in(outcome.model_archive);
  torch::jit::Module model = torch::jit::load(in);
  model.eval();
  const int64_t rows = run.dataset->features.size(0);
  const int64_t held_out = HeldOutRows(run.spec.validation_fraction, rows);
  at::Generator gen = at::detail::createCPUGenerator(*run.spec.seed);
  const torch::Tensor split = torch::randperm(rows, gen, torch::TensorOptions(torch::kLong));
  const torch::Tensor rows_out = split.narrow(0, rows - held_out, held_out);
  torch::NoGradGuard no_grad;
  const torch::Tensor out =
      model.forward({run.dataset->features.index_select(0, rows_out)}).toTensor();
  return torch::mse_loss(out, run.dataset->targets.index_select(0, rows_out))
      .to(torch::kFloat64)
      .item<double>();
}

// The first epoch with the lowest validation loss (improvements are strict), 1-based.
int32_t LowestValidationEpoch(const std::vector<EpochResult>& epochs) {
  int32_t best = 0;
  double best_loss = std::numeric_limits<double>::infinity();
  for (const EpochResult& e : epochs) {
    if (*e.validation_loss < best_loss) {
      best_loss = *e.validation_loss;
      best = e.epoch;
    }
  }
  return best;
}

void ExpectCloseRelative(double got, double want) {
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "got " << got << ", want " << want;
}

class BestEpochTest : public ::testing::TestWithParam<EngineKind> {};

// Early stopping hands back the best epoch by default: the model scores the best epoch's recorded
// validation loss on the held-out rows, not the last epoch's.
TEST_P(BestEpochTest, EarlyStoppingHandsBackTheBestEpoch) {
  TrainingRun run = MakeRun(MakeDataset(), GetParam());
  run.spec.early_stop_patience = 4;
  const Recorded job = Train(run);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  EXPECT_EQ(job.outcome.engine, GetParam() == EngineKind::kFused ? "fused" : "libtorch");
  ASSERT_TRUE(job.outcome.stopped_early) << "the validation loss never turned up";
  const int32_t last = static_cast<int32_t>(job.epochs.size());
  EXPECT_EQ(job.outcome.best_epoch, last - 4);
  EXPECT_EQ(job.outcome.best_epoch, LowestValidationEpoch(job.epochs));
  EXPECT_EQ(job.outcome.model_epoch, job.outcome.best_epoch);
  const double best_loss = *job.epochs[job.outcome.best_epoch - 1].validation_loss;
  const double last_loss = *job.epochs.back().validation_loss;
  ASSERT_GT(last_loss, best_loss * (1 + 1e-3));  // the two models tell apart
  ExpectCloseRelative(HeldOutLoss(run, job.outcome), best_loss);

  // model_from last: the same job hands back its last epoch.
  run.spec.model_from = ModelFrom::kLast;
  const Recorded last_job = Train(run);
  ASSERT_EQ(last_job.outcome.state, JobState::kSucceeded) << last_job.outcome.error;
  ASSERT_EQ(last_job.epochs.size(), job.epochs.size());
  EXPECT_EQ(last_job.outcome.model_epoch, last);
  EXPECT_EQ(last_job.outcome.best_epoch, job.outcome.best_epoch);
  ExpectCloseRelative(HeldOutLoss(run, last_job.outcome), last_loss);
}

// model_from best without early stopping: every epoch runs, and the model is the epoch with the
// lowest validation loss.
TEST_P(BestEpochTest, ModelFromBestWithoutEarlyStopping) {
  TrainingRun run = MakeRun(MakeDataset(), GetParam());
  run.spec.epochs = 20;
  run.spec.model_from = ModelFrom::kBest;
  const Recorded job = Train(run);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  ASSERT_EQ(job.epochs.size(), 20u);
  EXPECT_FALSE(job.outcome.stopped_early);
  const int32_t best = LowestValidationEpoch(job.epochs);
  ASSERT_LT(best, 20) << "the validation loss never turned up";
  EXPECT_EQ(job.outcome.best_epoch, best);
  EXPECT_EQ(job.outcome.model_epoch, best);
  ExpectCloseRelative(HeldOutLoss(run, job.outcome), *job.epochs[best - 1].validation_loss);
}

// Without early stopping and without model_from the model is the last epoch's; the best epoch is
// still reported.
TEST_P(BestEpochTest, DefaultWithoutEarlyStoppingIsTheLastEpoch) {
  TrainingRun run = MakeRun(MakeDataset(), GetParam());
  run.spec.epochs = 20;
  const Recorded job = Train(run);
  ASSERT_EQ(job.outcome.state, JobState::kSucceeded) << job.outcome.error;
  EXPECT_EQ(job.outcome.model_epoch, 20);
  EXPECT_EQ(job.outcome.best_epoch, LowestValidationEpoch(job.epochs));
  ExpectCloseRelative(HeldOutLoss(run, job.outcome), *job.epochs.back().validation_loss);
}

// A job taken up from a checkpoint after its best epoch still hands back the best: the best
// epoch's weights are in the checkpoint.
TEST_P(BestEpochTest, ResumedJobHandsBackTheBest) {
  const test_support::ScratchDir dir;
  TrainingRun run = MakeRun(MakeDataset(), GetParam());
  run.spec.early_stop_patience = 4;
  run.spec.checkpoint_every = 1;
  run.checkpoint_dir = dir.path();
  const Recorded whole = Train(run);
  ASSERT_EQ(whole.outcome.state, JobState::kSucceeded) << whole.outcome.error;
  ASSERT_TRUE(whole.outcome.stopped_early);
  const int32_t best = whole.outcome.best_epoch;
  const int32_t from = best + 2;  // after the best, before the stop
  ASSERT_LT(from, static_cast<int32_t>(whole.epochs.size()));
  TrainingRun resumed = run;
  resumed.checkpoint_dir.clear();
  resumed.resume_from = dir.path() + "/" + CheckpointFileName(from);
  const Recorded after = Train(resumed);
  ASSERT_EQ(after.outcome.state, JobState::kSucceeded) << after.outcome.error;
  EXPECT_EQ(after.epochs.size() + from, whole.epochs.size());
  EXPECT_EQ(after.outcome.best_epoch, best);
  EXPECT_EQ(after.outcome.model_epoch, best);
  // The very model the job run whole hands back.
  std::istringstream a(after.outcome.model_archive);
  std::istringstream b(whole.outcome.model_archive);
  torch::jit::Module got = torch::jit::load(a);
  torch::jit::Module want = torch::jit::load(b);
  std::vector<torch::Tensor> got_params;
  for (const torch::Tensor& p : got.parameters()) got_params.push_back(p);
  size_t k = 0;
  for (const torch::Tensor& p : want.parameters()) {
    ASSERT_LT(k, got_params.size());
    EXPECT_TRUE(torch::equal(got_params[k++], p));
  }
  EXPECT_EQ(k, got_params.size());
  ExpectCloseRelative(HeldOutLoss(run, after.outcome),
                      *whole.epochs[best - 1].validation_loss);

  // A checkpoint without the best epoch's weights (a job that kept none: model_from last) still
  // resumes a job that hands back its best: the best is then that of the epochs after the
  // resume, or the last.
  TrainingRun keeps_none = run;
  keeps_none.spec.model_from = ModelFrom::kLast;
  const test_support::ScratchDir other;
  keeps_none.checkpoint_dir = other.path();
  ASSERT_EQ(Train(keeps_none).outcome.state, JobState::kSucceeded);
  TrainingRun without = run;
  without.checkpoint_dir.clear();
  without.resume_from = other.path() + "/" + CheckpointFileName(from);
  const Recorded taken_up = Train(without);
  ASSERT_EQ(taken_up.outcome.state, JobState::kSucceeded) << taken_up.outcome.error;
  EXPECT_EQ(taken_up.outcome.model_epoch, static_cast<int32_t>(whole.epochs.size()));
  ExpectCloseRelative(HeldOutLoss(run, taken_up.outcome), *whole.epochs.back().validation_loss);
}

INSTANTIATE_TEST_SUITE_P(Paths, BestEpochTest,
                         ::testing::Values(EngineKind::kLibTorch, EngineKind::kFused),
                         [](const ::testing::TestParamInfo<EngineKind>& info) {
                           return std::string(EngineKindName(info.param));
                         });

// A sweep's members trained stacked (here on the CPU through stack_on_cpu) each keep their own
// best: each member's model scores its own best epoch's validation loss.
TEST(BestEpochPackTest, StackedMembersKeepEachTheirBest) {
  const std::shared_ptr<const Dataset> dataset = MakeDataset();
  std::vector<TrainingRun> runs;
  for (double lr : {0.05, 0.03, 0.08}) {
    TrainingRun run = MakeRun(dataset, EngineKind::kLibTorch);
    run.spec.learning_rate = lr;
    run.spec.epochs = 20;
    run.spec.model_from = ModelFrom::kBest;
    run.stack_on_cpu = true;
    runs.push_back(run);
  }
  std::vector<std::vector<EpochResult>> epochs(runs.size());
  std::vector<const TrainingRun*> pointers;
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].on_epoch = [&epochs, i](const EpochResult& e, int64_t, int64_t) {
      epochs[i].push_back(e);
    };
    pointers.push_back(&runs[i]);
  }
  std::vector<TrainingOutcome> outcomes(runs.size());
  RunPackedTraining(pointers,
                    [&](size_t i, TrainingOutcome outcome) { outcomes[i] = std::move(outcome); });
  std::vector<int32_t> bests;
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("member ", i));
    ASSERT_EQ(outcomes[i].state, JobState::kSucceeded) << outcomes[i].error;
    EXPECT_EQ(outcomes[i].engine, "libtorch-stacked");
    const int32_t best = LowestValidationEpoch(epochs[i]);
    EXPECT_EQ(outcomes[i].best_epoch, best);
    EXPECT_EQ(outcomes[i].model_epoch, best);
    ExpectCloseRelative(HeldOutLoss(runs[i], outcomes[i]), *epochs[i][best - 1].validation_loss);
    bests.push_back(best);
  }
  // At least one member's best is not its last epoch: the test tells best from last.
  EXPECT_THAT(bests, ::testing::Contains(::testing::Lt(20)));
}

// A module "Mlp": 4 features, a hidden layer of 64 with relu, one output; saved as torch.jit.save
// would.
std::string MlpModuleBytes() {
  torch::manual_seed(3);
  torch::jit::Module m("Mlp");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w1", torch::randn({64, 4}) * 0.5, /*is_buffer=*/false);
  m.register_parameter("b1", torch::zeros({64}), /*is_buffer=*/false);
  m.register_parameter("w2", torch::randn({1, 64}) * 0.1, /*is_buffer=*/false);
  m.register_parameter("b2", torch::zeros({1}), /*is_buffer=*/false);
  m.define(
      "def forward(self, x):\n"
      "  return torch.linear(torch.relu(torch.linear(x, self.w1, self.b1)), self.w2, self.b2)\n");
  std::ostringstream out;
  m.save(out);
  return out.str();
}

class BestEpochEngineTest : public test_support::EngineFixture {};

// A TorchScript job trains in the worker process: the spec's rule crosses to it and the outcome's
// epochs come back, and the model the daemon keeps is the best epoch's. Its checkpoints are found
// by epoch; an epoch without one is NOT_FOUND naming those that have one.
TEST_F(BestEpochEngineTest, TorchScriptJobInTheWorkerHandsBackItsBest) {
  const Table table = test_support::RandomTable(48, 4);
  ASSERT_TRUE(test_support::Upload(*engine_, "noise", table).ok());
  JobSpec spec = test_support::SeedSpec("noise");
  spec.model = "";
  spec.torchscript = MlpModuleBytes();
  spec.batch_size = 8;
  spec.epochs = 60;
  spec.validation_fraction = 0.25;
  spec.early_stop_patience = 4;
  spec.checkpoint_every = 1;
  const absl::StatusOr<JobSnapshot> job = test_support::RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_TRUE(job->stopped_early) << "the validation loss never turned up";
  EXPECT_EQ(job->best_epoch, job->epochs_completed - 4);
  EXPECT_EQ(job->model_epoch, job->best_epoch);
  ASSERT_GT(job->best_epoch, 0);

  const absl::StatusOr<std::string> path = engine_->ModelArchivePath(job->id);
  ASSERT_TRUE(path.ok()) << path.status();
  torch::jit::Module model = torch::jit::load(*path);
  model.eval();
  const torch::Tensor features =
      torch::from_blob(const_cast<float*>(table.features.data()), {48, 4}).clone();
  const torch::Tensor targets =
      torch::from_blob(const_cast<float*>(table.targets_f32.data()), {48, 1}).clone();
  const int64_t held_out = HeldOutRows(0.25, 48);
  at::Generator gen = at::detail::createCPUGenerator(*job->spec.seed);
  const torch::Tensor rows =
      torch::randperm(48, gen, torch::TensorOptions(torch::kLong)).narrow(0, 48 - held_out, held_out);
  torch::NoGradGuard no_grad;
  const double loss =
      torch::mse_loss(model.forward({features.index_select(0, rows)}).toTensor(),
                      targets.index_select(0, rows))
          .item<double>();
  ExpectCloseRelative(loss, *job->epochs[job->best_epoch - 1].validation_loss);
  ASSERT_GT(*job->epochs.back().validation_loss,
            *job->epochs[job->best_epoch - 1].validation_loss * (1 + 1e-3));

  CheckpointInfo info;
  const absl::StatusOr<std::string> newest = engine_->CheckpointFilePath(job->id, 0, &info);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(info.epoch, job->epochs_completed);
  EXPECT_THAT(*newest, ::testing::EndsWith(CheckpointFileName(job->epochs_completed)));
  const absl::StatusOr<std::string> second = engine_->CheckpointFilePath(job->id, 2, &info);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(info.epoch, 2);
  const absl::StatusOr<std::string> missing =
      engine_->CheckpointFilePath(job->id, job->epochs_completed + 1, &info);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr(absl::StrCat("has no checkpoint of epoch ", job->epochs_completed + 1,
                                     "; it has epochs 1, 2, 3")));
}

// The working set Submit reserves counts the best epoch's copy of the weights: 4 bytes per
// parameter more for a job that keeps it.
TEST_F(BestEpochEngineTest, TheEstimateCountsTheBestEpochsCopy) {
  ASSERT_TRUE(test_support::Upload(*engine_, "noise", test_support::RandomTable(48, 4)).ok());
  JobSpec spec = test_support::SeedSpec("noise");
  spec.model = "linear:16,relu,linear:1";  // 97 parameters
  spec.epochs = 2;
  spec.validation_fraction = 0.25;
  spec.model_from = ModelFrom::kLast;
  const absl::StatusOr<JobSnapshot> last = test_support::RunJob(*engine_, spec);
  spec.model_from = ModelFrom::kBest;
  const absl::StatusOr<JobSnapshot> best = test_support::RunJob(*engine_, spec);
  ASSERT_TRUE(last.ok() && best.ok());
  EXPECT_EQ(best->estimated_memory_bytes - last->estimated_memory_bytes, 97 * 4);
}

// Submit's check: model_from best needs validation.
TEST(BestEpochCheckTest, ModelFromBestNeedsValidation) {
  TrainingRun run = MakeRun(MakeDataset(), EngineKind::kAuto);
  run.spec.validation_fraction = 0;
  run.spec.model_from = ModelFrom::kBest;
  const absl::StatusOr<ModelSpec> checked = CheckJobSpec(run.spec, run.dataset->meta);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.status().message(),
            "model_from best hands back the best validation epoch's weights; give a validation "
            "fraction or a validation dataset, or model_from last");
  run.spec.model_from = ModelFrom::kLast;
  EXPECT_TRUE(CheckJobSpec(run.spec, run.dataset->meta).ok());
  run.spec.validation_dataset = "other";
  run.spec.model_from = ModelFrom::kBest;
  EXPECT_TRUE(CheckJobSpec(run.spec, run.dataset->meta).ok());
}

}  // namespace
}  // namespace trainerd::engine
