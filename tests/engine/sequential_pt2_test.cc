// Tests for server/engine/training/sequential_pt2.h: a spec-built model's .pt2, made from its
// kept state_dict, passes the daemon's own checks of an exported program and, loaded by its
// runtime (which takes the training graph and switches it), computes what the model computes in
// evaluation mode for every layer kind and any batch size; the evaluation graph differs from it
// only in the modes it fixes; other state_dicts and damaged ones are refused with the right
// status. (tests/python/test_models_out.py loads the evaluation graph with torch.export.load and
// compares it with torch's own export.)
#include "server/engine/training/sequential_pt2.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/training/exported_program.h"
#include "server/engine/training/model.h"
#include "server/engine/training/state_dict.h"
#include "server/engine/training/torchscript_export.h"

namespace trainerd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

struct Trained {
  torch::nn::Sequential model;
  std::string state_dict;
};

// The spec's model with trained-looking weights and batch-norm statistics that have moved.
Trained Train(const std::string& text, const std::vector<int64_t>& row) {
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  torch::manual_seed(11);
  torch::nn::Sequential model = BuildModel(*spec, row);
  std::vector<int64_t> batch = {6};
  batch.insert(batch.end(), row.begin(), row.end());
  model->train();
  for (int i = 0; i < 3; ++i) model->forward(torch::randn(batch) * 2 + 0.5);
  model->eval();
  absl::StatusOr<std::string> file = SequentialSafetensors(CopyModelStateToHost(model), *spec, row);
  EXPECT_TRUE(file.ok()) << file.status();
  return {model, file.ok() ? *file : std::string()};
}

TEST(SequentialPt2Test, EveryLayerKindComputesAsTheModelInEvaluation) {
  const std::vector<int64_t> row = {2, 10, 10};
  Trained t = Train(
      "conv2d:4:3:1:1,batchnorm,relu,maxpool2d:2,conv2d:4:3,avgpool2d:2,flatten,dropout:0.5,"
      "linear:8,batchnorm,layernorm,gelu,tanh,sigmoid,linear:3,logsoftmax",
      row);
  const absl::StatusOr<std::string> pt2 = SequentialPt2(t.state_dict, Pt2Mode::kTraining);
  ASSERT_TRUE(pt2.ok()) << pt2.status();
  // The evaluation graph is the one the runtime refuses: its batch norm cannot be switched.
  const absl::StatusOr<std::string> deployed = SequentialPt2(t.state_dict);
  ASSERT_TRUE(deployed.ok()) << deployed.status();
  EXPECT_THAT(CheckExportedProgram(*deployed).status().message(),
              HasSubstr("node 'batch_norm' (torch.ops.aten.batch_norm.default) runs in "
                        "evaluation mode"));

  const absl::StatusOr<ExportedProgramInfo> info = CheckExportedProgram(*pt2);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->input_shape, ElementsAreArray(row));
  EXPECT_THAT(info->output_shape, ElementsAre(3));
  int64_t values = 0;
  for (const torch::Tensor& p : t.model->parameters()) values += p.numel();
  EXPECT_EQ(info->parameter_count, values);

  absl::StatusOr<std::shared_ptr<ExportedProgram>> program = ExportedProgram::Load(*pt2);
  ASSERT_TRUE(program.ok()) << program.status();
  (*program)->Train(false);
  // The buffers came through: batch norm's statistics and its count of batches.
  auto buffers = t.model->named_buffers();
  ASSERT_EQ((*program)->named_buffers().size(), 6u);
  for (const auto& [name, value] : (*program)->named_buffers()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(torch::equal(value, buffers[name]));
  }
  torch::NoGradGuard no_grad;
  for (int64_t rows : {1, 5, 32}) {
    SCOPED_TRACE(rows);
    const torch::Tensor x = torch::randn({rows, 2, 10, 10});
    const torch::Tensor expected = t.model->forward(x);
    const torch::Tensor got = (*program)->Forward(x);
    ASSERT_EQ(got.sizes(), expected.sizes());
    EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6))
        << (got - expected).abs().max().item<float>();
  }
}

TEST(SequentialPt2Test, SoftmaxAndAFlatRow) {
  Trained t = Train("linear:16,relu,dropout:0.2,linear:4,softmax", {7});
  const absl::StatusOr<std::string> pt2 = SequentialPt2(t.state_dict, Pt2Mode::kTraining);
  ASSERT_TRUE(pt2.ok()) << pt2.status();
  absl::StatusOr<std::shared_ptr<ExportedProgram>> program = ExportedProgram::Load(*pt2);
  ASSERT_TRUE(program.ok()) << program.status();
  (*program)->Train(false);
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({9, 7});
  const torch::Tensor got = (*program)->Forward(x);
  EXPECT_TRUE(torch::allclose(got, t.model->forward(x), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(got.sum(1), torch::ones({9}), 1e-5, 1e-6));
}

TEST(SequentialPt2Test, OtherStateDictsAndDamagedOnesAreRefused) {
  Trained t = Train("linear:3", {4});
  // A TorchScript module's or an exported program's state_dict: not a spec's.
  for (const char* model : {"torchscript", "exported"}) {
    const absl::StatusOr<std::string> other =
        SetSafetensorsMetadata(t.state_dict, "trainerd.model", model);
    ASSERT_TRUE(other.ok());
    const absl::StatusOr<std::string> pt2 = SequentialPt2(*other);
    EXPECT_EQ(pt2.status().code(), absl::StatusCode::kFailedPrecondition) << pt2.status();
  }
  // Weights that are not the spec's.
  const absl::StatusOr<std::string> wider =
      SetSafetensorsMetadata(t.state_dict, "trainerd.model", "linear:5");
  ASSERT_TRUE(wider.ok());
  EXPECT_THAT(SequentialPt2(*wider).status().message(), HasSubstr("'0.weight'"));
  EXPECT_EQ(SequentialPt2(*wider).status().code(), absl::StatusCode::kDataLoss);
  const absl::StatusOr<std::string> shape =
      SetSafetensorsMetadata(t.state_dict, "trainerd.feature_shape", "[4, x]");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(SequentialPt2(*shape).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(SequentialPt2("not a safetensors file").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace trainerd::engine
