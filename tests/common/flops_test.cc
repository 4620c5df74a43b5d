// Tests for common/flops.h against FLOP counts worked out by hand.
#include "common/flops.h"

#include <string>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "gtest/gtest.h"

namespace trainerd::common {
namespace {

ModelSpec Parse(const std::string& text) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec();
}

TEST(FlopsTest, SingleLinearOnOneFeatureIsOneMultiplyAdd) {
  const ModelSpec spec = Parse("linear:1");
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(spec, {1}), 2.0);
  // The seed job's step: 3 x forward x 16 rows.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerStep(spec, {1}, 16), 96.0);
}

TEST(FlopsTest, Mlp) {
  const ModelSpec spec = Parse("linear:64,relu,linear:10");
  // 2*784*64 + 64 (relu) + 2*64*10.
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(spec, {784}), 100352.0 + 64.0 + 1280.0);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerStep(spec, {784}, 32), 3.0 * 101696.0 * 32.0);
}

TEST(FlopsTest, SmallCnnOnMnistShapedRows) {
  const ModelSpec spec = Parse("conv2d:8:3,relu,maxpool2d:2,flatten,linear:10");
  // conv2d 1x28x28 -> 8x26x26: 2 * 1*3*3 * 8*26*26 = 97344;
  // relu on 8x26x26: 5408; maxpool2d:2 -> 8x13x13: 4 per output, 5408; flatten 0;
  // linear 1352 -> 10: 27040.
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(spec, {1, 28, 28}), 97344.0 + 5408.0 + 5408.0 + 27040.0);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerStep(spec, {1, 28, 28}, 64), 3.0 * 135200.0 * 64.0);
}

TEST(FlopsTest, StridedPaddedConv) {
  // 3x32x32, conv2d:16:3:2:1 -> 16x16x16: 2 * 3*3*3 * 16*16*16.
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(Parse("conv2d:16:3:2:1"), {3, 32, 32}),
                   2.0 * 27.0 * 4096.0);
}

TEST(FlopsTest, LinearOnTheLastDimensionCountsEveryLeadingPosition) {
  // [3, 5] -> [3, 4]: three 5 x 4 products.
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(Parse("linear:4"), {3, 5}), 2.0 * 5.0 * 12.0);
}

TEST(FlopsTest, NormsAndFreeLayers) {
  // linear 2 -> 10: 40; batchnorm: 6 per element; dropout and flatten: 0.
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(Parse("linear:10,batchnorm,dropout:0.5,flatten"), {2}),
                   40.0 + 60.0);
}

TEST(FlopsTest, UnknownShapesAndEmptyBatchesAreZero) {
  // conv2d needs CxHxW rows: the figure is unknown, reported as 0.
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(Parse("conv2d:8:3"), {784}), 0.0);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerStep(Parse("conv2d:8:3"), {784}, 16), 0.0);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerStep(Parse("linear:1"), {1}, 0), 0.0);
  EXPECT_DOUBLE_EQ(ForwardFlopsPerRow(ModelSpec(), {1}), 0.0);
}

}  // namespace
}  // namespace trainerd::common
