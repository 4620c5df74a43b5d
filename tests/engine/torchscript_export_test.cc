// Tests for server/engine/torchscript_export.h: a spec-built model exported as TorchScript loads
// back with torch::jit::load and computes what the trained torch::nn::Sequential computes in eval
// mode, for every layer kind; and a job through the Engine leaves its model as
// <data_dir>/models/<id>.pt, whose outputs match the parameters the engine reports.
#include "server/engine/training/torchscript_export.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/training/model.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::BlockerSpec;
using test_support::EngineFixture;
using test_support::FindParameter;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;

constexpr int64_t kRows = 8;

// Builds `spec_text` for `input_shape`, trains it for a few SGD steps in training mode (so that
// batchnorm's running statistics move away from their initial values), exports it and checks that
// the loaded archive's forward equals the model's in eval mode on a fresh random batch.
void ExpectExportMatchesModel(const std::string& spec_text,
                              const std::vector<int64_t>& input_shape) {
  SCOPED_TRACE(spec_text);
  torch::manual_seed(11);
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec(spec_text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  torch::nn::Sequential model = BuildModel(*spec, input_shape);
  std::vector<int64_t> batch_shape = {kRows};
  batch_shape.insert(batch_shape.end(), input_shape.begin(), input_shape.end());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(/*lr=*/0.05));
  model->train();
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    torch::Tensor out = model->forward(torch::randn(batch_shape));
    out.pow(2).mean().backward();
    optimizer.step();
  }

  const absl::StatusOr<std::string> archive = ExportTorchScript(model, *spec, input_shape);
  ASSERT_TRUE(archive.ok()) << archive.status();
  ASSERT_GE(archive->size(), 2u);
  EXPECT_EQ(archive->substr(0, 2), "PK");  // a ZIP file, as torch.jit.save writes

  std::istringstream in(*archive);
  torch::jit::Module loaded = torch::jit::load(in);
  loaded.eval();
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn(batch_shape);
  const torch::Tensor expected = model->forward(x);
  const torch::Tensor actual = loaded.forward({x}).toTensor();
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(torch::allclose(actual, expected, /*rtol=*/1e-5, /*atol=*/1e-5))
      << "max difference " << (actual - expected).abs().max().item<double>();
}

TEST(TorchScriptExportTest, MlpMatchesTrainedModel) {
  ExpectExportMatchesModel("linear:16,relu,linear:8,tanh,linear:4,sigmoid,linear:2", {5});
}

TEST(TorchScriptExportTest, CnnWithPoolingMatchesTrainedModel) {
  ExpectExportMatchesModel(
      "conv2d:4:3,relu,maxpool2d:2,conv2d:6:3:2:1,avgpool2d:2,flatten,linear:10", {1, 12, 12});
}

TEST(TorchScriptExportTest, NormalisationAndActivationsMatchTrainedModelInEvalMode) {
  ExpectExportMatchesModel(
      "conv2d:3:3:1:1,batchnorm,gelu,flatten,dropout:0.5,linear:12,batchnorm,layernorm,relu,"
      "linear:5,softmax",
      {2, 6, 6});
  ExpectExportMatchesModel("layernorm,linear:3,flatten,linear:6,logsoftmax", {2, 4, 4});
}

TEST(TorchScriptExportTest, ExportedTensorsHaveTheSequentialsNamesAndValues) {
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec("linear:3,batchnorm,relu,linear:2");
  ASSERT_TRUE(spec.ok());
  torch::nn::Sequential model = BuildModel(*spec, {2});
  model->train();
  model->forward(torch::randn({4, 2}));  // moves the running statistics and counts one batch
  const absl::StatusOr<std::string> archive = ExportTorchScript(model, *spec, {2});
  ASSERT_TRUE(archive.ok()) << archive.status();
  std::istringstream in(*archive);
  torch::jit::Module loaded = torch::jit::load(in);
  // Python's torch.jit.load(...).state_dict() has these keys: nn.Sequential's.
  std::vector<std::string> parameters;
  for (const auto& p : loaded.named_parameters(/*recurse=*/true)) {
    parameters.push_back(p.name);
    EXPECT_TRUE(torch::equal(p.value, model->named_parameters()[p.name])) << p.name;
  }
  EXPECT_THAT(parameters,
              ::testing::ElementsAre("0.weight", "0.bias", "1.weight", "1.bias", "3.weight",
                                     "3.bias"));
  std::vector<std::string> buffers;
  for (const auto& b : loaded.named_buffers(/*recurse=*/true)) {
    buffers.push_back(b.name);
    EXPECT_TRUE(torch::equal(b.value, model->named_buffers()[b.name])) << b.name;
  }
  EXPECT_THAT(buffers, ::testing::ElementsAre("1.running_mean", "1.running_var",
                                              "1.num_batches_tracked"));
  EXPECT_EQ(loaded.attr("1").toModule().attr("num_batches_tracked").toTensor().item<int64_t>(),
            1);
  EXPECT_EQ(loaded.attr("1").toModule().attr("num_batches_tracked").toTensor().scalar_type(),
            torch::kInt64);
  EXPECT_FALSE(loaded.hasattr("l0_weight"));
}

TEST(TorchScriptExportTest, SourceNamesEachLayer) {
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec("conv2d:2:3,flatten,linear:1");
  ASSERT_TRUE(spec.ok());
  const absl::StatusOr<std::string> source = TorchScriptSource(*spec, {1, 5, 5});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT(*source, HasSubstr("torch.conv2d(x, getattr(self, \"0\").weight, "
                                 "getattr(self, \"0\").bias, [1, 1], [0, 0]"));
  EXPECT_THAT(*source, HasSubstr("torch.flatten(x, 1)"));
  EXPECT_THAT(*source, HasSubstr("torch.linear(x, getattr(self, \"2\").weight, "
                                 "getattr(self, \"2\").bias)"));
}

TEST(TorchScriptExportTest, SourceForShapeThatDoesNotFitIsInvalidArgument) {
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec("conv2d:2:3");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(TorchScriptSource(*spec, {4}).status().code(), absl::StatusCode::kInvalidArgument);
}

class EngineModelExportTest : public EngineFixture {};

TEST_F(EngineModelExportTest, SucceededJobLeavesModelWhoseOutputsMatchReportedParameters) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:4,tanh,linear:1";
  spec.epochs = 5;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->host_syncs, 5 + 1);  // the export adds no transfer on the CPU

  const absl::StatusOr<std::string> path = engine_->ModelArchivePath(job->id);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir_.path() + "/models/" + job->id + ".pt");
  torch::jit::Module loaded = torch::jit::load(*path);

  // The daemon's model, rebuilt from the parameters it reports.
  const ParameterValues* w0 = FindParameter(*job, "0.weight");
  const ParameterValues* b0 = FindParameter(*job, "0.bias");
  const ParameterValues* w2 = FindParameter(*job, "2.weight");
  const ParameterValues* b2 = FindParameter(*job, "2.bias");
  ASSERT_TRUE(w0 && b0 && w2 && b2);
  auto tensor = [](const ParameterValues& p) { return torch::tensor(p.values).reshape(p.shape); };
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::linspace(-1, 2, /*steps=*/7).reshape({7, 1});
  const torch::Tensor expected = torch::linear(
      torch::tanh(torch::linear(x, tensor(*w0), tensor(*b0))), tensor(*w2), tensor(*b2));
  const torch::Tensor actual = loaded.forward({x}).toTensor();
  EXPECT_TRUE(torch::allclose(actual, expected, /*rtol=*/1e-5, /*atol=*/1e-6))
      << actual << expected;
}

TEST_F(EngineModelExportTest, ModelOfUnknownJobIsNotFound) {
  EXPECT_EQ(engine_->ModelArchivePath("job-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EngineModelExportTest, ModelOfRunningJobIsFailedPrecondition) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();

  const absl::Status status = engine_->ModelArchivePath(job->id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("its model is available once it succeeds"));
  ASSERT_TRUE(engine_->CancelJob(job->id).ok());
}

TEST_F(EngineModelExportTest, ModelOfCancelledJobIsFailedPrecondition) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(engine_->CancelJob(job->id).ok());
  ASSERT_TRUE(test_support::WaitForEnd(*engine_, job->id).ok());

  const absl::Status status = engine_->ModelArchivePath(job->id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("CANCELLED"));
}

}  // namespace
}  // namespace trainerd::engine
