// Tests for server/engine/model.h: CheckJobSpec's edge cases not reached through Submit's common
// paths, BuildModel's layers (shapes, parameters, seeded dropout), a small CNN trained through the
// Engine, and ComputeLoss's target reshaping.
#include "server/engine/training/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/loss.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

DatasetMeta FloatDataset(std::vector<int64_t> features, std::vector<int64_t> targets) {
  DatasetMeta meta;
  meta.name = "d";
  meta.feature_shape = std::move(features);
  meta.target_shape = std::move(targets);
  meta.target_dtype = TargetDType::kFloat32;
  meta.rows = 10;
  return meta;
}

JobSpec Spec(const std::string& model, LossKind loss = LossKind::kMse) {
  JobSpec spec;
  spec.dataset = "d";
  spec.model = model;
  spec.loss = loss;
  spec.learning_rate = 0.1;
  spec.batch_size = 4;
  spec.epochs = 1;
  return spec;
}

TEST(ModelTest, MseAcceptsOneWideOutputForScalarTargets) {
  EXPECT_TRUE(CheckJobSpec(Spec("linear:1"), FloatDataset({3}, {})).ok());
}

TEST(ModelTest, MseAcceptsMatchingVectorTargets) {
  EXPECT_TRUE(CheckJobSpec(Spec("linear:8,relu,linear:2"), FloatDataset({3}, {2})).ok());
}

TEST(ModelTest, CrossEntropyWithOneOutputIsInvalidArgument) {
  DatasetMeta meta = FloatDataset({3}, {});
  meta.target_dtype = TargetDType::kInt64;
  absl::StatusOr<ModelSpec> model = CheckJobSpec(Spec("linear:1", LossKind::kCrossEntropy), meta);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("at least 2"));
}

TEST(ModelTest, CrossEntropyWithNegativeClassIsInvalidArgument) {
  DatasetMeta meta = FloatDataset({3}, {});
  meta.target_dtype = TargetDType::kInt64;
  meta.target_min = -1;
  meta.target_max = 1;
  absl::StatusOr<ModelSpec> model = CheckJobSpec(Spec("linear:3", LossKind::kCrossEntropy), meta);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("class indices -1..1"));
}

TEST(ModelTest, CrossEntropyWithVectorTargetsIsInvalidArgument) {
  DatasetMeta meta = FloatDataset({3}, {2});
  meta.target_dtype = TargetDType::kInt64;
  absl::StatusOr<ModelSpec> model = CheckJobSpec(Spec("linear:3", LossKind::kCrossEntropy), meta);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("one class index per row"));
}

TEST(ModelTest, InfiniteLearningRateIsInvalidArgument) {
  JobSpec spec = Spec("linear:1");
  spec.learning_rate = std::numeric_limits<double>::infinity();
  EXPECT_EQ(CheckJobSpec(spec, FloatDataset({1}, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, BuildModelNamesLayersLikeSequential) {
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("linear:4,relu,linear:2"), {3});
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : model->named_parameters()) {
    names.push_back(p.key());
    shapes.push_back(p.value().sizes().vec());
  }
  EXPECT_THAT(names, ElementsAre("0.weight", "0.bias", "2.weight", "2.bias"));
  EXPECT_THAT(shapes, ElementsAre(std::vector<int64_t>{4, 3}, std::vector<int64_t>{4},
                                  std::vector<int64_t>{2, 4}, std::vector<int64_t>{2}));
}

TEST(ModelTest, MseLossReshapesFlatTargetsToTheOutput) {
  torch::Tensor output = torch::tensor({1.0f, 2.0f, 3.0f}).view({3, 1});
  torch::Tensor targets = torch::tensor({1.0f, 2.0f, 5.0f});  // scalar targets: [rows]
  JobSpec spec;
  spec.loss = LossKind::kMse;
  EXPECT_FLOAT_EQ(ComputeLoss(spec, output, targets).item<float>(), 4.0f / 3.0f);
}

TEST(ModelTest, CrossEntropyLossOfConfidentRightAnswersIsNearZero) {
  torch::Tensor output = torch::tensor({20.0f, 0.0f, 0.0f, 20.0f}).view({2, 2});
  torch::Tensor targets = torch::tensor({0, 1}, torch::kInt64).view({2, 1});
  JobSpec spec;
  spec.loss = LossKind::kCrossEntropy;
  EXPECT_LT(ComputeLoss(spec, output, targets).item<float>(), 1e-6f);
}


// --- BuildModel for every layer kind. ---

struct LayerCase {
  std::string spec;
  std::vector<int64_t> input_shape;  // per row
};

void PrintTo(const LayerCase& layer_case, std::ostream* os) {
  *os << "'" << layer_case.spec << "' on " << ShapeToString(layer_case.input_shape);
}

class BuildModelLayerTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(BuildModelLayerTest, ForwardGivesTheInferredShapeAndCountedParameters) {
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec(GetParam().spec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::vector<int64_t>& input_shape = GetParam().input_shape;
  const absl::StatusOr<std::vector<int64_t>> output_shape = InferOutputShape(*spec, input_shape);
  ASSERT_TRUE(output_shape.ok()) << output_shape.status();
  const absl::StatusOr<int64_t> count = CountParameters(*spec, input_shape);
  ASSERT_TRUE(count.ok()) << count.status();

  torch::nn::Sequential model = BuildModel(*spec, input_shape);
  std::vector<int64_t> batch_shape = {4};
  batch_shape.insert(batch_shape.end(), input_shape.begin(), input_shape.end());
  const torch::Tensor output = model->forward(torch::randn(batch_shape));

  std::vector<int64_t> expected = {4};
  expected.insert(expected.end(), output_shape->begin(), output_shape->end());
  EXPECT_EQ(output.sizes().vec(), expected);
  int64_t parameters = 0;
  for (const torch::Tensor& p : model->parameters()) parameters += p.numel();
  EXPECT_EQ(parameters, *count);
}

INSTANTIATE_TEST_SUITE_P(
    EveryLayerKind, BuildModelLayerTest,
    ::testing::Values(LayerCase{"linear:3", {5}}, LayerCase{"linear:3", {2, 5}},
                      LayerCase{"conv2d:4:3", {2, 8, 8}}, LayerCase{"conv2d:4:3:2:1", {2, 9, 7}},
                      LayerCase{"conv2d:3:5:1:2", {1, 6, 6}}, LayerCase{"maxpool2d:2", {3, 7, 5}},
                      LayerCase{"avgpool2d:3", {2, 9, 9}}, LayerCase{"flatten", {2, 3, 4}},
                      LayerCase{"dropout:0.5", {6}}, LayerCase{"dropout:0.3", {2, 3, 3}},
                      LayerCase{"batchnorm", {6}}, LayerCase{"batchnorm", {3, 4, 4}},
                      LayerCase{"layernorm", {3, 4, 4}}, LayerCase{"layernorm", {7}},
                      LayerCase{"relu", {5}}, LayerCase{"gelu", {2, 5}}, LayerCase{"tanh", {5}},
                      LayerCase{"sigmoid", {5}}, LayerCase{"softmax", {5}},
                      LayerCase{"logsoftmax", {5}},
                      LayerCase{"conv2d:8:3:1:1,relu,maxpool2d:2,flatten,linear:10", {1, 28, 28}},
                      LayerCase{"conv2d:4:3,batchnorm,gelu,avgpool2d:2,flatten,dropout:0.2,"
                                "linear:16,layernorm,tanh,linear:3,logsoftmax",
                                {3, 10, 10}}));

TEST(ModelTest, BatchNormIsOneDimensionalForVectorRows) {
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("batchnorm"), {6});
  EXPECT_NE(model->ptr(0)->as<torch::nn::BatchNorm1d>(), nullptr);
  EXPECT_EQ(model->ptr(0)->as<torch::nn::BatchNorm2d>(), nullptr);
  EXPECT_EQ(model->named_buffers()["0.running_mean"].sizes().vec(), std::vector<int64_t>{6});
}

TEST(ModelTest, BatchNormIsTwoDimensionalForImageRows) {
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("batchnorm"), {3, 4, 4});
  EXPECT_NE(model->ptr(0)->as<torch::nn::BatchNorm2d>(), nullptr);
  EXPECT_EQ(model->ptr(0)->as<torch::nn::BatchNorm1d>(), nullptr);
  EXPECT_EQ(model->named_buffers()["0.running_mean"].sizes().vec(), std::vector<int64_t>{3});
}

TEST(ModelTest, SoftmaxNormalisesOverTheClasses) {
  const torch::Tensor x = torch::randn({4, 5});
  const torch::Tensor probabilities = BuildModel(*ParseModelSpec("softmax"), {5})->forward(x);
  EXPECT_TRUE(torch::allclose(probabilities.sum(/*dim=*/1), torch::ones({4})));
  const torch::Tensor log_probabilities =
      BuildModel(*ParseModelSpec("logsoftmax"), {5})->forward(x);
  EXPECT_TRUE(torch::allclose(log_probabilities.exp(), probabilities));
}

TEST(ModelTest, Conv2dUsesStrideAndPadding) {
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("conv2d:4:3:2:1"), {2, 9, 7});
  const auto* conv = model->ptr(0)->as<torch::nn::Conv2d>();
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->options.in_channels(), 2);
  EXPECT_EQ(conv->weight.sizes().vec(), (std::vector<int64_t>{4, 2, 3, 3}));
  EXPECT_EQ(c10::IntArrayRef(conv->options.stride()).vec(), (std::vector<int64_t>{2, 2}));
}

TEST(ModelTest, BuildModelOnAMisfitThrowsInvalidArgument) {
  EXPECT_THROW(BuildModel(*ParseModelSpec("conv2d:4:3"), {784}), std::invalid_argument);
}

// The output of dropout:0.5 on ones, with the job's generator seeded with `seed`. The global
// generator is seeded differently each time, to show that the mask does not come from it.
torch::Tensor DropoutOutput(uint64_t seed) {
  static int64_t global_seed = 0;
  torch::manual_seed(++global_seed);
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("dropout:0.5"), {1000},
                                           at::detail::createCPUGenerator(seed));
  return model->forward(torch::ones({4, 1000}));
}

TEST(ModelTest, DropoutWithTheSameSeedDrawsTheSameMask) {
  EXPECT_TRUE(torch::equal(DropoutOutput(7), DropoutOutput(7)));
}

TEST(ModelTest, DropoutWithAnotherSeedDrawsAnotherMask) {
  EXPECT_FALSE(torch::equal(DropoutOutput(7), DropoutOutput(8)));
}

TEST(ModelTest, DropoutZeroesAboutPAndScalesTheRest) {
  const torch::Tensor output = DropoutOutput(7);
  const torch::Tensor zeros = output.eq(0);
  EXPECT_TRUE(torch::logical_or(zeros, output.eq(2)).all().item<bool>());
  const double dropped = zeros.to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(dropped, 0.45);
  EXPECT_LT(dropped, 0.55);
}

TEST(ModelTest, DropoutIsTheIdentityInEvalMode) {
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("dropout:0.5"), {100},
                                           at::detail::createCPUGenerator(7));
  model->eval();
  const torch::Tensor x = torch::randn({4, 100});
  EXPECT_TRUE(torch::equal(model->forward(x), x));
}

TEST(ModelTest, DropoutMasksDifferFromStepToStep) {
  torch::nn::Sequential model = BuildModel(*ParseModelSpec("dropout:0.5"), {1000},
                                           at::detail::createCPUGenerator(7));
  const torch::Tensor first = model->forward(torch::ones({4, 1000}));
  EXPECT_FALSE(torch::equal(first, model->forward(torch::ones({4, 1000}))));
}

// --- CheckJobSpec with the new layers. ---

TEST(ModelTest, Conv2dOnFlatRowsNamesTheLayerAndShapes) {
  absl::StatusOr<ModelSpec> model =
      CheckJobSpec(Spec("conv2d:8:3,relu,flatten,linear:1"), FloatDataset({784}, {}));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            "model 'conv2d:8:3,relu,flatten,linear:1' does not fit dataset 'd' (784 features per "
            "row): layer 1 (conv2d:8:3) needs a per-row input of shape CxHxW; the input is 784");
}

TEST(ModelTest, PoolThatShrinksBelowOnePixelNamesTheShapes) {
  absl::StatusOr<ModelSpec> model = CheckJobSpec(
      Spec("conv2d:8:3,relu,maxpool2d:4,flatten,linear:1"), FloatDataset({1, 4, 4}, {}));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr("(1x4x4 features per row): layer 3 (maxpool2d:4) would shrink 8x2x2 "
                        "below 1x1"));
}

TEST(ModelTest, CnnOnImageRowsIsAccepted) {
  absl::StatusOr<ModelSpec> model = CheckJobSpec(
      Spec("conv2d:4:3,relu,maxpool2d:2,flatten,linear:1"), FloatDataset({1, 28, 28}, {}));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->ToString(), "conv2d:4:3,relu,maxpool2d:2,flatten,linear:1");
}

TEST(ModelTest, BatchNormOnVectorsWithBatchSizeOneIsInvalidArgument) {
  JobSpec spec = Spec("linear:4,batchnorm,linear:1");
  spec.batch_size = 1;
  absl::StatusOr<ModelSpec> model = CheckJobSpec(spec, FloatDataset({3}, {}));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            "layer 2 (batchnorm) needs at least 2 rows per batch to train on 4 rows; the batch "
            "size is 1 and dataset 'd' has 10 rows");
}

TEST(ModelTest, BatchNormOnImagesWithBatchSizeOneIsAccepted) {
  JobSpec spec = Spec("batchnorm,flatten,linear:1");
  spec.batch_size = 1;
  EXPECT_TRUE(CheckJobSpec(spec, FloatDataset({2, 3, 3}, {})).ok());
}

// --- A small CNN trained through the Engine. ---

class ModelEngineTest : public test_support::EngineFixture {};

// `rows` 1x28x28 images of noise around a brightness of -0.5 (class 0) or +0.5 (class 1), with
// int64 class targets alternating 0, 1.
Table BrightnessTable(int64_t rows) {
  std::mt19937 gen(5);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  Table table;
  table.feature_shape = {1, 28, 28};
  table.target_shape = {};
  table.target_dtype = TargetDType::kInt64;
  table.rows = rows;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t label = row % 2;
    for (int i = 0; i < 28 * 28; ++i) {
      table.features.push_back((label == 0 ? -0.5f : 0.5f) + noise(gen));
    }
    table.targets_i64.push_back(label);
  }
  return table;
}

TEST_F(ModelEngineTest, SmallCnnOnImageRowsTrainsWithOneSyncPerEpoch) {
  ASSERT_TRUE(test_support::Upload(*engine_, "images", BrightnessTable(256)).ok());
  JobSpec spec = test_support::SeedSpec("images");
  spec.model = "conv2d:4:3,relu,maxpool2d:2,flatten,linear:2";
  spec.loss = LossKind::kCrossEntropy;
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.01;
  spec.batch_size = 32;
  spec.epochs = 3;

  const absl::StatusOr<JobSnapshot> job = test_support::RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  const std::vector<double> losses = test_support::Losses(*job);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LT(losses.back(), losses.front());
  // conv 1*4*3*3 + 4, linear 4*13*13*2 + 2: more than the 1,000 values read back at the end.
  EXPECT_EQ(job->parameter_count, 40 + 1354);
  EXPECT_EQ(CountParameters(*ParseModelSpec(spec.model), {1, 28, 28}).value_or(-1),
            job->parameter_count);
  EXPECT_EQ(job->host_syncs, 3);
}

TEST_F(ModelEngineTest, DropoutJobRepeatsItsLossesWithTheSameSeed) {
  ASSERT_TRUE(test_support::Upload(*engine_, "images", BrightnessTable(64)).ok());
  JobSpec spec = test_support::SeedSpec("images");
  spec.model = "flatten,linear:8,relu,dropout:0.5,linear:2";
  spec.loss = LossKind::kCrossEntropy;
  spec.learning_rate = 0.05;
  spec.batch_size = 16;
  spec.epochs = 2;

  const absl::StatusOr<JobSnapshot> first = test_support::RunJob(*engine_, spec);
  const absl::StatusOr<JobSnapshot> second = test_support::RunJob(*engine_, spec);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(first->state, JobState::kSucceeded) << first->error;
  ASSERT_EQ(second->state, JobState::kSucceeded) << second->error;
  EXPECT_EQ(test_support::Losses(*first), test_support::Losses(*second));  // exact
}

}  // namespace
}  // namespace trainerd::engine
