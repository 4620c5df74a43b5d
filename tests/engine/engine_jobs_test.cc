// Jobs through the Engine: what Submit accepts and rejects (and with which sentence), cancelling
// queued, running and finished jobs, each job's ordered event stream, and shutdown.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::BlockerSpec;
using test_support::EngineFixture;
using test_support::EventRecorder;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// --- Submit ---

// Datasets "seed" (float32 targets, 1 feature), "classes" (int64 targets 0..9, 2 features).
class JobSubmitTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(/*rows=*/64)).ok());
    ASSERT_TRUE(Upload(*engine_, "classes", test_support::ClassTable(/*rows=*/20, 0, 9)).ok());
  }

  JobSpec ClassSpec() const {
    JobSpec spec = SeedSpec("classes");
    spec.model = "linear:10";
    spec.loss = LossKind::kCrossEntropy;
    return spec;
  }

  // Submits `spec`, expects `code` and returns the message.
  std::string Rejection(const JobSpec& spec, absl::StatusCode code) {
    absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
    EXPECT_EQ(job.status().code(), code) << job.status();
    EXPECT_THAT(engine_->ListJobs()->jobs, IsEmpty());
    return std::string(job.status().message());
  }
};

// Without a job store (records in memory), as with one (tests/service/request_id_test.cc).
TEST_F(JobSubmitTest, ARepeatedRequestIdGetsItsJobOrSweepBackAndAnotherDigestIsRefused) {
  CallContext caller;
  caller.owner = "alice";  // an admin with a name: "/seed" is the dataset without an owner
  caller.request_id = "r-1";
  caller.request_digest = "digest-a";
  absl::StatusOr<JobSnapshot> first = engine_->SubmitJob(SeedSpec("/seed"), caller);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->request_id, "r-1");
  absl::StatusOr<JobSnapshot> again = engine_->SubmitJob(SeedSpec("/seed"), caller);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id, first->id);
  // Found before anything else is checked: the spec is not read again.
  JobSpec unusable = SeedSpec("no-such-dataset");
  EXPECT_EQ(engine_->SubmitJob(unusable, caller)->id, first->id);

  CallContext other = caller;
  other.request_digest = "digest-b";
  EXPECT_EQ(engine_->SubmitJob(SeedSpec("/seed"), other).status().code(),
            absl::StatusCode::kAlreadyExists);
  CallContext bob = caller;
  bob.owner = "bob";
  absl::StatusOr<JobSnapshot> bobs = engine_->SubmitJob(SeedSpec("/seed"), bob);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_NE(bobs->id, first->id);

  CallContext sweep_call = caller;
  sweep_call.request_id = "r-2";
  SweepAxes axes;
  axes.learning_rates = {0.1, 0.2, 0.3};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(SeedSpec("/seed"), axes, sweep_call);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  absl::StatusOr<SweepSnapshot> repeated =
      engine_->SubmitSweep(SeedSpec("/seed"), axes, sweep_call);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(repeated->id, sweep->id);
  ASSERT_EQ(repeated->members.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(repeated->members[i].id, sweep->members[i].id);

  JobQuery query;
  query.owner = "alice";
  query.request_id = "r-2";
  EXPECT_THAT(engine_->ListJobs(query)->jobs, SizeIs(3));
  query.request_id = "r-1";
  EXPECT_THAT(engine_->ListJobs(query)->jobs, SizeIs(1));
  query.owner = "bob";
  EXPECT_THAT(engine_->ListJobs(query)->jobs, SizeIs(1));
}

TEST_F(JobSubmitTest, ValidJobIsQueuedWithAnId) {
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kQueued);
  EXPECT_FALSE(job->id.empty());
  EXPECT_THAT(job->epochs, IsEmpty());
  ASSERT_THAT(engine_->ListJobs()->jobs, SizeIs(1));
  EXPECT_EQ(engine_->ListJobs()->jobs[0].id, job->id);
}

TEST_F(JobSubmitTest, MseOnInt64TargetsIsInvalidArgument) {
  JobSpec spec = ClassSpec();
  spec.loss = LossKind::kMse;
  spec.model = "linear:1";
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("mse needs float32 targets"));
}

TEST_F(JobSubmitTest, CrossEntropyOnFloatTargetsIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.loss = LossKind::kCrossEntropy;
  spec.model = "linear:3";
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("cross_entropy needs int64 class targets"));
}

TEST_F(JobSubmitTest, MseWithOutputWidthOtherThanTargetsIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:2";
  const std::string message = Rejection(spec, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("outputs 2 per row"));
  EXPECT_THAT(message, HasSubstr("has 1 targets per row"));
}

TEST_F(JobSubmitTest, CrossEntropyWithClassesBeyondModelOutputsIsInvalidArgument) {
  JobSpec spec = ClassSpec();
  spec.model = "linear:5";
  const std::string message = Rejection(spec, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("class indices 0..9"));
  EXPECT_THAT(message, HasSubstr("outputs 5 classes"));
}

TEST_F(JobSubmitTest, CrossEntropyWithEnoughOutputsIsAccepted) {
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(ClassSpec());
  EXPECT_TRUE(job.ok()) << job.status();
}

TEST_F(JobSubmitTest, UnparsableModelSpecIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:1,relux";
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("unknown layer 'relux'"));
}

TEST_F(JobSubmitTest, EmptyModelSpecIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.model = "";
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("the model spec is empty"));
}

TEST_F(JobSubmitTest, ZeroLearningRateIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.learning_rate = 0;
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("learning rate must be a positive number"));
}

TEST_F(JobSubmitTest, NegativeLearningRateIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.learning_rate = -0.1;
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("learning rate must be a positive number"));
}

TEST_F(JobSubmitTest, ZeroBatchSizeIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.batch_size = 0;
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("batch size must be at least 1"));
}

TEST_F(JobSubmitTest, ZeroEpochsIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 0;
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("epochs must be between 1 and"));
}

TEST_F(JobSubmitTest, MomentumWithAdamIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.optimizer = OptimizerKind::kAdam;
  spec.momentum = 0.9;
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("momentum applies to sgd and rmsprop; optimizer adam does not take it"));
}

TEST_F(JobSubmitTest, MomentumOfOneIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.momentum = 1.0;
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("momentum must be in [0, 1)"));
}

TEST_F(JobSubmitTest, UnknownDatasetIsNotFound) {
  EXPECT_THAT(Rejection(SeedSpec("nope"), absl::StatusCode::kNotFound),
              HasSubstr("dataset 'nope' not found"));
}

TEST_F(JobSubmitTest, UnavailableCudaDeviceIsInvalidArgumentNamingAvailableOnes) {
  if (torch::cuda::device_count() > 7) GTEST_SKIP() << "this machine has a cuda:7";
  JobSpec spec = SeedSpec("seed");
  spec.device = "cuda:7";
  const std::string message = Rejection(spec, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("'cuda:7' is not available"));
  EXPECT_THAT(message, HasSubstr("available: cpu"));
}

TEST_F(JobSubmitTest, MalformedDeviceIsInvalidArgument) {
  JobSpec spec = SeedSpec("seed");
  spec.device = "tpu";
  EXPECT_THAT(Rejection(spec, absl::StatusCode::kInvalidArgument),
              HasSubstr("'tpu' is not a device name"));
}

TEST_F(JobSubmitTest, AbsentSeedIsFilledIn) {
  JobSpec spec = SeedSpec("seed");
  spec.seed.reset();
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec.seed.has_value());
  absl::StatusOr<JobSnapshot> stored = engine_->GetJob(job->id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->spec.seed, job->spec.seed);
}

TEST_F(JobSubmitTest, GivenSeedIsKept) {
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.seed, std::optional<uint64_t>(42));
}

TEST_F(JobSubmitTest, EmptyDeviceIsFilledInWithTheEngineDefault) {
  JobSpec spec = SeedSpec("seed");
  spec.device = "";
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.device, "cpu");
  EXPECT_EQ(job->device, "cpu");
  EXPECT_EQ(engine_->default_device(), "cpu");
}

TEST_F(JobSubmitTest, GetUnknownJobIsNotFound) {
  EXPECT_EQ(engine_->GetJob("job-000000000000").status().code(), absl::StatusCode::kNotFound);
}

// --- Cancel ---

class JobCancelTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
};

TEST_F(JobCancelTest, CancelQueuedJobEndsCancelledAtOnce) {
  // The CPU has one worker: the blocker holds it, so the second job waits in the queue.
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  absl::StatusOr<JobSnapshot> waiting = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(blocker.ok()) << blocker.status();
  ASSERT_TRUE(waiting.ok()) << waiting.status();

  absl::StatusOr<JobSnapshot> cancelled = engine_->CancelJob(waiting->id);

  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_THAT(cancelled->epochs, IsEmpty());
  EXPECT_EQ(cancelled->start_time, absl::InfinitePast());  // it never ran
  EXPECT_NE(cancelled->end_time, absl::InfinitePast());
  absl::StatusOr<JobSnapshot> stored = engine_->GetJob(waiting->id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state, JobState::kCancelled);
  EXPECT_EQ(stored->steps, 0);
}

TEST_F(JobCancelTest, CancelRunningJobAfterFirstEpochEndsCancelledEarly) {
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(job.ok()) << job.status();
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(job->id, recorder).ok());
  ASSERT_TRUE(recorder->WaitForEpochs(1));

  absl::StatusOr<JobSnapshot> cancelling = engine_->CancelJob(job->id);
  ASSERT_TRUE(cancelling.ok()) << cancelling.status();
  std::optional<JobSnapshot> ended = recorder->WaitForTerminal();

  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state, JobState::kCancelled);
  EXPECT_GE(ended->epochs.size(), 1u);
  EXPECT_LT(ended->epochs.size(), 1000000u);
  EXPECT_EQ(ended->error, "");  // a user's cancel is not an error
  EXPECT_NE(ended->start_time, absl::InfinitePast());
}

TEST_F(JobCancelTest, CancelFinishedJobIsFailedPrecondition) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded);

  absl::StatusOr<JobSnapshot> cancelled = engine_->CancelJob(job->id);

  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cancelled.status().message(), HasSubstr("already ended SUCCEEDED"));
  EXPECT_EQ(engine_->GetJob(job->id)->state, JobState::kSucceeded);
}

TEST_F(JobCancelTest, CancelUnknownJobIsNotFound) {
  absl::StatusOr<JobSnapshot> cancelled = engine_->CancelJob("job-000000000000");
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(cancelled.status().message(), HasSubstr("'job-000000000000'"));
}

TEST_F(JobCancelTest, JobBehindCancelledBlockerRunsToSuccess) {
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 2;
  absl::StatusOr<JobSnapshot> next = engine_->SubmitJob(spec);
  ASSERT_TRUE(blocker.ok() && next.ok());

  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  absl::StatusOr<JobSnapshot> ended = WaitForEnd(*engine_, next->id);

  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state, JobState::kSucceeded) << ended->error;
  EXPECT_THAT(ended->epochs, SizeIs(2));
  EXPECT_EQ(engine_->GetJob(blocker->id)->state, JobState::kCancelled);
}

// --- Events ---

class JobEventsTest : public JobCancelTest {};

TEST_F(JobEventsTest, SubscriberGetsEveryEpochInOrderThenTheTerminalState) {
  // Subscribe while the job is certainly queued (behind a blocker), so the stream is complete.
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_TRUE(blocker.ok() && job.ok());
  auto recorder = std::make_shared<EventRecorder>();
  absl::StatusOr<JobSnapshot> at_subscribe = engine_->SubscribeJob(job->id, recorder);
  ASSERT_TRUE(at_subscribe.ok()) << at_subscribe.status();
  ASSERT_EQ(at_subscribe->state, JobState::kQueued);

  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  std::optional<JobSnapshot> ended = recorder->WaitForTerminal();
  ASSERT_TRUE(ended.has_value());
  ASSERT_EQ(ended->state, JobState::kSucceeded) << ended->error;

  const std::vector<JobEvent> events = recorder->events();
  ASSERT_THAT(events, SizeIs(1 + 5 + 1));
  EXPECT_EQ(events.front().kind, JobEvent::Kind::kState);
  EXPECT_EQ(events.front().job.state, JobState::kRunning);
  for (int i = 1; i <= 5; ++i) {
    ASSERT_EQ(events[i].kind, JobEvent::Kind::kEpoch) << "event " << i;
    EXPECT_EQ(events[i].epoch.epoch, i);
    EXPECT_EQ(events[i].epoch.loss, ended->epochs[i - 1].loss);
  }
  EXPECT_EQ(events.back().kind, JobEvent::Kind::kState);
  EXPECT_EQ(events.back().job.state, JobState::kSucceeded);
  EXPECT_EQ(Losses(events.back().job), Losses(*ended));
}

TEST_F(JobEventsTest, SubscribingToFinishedJobReturnsHistoryAndNoEvents) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 3;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();

  auto late = std::make_shared<EventRecorder>();
  absl::StatusOr<JobSnapshot> snapshot = engine_->SubscribeJob(job->id, late);

  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->state, JobState::kSucceeded);
  EXPECT_EQ(Losses(*snapshot), Losses(*job));
  EXPECT_THAT(snapshot->epochs, SizeIs(3));
  engine_->Shutdown();  // nothing left that could publish
  EXPECT_THAT(late->events(), IsEmpty());
}

TEST_F(JobEventsTest, UnsubscribedSinkGetsNoMoreEvents) {
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 2;
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  ASSERT_TRUE(blocker.ok() && job.ok());
  auto gone = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(job->id, gone).ok());
  engine_->UnsubscribeJob(job->id, gone.get());

  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  absl::StatusOr<JobSnapshot> ended = WaitForEnd(*engine_, job->id);

  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state, JobState::kSucceeded);
  EXPECT_THAT(gone->events(), IsEmpty());
}

TEST_F(JobEventsTest, SubscribingToUnknownJobIsNotFound) {
  auto recorder = std::make_shared<EventRecorder>();
  EXPECT_EQ(engine_->SubscribeJob("job-000000000000", recorder).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobEventsTest, CancellingQueuedJobPublishesCancelledToItsSubscriber) {
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(blocker.ok() && job.ok());
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(job->id, recorder).ok());

  ASSERT_TRUE(engine_->CancelJob(job->id).ok());

  // Published on the cancelling thread, before CancelJob returned.
  const std::vector<JobEvent> events = recorder->events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].kind, JobEvent::Kind::kState);
  EXPECT_EQ(events[0].job.state, JobState::kCancelled);
}

// --- Shutdown ---

class JobShutdownTest : public JobCancelTest {};

TEST_F(JobShutdownTest, ShutdownCancelsRunningAndQueuedJobsWithAReason) {
  absl::StatusOr<JobSnapshot> running = engine_->SubmitJob(BlockerSpec("seed"));
  absl::StatusOr<JobSnapshot> queued = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(running.ok() && queued.ok());
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(running->id, recorder).ok());
  // An epoch event proves it runs (the RUNNING event may precede the subscription).
  ASSERT_TRUE(recorder->WaitForEpochs(1));

  engine_->Shutdown();

  for (const std::string& id : {running->id, queued->id}) {
    absl::StatusOr<JobSnapshot> job = engine_->GetJob(id);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state, JobState::kCancelled) << id;
    EXPECT_EQ(job->error, "the daemon shut down") << id;
  }
}

TEST_F(JobShutdownTest, SubmitAfterShutdownIsUnavailable) {
  engine_->Shutdown();
  EXPECT_EQ(engine_->SubmitJob(SeedSpec("seed")).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(JobShutdownTest, ShutdownTwiceIsHarmless) {
  engine_->Shutdown();
  engine_->Shutdown();
  EXPECT_THAT(engine_->ListJobs()->jobs, IsEmpty());
}

}  // namespace
}  // namespace trainerd::engine
