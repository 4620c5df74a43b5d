// Tests for common/job_limits.h: the limits of a submission and the memory estimate.
#include "common/job_limits.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

ModelSpec Parse(const char* text) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(CheckEpochsAndCheckpointsTest, AcceptsTheirRanges) {
  EXPECT_TRUE(CheckEpochsAndCheckpoints(1, 0).ok());
  EXPECT_TRUE(CheckEpochsAndCheckpoints(kMaxEpochs, 0).ok());
  EXPECT_TRUE(CheckEpochsAndCheckpoints(100, 1).ok());
  EXPECT_TRUE(CheckEpochsAndCheckpoints(kMaxCheckpointsPerJob, 1).ok());
}

TEST(CheckEpochsAndCheckpointsTest, RefusesEpochsAndCheckpointCountsBeyondThem) {
  EXPECT_EQ(CheckEpochsAndCheckpoints(0, 0).message(), "epochs must be between 1 and 1000000; got 0");
  EXPECT_EQ(CheckEpochsAndCheckpoints(kMaxEpochs + 1, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(CheckEpochsAndCheckpoints(10, 11).message(), HasSubstr("between 1 and the epochs"));
  const absl::Status many = CheckEpochsAndCheckpoints(100000, 1);
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(many.message(),
            "a checkpoint every 1 epochs over 100000 epochs writes 100000 checkpoints; at most "
            "1000 are allowed (checkpoint every 100 epochs or more)");
}

// linear:2 on 3 features with adam, batch 4: 8 weights (32 bytes), 32 of gradients, 64 of moments;
// activations: the input (4x3), the output (4x2) and the output's gradient (4x2), 4 bytes each.
TEST(EstimateTrainingMemoryTest, AddsWeightsGradientsStateAndActivations) {
  const absl::StatusOr<MemoryEstimate> estimate =
      EstimateTrainingMemory(Parse("linear:2"), {3}, /*batch=*/4, /*optimizer_slots=*/2);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  EXPECT_EQ(estimate->parameters, 8);
  EXPECT_EQ(estimate->parameter_bytes, 32);
  EXPECT_EQ(estimate->gradient_bytes, 32);
  EXPECT_EQ(estimate->optimizer_bytes, 64);
  EXPECT_EQ(estimate->activation_bytes, (12 + 8 + 12) * 4);
  EXPECT_EQ(estimate->total_bytes, 32 + 32 + 64 + (12 + 8 + 12) * 4);
}

TEST(EstimateTrainingMemoryTest, OverflowingEstimatesAreInvalidArgument) {
  const absl::StatusOr<MemoryEstimate> estimate = EstimateTrainingMemory(
      Parse("conv2d:65536:1"), {1, 1 << 20, 1 << 20}, /*batch=*/int64_t{1} << 20, 0);
  EXPECT_EQ(estimate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(estimate.status().message(), HasSubstr("the memory estimate of 'conv2d:65536:1'"));
}

TEST(CheckModelSizeTest, TooManyParametersIsResourceExhausted) {
  const absl::StatusOr<MemoryEstimate> estimate =
      EstimateTrainingMemory(Parse("linear:1048576,linear:4096"), {1}, 1, 0);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  const absl::Status status = CheckModelSize(*estimate, "linear:1048576,linear:4096");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "model 'linear:1048576,linear:4096' has 4297068544 parameters; at most 2147483648 are "
            "allowed");
}

TEST(CheckModelSizeTest, AnEstimateOverTheLimitIsResourceExhaustedWithItsParts) {
  // 65,536 channels of 64x64 per row: 1 GiB of activations per row and layer.
  const absl::StatusOr<MemoryEstimate> estimate =
      EstimateTrainingMemory(Parse("conv2d:65536:1,relu,relu,relu"), {1, 64, 64}, 512, 0);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  const absl::Status status = CheckModelSize(*estimate, "conv");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("model 'conv' would need about "));
  EXPECT_THAT(status.message(), HasSubstr("activations of one batch 2560.0 GiB"));
  EXPECT_THAT(status.message(), HasSubstr("at most 1024.0 GiB per job is allowed"));
}

TEST(CheckModelSizeTest, SmallModelsPass) {
  const absl::StatusOr<MemoryEstimate> estimate =
      EstimateTrainingMemory(Parse("linear:64,relu,linear:1"), {8}, 32, 2);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  EXPECT_TRUE(CheckModelSize(*estimate, "small").ok());
}

}  // namespace
}  // namespace trainerd
