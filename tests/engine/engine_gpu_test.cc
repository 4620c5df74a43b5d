// GPU tests for the engine (ctest label "gpu"): each skips itself when LibTorch sees no CUDA
// device. On a GPU they check that training on the device matches the CPU's result, that the
// host transfers are still counted exactly (with clipping and schedules too), that clipping never
// synchronises with the host, and that datasets are resident on the device.
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/precision.h"
#include "server/engine/training/stacked_path.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::FindParameter;
using test_support::RunJob;
using test_support::ScratchDir;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::SizeIs;

// Without a CUDA device a GPU test skips itself, except where REQUIRE_CUDA=1 (bench/gpu/run.sh on
// the GPU host sets it): there a missing device is a failure, not a quiet skip.
#define TRAINERD_SKIP_WITHOUT_CUDA()                                 \
  do {                                                               \
    if (!torch::cuda::is_available()) {                              \
      const char* require = std::getenv("REQUIRE_CUDA");             \
      if (require != nullptr && std::string(require) == "1") {       \
        FAIL() << "REQUIRE_CUDA=1 but LibTorch sees no CUDA device"; \
      }                                                              \
      GTEST_SKIP() << "no CUDA device";                              \
    }                                                                \
  } while (0)

class EngineGpuTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> StartEngine(const std::string& device) {
    EngineOptions options;
    options.data_dir = dir_.path();
    options.device = device;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  ScratchDir dir_;
};

TEST_F(EngineGpuTest, DatasetOnCudaEngineIsResidentOnCuda0) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->default_device(), "cuda:0");

  absl::StatusOr<DatasetMeta> meta = Upload(*engine, "seed", SeedTable());

  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->device, "cuda:0");
  EXPECT_EQ(engine->GetDataset("seed")->device, "cuda:0");
}

TEST_F(EngineGpuTest, SeedJobOnCudaConvergesLikeOnTheCpu) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "";  // the engine's default: cuda:0

  absl::StatusOr<JobSnapshot> job = RunJob(*engine, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->device, "cuda:0");
  const ParameterValues* weight = FindParameter(*job, "0.weight");
  const ParameterValues* bias = FindParameter(*job, "0.bias");
  ASSERT_NE(weight, nullptr);
  ASSERT_NE(bias, nullptr);
  EXPECT_NEAR(weight->values.at(0), 2.0, 0.05);
  EXPECT_NEAR(bias->values.at(0), 1.0, 0.05);
  ASSERT_THAT(job->epochs, SizeIs(100));
  EXPECT_LT(job->final_loss, 0.02);
  EXPECT_EQ(job->steps, 100 * 50);
  // One transfer per epoch and one parameter read-back: nothing else touched the host.
  EXPECT_EQ(job->host_syncs, 100 + 1);
}

TEST_F(EngineGpuTest, SameSeedOnCudaReproducesLosses) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda:0";
  spec.epochs = 5;

  absl::StatusOr<JobSnapshot> first = RunJob(*engine, spec);
  absl::StatusOr<JobSnapshot> second = RunJob(*engine, spec);

  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(first->state, JobState::kSucceeded) << first->error;
  ASSERT_THAT(first->epochs, SizeIs(5));
  ASSERT_THAT(second->epochs, SizeIs(5));
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(first->epochs[i].loss, second->epochs[i].loss, 1e-6) << "epoch " << i + 1;
  }
}

TEST_F(EngineGpuTest, CpuResidentDatasetIsCopiedToCudaOnceForAJob) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cpu");
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda";
  spec.epochs = 3;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->device, "cuda:0");
  // The one copy of the dataset at start, one transfer per epoch, one parameter read-back.
  EXPECT_EQ(job->host_syncs, 1 + 3 + 1);
}

TEST_F(EngineGpuTest, ClippedCosineAdamWJobOnCudaKeepsOneTransferPerEpoch) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda:0";
  spec.epochs = 6;
  spec.optimizer = OptimizerKind::kAdamW;
  spec.schedule.kind = ScheduleKind::kCosine;
  spec.schedule.warmup_epochs = 2;
  spec.clip_grad_norm = 0.5;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->epochs, SizeIs(6));
  EXPECT_DOUBLE_EQ(job->epochs[0].learning_rate, spec.learning_rate / 3);
  EXPECT_EQ(job->host_syncs, 6 + 1);
}

TEST_F(EngineGpuTest, CheckpointsOnCudaAddOneHostSyncEach) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda:0";
  spec.epochs = 6;
  spec.momentum = 0.9;
  spec.checkpoint_every = 2;

  absl::StatusOr<JobSnapshot> job = RunJob(*engine, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_THAT(job->checkpoints, SizeIs(3));
  // One per epoch, one per checkpoint, one for the parameter read-back and export.
  EXPECT_EQ(job->host_syncs, 6 + 3 + 1);
}

// Sets LibTorch's CUDA sync-debug mode for its lifetime: with L_ERROR, any operation that
// synchronises the host with the device (item(), a blocking copy to the host) throws.
class SyncDebugModeScope {
 public:
  explicit SyncDebugModeScope(c10::cuda::SyncDebugMode mode)
      : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(mode);
  }
  ~SyncDebugModeScope() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }

 private:
  c10::cuda::SyncDebugMode previous_;
};

// A TorchScript job on a GPU trains in a worker whose device memory is capped at
// --worker_memory_limit_bytes (LibTorch's CUDA allocator; its address space cannot be, as CUDA
// reserves far more than it uses): a module that asks for more fails alone, naming the allocation,
// and one within it trains.
TEST_F(EngineGpuTest, AWorkersDeviceMemoryIsCappedAtItsLimit) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  EngineOptions options;
  options.data_dir = dir_.path();
  options.device = "cuda:0";
  options.module_checker.program = TRAINERD_MODULE_CHECKER;
  options.jobs.worker.program = TRAINERD_WORKER;
  options.jobs.worker.memory_limit_bytes = int64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(Upload(**engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.model = "";
  spec.epochs = 2;
  spec.device = "cuda:0";
  // 1 GiB on the device in training mode.
  spec.torchscript = test_support::ScriptedLinearModule(
      "    z = torch.ones([16384, 16384], device=x.device)\n"
      "    x = x + z.sum()\n");
  absl::StatusOr<JobSnapshot> over = RunJob(**engine, spec);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->state, JobState::kFailed);
  EXPECT_THAT(over->error, ::testing::HasSubstr("out of memory")) << over->error;
  spec.torchscript = test_support::ScriptedLinearModule();
  absl::StatusOr<JobSnapshot> within = RunJob(**engine, spec);
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(within->state, JobState::kSucceeded) << within->error;
  ASSERT_TRUE(within->report.worker_sandbox.has_value());
  EXPECT_TRUE(within->report.worker_sandbox->seccomp);
}

TEST(ClipGradNormGpuTest, ClippingAndAStepOnCudaNeverSynchroniseWithTheHost) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  const auto cuda = torch::TensorOptions(torch::kFloat32).device(torch::kCUDA, 0);
  torch::Tensor a = torch::zeros({2}, cuda).set_requires_grad(true);
  torch::Tensor b = torch::zeros({1}, cuda).set_requires_grad(true);
  a.mutable_grad() = torch::tensor({3.0f, 4.0f}).to(cuda);
  b.mutable_grad() = torch::tensor({12.0f}).to(cuda);
  JobSpec spec;
  spec.optimizer = OptimizerKind::kAdamW;
  spec.learning_rate = 0.1;
  auto optimizer = MakeOptimizer(spec, {a, b});

  {
    SyncDebugModeScope no_syncs(c10::cuda::SyncDebugMode::L_ERROR);
    SetLearningRate(*optimizer, 0.05);
    EXPECT_NO_THROW(ClipGradNorm({a, b}, /*max_norm=*/1.3));
    EXPECT_NO_THROW(optimizer->step());
  }

  const double norm =
      std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(norm, 1.3, 1e-5);
}

// A sweep's members on a GPU train stacked (stacked_path.h): each member's losses are its job's
// alone on the same device, each keeps one transfer per epoch (plus the read-back), and a stacked
// step, with a learning-rate change, never synchronises the host with the device.
TEST(StackedPathGpuTest, MembersOnCudaEqualTheirJobsAloneWithoutHostSyncsInAStep) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "classes";
  dataset->meta.feature_shape = {4};
  dataset->meta.rows = 256;
  dataset->meta.device = "cuda:0";
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({256, 4});
  dataset->features = x.to(cuda);
  dataset->targets =
      ((x.select(1, 0) > 0).to(torch::kInt64) + (x.select(1, 1) > 0.5).to(torch::kInt64)).to(cuda);
  std::vector<TrainingRun> runs(3);
  for (size_t i = 0; i < runs.size(); ++i) {
    TrainingRun& run = runs[i];
    run.spec.model = "linear:16,relu,linear:3";
    run.spec.loss = LossKind::kCrossEntropy;
    run.spec.optimizer = OptimizerKind::kAdamW;
    run.spec.learning_rate = 0.01 * static_cast<double>(i + 1);
    run.spec.schedule.kind = ScheduleKind::kCosine;
    run.spec.clip_grad_norm = 1.0;
    run.spec.batch_size = 32;
    run.spec.epochs = 4;
    run.spec.seed = 10 + i;
    run.spec.device = "cuda:0";
    run.spec.engine = EngineKind::kLibTorch;
    run.model = *ParseModelSpec(run.spec.model);
    run.dataset = dataset;
    run.device = cuda;
  }
  std::vector<const TrainingRun*> pointers;
  for (const TrainingRun& run : runs) pointers.push_back(&run);
  std::vector<TrainingOutcome> packed(runs.size());
  RunPackedTraining(pointers, [&](size_t i, TrainingOutcome o) { packed[i] = std::move(o); });
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_EQ(packed[i].state, JobState::kSucceeded) << packed[i].error;
    EXPECT_EQ(packed[i].engine, "libtorch-stacked");
    // A GPU's packs are stacked: not bitwise the job alone, and the member says so.
    EXPECT_FALSE(packed[i].packed_bitwise);
    EXPECT_EQ(packed[i].packed_numerics, kStackedNumerics);
    EXPECT_EQ(packed[i].host_syncs, 4 + 1);
    TrainingOutcome alone = RunTraining(runs[i]);
    ASSERT_EQ(alone.state, JobState::kSucceeded) << alone.error;
    EXPECT_NEAR(packed[i].final_loss, alone.final_loss, 1e-3 * std::max(1.0, alone.final_loss));
  }

  // The stacked step itself, under sync-debug mode: a learning-rate change, a step, validation.
  StackedPack pack(pointers);
  std::vector<std::unique_ptr<TrainingPath>> paths;
  for (size_t i = 0; i < runs.size(); ++i) {
    at::Generator gen = at::cuda::detail::createCUDAGenerator(0);
    paths.push_back(pack.MemberPath(i, gen));
  }
  for (auto& path : paths) path->BeginEpoch();
  const torch::Tensor targets = dataset->targets;
  const BatchView batch{&dataset->features, &targets, 0, 32};
  {
    SyncDebugModeScope no_syncs(c10::cuda::SyncDebugMode::L_ERROR);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < paths.size(); ++i) paths[i]->SetLearningRate(0.001 * (step + i + 1));
      for (auto& path : paths) path->Step(batch);
      EXPECT_NO_THROW(pack.StepAll());
    }
    for (auto& path : paths) path->BeginValidation();
    for (auto& path : paths) path->ValidateBatch(batch);
    EXPECT_NO_THROW(pack.ValidateAll());
  }
  EXPECT_GT(paths[0]->loss_sum().item<double>(), 0.0);
}

// The best epoch on a GPU: a job alone (LibTorch path) and a pack's stacked members each hand back
// their best validation epoch's weights, kept by copies on the device: the job still makes one
// transfer per epoch plus the read-back.
TEST(BestEpochGpuTest, AJobAndStackedMembersOnCudaHandBackTheirBest) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  constexpr int64_t kRows = 64;
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "noise";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = kRows;
  dataset->meta.device = "cuda:0";
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({kRows, 4});
  const torch::Tensor y = x.narrow(1, 0, 1).sin() + 0.5 * torch::randn({kRows, 1});
  dataset->features = x.to(cuda);
  dataset->targets = y.to(cuda);
  auto make = [&](double lr, uint64_t seed) {
    TrainingRun run;
    run.spec.model = "linear:64,relu,linear:64,relu,linear:1";
    run.spec.loss = LossKind::kMse;
    run.spec.optimizer = OptimizerKind::kSgd;
    run.spec.learning_rate = lr;
    run.spec.momentum = 0.9;
    run.spec.batch_size = 8;
    run.spec.epochs = 25;
    run.spec.seed = seed;
    run.spec.validation_fraction = 0.25;
    run.spec.model_from = ModelFrom::kBest;
    run.spec.device = "cuda:0";
    run.spec.engine = EngineKind::kLibTorch;
    run.model = *ParseModelSpec(run.spec.model);
    run.dataset = dataset;
    run.device = cuda;
    return run;
  };
  // The handed-back model's loss on the held-out rows, on the CPU, against the epoch's record.
  auto check = [&](const TrainingRun& run, const TrainingOutcome& outcome,
                   const std::vector<double>& val_losses) -> int32_t {
    if (outcome.state != JobState::kSucceeded || val_losses.empty()) {
      ADD_FAILURE() << "the job did not succeed: " << outcome.error;
      return 0;
    }
    const int32_t best = static_cast<int32_t>(
        std::min_element(val_losses.begin(), val_losses.end()) - val_losses.begin() + 1);
    EXPECT_EQ(outcome.best_epoch, best);
    EXPECT_EQ(outcome.model_epoch, best);
    std::istringstream in(outcome.model_archive);
    torch::jit::Module model = torch::jit::load(in);
    const int64_t held = HeldOutRows(0.25, kRows);
    at::Generator gen = at::detail::createCPUGenerator(*run.spec.seed);
    const torch::Tensor rows = torch::randperm(kRows, gen, torch::TensorOptions(torch::kLong))
                                   .narrow(0, kRows - held, held);
    torch::NoGradGuard no_grad;
    const double loss =
        torch::mse_loss(model.forward({x.index_select(0, rows)}).toTensor(), y.index_select(0, rows))
            .item<double>();
    EXPECT_NEAR(loss, val_losses[best - 1], 1e-4 * val_losses[best - 1]);
    return best;
  };
  std::vector<TrainingRun> runs = {make(0.05, 1), make(0.03, 2), make(0.08, 3)};
  std::vector<std::vector<double>> val_losses(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].on_epoch = [&val_losses, i](const EpochResult& e, int64_t, int64_t) {
      val_losses[i].push_back(*e.validation_loss);
    };
  }
  const TrainingOutcome alone = RunTraining(runs[0]);
  EXPECT_EQ(alone.host_syncs, 25 + 1);
  EXPECT_LT(check(runs[0], alone, val_losses[0]), 25) << "the validation loss never turned up";

  for (auto& v : val_losses) v.clear();
  std::vector<const TrainingRun*> pointers;
  for (const TrainingRun& run : runs) pointers.push_back(&run);
  std::vector<TrainingOutcome> packed(runs.size());
  RunPackedTraining(pointers, [&](size_t i, TrainingOutcome o) { packed[i] = std::move(o); });
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(packed[i].engine, "libtorch-stacked");
    EXPECT_EQ(packed[i].host_syncs, 25 + 1);
    check(runs[i], packed[i], val_losses[i]);
  }
}

// On a GPU: after the device is measured, the seed job (two parameters,
// batches of 16) is launch-bound, and the verdict says so with a recommendation.
TEST_F(EngineGpuTest, SeedJobOnCudaIsLaunchBoundAfterDiagnose) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  absl::StatusOr<Diagnosis> diagnosis = engine->Diagnose(/*refresh=*/false);
  ASSERT_TRUE(diagnosis.ok()) << diagnosis.status();
  ASSERT_GE(diagnosis->devices.size(), 2u);  // cpu and cuda:0
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda:0";

  absl::StatusOr<JobSnapshot> job = RunJob(*engine, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.bound, SpeedBound::kLaunchBound) << job->report.verdict;
  EXPECT_THAT(job->report.verdict, ::testing::StartsWith("launch-bound: "));
  EXPECT_THAT(job->report.verdict, ::testing::HasSubstr("too small for cuda:0"));
  EXPECT_EQ(job->report.host_syncs, 100 + 1);
}

// Mixed precision on CUDA: the seed job in bf16 and fp16 learns the line with exactly the host
// transfers of an fp32 job (fp16's scale and skips ride on the epoch's transfer).
class MixedPrecisionGpuTest : public EngineGpuTest,
                              public ::testing::WithParamInterface<Precision> {};

TEST_P(MixedPrecisionGpuTest, SeedJobConvergesWithOneTransferPerEpoch) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Upload(*engine, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda:0";
  spec.precision = GetParam();

  absl::StatusOr<JobSnapshot> job = RunJob(*engine, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_LT(job->final_loss, 0.0125);
  EXPECT_EQ(job->host_syncs, 100 + 1);
  ASSERT_THAT(job->epochs, SizeIs(100));
  EXPECT_EQ(job->epochs.back().loss_scale.has_value(), GetParam() == Precision::kFp16);
}

INSTANTIATE_TEST_SUITE_P(Precisions, MixedPrecisionGpuTest,
                         ::testing::Values(Precision::kBf16, Precision::kFp16),
                         [](const auto& info) { return PrecisionName(info.param); });

// An fp16 step whose gradients overflowed is undone without the host: the check, the step (with
// its step count and bias corrections on the device), the restore and the scale update all run
// under sync-debug "error".
class LossScalerGpuTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(LossScalerGpuTest, OverflowedStepIsUndoneWithoutSynchronisingWithTheHost) {
  TRAINERD_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::Tensor p = torch::tensor({1.0f, -2.0f, 3.0f}).to(cuda).set_requires_grad(true);
  const torch::Tensor x = torch::tensor({0.5f, 0.25f, -1.0f}).to(cuda);
  JobSpec spec;
  spec.optimizer = GetParam();
  spec.learning_rate = 0.1;
  spec.precision = Precision::kFp16;
  if (spec.optimizer == OptimizerKind::kAdagrad) spec.lr_decay = 0.1;
  auto optimizer = MakeOptimizer(spec, {p});
  LossScaler scaler(cuda, LossScaler::Options{});
  auto step = [&](bool poison) {
    optimizer->zero_grad();
    torch::Tensor loss;
    {
      AutocastGuard autocast(cuda, Precision::kFp16);
      loss = (p.unsqueeze(0).mm(x.unsqueeze(1))).sum();
    }
    scaler.Scale(loss.to(torch::kFloat32)).backward();
    if (poison) p.mutable_grad().fill_(std::numeric_limits<float>::infinity());
    scaler.Unscale({p});
    scaler.Step(*optimizer, {p});
  };
  step(/*poison=*/false);
  const torch::Tensor before = p.detach().clone();

  {
    SyncDebugModeScope no_syncs(c10::cuda::SyncDebugMode::L_ERROR);
    EXPECT_NO_THROW(step(/*poison=*/true));
  }

  EXPECT_TRUE(torch::equal(p.detach(), before));
  EXPECT_EQ(scaler.scale().item<float>(), 32768.0f);
  EXPECT_EQ(scaler.skipped_steps().item<double>(), 1.0);
  {
    SyncDebugModeScope no_syncs(c10::cuda::SyncDebugMode::L_ERROR);
    EXPECT_NO_THROW(step(/*poison=*/false));
  }
  EXPECT_FALSE(torch::equal(p.detach(), before));
}

INSTANTIATE_TEST_SUITE_P(Fp16Optimizers, LossScalerGpuTest,
                         ::testing::Values(OptimizerKind::kAdam, OptimizerKind::kAdamW,
                                           OptimizerKind::kNAdam, OptimizerKind::kRAdam,
                                           OptimizerKind::kAdagrad),
                         [](const auto& info) { return OptimizerKindName(info.param); });

}  // namespace
}  // namespace trainerd::engine
