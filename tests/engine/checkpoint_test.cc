// Tests for server/engine/checkpoint.h and the trainer's checkpoints (JobSpec::checkpoint_every):
// a job writes one archive every N epochs under <data_dir>/checkpoints/<job-id>/, the archives
// load back into a freshly built model and optimizer, the Job lists them, and writing them costs
// no host synchronisation on the CPU.
#include "server/engine/training/checkpoint.h"

#include <sys/stat.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/training/device_step_optimizer.h"
#include "server/engine/training/model.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/precision.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::FindParameter;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;

// A small MLP with momentum, so that the optimizer has state worth saving (a momentum buffer per
// parameter) and the model reports its parameters in the Job (at most 1,000 values).
JobSpec CheckpointSpec() {
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:4,tanh,linear:1";
  spec.momentum = 0.9;
  spec.epochs = 6;
  spec.checkpoint_every = 2;
  return spec;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// A checkpoint loaded into a model and optimizer built afresh from the job's spec, as a resume
// will do.
struct Loaded {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  int64_t epoch = 0;
  int64_t seed = 0;
};

Loaded LoadCheckpoint(const std::string& path, const JobSpec& spec) {
  Loaded loaded;
  const absl::StatusOr<ModelSpec> model_spec = ParseModelSpec(spec.model);
  EXPECT_TRUE(model_spec.ok()) << model_spec.status();
  loaded.model = BuildModel(*model_spec, /*input_shape=*/{1});
  loaded.optimizer = MakeOptimizer(spec, loaded.model->parameters());
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::serialize::InputArchive model_archive;
  archive.read(kCheckpointModelKey, model_archive);
  loaded.model->load(model_archive);
  torch::serialize::InputArchive optimizer_archive;
  archive.read(kCheckpointOptimizerKey, optimizer_archive);
  loaded.optimizer->load(optimizer_archive);
  torch::serialize::InputArchive meta;
  archive.read(kCheckpointMetaKey, meta);
  torch::Tensor value;
  meta.read("epoch", value);
  loaded.epoch = value.item<int64_t>();
  meta.read("seed", value);
  loaded.seed = value.item<int64_t>();
  return loaded;
}

class CheckpointTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
};

TEST(CheckpointFileNameTest, IsZeroPaddedSoThatNamesSortByEpoch) {
  EXPECT_EQ(CheckpointFileName(10), "epoch-000010.pt");
  EXPECT_EQ(CheckpointFileName(2), "epoch-000002.pt");
}

TEST_F(CheckpointTest, EveryTwoEpochsOfSixWritesThreeListedFiles) {
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, CheckpointSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_EQ(job->checkpoints.size(), 3u);
  const std::vector<int32_t> epochs = {2, 4, 6};
  for (size_t i = 0; i < epochs.size(); ++i) {
    const CheckpointInfo& checkpoint = job->checkpoints[i];
    EXPECT_EQ(checkpoint.epoch, epochs[i]);
    EXPECT_EQ(checkpoint.path,
              "checkpoints/" + job->id + "/" + CheckpointFileName(epochs[i]));
    EXPECT_EQ(checkpoint.size_bytes, FileSize(dir_.path() + "/" + checkpoint.path));
    EXPECT_GT(checkpoint.size_bytes, 0);
    EXPECT_NE(checkpoint.create_time, absl::InfinitePast());
  }
  // Exactly those: no file for an odd epoch, no temporary left behind.
  for (int32_t epoch : {1, 3, 5}) {
    EXPECT_FALSE(FileExists(dir_.path() + "/checkpoints/" + job->id + "/" +
                            CheckpointFileName(epoch)));
  }
  EXPECT_FALSE(FileExists(dir_.path() + "/checkpoints/" + job->id + "/" +
                          CheckpointFileName(6) + ".tmp"));
}

TEST_F(CheckpointTest, CheckpointsCostNoHostSyncOnTheCpu) {
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, CheckpointSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->host_syncs, 6 + 1);
}

TEST_F(CheckpointTest, LastCheckpointLoadsIntoFreshModelWithTheTrainedParameters) {
  const JobSpec spec = CheckpointSpec();
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_EQ(job->checkpoints.size(), 3u);

  Loaded loaded = LoadCheckpoint(dir_.path() + "/" + job->checkpoints.back().path, spec);
  EXPECT_EQ(loaded.epoch, 6);
  EXPECT_EQ(loaded.seed, 42);
  // The final epoch's checkpoint holds the parameters the Job reports, bit for bit.
  for (const auto& item : loaded.model->named_parameters()) {
    const ParameterValues* reported = FindParameter(*job, item.key());
    ASSERT_NE(reported, nullptr) << item.key();
    const torch::Tensor expected = torch::tensor(reported->values).reshape(reported->shape);
    EXPECT_TRUE(torch::equal(item.value().detach(), expected))
        << item.key() << item.value() << expected;
  }
  // SGD with momentum keeps one momentum buffer per parameter; all of them came back.
  EXPECT_EQ(loaded.optimizer->state().size(), loaded.model->parameters().size());
}

TEST_F(CheckpointTest, EarlierCheckpointHoldsThatEpochsStateNotTheFinalOne) {
  const JobSpec spec = CheckpointSpec();
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->checkpoints.size(), 3u);
  Loaded first = LoadCheckpoint(dir_.path() + "/" + job->checkpoints.front().path, spec);
  EXPECT_EQ(first.epoch, 2);
  const ParameterValues* reported = FindParameter(*job, "0.weight");
  ASSERT_NE(reported, nullptr);
  const torch::Tensor final_weight = torch::tensor(reported->values).reshape(reported->shape);
  EXPECT_FALSE(torch::equal(first.model->named_parameters()["0.weight"].detach(), final_weight));
}

TEST_F(CheckpointTest, WithoutCheckpointEveryNothingIsWrittenOrListed) {
  JobSpec spec = CheckpointSpec();
  spec.checkpoint_every = 0;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_TRUE(job->checkpoints.empty());
  struct stat st;
  EXPECT_NE(::stat((dir_.path() + "/checkpoints/" + job->id).c_str(), &st), 0);
}

TEST_F(CheckpointTest, NegativeCheckpointEveryIsRejected) {
  JobSpec spec = CheckpointSpec();
  spec.checkpoint_every = -1;
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("checkpoint every"));
}

TEST_F(CheckpointTest, CheckpointEveryBeyondTheEpochsIsRejected) {
  JobSpec spec = CheckpointSpec();
  spec.checkpoint_every = spec.epochs + 1;
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("got 7"));
}

// A checkpoint is insurance: one that cannot be written (a full disk, an I/O error) does not end a
// job that would otherwise finish. The job trains to the end, with the losses of a job whose
// checkpoints were written, and says which checkpoint it went without.
TEST_F(CheckpointTest, ACheckpointThatCannotBeWrittenLeavesTheJobTrainingAndSaysSo) {
  // A plain file where the checkpoints folder belongs: the job's folder cannot be created.
  std::ofstream(dir_.path() + "/checkpoints") << "in the way";
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, CheckpointSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_THAT(job->checkpoint_error, HasSubstr("cannot write the checkpoint of epoch "));
  EXPECT_TRUE(job->checkpoints.empty());
  ASSERT_EQ(std::remove((dir_.path() + "/checkpoints").c_str()), 0);
  const absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, CheckpointSpec());
  ASSERT_TRUE(reference.ok());
  EXPECT_FALSE(reference->checkpoints.empty());
  EXPECT_TRUE(reference->checkpoint_error.empty());
  EXPECT_EQ(Losses(*job), Losses(*reference));
}

TEST_F(CheckpointTest, TorchScriptJobCheckpointsItsParametersByFlatName) {
  // A bring-your-own module: y = linear(x, w, b), saved as torch.jit.save would.
  torch::jit::Module m("Net");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::ones({1, 1}), /*is_buffer=*/false);
  m.register_parameter("b", torch::zeros({1}), /*is_buffer=*/false);
  m.define("def forward(self, x):\n  return torch.linear(x, self.w, self.b)\n");
  std::ostringstream bytes;
  m.save(bytes);
  JobSpec spec = SeedSpec("seed");
  spec.model = "";
  spec.torchscript = bytes.str();
  spec.epochs = 4;
  spec.checkpoint_every = 2;

  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);

  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_EQ(job->checkpoints.size(), 2u);
  torch::serialize::InputArchive archive;
  archive.load_from(dir_.path() + "/" + job->checkpoints.back().path);
  torch::serialize::InputArchive model_archive;
  archive.read(kCheckpointModelKey, model_archive);
  torch::Tensor w;
  model_archive.read("w", w);
  const ParameterValues* reported = FindParameter(*job, "w");
  ASSERT_NE(reported, nullptr);
  EXPECT_TRUE(torch::equal(w, torch::tensor(reported->values).reshape(reported->shape))) << w;
}

TEST_F(CheckpointTest, Fp16CheckpointHoldsTheLossScaleOfItsEpoch) {
  JobSpec spec = CheckpointSpec();
  spec.precision = Precision::kFp16;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_FALSE(job->checkpoints.empty());
  const CheckpointInfo& checkpoint = job->checkpoints.front();
  const EpochResult& epoch = job->epochs.at(checkpoint.epoch - 1);
  ASSERT_TRUE(epoch.loss_scale.has_value());

  torch::serialize::InputArchive archive;
  archive.load_from(dir_.path() + "/" + checkpoint.path);
  torch::serialize::InputArchive scaler_archive;
  ASSERT_TRUE(archive.try_read(kCheckpointLossScalerKey, scaler_archive));
  LossScaler scaler(torch::kCPU, LossScaler::Options{});
  scaler.Load(scaler_archive);
  EXPECT_EQ(scaler.scale().item<double>(), *epoch.loss_scale);
  EXPECT_LT(*epoch.loss_scale, 65536.0);  // the seed job backs off in its first epoch

  // An fp32 job's checkpoints have no scaler part.
  const absl::StatusOr<JobSnapshot> plain = RunJob(*engine_, CheckpointSpec());
  ASSERT_TRUE(plain.ok()) << plain.status();
  torch::serialize::InputArchive plain_archive;
  plain_archive.load_from(dir_.path() + "/" + plain->checkpoints.front().path);
  torch::serialize::InputArchive unused;
  EXPECT_FALSE(plain_archive.try_read(kCheckpointLossScalerKey, unused));
}

// An fp16 Adam job keeps its step count on the device and a skipped step does not advance it
// (as GradScaler skips optimizer.step()): the checkpoint's count is the steps taken, so a resumed
// job's bias correction counts only those.
TEST_F(CheckpointTest, Fp16AdamCheckpointCountsOnlyTheStepsTaken) {
  JobSpec spec = CheckpointSpec();
  spec.precision = Precision::kFp16;
  spec.optimizer = OptimizerKind::kAdam;
  spec.momentum = 0;
  spec.learning_rate = 0.01;
  const absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  const CheckpointInfo& checkpoint = job->checkpoints.front();  // end of epoch 2
  int64_t skipped = 0;
  for (int32_t e = 0; e < checkpoint.epoch; ++e) skipped += job->epochs[e].skipped_steps;
  ASSERT_GT(skipped, 0);  // the seed job overflows 2^16 at first
  const int64_t steps_per_epoch = job->steps / static_cast<int64_t>(job->epochs.size());

  Loaded loaded = LoadCheckpoint(dir_.path() + "/" + checkpoint.path, spec);
  ASSERT_FALSE(loaded.optimizer->state().empty());
  for (const auto& [key, state] : loaded.optimizer->state()) {
    (void)key;
    const auto& adam = static_cast<const DeviceStepParamState&>(*state);
    EXPECT_EQ(adam.step().item<float>(),
              static_cast<float>(steps_per_epoch * checkpoint.epoch - skipped));
  }
}

// A checkpoint of an fp16 Adam job written before the step count moved to the device holds
// LibTorch's AdamParamState (an integer step): it loads into the DeviceStepOptimizer, moments
// and options as they were and the step as a float32 tensor, and the next step equals
// LibTorch's Adam's from the same state.
TEST(CheckpointCompatibilityTest, LibTorchAdamStateLoadsIntoTheDeviceStepOptimizer) {
  auto problem = [](torch::Tensor p) { return (p * torch::tensor({0.5f, -1.0f, 2.0f})).sum(); };
  torch::Tensor p_old = torch::tensor({1.0f, 2.0f, 3.0f}).set_requires_grad(true);
  torch::optim::Adam old_adam({p_old},
                              torch::optim::AdamOptions(0.05).betas(std::make_tuple(0.8, 0.99)));
  for (int i = 0; i < 3; ++i) {
    old_adam.zero_grad();
    problem(p_old).backward();
    old_adam.step();
  }
  torch::serialize::OutputArchive out;
  old_adam.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  JobSpec spec;
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.05;
  spec.beta1 = 0.8;
  spec.beta2 = 0.99;
  spec.precision = Precision::kFp16;
  torch::Tensor p_new = p_old.detach().clone().set_requires_grad(true);
  auto resumed = MakeOptimizer(spec, {p_new});
  torch::serialize::InputArchive in;
  std::istringstream input(bytes.str());
  in.load_from(input);
  resumed->load(in);
  const auto& state =
      static_cast<const DeviceStepParamState&>(*resumed->state().at(p_new.unsafeGetTensorImpl()));
  EXPECT_EQ(state.step().scalar_type(), torch::kFloat32);
  EXPECT_EQ(state.step().item<float>(), 3.0f);
  const auto& old_state = static_cast<const torch::optim::AdamParamState&>(
      *old_adam.state().at(p_old.unsafeGetTensorImpl()));
  EXPECT_TRUE(torch::equal(state.exp_avg(), old_state.exp_avg()));
  EXPECT_TRUE(torch::equal(state.exp_avg_sq(), old_state.exp_avg_sq()));

  for (auto* run : {static_cast<torch::optim::Optimizer*>(&old_adam), resumed.get()}) {
    torch::Tensor& p = run == resumed.get() ? p_new : p_old;
    run->zero_grad();
    problem(p).backward();
    run->step();
  }
  EXPECT_TRUE(torch::allclose(p_new.detach(), p_old.detach(), /*rtol=*/1e-6, /*atol=*/0))
      << p_new << p_old;
}

}  // namespace
}  // namespace trainerd::engine
