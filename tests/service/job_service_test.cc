// Tests trainerd.v1.JobService (server/service/job_service.h) through a real server and a real TCP
// channel: submission, the WatchJob stream (live, late and concurrent watchers), cancellation and
// the errors with their codes. A Watch stream is the only synchronisation: no test sleeps.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace trainerd::service::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

constexpr int32_t kEpochs = 10;

bool IsJobId(const std::string& id) {
  return id.size() == 16 && id.rfind("job-", 0) == 0 &&
         std::all_of(id.begin() + 4, id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

const v1::Parameter* FindParameter(const v1::Job& job, const std::string& name) {
  for (const v1::Parameter& parameter : job.parameters()) {
    if (parameter.name() == name) return &parameter;
  }
  return nullptr;
}

class JobServiceTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    UploadSeed();
  }

  // Submits `spec`; fails the test unless it is accepted.
  v1::Job Submit(const v1::JobSpec& spec) {
    v1::Job job;
    grpc::Status status = SubmitJob(spec, &job);
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    return job;
  }

  // Submits a job on "seed" that runs until cancelled and returns a watch of it that has received
  // its first epoch, so the job is running.
  std::unique_ptr<JobWatch> StartLongJob(std::string* id) {
    *id = Submit(LinearSpec("seed", kLongJobEpochs)).id();
    std::unique_ptr<JobWatch> watch = Watch(*id);
    EXPECT_TRUE(watch->NextEpoch()) << "the stream ended before the first epoch";
    return watch;
  }
};

// Bring your own model through gRPC: the module bytes reach the engine, which refuses bytes that
// are no TorchScript archive. 5 MiB, above gRPC's default 4 MiB receive limit, so that the server's
// raised limit is what is tested too (a real module trains in tests/e2e and tests/engine).
TEST_F(JobServiceTest, SubmitWithTorchScriptBytesOverFourMebibytesReachesTheEngine) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = LinearSpec("seed", kEpochs);
  request.mutable_spec()->set_model("torchscript");
  request.set_torchscript_module(std::string(size_t{5} << 20, 'x'));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::Job job;
  grpc::Status status = jobs_->SubmitJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("the TorchScript module cannot be loaded"));
}

TEST_F(JobServiceTest, SubmitReturnsQueuedJobWithSpecFilledIn) {
  v1::Job job;
  grpc::Status status = SubmitJob(LinearSpec("seed", kEpochs), &job);

  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(IsJobId(job.id())) << job.id();
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.device(), "cpu");
  EXPECT_GT(job.create_time().seconds(), 0);
  const v1::JobSpec& spec = job.spec();
  EXPECT_EQ(spec.dataset(), "seed");
  EXPECT_EQ(spec.model(), "linear:1");
  EXPECT_EQ(spec.loss(), v1::LOSS_MSE);
  EXPECT_EQ(spec.optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_DOUBLE_EQ(spec.optimizer().learning_rate(), 0.1);
  EXPECT_EQ(spec.batch_size(), 16);
  EXPECT_EQ(spec.epochs(), kEpochs);
  ASSERT_TRUE(spec.has_seed());
  EXPECT_EQ(spec.seed(), 42u);
  ASSERT_TRUE(spec.has_shuffle());
  EXPECT_TRUE(spec.shuffle());
  EXPECT_EQ(spec.device(), "cpu");
}

TEST_F(JobServiceTest, WhatARequestLeavesUnsetGetsTheDaemonsDefaults) {
  // A client that knows none of the defaults: the dataset and the model, nothing else.
  v1::JobSpec bare;
  bare.set_dataset("seed");
  bare.set_model("linear:1");
  v1::Job job;
  grpc::Status status = SubmitJob(bare, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const v1::JobSpec& spec = job.spec();
  EXPECT_EQ(spec.optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_DOUBLE_EQ(spec.optimizer().learning_rate(), 0.01);
  EXPECT_EQ(spec.batch_size(), 32);
  EXPECT_EQ(spec.epochs(), 10);
  EXPECT_EQ(spec.loss(), v1::LOSS_MSE);  // from the float targets
}

TEST_F(JobServiceTest, SubmitWithAdamWCosineAndClippingEchoesTheSpec) {
  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/4);
  spec.set_loss(v1::LOSS_HUBER);
  spec.set_huber_delta(0.5);
  v1::Optimizer* optimizer = spec.mutable_optimizer();
  optimizer->set_kind(v1::OPTIMIZER_KIND_ADAMW);
  optimizer->set_learning_rate(0.05);
  optimizer->set_weight_decay(0.02);
  optimizer->set_beta1(0.85);
  optimizer->set_beta2(0.995);
  optimizer->set_eps(1e-7);
  v1::Schedule* schedule = spec.mutable_schedule();
  schedule->set_kind(v1::Schedule::COSINE);
  schedule->set_min_learning_rate(0.001);
  schedule->set_warmup_epochs(1);
  spec.set_clip_grad_norm(1.5);
  spec.set_device("cpu");
  spec.set_shuffle(true);
  spec.set_precision(v1::PRECISION_BF16);
  spec.set_priority(v1::JOB_PRIORITY_HIGH);
  spec.set_engine(v1::ENGINE_AUTO);         // the echo fills in the default
  spec.set_gradient_accumulation_steps(1);  // and this one
  spec.set_early_stop_metric(v1::EARLY_STOP_METRIC_VALIDATION_LOSS);  // and this one

  const v1::Job job = Submit(spec);

  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job.spec(), spec))
      << "sent:\n"
      << spec.DebugString() << "echoed:\n"
      << job.spec().DebugString();

  // Each epoch reports the rate it used: warm-up at half the rate, then cosine over 3 epochs.
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->Finish().ok());
  const std::vector<v1::EpochResult> epochs = watch->epochs();
  ASSERT_EQ(epochs.size(), 4u);
  const double pi = std::acos(-1.0);
  EXPECT_DOUBLE_EQ(epochs[0].learning_rate(), 0.025);
  for (int e = 0; e < 3; ++e) {
    EXPECT_NEAR(epochs[e + 1].learning_rate(), 0.001 + 0.049 * (1 + std::cos(pi * e / 3)) / 2,
                1e-12);
  }
}

TEST_F(JobServiceTest, EveryScheduleOptionIsEchoedAsSent) {
  std::vector<v1::Schedule> schedules(3);
  schedules[0].set_kind(v1::Schedule::ONE_CYCLE);
  schedules[0].set_pct_start(0.25);
  schedules[0].set_anneal_strategy("linear");
  schedules[0].set_div_factor(10);
  schedules[0].set_final_div_factor(100);
  schedules[0].set_three_phase(true);
  schedules[1].set_kind(v1::Schedule::REDUCE_ON_PLATEAU);
  schedules[1].set_factor(0.5);
  schedules[1].set_patience(0);
  schedules[1].set_threshold(0.01);
  schedules[1].set_cooldown(1);
  schedules[1].set_min_learning_rate(0.001);
  schedules[2].set_kind(v1::Schedule::MULTI_STEP);
  schedules[2].add_milestones(2);
  schedules[2].add_milestones(5);
  schedules[2].set_gamma(0.5);
  schedules[2].set_per_step(true);
  schedules[2].set_warmup_steps(3);
  for (const v1::Schedule& schedule : schedules) {
    v1::JobSpec spec = LinearSpec("seed", /*epochs=*/2);
    *spec.mutable_schedule() = schedule;
    spec.set_validation_fraction(0.25);
    spec.set_device("cpu");
    spec.set_engine(v1::ENGINE_AUTO);
    const v1::Job job = Submit(spec);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job.spec().schedule(),
                                                                   spec.schedule()))
        << "sent:\n"
        << spec.schedule().DebugString() << "echoed:\n"
        << job.spec().schedule().DebugString();
  }
}

// The optimizers' options cross to the engine and back: the job's spec echoes what was sent.
TEST_F(JobServiceTest, SubmitWithTheOptimizersOptionsEchoesTheSpec) {
  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/2);
  spec.set_device("cpu");
  spec.set_shuffle(true);
  spec.set_engine(v1::ENGINE_AUTO);  // the echo fills in these defaults
  spec.mutable_schedule()->set_kind(v1::Schedule::CONSTANT);
  spec.set_precision(v1::PRECISION_FP32);
  spec.set_priority(v1::JOB_PRIORITY_NORMAL);
  spec.set_gradient_accumulation_steps(1);
  spec.set_early_stop_metric(v1::EARLY_STOP_METRIC_VALIDATION_LOSS);
  v1::Optimizer* optimizer = spec.mutable_optimizer();
  optimizer->set_kind(v1::OPTIMIZER_KIND_NADAM);
  optimizer->set_learning_rate(0.01);
  optimizer->set_weight_decay(0.1);
  optimizer->set_momentum_decay(0.01);
  optimizer->set_decoupled_weight_decay(true);
  optimizer->set_weight_decay_exclude_bias_and_norm(true);
  v1::Job job = Submit(spec);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job.spec(), spec))
      << "sent:\n"
      << spec.DebugString() << "echoed:\n"
      << job.spec().DebugString();

  optimizer->Clear();
  optimizer->set_kind(v1::OPTIMIZER_KIND_ADAGRAD);
  optimizer->set_learning_rate(0.01);
  optimizer->set_lr_decay(0.5);
  optimizer->set_initial_accumulator_value(0.25);
  job = Submit(spec);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job.spec(), spec))
      << job.spec().DebugString();

  optimizer->Clear();
  optimizer->set_kind(v1::OPTIMIZER_KIND_RMSPROP);
  optimizer->set_learning_rate(0.01);
  optimizer->set_centered(true);
  job = Submit(spec);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job.spec(), spec))
      << job.spec().DebugString();
}

TEST_F(JobServiceTest, SubmitWithValidationFractionEchoesItAndEpochsCarryValidationLoss) {
  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/3);
  spec.set_validation_fraction(0.25);
  spec.set_early_stop_patience(2);

  const v1::Job job = Submit(spec);

  EXPECT_DOUBLE_EQ(job.spec().validation_fraction(), 0.25);
  EXPECT_EQ(job.spec().early_stop_patience(), 2);
  EXPECT_TRUE(job.spec().validation_dataset().empty());
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->Finish().ok());
  ExpectEpochsThenTerminal(watch->events(), 3, v1::JOB_STATE_SUCCEEDED);
  for (const v1::EpochResult& epoch : watch->epochs()) {
    EXPECT_TRUE(epoch.has_validation_loss()) << "epoch " << epoch.epoch();
    EXPECT_TRUE(std::isfinite(epoch.validation_loss()));
    EXPECT_FALSE(epoch.has_validation_accuracy());  // mse: no accuracy
  }
  v1::Job ended;
  ASSERT_TRUE(GetJob(job.id(), &ended).ok());
  ASSERT_EQ(ended.epochs_size(), 3);
  EXPECT_TRUE(ended.epochs(2).has_validation_loss());
  EXPECT_FALSE(ended.stopped_early());
  // Validation adds no host transfer: one per epoch plus the parameter read-back.
  EXPECT_EQ(ended.host_syncs(), 3 + 1);
}

TEST_F(JobServiceTest, SubmitWithCheckpointEveryEchoesItAndJobListsItsCheckpoints) {
  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/4);
  spec.set_checkpoint_every(2);

  const v1::Job job = Submit(spec);

  EXPECT_EQ(job.spec().checkpoint_every(), 2);
  EXPECT_EQ(job.checkpoints_size(), 0);
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->Finish().ok());
  v1::Job ended;
  ASSERT_TRUE(GetJob(job.id(), &ended).ok());
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  ASSERT_EQ(ended.checkpoints_size(), 2);
  EXPECT_EQ(ended.checkpoints(0).epoch(), 2);
  EXPECT_EQ(ended.checkpoints(0).path(), "checkpoints/" + job.id() + "/epoch-000002.pt");
  EXPECT_EQ(ended.checkpoints(1).epoch(), 4);
  EXPECT_EQ(ended.checkpoints(1).path(), "checkpoints/" + job.id() + "/epoch-000004.pt");
  for (const v1::Checkpoint& checkpoint : ended.checkpoints()) {
    EXPECT_GT(checkpoint.size_bytes(), 0);
    EXPECT_TRUE(checkpoint.has_create_time());
  }
  // On the CPU a checkpoint adds no host transfer.
  EXPECT_EQ(ended.host_syncs(), 4 + 1);
}

TEST_F(JobServiceTest, ClassifierWithValidationDatasetReportsAccuracy) {
  v1::Dataset dataset;
  ASSERT_TRUE(UploadTable("classes", ClassTable(64), &dataset).ok());
  ASSERT_TRUE(UploadTable("classes-val", ClassTable(16), &dataset).ok());
  v1::JobSpec spec = LinearSpec("classes", /*epochs=*/2);
  spec.set_model("linear:2");
  spec.set_loss(v1::LOSS_CROSS_ENTROPY);
  spec.set_validation_dataset("classes-val");

  const v1::Job job = Submit(spec);

  EXPECT_EQ(job.spec().validation_dataset(), "classes-val");
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->Finish().ok());
  ASSERT_EQ(watch->epochs().size(), 2u);
  for (const v1::EpochResult& epoch : watch->epochs()) {
    ASSERT_TRUE(epoch.has_validation_accuracy()) << "epoch " << epoch.epoch();
    EXPECT_GE(epoch.validation_accuracy(), 0.0);
    EXPECT_LE(epoch.validation_accuracy(), 1.0);
  }
}

TEST_F(JobServiceTest, UnsetScheduleAndOptionsComeBackAsConstantAndUnset) {
  const v1::Job job = Submit(LinearSpec("seed", kEpochs));

  EXPECT_EQ(job.spec().schedule().kind(), v1::Schedule::CONSTANT);
  EXPECT_FALSE(job.spec().optimizer().has_weight_decay());
  EXPECT_FALSE(job.spec().optimizer().has_beta1());
  EXPECT_EQ(job.spec().huber_delta(), 0);  // only echoed for LOSS_HUBER
  EXPECT_EQ(job.spec().clip_grad_norm(), 0);
}

TEST_F(JobServiceTest, SubmitWithoutSeedReportsTheSeedItPicked) {
  v1::JobSpec spec = LinearSpec("seed", kEpochs);
  spec.clear_seed();

  v1::Job job = Submit(spec);

  EXPECT_TRUE(job.spec().has_seed());
}

TEST_F(JobServiceTest, WatchStreamsEveryEpochThenSucceededJob) {
  const v1::Job job = Submit(LinearSpec("seed", kEpochs));

  std::unique_ptr<JobWatch> watch = Watch(job.id());
  grpc::Status status = watch->Finish();

  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ExpectEpochsThenTerminal(watch->events(), kEpochs, v1::JOB_STATE_SUCCEEDED);
  const std::vector<v1::EpochResult> epochs = watch->epochs();
  ASSERT_EQ(epochs.size(), static_cast<size_t>(kEpochs));
  // y = 1 + 2x + 0.1 noise: the loss falls towards the noise's variance, 0.01.
  EXPECT_GT(epochs.front().loss(), epochs.back().loss());
  EXPECT_LT(epochs.back().loss(), 0.02);
  for (size_t i = 1; i < epochs.size(); ++i) {
    EXPECT_GE(epochs[i].elapsed_seconds(), epochs[i - 1].elapsed_seconds());
  }
}

TEST_F(JobServiceTest, FinishedJobReportsStepsHostSyncsAndParameters) {
  const v1::Job submitted = Submit(LinearSpec("seed", kEpochs));
  ASSERT_TRUE(Watch(submitted.id())->Finish().ok());

  v1::Job job;
  grpc::Status status = GetJob(submitted.id(), &job);

  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.error(), "");
  ASSERT_EQ(job.epochs_size(), kEpochs);
  EXPECT_EQ(job.final_loss(), job.epochs(kEpochs - 1).loss());
  EXPECT_EQ(job.steps(), 500);      // 800 rows / 16 per batch * 10 epochs
  EXPECT_EQ(job.host_syncs(), 11);  // one per epoch plus the parameter read-back
  EXPECT_EQ(job.parameter_count(), 2);
  EXPECT_EQ(job.device(), "cpu");
  EXPECT_GT(job.end_time().seconds(), 0);
  const v1::Parameter* weight = FindParameter(job, "0.weight");
  const v1::Parameter* bias = FindParameter(job, "0.bias");
  ASSERT_NE(weight, nullptr);
  ASSERT_NE(bias, nullptr);
  EXPECT_THAT(weight->shape(), ElementsAre(1, 1));
  EXPECT_THAT(bias->shape(), ElementsAre(1));
  EXPECT_THAT(weight->values(), ElementsAre(FloatNear(2.0f, 0.05f)));
  EXPECT_THAT(bias->values(), ElementsAre(FloatNear(1.0f, 0.05f)));
}

TEST_F(JobServiceTest, LateWatcherGetsHistoryThenTerminalJob) {
  const v1::Job job = Submit(LinearSpec("seed", kEpochs));
  ASSERT_TRUE(Watch(job.id())->Finish().ok());  // the job has ended

  std::unique_ptr<JobWatch> late = Watch(job.id());
  grpc::Status status = late->Finish();

  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ASSERT_EQ(late->events().size(), static_cast<size_t>(kEpochs + 1));
  ExpectEpochsThenTerminal(late->events(), kEpochs, v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobServiceTest, TwoConcurrentWatchersBothGetFullSequence) {
  // A long job ahead in the CPU queue keeps the watched job QUEUED until both watchers are
  // subscribed (each has received the job's QUEUED state).
  const v1::Job blocker = Submit(LinearSpec("seed", kLongJobEpochs));
  const v1::Job job = Submit(LinearSpec("seed", kEpochs));
  std::unique_ptr<JobWatch> first = Watch(job.id());
  std::unique_ptr<JobWatch> second = Watch(job.id());
  v1::JobEvent event;
  ASSERT_TRUE(first->Next(&event));
  ASSERT_TRUE(event.has_job());
  EXPECT_EQ(event.job().state(), v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(second->Next(&event));
  ASSERT_TRUE(event.has_job());
  EXPECT_EQ(event.job().state(), v1::JOB_STATE_QUEUED);

  auto first_done = std::async(std::launch::async, [&] { return first->Finish(); });
  auto second_done = std::async(std::launch::async, [&] { return second->Finish(); });
  v1::Job cancelled;
  ASSERT_TRUE(CancelJob(blocker.id(), &cancelled).ok());
  grpc::Status first_status = first_done.get();
  grpc::Status second_status = second_done.get();

  EXPECT_TRUE(first_status.ok()) << first_status.error_message();
  EXPECT_TRUE(second_status.ok()) << second_status.error_message();
  ExpectEpochsThenTerminal(first->events(), kEpochs, v1::JOB_STATE_SUCCEEDED);
  ExpectEpochsThenTerminal(second->events(), kEpochs, v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(first->epochs().size(), second->epochs().size());
  for (size_t i = 0; i < first->epochs().size(); ++i) {
    EXPECT_EQ(first->epochs()[i].loss(), second->epochs()[i].loss());
  }
}

TEST_F(JobServiceTest, ListJobsReturnsJobsOldestFirst) {
  const v1::Job first = Submit(LinearSpec("seed", /*epochs=*/1));
  const v1::Job second = Submit(LinearSpec("seed", /*epochs=*/1));

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  v1::ListJobsResponse list;
  grpc::Status status = jobs_->ListJobs(&context, v1::ListJobsRequest(), &list);

  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(list.jobs_size(), 2);
  EXPECT_EQ(list.jobs(0).id(), first.id());
  EXPECT_EQ(list.jobs(1).id(), second.id());
}

TEST_F(JobServiceTest, WatchOfUnknownJobIsNotFound) {
  std::unique_ptr<JobWatch> watch = Watch("job-000000000000");
  grpc::Status status = watch->Finish();

  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'job-000000000000'"));
  EXPECT_TRUE(watch->events().empty());
}

TEST_F(JobServiceTest, GetOfUnknownJobIsNotFound) {
  v1::Job job;
  grpc::Status status = GetJob("job-000000000000", &job);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'job-000000000000'"));
}

TEST_F(JobServiceTest, SubmitOnUnknownDatasetIsNotFound) {
  v1::Job job;
  grpc::Status status = SubmitJob(LinearSpec("missing", kEpochs), &job);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'missing'"));
}

TEST_F(JobServiceTest, CancelOfFinishedJobIsFailedPrecondition) {
  const v1::Job job = Submit(LinearSpec("seed", /*epochs=*/1));
  ASSERT_TRUE(Watch(job.id())->Finish().ok());

  v1::Job cancelled;
  grpc::Status status = CancelJob(job.id(), &cancelled);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("already ended"));
}

TEST_F(JobServiceTest, CancelOfRunningJobEndsWatchWithCancelledJob) {
  std::string id;
  std::unique_ptr<JobWatch> watch = StartLongJob(&id);
  ASSERT_FALSE(HasFailure());

  v1::Job job;
  grpc::Status cancel = CancelJob(id, &job);
  grpc::Status status = watch->Finish();

  ASSERT_TRUE(cancel.ok()) << cancel.error_message();
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  const v1::JobEvent& last = watch->events().back();
  ASSERT_TRUE(last.has_job());
  EXPECT_EQ(last.job().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_GE(last.job().epochs_completed(), 1);
  EXPECT_LT(last.job().epochs_completed(), kLongJobEpochs);
  EXPECT_EQ(last.job().epochs_size(), 0);  // the epoch events carried them
  EXPECT_EQ(watch->epochs().size(), static_cast<size_t>(last.job().epochs_completed()));
}

TEST_F(JobServiceTest, DeleteOfDatasetInUseIsFailedPreconditionUntilJobEnds) {
  std::string id;
  std::unique_ptr<JobWatch> watch = StartLongJob(&id);
  ASSERT_FALSE(HasFailure());

  grpc::Status in_use = DeleteDataset("seed");
  EXPECT_EQ(in_use.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(in_use.error_message(), HasSubstr(id));

  v1::Job job;
  ASSERT_TRUE(CancelJob(id, &job).ok());
  ASSERT_TRUE(watch->Finish().ok());
  ASSERT_EQ(watch->events().back().job().state(), v1::JOB_STATE_CANCELLED);
  grpc::Status deleted = DeleteDataset("seed");
  EXPECT_TRUE(deleted.ok()) << deleted.error_code() << ": " << deleted.error_message();
}

// A spec the daemon refuses with INVALID_ARGUMENT and a sentence that names the fault.
struct InvalidSpec {
  std::string name;  // the test's name
  std::function<void(v1::JobSpec*)> mutate;
  std::string message_part;
};

void PrintTo(const InvalidSpec& spec, std::ostream* os) { *os << spec.name; }

std::vector<InvalidSpec> InvalidSpecs() {
  return {
      {"UnknownLoss", [](v1::JobSpec* spec) { spec->set_loss(static_cast<v1::Loss>(42)); },
       "unknown loss 42"},
      // No loss: the targets choose (cross_entropy here), which then refuses a one-output model
      // on class indices 0..2 with its own sentence.
      {"LossFromClassTargetsIsCrossEntropy",
       [](v1::JobSpec* spec) {
         spec->set_loss(v1::LOSS_UNSPECIFIED);
         spec->set_dataset("classes");
       },
       "loss cross_entropy needs one score per class"},
      {"OptimizerNotOne",
       [](v1::JobSpec* spec) {
         spec->mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(42));
       },
       "optimizer.kind 42 is not one of OPTIMIZER_KIND_SGD"},
      {"BadModelText", [](v1::JobSpec* spec) { spec->set_model("linear:4,conv:3"); }, "conv"},
      {"MseOnInt64Targets", [](v1::JobSpec* spec) { spec->set_dataset("classes"); }, "int64"},
      {"NegativeLearningRate",
       [](v1::JobSpec* spec) { spec->mutable_optimizer()->set_learning_rate(-0.1); },
       "learning rate must be a positive number; got -0.1"},
      {"Beta1WithSgd", [](v1::JobSpec* spec) { spec->mutable_optimizer()->set_beta1(0.9); },
       "beta1 applies to adam, adamw, nadam and radam; optimizer sgd does not take it"},
      {"AmsgradWithSgd", [](v1::JobSpec* spec) { spec->mutable_optimizer()->set_amsgrad(true); },
       "amsgrad applies to adam and adamw; optimizer sgd does not take it"},
      {"ExemptionWithoutWeightDecay",
       [](v1::JobSpec* spec) {
         spec->mutable_optimizer()->set_weight_decay_exclude_bias_and_norm(true);
       },
       "weight decay exclude bias and norm needs a weight decay above 0"},
      {"NegativeLrDecay",
       [](v1::JobSpec* spec) {
         spec->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAGRAD);
         spec->mutable_optimizer()->set_lr_decay(-1);
       },
       "lr decay must be 0 or more; got -1"},
      {"LabelSmoothingWithMse", [](v1::JobSpec* spec) { spec->set_label_smoothing(0.1); },
       "label smoothing applies to loss cross_entropy only"},
      {"ClassWeightsWithMse", [](v1::JobSpec* spec) { spec->add_class_weights(2); },
       "class_weights apply to losses cross_entropy and nll only; loss mse does not take them"},
      {"IgnoreIndexWithMse", [](v1::JobSpec* spec) { spec->set_ignore_index(-100); },
       "ignore_index applies to losses cross_entropy and nll only"},
      {"PosWeightWithMse", [](v1::JobSpec* spec) { spec->add_pos_weight(2); },
       "pos_weight applies to loss bce_with_logits only"},
      {"ClassWeightsOfAnotherCount",
       [](v1::JobSpec* spec) {
         spec->set_dataset("classes");
         spec->set_model("linear:2");
         spec->set_loss(v1::LOSS_CROSS_ENTROPY);
         for (int i = 0; i < 3; ++i) spec->add_class_weights(1);
       },
       "class_weights needs one weight for each of the model's 2 classes; got 3 values"},
      {"NegativeClassWeight",
       [](v1::JobSpec* spec) {
         spec->set_dataset("classes");
         spec->set_model("linear:2");
         spec->set_loss(v1::LOSS_NLL);
         spec->add_class_weights(1);
         spec->add_class_weights(-1);
       },
       "class_weights values must be positive finite numbers; value 1 is -1"},
      {"PosWeightNotFinite",
       [](v1::JobSpec* spec) {
         spec->set_loss(v1::LOSS_BCE_WITH_LOGITS);
         spec->add_pos_weight(std::numeric_limits<double>::infinity());
       },
       "pos_weight values must be positive finite numbers; value 0 is inf"},
      {"FusedEngineWithClassWeights",
       [](v1::JobSpec* spec) {
         spec->set_dataset("classes");
         spec->set_model("linear:2");
         spec->set_loss(v1::LOSS_CROSS_ENTROPY);
         spec->set_engine(v1::ENGINE_FUSED);
         spec->add_class_weights(1);
         spec->add_class_weights(3);
       },
       "engine fused cannot run this job: class_weights have no fused kernel"},
      {"ReplicasWithIgnoreIndex",
       [](v1::JobSpec* spec) {
         spec->set_dataset("classes");
         spec->set_model("linear:2");
         spec->set_loss(v1::LOSS_CROSS_ENTROPY);
         spec->set_ignore_index(-100);
         spec->set_replicas(2);
       },
       "ignore_index trains on one rank"},
      {"StepScheduleWithoutStepEpochs",
       [](v1::JobSpec* spec) { spec->mutable_schedule()->set_kind(v1::Schedule::STEP); },
       "step epochs of at least 1"},
      {"UnknownScheduleKind",
       [](v1::JobSpec* spec) {
         spec->mutable_schedule()->set_kind(static_cast<v1::Schedule::Kind>(9));
       },
       "schedule.kind"},
      {"UnknownPriority",
       [](v1::JobSpec* spec) { spec->set_priority(static_cast<v1::JobPriority>(9)); },
       "priority must be"},
      {"NegativePriority",
       [](v1::JobSpec* spec) { spec->set_priority(static_cast<v1::JobPriority>(-5)); },
       "priority must be"},
      {"UnknownEngine", [](v1::JobSpec* spec) { spec->set_engine(static_cast<v1::Engine>(9)); },
       "engine must be"},
      {"NegativeEngine", [](v1::JobSpec* spec) { spec->set_engine(static_cast<v1::Engine>(-3)); },
       "engine must be"},
      {"FusedEngineWithMixedPrecision",
       [](v1::JobSpec* spec) {
         spec->set_engine(v1::ENGINE_FUSED);
         spec->set_precision(v1::PRECISION_BF16);
       },
       "engine fused cannot run this job: mixed precision"},
      {"NegativeClipNorm", [](v1::JobSpec* spec) { spec->set_clip_grad_norm(-1); },
       "gradient clipping norm"},
      {"ValidationFractionOne", [](v1::JobSpec* spec) { spec->set_validation_fraction(1); },
       "validation fraction must be in [0, 1)"},
      {"PatienceWithoutValidation", [](v1::JobSpec* spec) { spec->set_early_stop_patience(3); },
       "watches the validation loss"},
      {"CheckpointEveryBeyondEpochs", [](v1::JobSpec* spec) { spec->set_checkpoint_every(1000); },
       "checkpoint every must be 0 (off) or between 1 and the epochs"},
      {"FractionAndValidationDataset",
       [](v1::JobSpec* spec) {
         spec->set_validation_fraction(0.2);
         spec->set_validation_dataset("seed");
       },
       "not both"},
  };
}

class InvalidSpecTest : public JobServiceTest, public ::testing::WithParamInterface<InvalidSpec> {
 protected:
  void SetUp() override {
    JobServiceTest::SetUp();
    if (HasFatalFailure()) return;
    v1::Dataset dataset;
    ASSERT_TRUE(UploadTable("classes", ClassTable(8), &dataset).ok());
  }
};

TEST_P(InvalidSpecTest, SubmitIsInvalidArgumentWithSentence) {
  v1::JobSpec spec = LinearSpec("seed", kEpochs);
  GetParam().mutate(&spec);

  v1::Job job;
  grpc::Status status = SubmitJob(spec, &job);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(GetParam().message_part));
  EXPECT_NE(status.error_message().find(' '), std::string::npos);  // words, not a bare token
}

INSTANTIATE_TEST_SUITE_P(Specs, InvalidSpecTest, ::testing::ValuesIn(InvalidSpecs()),
                         [](const ::testing::TestParamInfo<InvalidSpec>& info) {
                           return info.param.name;
                         });

TEST_F(JobServiceTest, PrecisionDefaultsToFp32AndFp16EpochsReportTheLossScale) {
  const v1::Job plain = Submit(LinearSpec("seed", /*epochs=*/2));
  EXPECT_EQ(plain.spec().precision(), v1::PRECISION_FP32);

  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/2);
  spec.set_precision(v1::PRECISION_FP16);
  const v1::Job job = Submit(spec);
  EXPECT_EQ(job.spec().precision(), v1::PRECISION_FP16);
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->Finish().ok());
  v1::Job ended;
  ASSERT_TRUE(GetJob(job.id(), &ended).ok());
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  ASSERT_EQ(ended.epochs_size(), 2);
  for (const v1::EpochResult& epoch : ended.epochs()) {
    ASSERT_TRUE(epoch.has_loss_scale());
    EXPECT_GT(epoch.loss_scale(), 0);
    EXPECT_LE(epoch.loss_scale(), 65536);
    EXPECT_GE(epoch.skipped_steps(), 0);
  }
  EXPECT_EQ(ended.host_syncs(), 2 + 1);  // the scale rides on the epoch's transfer
}

TEST_F(JobServiceTest, UnknownPrecisionIsInvalidArgument) {
  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/2);
  spec.set_precision(static_cast<v1::Precision>(42));
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  const grpc::Status status = jobs_->SubmitJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("precision must be"));
}

// SubmitSweep over the wire: every member comes back QUEUED with the sweep's id, and each ends as
// a Job of its own, packed with the others; a bad list is INVALID_ARGUMENT naming the member.
TEST_F(JobServiceTest, SubmitSweepQueuesEveryMemberAndEachEndsAsItsOwnJob) {
  v1::SubmitSweepRequest request;
  *request.mutable_spec() = LinearSpec("seed", 3);
  request.add_learning_rates(0.1);
  request.add_learning_rates(0.05);
  request.add_seeds(1);
  request.add_seeds(2);
  v1::SubmitSweepResponse response;
  grpc::ClientContext context;
  grpc::Status status = jobs_->SubmitSweep(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.sweep_id().rfind("sweep-", 0), 0u) << response.sweep_id();
  ASSERT_EQ(response.members_size(), 4);
  EXPECT_EQ(response.members(1).spec().seed(), 2u);
  EXPECT_EQ(response.members(2).spec().optimizer().learning_rate(), 0.05);
  for (const v1::Job& member : response.members()) {
    EXPECT_TRUE(IsJobId(member.id()));
    EXPECT_EQ(member.state(), v1::JOB_STATE_QUEUED);
    EXPECT_EQ(member.sweep_id(), response.sweep_id());
    std::unique_ptr<JobWatch> watch = Watch(member.id());
    ASSERT_TRUE(watch->Finish().ok());
    ExpectEpochsThenTerminal(watch->events(), 3, v1::JOB_STATE_SUCCEEDED);
    v1::Job ended;
    ASSERT_TRUE(GetJob(member.id(), &ended).ok());
    EXPECT_EQ(ended.report().packed_members(), 4);
    // On the CPU each member ran its own path in turn: bitwise its job alone, and it says so.
    EXPECT_TRUE(ended.report().packed_bitwise());
    EXPECT_THAT(ended.report().packed_numerics(), ::testing::StartsWith("bitwise the job alone"));
    EXPECT_EQ(ended.sweep_id(), response.sweep_id());
  }

  request.add_learning_rates(-0.5);
  v1::SubmitSweepResponse refused;
  grpc::ClientContext again;
  status = jobs_->SubmitSweep(&again, request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("sweep member 5 (learning rate -0.5"));
  EXPECT_EQ(refused.members_size(), 0);
}

// A point's own fields over the wire: the paths of its FieldMask replace the sweep's values (a
// nested one too), the rest of its spec is ignored, and a path that names no field of JobSpec is
// INVALID_ARGUMENT naming the point.
TEST_F(JobServiceTest, SweepPointsReplaceTheFieldsTheirMaskNames) {
  v1::SubmitSweepRequest request;
  *request.mutable_spec() = LinearSpec("seed", 2);
  request.add_points()->set_learning_rate(0.1);
  v1::SweepPoint* wide = request.add_points();
  wide->mutable_spec()->set_model("linear:4,relu,linear:1");
  wide->mutable_spec()->set_batch_size(8);
  wide->mutable_spec()->set_epochs(40);  // not in the mask: stays the sweep's
  wide->mutable_spec()->mutable_optimizer()->set_nesterov(true);
  wide->mutable_spec()->mutable_optimizer()->set_momentum(0.5);
  wide->mutable_fields()->add_paths("model");
  wide->mutable_fields()->add_paths("batch_size");
  wide->mutable_fields()->add_paths("optimizer.momentum");
  v1::SubmitSweepResponse response;
  grpc::ClientContext context;
  grpc::Status status = jobs_->SubmitSweep(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.members_size(), 2);
  EXPECT_EQ(response.members(0).spec().model(), "linear:1");
  const v1::JobSpec& member = response.members(1).spec();
  EXPECT_EQ(member.model(), "linear:4,relu,linear:1");
  EXPECT_EQ(member.batch_size(), 8);
  EXPECT_EQ(member.epochs(), 2);
  EXPECT_EQ(member.optimizer().momentum(), 0.5);
  EXPECT_FALSE(member.optimizer().nesterov());
  EXPECT_EQ(member.optimizer().learning_rate(), request.spec().optimizer().learning_rate());
  for (const v1::Job& job : response.members()) {
    std::unique_ptr<JobWatch> watch = Watch(job.id());
    ASSERT_TRUE(watch->Finish().ok());
  }

  // More paths than a spec has fields, from one caller: refused before any merge.
  v1::SweepPoint flood = *wide;
  flood.mutable_fields()->Clear();
  for (int i = 0; i < 1000; ++i) flood.mutable_fields()->add_paths("model");
  *request.add_points() = flood;
  v1::SubmitSweepResponse flooded;
  grpc::ClientContext flooding;
  status = jobs_->SubmitSweep(&flooding, request, &flooded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("points[2]: fields names 1000 paths; at most 64"));
  request.mutable_points()->RemoveLast();
  // A halving that cannot work is refused with its reason, whatever else the sweep is.
  request.mutable_spec()->mutable_halving()->set_min_epochs(1);
  request.mutable_spec()->mutable_halving()->set_reduction_factor(-5);
  grpc::ClientContext halving;
  status = jobs_->SubmitSweep(&halving, request, &flooded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("halving's reduction factor must be 2 to 100"));
  request.mutable_spec()->clear_halving();
  wide->mutable_fields()->add_paths("optimizer.no_such_field");
  v1::SubmitSweepResponse refused;
  grpc::ClientContext again;
  status = jobs_->SubmitSweep(&again, request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("points[1]: fields: 'optimizer.no_such_field' names no field of JobSpec"));
}

// A random search: the daemon draws the members from the space with its seed (the same seed, the
// same members), each value within its distribution; a space that does not fit its fields is
// INVALID_ARGUMENT before anything is drawn.
TEST_F(JobServiceTest, ASearchDrawsItsMembersFromTheSpaceWithItsSeed) {
  v1::SubmitSweepRequest request;
  *request.mutable_spec() = LinearSpec("seed", 1);
  v1::SearchSpace* space = request.mutable_search();
  space->set_trials(6);
  space->set_seed(7);
  v1::SearchParameter* lr = space->add_parameters();
  lr->set_field("optimizer.learning_rate");
  lr->mutable_log_uniform()->set_low(1e-4);
  lr->mutable_log_uniform()->set_high(1e-1);
  v1::SearchParameter* batch = space->add_parameters();
  batch->set_field("batch_size");
  batch->mutable_integer()->set_low(8);
  batch->mutable_integer()->set_high(64);
  batch->mutable_integer()->set_log(true);
  v1::SearchParameter* model = space->add_parameters();
  model->set_field("model");
  model->mutable_choice()->add_values("linear:1");
  model->mutable_choice()->add_values("linear:4,relu,linear:1");
  v1::SearchParameter* kind = space->add_parameters();
  kind->set_field("optimizer.kind");
  kind->mutable_choice()->add_values("sgd");
  kind->mutable_choice()->add_values("OPTIMIZER_KIND_ADAM");
  auto submit = [&](v1::SubmitSweepResponse* response) {
    grpc::ClientContext context;
    return jobs_->SubmitSweep(&context, request, response);
  };
  v1::SubmitSweepResponse first;
  grpc::Status status = submit(&first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(first.members_size(), 6);
  std::set<std::string> models;
  std::set<int> kinds;
  for (const v1::Job& member : first.members()) {
    const v1::JobSpec& spec = member.spec();
    EXPECT_GE(spec.optimizer().learning_rate(), 1e-4);
    EXPECT_LE(spec.optimizer().learning_rate(), 1e-1);
    EXPECT_GE(spec.batch_size(), 8);
    EXPECT_LE(spec.batch_size(), 64);
    models.insert(spec.model());
    kinds.insert(spec.optimizer().kind());
  }
  EXPECT_THAT(models, ::testing::IsSubsetOf({"linear:1", "linear:4,relu,linear:1"}));
  EXPECT_THAT(kinds, ::testing::IsSubsetOf({v1::OPTIMIZER_KIND_SGD, v1::OPTIMIZER_KIND_ADAM}));
  v1::SubmitSweepResponse again;
  ASSERT_TRUE(submit(&again).ok());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(again.members(i).spec().optimizer().learning_rate(),
              first.members(i).spec().optimizer().learning_rate());
    EXPECT_EQ(again.members(i).spec().batch_size(), first.members(i).spec().batch_size());
    EXPECT_EQ(again.members(i).spec().model(), first.members(i).spec().model());
  }
  for (const v1::SubmitSweepResponse* sweep : {&first, &again}) {
    for (const v1::Job& job : sweep->members()) ASSERT_TRUE(Watch(job.id())->Finish().ok());
  }

  batch->mutable_uniform()->set_low(1);
  batch->mutable_uniform()->set_high(2);
  v1::SubmitSweepResponse refused;
  status = submit(&refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("'batch_size': a uniform draw needs a floating-point field"));
  // Hostile bounds are refused before any arithmetic on them.
  batch->mutable_integer()->set_low(std::numeric_limits<int64_t>::min());
  batch->mutable_integer()->set_high(std::numeric_limits<int64_t>::max());
  status = submit(&refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("within 2^52"));
  batch->mutable_integer()->set_low(8);
  batch->mutable_integer()->set_high(64);
  lr->mutable_uniform()->set_low(-1e308);  // the oneof now uniform: high - low overflows
  lr->mutable_uniform()->set_high(1e308);
  status = submit(&refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("finite low < high"));
  lr->mutable_log_uniform()->set_low(1e-4);
  lr->mutable_log_uniform()->set_high(1e-1);
  kind->mutable_choice()->add_values("lbfgs");
  status = submit(&refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("choice 'lbfgs' of 'optimizer.kind' is not"));
  kind->mutable_choice()->clear_values();
  kind->mutable_choice()->add_values("adam");
  request.add_learning_rates(0.1);
  status = submit(&refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("lists, points or a search, one of them"));
}

}  // namespace
}  // namespace trainerd::service::testing
