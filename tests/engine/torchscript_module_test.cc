// Tests for bring-your-own-model jobs (server/engine/torchscript_module.h and the trainer's
// TorchScript path): a torch::jit::Module assembled in C++ with define() stands in for one saved
// from PyTorch, so no Python is needed. It trains through the Engine like a spec-built model, its
// buffers are kept, a module that does not fit the dataset fails at Submit, and the job's model
// download is the trained module.
#include "server/engine/torchscript/torchscript_module.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::FindParameter;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;

// A module "Net" computing torch.linear(x, w, b) with w of shape [outputs, inputs], plus a
// buffer "calls" that its forward never touches; saved as torch.jit.save would.
std::string LinearModuleBytes(int64_t inputs, int64_t outputs) {
  torch::manual_seed(5);
  torch::jit::Module m("Net");
  // nn.Module's flag, which every module scripted in Python carries (train() and eval() set it).
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::randn({outputs, inputs}), /*is_buffer=*/false);
  m.register_parameter("b", torch::zeros({outputs}), /*is_buffer=*/false);
  m.register_buffer("calls", torch::full({1}, 7.0));
  m.define("def forward(self, x):\n  return torch.linear(x, self.w, self.b)\n");
  std::ostringstream out;
  m.save(out);
  return out.str();
}

class TorchScriptModuleTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
  // The seed job (mse, sgd, 100 epochs) with a TorchScript module instead of linear:1.
  JobSpec ModuleSpec(std::string bytes) const {
    JobSpec spec = SeedSpec("seed");
    spec.model = "";
    spec.torchscript = std::move(bytes);
    return spec;
  }
};

// Autocast reaches the ops a TorchScript module's interpreter dispatches: a bf16 job's losses
// differ from the fp32 job's, and both learn the line. The module's parameters stay float32.
TEST_F(TorchScriptModuleTest, Bf16TrainsTheModuleUnderAutocast) {
  const std::string bytes = LinearModuleBytes(/*inputs=*/1, /*outputs=*/1);
  JobSpec bf16 = ModuleSpec(bytes);
  bf16.precision = Precision::kBf16;
  const absl::StatusOr<JobSnapshot> a = RunJob(*engine_, ModuleSpec(bytes));
  const absl::StatusOr<JobSnapshot> b = RunJob(*engine_, bf16);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(b->state, JobState::kSucceeded) << b->error;
  EXPECT_NE(test_support::Losses(*a), test_support::Losses(*b));
  EXPECT_LT(b->final_loss, 0.0125);
  EXPECT_EQ(b->host_syncs, a->host_syncs);
  const absl::StatusOr<std::string> path = engine_->ModelArchivePath(b->id);
  ASSERT_TRUE(path.ok()) << path.status();
  torch::jit::Module loaded = torch::jit::load(*path);
  EXPECT_EQ(loaded.attr("w").toTensor().scalar_type(), torch::kFloat32);
}

TEST_F(TorchScriptModuleTest, LinearModuleConvergesOnSeedDataAndKeepsItsBuffer) {
  const std::string bytes = LinearModuleBytes(/*inputs=*/1, /*outputs=*/1);
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, ModuleSpec(bytes));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->spec.model, absl::StrCat("torchscript (", bytes.size(), " bytes)"));
  EXPECT_TRUE(job->spec.torchscript.empty());
  EXPECT_EQ(job->parameter_count, 2);
  const ParameterValues* w = FindParameter(*job, "w");
  const ParameterValues* b = FindParameter(*job, "b");
  ASSERT_NE(w, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NEAR(w->values.at(0), 2.0, 0.05);
  EXPECT_NEAR(b->values.at(0), 1.0, 0.05);
  // One transfer per epoch plus the parameter read-back, as for a spec-built model.
  EXPECT_EQ(job->host_syncs, job->spec.epochs + 1);

  // The download is the trained module: same code, trained parameters, buffer as it was.
  const absl::StatusOr<std::string> path = engine_->ModelArchivePath(job->id);
  ASSERT_TRUE(path.ok()) << path.status();
  torch::jit::Module loaded = torch::jit::load(*path);
  EXPECT_FALSE(loaded.is_training());
  EXPECT_EQ(loaded.attr("calls").toTensor().item<float>(), 7.0f);
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::tensor({{0.0f}, {0.5f}, {1.0f}});
  const torch::Tensor y = loaded.forward({x}).toTensor();
  const torch::Tensor expected = x * w->values[0] + b->values[0];
  EXPECT_TRUE(torch::allclose(y, expected, /*rtol=*/1e-6, /*atol=*/1e-6));
}

TEST_F(TorchScriptModuleTest, ForwardOfWrongWidthIsRefusedAtSubmitNamingTheShape) {
  const absl::StatusOr<JobSnapshot> job =
      engine_->SubmitJob(ModuleSpec(LinearModuleBytes(/*inputs=*/3, /*outputs=*/1)));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr("the TorchScript module's forward does not accept a batch of shape "
                        "[2, 1]"));
  EXPECT_TRUE(engine_->ListJobs()->jobs.empty());
}

TEST_F(TorchScriptModuleTest, GarbageBytesAreRefusedAtSubmit) {
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(ModuleSpec("not a zip archive"));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("the TorchScript module cannot be loaded"));
}

TEST_F(TorchScriptModuleTest, OutputThatDoesNotFitTheTargetsIsRefusedAtSubmit) {
  // Three outputs per row; the seed data's mse targets are one value per row.
  const absl::StatusOr<JobSnapshot> job =
      engine_->SubmitJob(ModuleSpec(LinearModuleBytes(/*inputs=*/1, /*outputs=*/3)));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("torchscript ("));
  EXPECT_THAT(job.status().message(), HasSubstr("outputs 3 per row"));
}

TEST_F(TorchScriptModuleTest, ModuleWithoutParametersIsRefusedAtSubmit) {
  torch::jit::Module m("Net");
  m.register_buffer("scale", torch::ones({1}));
  m.define("def forward(self, x):\n  return x * self.scale\n");
  std::ostringstream out;
  m.save(out);
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(ModuleSpec(out.str()));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("no parameters"));
}

TEST_F(TorchScriptModuleTest, ModelSpecAndModuleTogetherAreRefused) {
  JobSpec spec = ModuleSpec(LinearModuleBytes(1, 1));
  spec.model = "linear:1";
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("not both"));
}

TEST_F(TorchScriptModuleTest, ModelNamedTorchscriptIsAccepted) {
  JobSpec spec = ModuleSpec(LinearModuleBytes(1, 1));
  spec.model = "torchscript";
  spec.epochs = 2;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->epochs.size(), 2u);
}

}  // namespace
}  // namespace trainerd::engine
