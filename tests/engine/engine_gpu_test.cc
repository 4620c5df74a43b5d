// GPU tests for the engine (ctest label "gpu"): each skips itself when LibTorch sees no CUDA
// device. On a GPU they check that training on the device matches the CPU's result, that the
// host transfers are still counted exactly, and that datasets are resident on the device.
#include <torch/torch.h>

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
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
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<Engine> engine = StartEngine("cuda");
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->default_device(), "cuda:0");

  absl::StatusOr<DatasetMeta> meta = Upload(*engine, "seed", SeedTable());

  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->device, "cuda:0");
  EXPECT_EQ(engine->GetDataset("seed")->device, "cuda:0");
}

TEST_F(EngineGpuTest, SeedJobOnCudaConvergesLikeOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
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
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
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
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
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

}  // namespace
}  // namespace trainerd::engine
