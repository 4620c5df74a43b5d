// Tests for server/engine/speed_report.h on recorded figures: the seed job on an H200, a
// matmul-heavy MLP, jobs bound by host transfers and by data preparation, missing figures and a
// launch-bound job on the CPU.
#include "server/engine/devices/speed_report.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Diagnose on an H200 and on its host's CPU.
constexpr double kH200PeakFlops = 50e12;  // float32, no TF32
constexpr double kH200LaunchSeconds = 5e-6;
constexpr double kCpuPeakFlops = 50e9;
constexpr double kCpuLaunchSeconds = 3e-6;

// The seed job: linear:1 on one feature, batch 16, 50 steps per epoch x 100 epochs at ~60 us a
// step on cuda:0.
SpeedFigures SeedJobOnH200() {
  SpeedFigures f;
  f.device = "cuda:0";
  f.queue_seconds = 0.001;
  f.data_seconds = 0.05;
  f.steps = 5000;
  f.compute_seconds = 5000 * 60e-6;
  f.host_transfer_seconds = 0.01;
  f.batch_size = 16;
  f.training_rows = 800;
  f.epochs_done = 100;
  f.flops_per_step = 3.0 * 2.0 * 16;  // common::TrainingFlopsPerStep
  f.layers = 1;
  f.peak_flops_per_second = kH200PeakFlops;
  f.launch_seconds = kH200LaunchSeconds;
  f.cpu_peak_flops_per_second = kCpuPeakFlops;
  f.cpu_launch_seconds = kCpuLaunchSeconds;
  return f;
}

TEST(SpeedBoundNameTest, NamesEveryBound) {
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kUnspecified), "unspecified");
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kLaunchBound), "launch-bound");
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kComputeBound), "compute-bound");
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kTransferBound), "transfer-bound");
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kDataBound), "data-bound");
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kBalanced), "balanced");
  EXPECT_STREQ(SpeedBoundName(SpeedBound::kCommunicationBound), "communication-bound");
}

// A data-parallel job: its collectives' share of compute decides before launch overhead does (the
// ranks wait on each other whatever the kernels cost); below the threshold the share is reported
// and the verdict is the one-rank job's.
TEST(JudgeSpeedTest, RanksWaitingOnCollectivesAreCommunicationBound) {
  SpeedFigures f = SeedJobOnH200();
  f.device = "cpu";
  f.ranks = 2;
  f.batch_size = 64;
  f.training_rows = 800;  // 400 a rank: a per-rank batch of 128 still fits
  f.collective_seconds = 0.62 * f.compute_seconds;
  SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kCommunicationBound);
  ASSERT_TRUE(v.collective_fraction.has_value());
  EXPECT_NEAR(*v.collective_fraction, 0.62, 1e-12);
  EXPECT_EQ(v.line,
            "communication-bound: 62% of step time in collectives across 2 ranks \xE2\x80\x94 a "
            "per-rank batch of 128 or fewer ranks will be faster");

  f.batch_size = 256;  // 512 would not fit in a rank's 400 rows
  EXPECT_EQ(JudgeSpeed(f).line,
            "communication-bound: 62% of step time in collectives across 2 ranks \xE2\x80\x94 "
            "fewer ranks will be faster");

  f.collective_seconds = 0.1 * f.compute_seconds;
  v = JudgeSpeed(f);
  EXPECT_NE(v.bound, SpeedBound::kCommunicationBound);
  ASSERT_TRUE(v.collective_fraction.has_value());
  EXPECT_NEAR(*v.collective_fraction, 0.1, 1e-12);

  f.ranks = 1;  // a one-rank job has no share to report
  EXPECT_FALSE(JudgeSpeed(f).collective_fraction.has_value());
}

TEST(JudgeSpeedTest, SeedJobOnH200IsLaunchBoundAndTheCpuWouldBeFaster) {
  const SpeedVerdict v = JudgeSpeed(SeedJobOnH200());
  EXPECT_EQ(v.bound, SpeedBound::kLaunchBound);
  // 16 kernels x 5 us = 80 us of overhead in a 60 us step: all of it. The batch at which the work
  // would match the overhead is far beyond the 800 rows: the largest power of two within them.
  // On the CPU: 16 x 3 us + 96 FLOPs / 50 GFLOP/s = 48 us < 60 us.
  EXPECT_EQ(v.line,
            "launch-bound: 100% of step time is fixed per-step overhead; this model is too small "
            "for cuda:0 \xE2\x80\x94 a batch of 512 or the cpu device will be faster");
  EXPECT_NEAR(v.steps_per_second, 1.0 / 60e-6, 1e-6);
  EXPECT_NEAR(v.achieved_flops_per_second, 96.0 / 60e-6, 1e-3);
  ASSERT_TRUE(v.peak_fraction.has_value());
  EXPECT_NEAR(*v.peak_fraction, 96.0 / 60e-6 / kH200PeakFlops, 1e-12);
  ASSERT_TRUE(v.overhead_fraction.has_value());
  EXPECT_DOUBLE_EQ(*v.overhead_fraction, 1.0);
}

TEST(JudgeSpeedTest, SlowerCpuIsNotRecommended) {
  SpeedFigures f = SeedJobOnH200();
  f.cpu_launch_seconds = 10e-6;  // 160 us a step on the CPU
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kLaunchBound);
  EXPECT_THAT(v.line, HasSubstr("\xE2\x80\x94 a batch of 512 will be faster"));
  EXPECT_THAT(v.line, Not(HasSubstr("cpu device")));
}

TEST(JudgeSpeedTest, WholeDatasetBatchLeavesOnlyTheCpu) {
  SpeedFigures f = SeedJobOnH200();
  f.batch_size = 800;
  f.flops_per_step = 3.0 * 2.0 * 800;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kLaunchBound);
  EXPECT_THAT(v.line, HasSubstr("for cuda:0 \xE2\x80\x94 the cpu device will be faster"));
}

TEST(JudgeSpeedTest, BatchFromMeasuredTimeWithoutFlops) {
  // A TorchScript module: FLOPs and layers unknown (counted as one layer: 16 kernels, 80 us of
  // overhead) in a 100 us step. The other 20 us are 16 rows' work, 1.25 us each: the overhead
  // matches 64 rows' work. Without FLOPs the CPU's step cannot be estimated.
  SpeedFigures f = SeedJobOnH200();
  f.flops_per_step = 0.0;
  f.layers = 0;
  f.compute_seconds = 5000 * 100e-6;
  f.training_rows = 10000;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kLaunchBound);
  EXPECT_EQ(v.line,
            "launch-bound: 80% of step time is fixed per-step overhead; this model is too small "
            "for cuda:0 \xE2\x80\x94 a batch of 64 will be faster");
  EXPECT_FALSE(v.peak_fraction.has_value());
  EXPECT_DOUBLE_EQ(v.achieved_flops_per_second, 0.0);
}

TEST(JudgeSpeedTest, MatmulHeavyMlpIsComputeBound) {
  SpeedFigures f;
  f.device = "cuda:0";
  f.data_seconds = 2.0;
  f.steps = 1000;
  f.flops_per_step = 3.55e12;
  // 0.1 s a step: 35.5 TFLOP/s, 71% of 50 TFLOP/s.
  f.compute_seconds = 100.0;
  f.host_transfer_seconds = 0.5;
  f.batch_size = 4096;
  f.training_rows = 4096000;
  f.layers = 5;
  f.peak_flops_per_second = kH200PeakFlops;
  f.launch_seconds = kH200LaunchSeconds;
  f.cpu_peak_flops_per_second = kCpuPeakFlops;
  f.cpu_launch_seconds = kCpuLaunchSeconds;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kComputeBound);
  EXPECT_EQ(v.line, "compute-bound: 71% of measured peak");
  ASSERT_TRUE(v.peak_fraction.has_value());
  EXPECT_NEAR(*v.peak_fraction, 0.71, 1e-9);
  ASSERT_TRUE(v.overhead_fraction.has_value());
  EXPECT_NEAR(*v.overhead_fraction, 40 * 5e-6 / 0.1, 1e-12);  // 6 x 5 + 10 kernels
  EXPECT_NEAR(v.steps_per_second, 10.0, 1e-12);
}

TEST(JudgeSpeedTest, HostTransfersDominate) {
  SpeedFigures f = SeedJobOnH200();
  f.data_seconds = 0.1;
  f.compute_seconds = 2.0;
  f.host_transfer_seconds = 1.5;  // 1.5 / 3.6
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kTransferBound);
  EXPECT_EQ(v.line, "transfer-bound: 42% of the job's time went to host transfers");
  // The derived figures are filled in whatever the verdict.
  EXPECT_NEAR(v.steps_per_second, 2500.0, 1e-9);
  EXPECT_TRUE(v.overhead_fraction.has_value());
}

TEST(JudgeSpeedTest, DataPreparationDominates) {
  SpeedFigures f = SeedJobOnH200();
  f.data_seconds = 9.0;
  f.compute_seconds = 5.0;
  f.host_transfer_seconds = 1.0;  // 9 / 15
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kDataBound);
  EXPECT_EQ(v.line,
            "data-bound: 60% of the job's time went to data preparation (model build, dataset "
            "copy, validation split)");
}

TEST(JudgeSpeedTest, NoStepsIsNotEnoughFigures) {
  SpeedFigures f = SeedJobOnH200();
  f.steps = 0;
  f.compute_seconds = 0.0;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kUnspecified);
  EXPECT_EQ(v.line, "not enough figures: no training step was timed");
  EXPECT_DOUBLE_EQ(v.steps_per_second, 0.0);
  EXPECT_FALSE(v.peak_fraction.has_value());
  EXPECT_FALSE(v.overhead_fraction.has_value());

  // Steps but no time (a clock that did not move): still nothing to divide by.
  f.steps = 10;
  EXPECT_EQ(JudgeSpeed(f).bound, SpeedBound::kUnspecified);
  EXPECT_EQ(JudgeSpeed(SpeedFigures()).bound, SpeedBound::kUnspecified);
}

TEST(JudgeSpeedTest, NoDiagnoseFiguresIsNotEnoughFigures) {
  SpeedFigures f = SeedJobOnH200();
  f.peak_flops_per_second.reset();
  f.launch_seconds.reset();
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kUnspecified);
  EXPECT_THAT(v.line, StartsWith("not enough figures: "));
  EXPECT_THAT(v.line, HasSubstr("cuda:0"));
  EXPECT_NEAR(v.steps_per_second, 1.0 / 60e-6, 1e-6);
  EXPECT_NEAR(v.achieved_flops_per_second, 96.0 / 60e-6, 1e-3);
  EXPECT_FALSE(v.peak_fraction.has_value());
  EXPECT_FALSE(v.overhead_fraction.has_value());

  // A zero peak is as good as none.
  f.peak_flops_per_second = 0.0;
  EXPECT_FALSE(JudgeSpeed(f).peak_fraction.has_value());
}

TEST(JudgeSpeedTest, LaunchBoundOnTheCpuRecommendsOnlyABatch) {
  SpeedFigures f = SeedJobOnH200();
  f.device = "cpu";
  f.compute_seconds = 5000 * 40e-6;  // 16 x 3 us = 48 us of overhead in a 40 us step
  f.peak_flops_per_second = kCpuPeakFlops;
  f.launch_seconds = kCpuLaunchSeconds;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kLaunchBound);
  EXPECT_EQ(v.line,
            "launch-bound: 100% of step time is fixed per-step overhead; this model is too small "
            "for cpu \xE2\x80\x94 a batch of 512 will be faster");
}

// Recorded on this project's 2-core CI machine under load: the seed job at 16k steps/s, the
// launch estimate (16 kernels x 1.8 us) explaining 45% of the 63 us step, 0% of peak. The rest of
// such a step is per-step cost the estimate does not count (96 FLOPs take no time at 84 GFLOP/s),
// so the overhead is the whole step and the job is launch-bound.
TEST(JudgeSpeedTest, TinyWorkWithModerateOverheadIsLaunchBound) {
  SpeedFigures f = SeedJobOnH200();
  f.device = "cpu";
  f.compute_seconds = 1000 / 15955.5;
  f.data_seconds = 0.0003;
  f.host_transfer_seconds = 0.0;
  f.steps = 1000;
  f.epochs_done = 20;
  f.peak_flops_per_second = 84.4e9;
  f.launch_seconds = 0.453 * (f.compute_seconds / f.steps) / 16;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kLaunchBound) << v.line;
  ASSERT_TRUE(v.overhead_fraction.has_value());
  EXPECT_GT(*v.overhead_fraction, 0.99);
  EXPECT_EQ(v.line,
            "launch-bound: 100% of step time is fixed per-step overhead; this model is too small "
            "for cpu \xE2\x80\x94 a batch of 512 will be faster");
}

TEST(JudgeSpeedTest, BalancedGivesTheFigures) {
  // 20% of peak and 20% overhead: neither dominates.
  SpeedFigures f;
  f.device = "cuda:0";
  f.steps = 100;
  f.compute_seconds = 100 * 1e-3;  // 1 ms a step
  f.flops_per_step = 0.2 * kH200PeakFlops * 1e-3;
  f.layers = 5;             // 40 kernels
  f.launch_seconds = 5e-6;  // 200 us
  f.peak_flops_per_second = kH200PeakFlops;
  f.batch_size = 256;
  const SpeedVerdict v = JudgeSpeed(f);
  EXPECT_EQ(v.bound, SpeedBound::kBalanced);
  EXPECT_EQ(v.line,
            "balanced: 20% of measured peak, 20% of step time is fixed per-step overhead (1000 "
            "steps/s)");
}

}  // namespace
}  // namespace trainerd::engine
