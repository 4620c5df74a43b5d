// Tests for server/engine/training/state_dict.h: a spec-built model's safetensors holds exactly
// nn.Sequential's state_dict (names, order, dtypes, values) for every layer kind of the grammar; a
// TorchScript module's holds its own state_dict names; and a job through the Engine keeps
// <data_dir>/models/<id>.safetensors, stamped with its id and checked by its digest.
#include "server/engine/training/state_dict.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/training/model.h"
#include "server/engine/training/torchscript_export.h"
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
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Pair;

std::vector<std::string> Names(const SafetensorsFile& file) {
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : file.tensors) names.push_back(e.name);
  return names;
}

// The tensor `e` of `file` as a CPU tensor of `dtype`.
torch::Tensor Read(const std::string& file, const SafetensorsEntry& e, torch::ScalarType dtype) {
  torch::Tensor t = torch::empty(e.shape, torch::TensorOptions(dtype));
  EXPECT_EQ(t.numel() * t.element_size(), e.size);
  std::memcpy(t.data_ptr(), file.data() + e.offset, static_cast<size_t>(e.size));
  return t;
}

TEST(StateDictTest, EveryLayerKindHasNnSequentialsNamesOrderAndValues) {
  // Every kind of the grammar: conv2d, batchnorm (2d and 1d), relu, maxpool2d, avgpool2d,
  // flatten, dropout, linear, layernorm, gelu, tanh, sigmoid, logsoftmax (softmax below).
  const std::string text =
      "conv2d:4:3:1:1,batchnorm,relu,maxpool2d:2,conv2d:4:3,avgpool2d:2,flatten,dropout:0.5,"
      "linear:8,batchnorm,layernorm,gelu,tanh,sigmoid,linear:3,logsoftmax";
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  torch::manual_seed(3);
  torch::nn::Sequential model = BuildModel(*spec, {2, 10, 10});
  model->train();
  model->forward(torch::randn({5, 2, 10, 10}));  // running statistics move, one batch counted
  model->forward(torch::randn({5, 2, 10, 10}));

  const HostModelState state = CopyModelStateToHost(model);
  const absl::StatusOr<std::string> file = SequentialSafetensors(state, *spec, {2, 10, 10});
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // What torch.nn.Sequential(*layers).state_dict() lists for these layers: each layer's
  // parameters then its buffers, layer by layer ("10" after "9").
  EXPECT_THAT(Names(*parsed),
              ElementsAre("0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                          "1.running_var", "1.num_batches_tracked", "4.weight", "4.bias",
                          "8.weight", "8.bias", "9.weight", "9.bias", "9.running_mean",
                          "9.running_var", "9.num_batches_tracked", "10.weight", "10.bias",
                          "14.weight", "14.bias"));
  auto parameters = model->named_parameters();
  auto buffers = model->named_buffers();
  for (const SafetensorsEntry& e : parsed->tensors) {
    SCOPED_TRACE(e.name);
    if (e.name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(e.dtype, "I64");
      EXPECT_TRUE(e.shape.empty());
      EXPECT_EQ(Read(*file, e, torch::kInt64).item<int64_t>(), 2);
      continue;
    }
    EXPECT_EQ(e.dtype, "F32");
    const torch::Tensor expected =
        parameters.contains(e.name) ? parameters[e.name] : buffers[e.name];
    EXPECT_THAT(e.shape, ElementsAreArray(expected.sizes().vec()));
    EXPECT_TRUE(torch::equal(Read(*file, e, torch::kFloat32), expected));
  }
  EXPECT_THAT(parsed->metadata,
              ElementsAre(Pair("format", "pt"), Pair("trainerd.feature_shape", "[2, 10, 10]"),
                          Pair("trainerd.model", spec->ToString())));

  const absl::StatusOr<ModelSpec> softmax = ParseModelSpec("linear:4,softmax");
  ASSERT_TRUE(softmax.ok());
  const absl::StatusOr<std::string> small = SequentialSafetensors(
      CopyModelStateToHost(BuildModel(*softmax, {3})), *softmax, {3});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_THAT(Names(*ParseSafetensors(*small)), ElementsAre("0.weight", "0.bias"));
}

TEST(StateDictTest, AModuleHasItsOwnStateDictNamesInNnModulesOrder) {
  torch::jit::Module child("Block");
  child.register_attribute("training", c10::BoolType::get(), false);
  child.register_parameter("weight", torch::ones({2, 2}), /*is_buffer=*/false);
  child.register_buffer("steps", torch::full({}, 5, torch::kInt64));
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), false);
  net.register_parameter("scale", torch::full({1}, 2.0), /*is_buffer=*/false);
  net.register_buffer("mean", torch::zeros({2}, torch::kFloat64));
  net.register_module("encoder", child);
  const absl::StatusOr<std::string> file = ModuleSafetensors(net, {2});
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(Names(*parsed), ElementsAre("scale", "mean", "encoder.weight", "encoder.steps"));
  EXPECT_EQ(parsed->tensors[1].dtype, "F64");  // kept as the module holds it
  EXPECT_EQ(parsed->tensors[3].dtype, "I64");
  EXPECT_EQ(Read(*file, parsed->tensors[3], torch::kInt64).item<int64_t>(), 5);
  EXPECT_THAT(parsed->metadata, ElementsAre(Pair("format", "pt"),
                                            Pair("trainerd.feature_shape", "[2]"),
                                            Pair("trainerd.model", "torchscript")));
}

class EngineStateDictTest : public EngineFixture {};

TEST_F(EngineStateDictTest, SucceededJobKeepsItsStateDictStampedAndChecked) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:4,tanh,linear:1";
  spec.epochs = 3;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;

  const absl::StatusOr<Engine::StateDictFile> kept = engine_->StateDictPath(job->id);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->path, dir_.path() + "/models/" + job->id + ".safetensors");
  const absl::StatusOr<std::string> bytes = ReadFileToString(kept->path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(kept->sha256, Sha256Hex(*bytes));
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(Names(*parsed), ElementsAre("0.weight", "0.bias", "2.weight", "2.bias"));
  EXPECT_THAT(parsed->metadata, ::testing::Contains(Pair("trainerd.job", job->id)));
  EXPECT_THAT(parsed->metadata,
              ::testing::Contains(Pair("trainerd.model", "linear:4,tanh,linear:1")));
  // The values are the ones the job reports.
  for (const SafetensorsEntry& e : parsed->tensors) {
    const ParameterValues* p = FindParameter(*job, e.name);
    ASSERT_NE(p, nullptr) << e.name;
    const torch::Tensor reported = torch::tensor(p->values).reshape(p->shape);
    EXPECT_TRUE(torch::equal(Read(*bytes, e, torch::kFloat32), reported)) << e.name;
  }

  ASSERT_TRUE(engine_->DeleteJob(job->id).ok());
  EXPECT_FALSE(std::filesystem::exists(kept->path));
  EXPECT_FALSE(std::filesystem::exists(kept->path + ".sha256"));
}

TEST_F(EngineStateDictTest, StateDictOfRunningJobIsFailedPrecondition) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Status status = engine_->StateDictPath(job->id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("its model is available once it succeeds"));
  ASSERT_TRUE(engine_->CancelJob(job->id).ok());
  EXPECT_EQ(engine_->StateDictPath("job-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EngineStateDictTest, JobWithoutAStateDictSaysSo) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  // As a job of a build that kept none.
  const std::string path = dir_.path() + "/models/" + job->id + ".safetensors";
  ASSERT_TRUE(std::filesystem::remove(path + ".sha256"));
  const absl::Status status = engine_->StateDictPath(job->id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("has no safetensors state_dict"));
}

}  // namespace
}  // namespace trainerd::engine
