// Tests for server/engine/model.h: CheckJobSpec's edge cases not reached through Submit's common
// paths, BuildModel's layer names, and ComputeLoss's target reshaping.
#include "server/engine/model.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  EXPECT_FLOAT_EQ(ComputeLoss(LossKind::kMse, output, targets).item<float>(), 4.0f / 3.0f);
}

TEST(ModelTest, CrossEntropyLossOfConfidentRightAnswersIsNearZero) {
  torch::Tensor output = torch::tensor({20.0f, 0.0f, 0.0f, 20.0f}).view({2, 2});
  torch::Tensor targets = torch::tensor({0, 1}, torch::kInt64).view({2, 1});
  EXPECT_LT(ComputeLoss(LossKind::kCrossEntropy, output, targets).item<float>(), 1e-6f);
}

}  // namespace
}  // namespace trainerd::engine
