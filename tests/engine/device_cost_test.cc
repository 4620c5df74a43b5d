// `--device auto` (server/engine/device_cost.h): the cost model on recorded figures, this build
// machine's CPU and an H200 with its host's CPU, and a job submitted with device "auto".
#include "server/engine/devices/device_cost.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;

// Diagnose on this project's 2-vCPU build machine (docs/PERFORMANCE.md, 2026-12-01).
DeviceCostFigures BuildMachineCpu() { return {"cpu", 118e9, 4.6e-6, 0.0, 16e9, true}; }
// An H200 (float32 without TF32, a launch, a synchronisation, pinned copies) and its host's CPU.
DeviceCostFigures H200(bool holds_dataset) {
  return {"cuda:0", 50e12, 5e-6, 10e-6, 50e9, holds_dataset};
}
DeviceCostFigures H200HostCpu() { return {"cpu", 1.5e12, 3e-6, 0.0, 20e9, true}; }

// The seed job: linear:1 on one feature, batch 16: 96 FLOPs a step, 50 steps x 100 epochs.
JobCostInput SeedJob(bool fused) {
  JobCostInput job;
  job.flops_per_step = 96;
  job.layers = 1;
  job.steps_per_epoch = 50;
  job.epochs = 100;
  job.dataset_bytes = 800 * 8;
  job.fused_on_cpu = fused;
  return job;
}

// The mlp workload: 64-256-256-10 (5 layers), batch 256: 130 MFLOPs a step, 79 steps x 5 epochs.
JobCostInput MlpJob() {
  JobCostInput job;
  job.flops_per_step = 130.2e6;
  job.layers = 5;
  job.steps_per_epoch = 79;
  job.epochs = 5;
  job.dataset_bytes = 20000 * (64 * 4 + 8);
  return job;
}

TEST(DeviceCostTest, TheSeedJobGoesToTheCpuBesideAnH200) {
  const std::vector<DeviceCostFigures> devices = {H200HostCpu(), H200(true)};
  for (bool fused : {true, false}) {
    const std::vector<DeviceCostEstimate> e = EstimateJobCost(SeedJob(fused), devices);
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e[0].device, "cpu");
    EXPECT_EQ(e[1].device, "cuda:0");
    // On the GPU: 16 launches of 5 us a step, plus a 10 us synchronisation per epoch.
    EXPECT_NEAR(e[1].step_seconds, 16 * 5e-6 + 96 / 50e12, 1e-12);
    EXPECT_NEAR(e[1].job_seconds, 100 * (50 * e[1].step_seconds + 10e-6), 1e-9);
    if (fused) {
      EXPECT_NEAR(e[0].step_seconds, kFusedStepSeconds + 96 / (1.5e12 * kFusedEfficiency), 1e-12);
    } else {
      EXPECT_NEAR(e[0].step_seconds, 16 * 3e-6 + 96 / 1.5e12, 1e-12);
    }
    EXPECT_EQ(Cheapest(e), 0u) << "fused " << fused;
  }
}

TEST(DeviceCostTest, TheMlpGoesToTheH200AndStaysOnTheBuildMachinesCpuAlone) {
  const std::vector<DeviceCostEstimate> h200 =
      EstimateJobCost(MlpJob(), {H200HostCpu(), H200(true)});
  ASSERT_EQ(h200.size(), 2u);
  // A close call: 40 launches a step bound both, and the H200 host's CPU is fast.
  EXPECT_EQ(Cheapest(h200), 1u);
  EXPECT_LT(h200[1].job_seconds, h200[0].job_seconds);
  // A 1024-wide MLP at batch 1024 (6.9 GFLOPs a step) is the GPU's by far.
  JobCostInput wide = MlpJob();
  wide.flops_per_step = 6.9e9;
  const std::vector<DeviceCostEstimate> big = EstimateJobCost(wide, {H200HostCpu(), H200(true)});
  ASSERT_EQ(big.size(), 2u);
  EXPECT_EQ(Cheapest(big), 1u);
  EXPECT_LT(big[1].job_seconds * 10, big[0].job_seconds);
  const std::vector<DeviceCostEstimate> alone = EstimateJobCost(MlpJob(), {BuildMachineCpu()});
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(Cheapest(alone), 0u);
  // 40 dispatches of 4.6 us and 130 MFLOPs at 118 GFLOP/s.
  EXPECT_NEAR(alone[0].step_seconds, 40 * 4.6e-6 + 130.2e6 / 118e9, 1e-9);
}

TEST(DeviceCostTest, CopyingALargeDatasetToTheGpuCanOutweighAShortJob) {
  JobCostInput job = MlpJob();
  job.epochs = 1;
  job.dataset_bytes = int64_t{40} << 30;  // 40 GiB to copy at 50 GB/s: ~0.86 s
  const std::vector<DeviceCostEstimate> away =
      EstimateJobCost(job, {H200HostCpu(), H200(/*holds_dataset=*/false)});
  const std::vector<DeviceCostEstimate> home =
      EstimateJobCost(job, {H200HostCpu(), H200(/*holds_dataset=*/true)});
  EXPECT_EQ(Cheapest(away), 0u);
  EXPECT_EQ(Cheapest(home), 1u);
  EXPECT_NEAR(away[1].job_seconds - home[1].job_seconds, (40.0 * (1 << 30)) / 50e9, 1e-6);
}

TEST(DeviceCostTest, UnmeasuredDevicesAreNotEstimated) {
  DeviceCostFigures unmeasured = H200(true);
  unmeasured.peak_flops_per_second = 0;
  const std::vector<DeviceCostEstimate> e =
      EstimateJobCost(MlpJob(), {BuildMachineCpu(), unmeasured});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].device, "cpu");
  EXPECT_FALSE(Cheapest({}).has_value());
  // An unknown FLOP count (a TorchScript module) still has the fixed costs.
  JobCostInput unknown = SeedJob(false);
  unknown.flops_per_step = 0;
  const std::vector<DeviceCostEstimate> fixed = EstimateJobCost(unknown, {BuildMachineCpu()});
  ASSERT_EQ(fixed.size(), 1u);
  EXPECT_NEAR(fixed[0].step_seconds, 16 * 4.6e-6, 1e-12);
}

class DeviceAutoTest : public EngineFixture {};

TEST_F(DeviceAutoTest, AJobOnDeviceAutoRecordsTheEstimatesItWasPlacedBy) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.device = "auto";
  spec.epochs = 2;
  // Before any measurement: the first GPU or the CPU, without estimates.
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_TRUE(job->device_estimates.empty());

  absl::StatusOr<Diagnosis> diagnosis = engine_->Diagnose(/*refresh=*/true);
  ASSERT_TRUE(diagnosis.ok()) << diagnosis.status();
  job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_EQ(job->device_estimates.size(), diagnosis->devices.size());
  const DeviceCostEstimate& cpu = job->device_estimates[0];
  EXPECT_EQ(cpu.device, "cpu");
  EXPECT_GT(cpu.step_seconds, 0);
  // 2 epochs of 50 fused steps; the CPU holds the data and needs no epoch synchronisation.
  EXPECT_NEAR(cpu.job_seconds, 2 * 50 * cpu.step_seconds, 1e-12);
  EXPECT_EQ(job->spec.device, job->device_estimates[*Cheapest(job->device_estimates)].device);
}

}  // namespace
}  // namespace trainerd::engine
