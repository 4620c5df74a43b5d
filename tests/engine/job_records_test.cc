// Durable jobs at the engine's level, with the real SQLite job store: records outlive the engine,
// listings page and filter, deletion and retention remove records and files, and a job that was
// running or queued when the engine stopped is taken up again at the next start, resuming from its
// last checkpoint exactly (the same losses, bit for bit, as the same job never interrupted).
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/store/sqlite_job_store.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/damaged_record.h"

namespace trainerd::engine {
namespace {

using test_support::BlockerSpec;
using test_support::EngineFixture;
using test_support::EventRecorder;
using test_support::kWaitTimeout;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Holds the job's worker for a moment when the job's `epoch` is published, so that a test can stop
// the engine while the job is mid-flight (the worker is inside the epoch's event until then).
class PauseAtEpoch final : public JobEventSink {
 public:
  explicit PauseAtEpoch(int32_t epoch, absl::Duration pause = absl::Milliseconds(400))
      : epoch_(epoch), pause_(pause) {}
  void Push(const JobEvent& event) override {
    if (event.kind != JobEvent::Kind::kEpoch || event.epoch.epoch != epoch_) return;
    reached_.store(true);
    absl::SleepFor(pause_);
  }
  // Waits until the epoch's event arrived; false after kWaitTimeout.
  bool WaitReached() const {
    const absl::Time deadline = absl::Now() + kWaitTimeout;
    while (!reached_.load()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

 private:
  const int32_t epoch_;
  const absl::Duration pause_;
  std::atomic<bool> reached_{false};
};

// A job whose whole future depends on more than its weights: momentum (Adam's moments and step
// counters), a shuffle per epoch and dropout (the generator), a validation split drawn from the
// seed, and early-stopping counters; a checkpoint every 2 epochs.
JobSpec ResumableSpec() {
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:16,relu,dropout:0.2,linear:1";
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.01;
  spec.epochs = 8;
  spec.validation_fraction = 0.2;
  spec.early_stop_patience = 50;
  spec.checkpoint_every = 2;
  return spec;
}

class JobRecordsTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    engine_.reset();  // the fixture's engine keeps no records; this test's engines do
    engine_ = StartEngine(DurableOptions());
    ASSERT_NE(engine_, nullptr);
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }

  // Options over this test's folder with a job store on <folder>/jobs.db.
  EngineOptions DurableOptions() const {
    EngineOptions options = Options();
    absl::StatusOr<std::unique_ptr<store::SqliteJobStore>> store =
        store::SqliteJobStore::Open(dir_.path() + "/jobs.db");
    EXPECT_TRUE(store.ok()) << store.status();
    if (store.ok()) options.job_store = *std::move(store);
    return options;
  }

  // Stops the engine (jobs in flight stay in the records) and starts a new one on the same folder.
  void Restart(EngineOptions options) {
    engine_.reset();
    engine_ = StartEngine(options);
    ASSERT_NE(engine_, nullptr);
  }
  void Restart() { Restart(DurableOptions()); }

  std::string ModelFile(const std::string& id) const {
    return dir_.path() + "/models/" + id + ".pt";
  }
  std::string CheckpointFile(const std::string& id, int epoch) const {
    char name[32];
    std::snprintf(name, sizeof(name), "epoch-%06d.pt", epoch);
    return dir_.path() + "/checkpoints/" + id + "/" + name;
  }

  // Submits `spec`, pauses its worker at `epoch`, and stops the engine meanwhile (Shutdown, or
  // Drain when `drain`): the job is left in the records as RUNNING. Returns its id.
  std::string StartAndStop(const JobSpec& spec, int32_t epoch, bool drain) {
    absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    auto pause = std::make_shared<PauseAtEpoch>(epoch);
    EXPECT_TRUE(engine_->SubscribeJob(job->id, pause).ok());
    EXPECT_TRUE(pause->WaitReached());
    if (drain) {
      engine_->Drain(absl::Seconds(60));
    } else {
      engine_->Shutdown();
    }
    return job->id;
  }
};

TEST_F(JobRecordsTest, EndedJobsOutliveARestartWithTheirHistoryAndModel) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;
  absl::StatusOr<JobSnapshot> ran = RunJob(*engine_, spec);
  ASSERT_TRUE(ran.ok()) << ran.status();
  ASSERT_EQ(ran->state, JobState::kSucceeded);

  Restart();
  absl::StatusOr<JobSnapshot> job = engine_->GetJob(ran->id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kSucceeded);
  EXPECT_EQ(Losses(*job), Losses(*ran));
  EXPECT_EQ(job->steps, ran->steps);
  EXPECT_EQ(job->end_time, ran->end_time);
  ASSERT_EQ(job->parameters.size(), ran->parameters.size());
  EXPECT_EQ(job->parameters[0].values, ran->parameters[0].values);
  EXPECT_EQ(job->report.verdict, ran->report.verdict);
  EXPECT_TRUE(job->restarts.empty());

  absl::StatusOr<std::string> model = engine_->ModelArchivePath(ran->id);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(FileExists(*model));

  // A Watch of a job from before the restart replays its history and then ends.
  auto recorder = std::make_shared<EventRecorder>();
  absl::StatusOr<JobSnapshot> watched = engine_->SubscribeJob(ran->id, recorder);
  ASSERT_TRUE(watched.ok());
  EXPECT_EQ(Losses(*watched), Losses(*ran));
  EXPECT_TRUE(IsTerminal(watched->state));

  absl::StatusOr<JobPage> page = engine_->ListJobs();
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(1));
  EXPECT_EQ(page->jobs[0].epochs_completed, 5);
  EXPECT_TRUE(page->jobs[0].epochs.empty());  // the summary view
}

TEST_F(JobRecordsTest, ListingsPageAndFilterByStateAndDataset) {
  ASSERT_TRUE(Upload(*engine_, "other", SeedTable(/*rows=*/64, /*seed=*/7)).ok());
  JobSpec short_spec = SeedSpec("seed");
  short_spec.epochs = 2;
  std::vector<std::string> ids;
  for (const char* dataset : {"seed", "other", "seed"}) {
    JobSpec spec = short_spec;
    spec.dataset = dataset;
    absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id);
  }
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(test_support::BlockerSpec("seed"));
  ASSERT_TRUE(blocker.ok());
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  ASSERT_TRUE(WaitForEnd(*engine_, blocker->id).ok());

  JobQuery query;
  query.page_size = 2;
  absl::StatusOr<JobPage> page = engine_->ListJobs(query);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(2));
  EXPECT_EQ(page->jobs[0].id, ids[0]);
  EXPECT_EQ(page->jobs[1].id, ids[1]);
  query.page_token = page->next_page_token;
  page = engine_->ListJobs(query);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(2));
  EXPECT_EQ(page->jobs[0].id, ids[2]);
  EXPECT_EQ(page->jobs[1].id, blocker->id);
  EXPECT_TRUE(page->next_page_token.empty());

  JobQuery cancelled;
  cancelled.state = JobState::kCancelled;
  page = engine_->ListJobs(cancelled);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(1));
  EXPECT_EQ(page->jobs[0].id, blocker->id);

  JobQuery other;
  other.dataset = "other";
  other.full = true;
  page = engine_->ListJobs(other);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(1));
  EXPECT_EQ(page->jobs[0].id, ids[1]);
  EXPECT_THAT(page->jobs[0].epochs, SizeIs(2));  // the full view

  JobQuery bad;
  bad.page_token = "garbage";
  EXPECT_EQ(engine_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobRecordsTest, DeleteRemovesTheRecordTheModelAndTheCheckpoints) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 3;
  spec.checkpoint_every = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state, JobState::kSucceeded);
  ASSERT_TRUE(FileExists(ModelFile(job->id)));
  ASSERT_TRUE(FileExists(CheckpointFile(job->id, 3)));

  ASSERT_TRUE(engine_->DeleteJob(job->id).ok());
  EXPECT_EQ(engine_->GetJob(job->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(FileExists(ModelFile(job->id)));
  EXPECT_FALSE(FileExists(CheckpointFile(job->id, 3)));
  EXPECT_FALSE(FileExists(dir_.path() + "/checkpoints/" + job->id));
  EXPECT_EQ(engine_->DeleteJob(job->id).code(), absl::StatusCode::kNotFound);
  Restart();
  EXPECT_EQ(engine_->GetJob(job->id).status().code(), absl::StatusCode::kNotFound);

  // A job that may still run is not deleted.
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(test_support::BlockerSpec("seed"));
  ASSERT_TRUE(blocker.ok());
  const absl::Status refused = engine_->DeleteJob(blocker->id);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("cancel it first"));
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  ASSERT_TRUE(WaitForEnd(*engine_, blocker->id).ok());
  EXPECT_TRUE(engine_->DeleteJob(blocker->id).ok());
}

TEST_F(JobRecordsTest, RetentionKeepsTheNewestEndedJobs) {
  EngineOptions options = DurableOptions();
  options.jobs.max_finished_jobs = 2;
  Restart(options);
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id);
  }
  // Retention runs on the worker right after a job ends: wait for it, not for a time.
  const absl::Time deadline = absl::Now() + kWaitTimeout;
  while (engine_->GetJob(ids[0]).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(engine_->GetJob(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(FileExists(ModelFile(ids[0])));
  EXPECT_TRUE(engine_->GetJob(ids[1]).ok());
  EXPECT_TRUE(engine_->GetJob(ids[2]).ok());

  // A tighter bound applies at the next start.
  options = DurableOptions();
  options.jobs.max_finished_jobs = 1;
  Restart(options);
  EXPECT_EQ(engine_->GetJob(ids[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetJob(ids[2]).ok());
  EXPECT_TRUE(FileExists(ModelFile(ids[2])));
}

TEST_F(JobRecordsTest, KeepCheckpointsKeepsEachJobsLastN) {
  EngineOptions options = DurableOptions();
  options.jobs.keep_checkpoints = 2;
  Restart(options);
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 6;
  spec.checkpoint_every = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok());
  ASSERT_THAT(job->checkpoints, SizeIs(2));
  EXPECT_EQ(job->checkpoints[0].epoch, 5);
  EXPECT_EQ(job->checkpoints[1].epoch, 6);
  for (int epoch = 1; epoch <= 4; ++epoch) {
    EXPECT_FALSE(FileExists(CheckpointFile(job->id, epoch))) << epoch;
  }
  EXPECT_TRUE(FileExists(CheckpointFile(job->id, 5)));
  EXPECT_TRUE(FileExists(CheckpointFile(job->id, 6)));
}

TEST_F(JobRecordsTest, JobStoppedMidwayResumesFromItsCheckpointBitForBit) {
  absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, ResumableSpec());
  ASSERT_TRUE(reference.ok());
  ASSERT_EQ(reference->state, JobState::kSucceeded) << reference->error;

  // Stopped while epoch 3's event is out: the checkpoint of epoch 2 is its last.
  const std::string id = StartAndStop(ResumableSpec(), /*epoch=*/3, /*drain=*/false);
  ASSERT_FALSE(id.empty());
  Restart();
  absl::StatusOr<JobSnapshot> resumed = WaitForEnd(*engine_, id);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->state, JobState::kSucceeded) << resumed->error;
  ASSERT_THAT(resumed->restarts, SizeIs(1));
  EXPECT_EQ(resumed->restarts[0].from_epoch, 2);
  EXPECT_EQ(resumed->restarts[0].previous_state, JobState::kRunning);
  // Every epoch once, with the values of the job that never stopped: losses, validation losses,
  // learning rates, the trained parameters and the step count.
  ASSERT_THAT(resumed->epochs, SizeIs(8));
  for (size_t i = 0; i < resumed->epochs.size(); ++i) {
    EXPECT_EQ(resumed->epochs[i].epoch, static_cast<int32_t>(i + 1));
    EXPECT_EQ(resumed->epochs[i].loss, reference->epochs[i].loss) << "epoch " << i + 1;
    EXPECT_EQ(resumed->epochs[i].validation_loss, reference->epochs[i].validation_loss);
    EXPECT_EQ(resumed->epochs[i].learning_rate, reference->epochs[i].learning_rate);
  }
  EXPECT_EQ(resumed->final_loss, reference->final_loss);
  EXPECT_EQ(resumed->steps, reference->steps);
  ASSERT_EQ(resumed->parameters.size(), reference->parameters.size());
  for (size_t i = 0; i < resumed->parameters.size(); ++i) {
    EXPECT_EQ(resumed->parameters[i].values, reference->parameters[i].values);
  }
  // The records agree after yet another restart.
  Restart();
  absl::StatusOr<JobSnapshot> stored = engine_->GetJob(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(Losses(*stored), Losses(*reference));
  EXPECT_THAT(stored->restarts, SizeIs(1));
}

// The newest checkpoint cut in half on disk: the resume falls back to the one before it and still
// ends with the losses of the job that never stopped.
TEST_F(JobRecordsTest, ADamagedNewestCheckpointFallsBackToTheOneBefore) {
  absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, ResumableSpec());
  ASSERT_TRUE(reference.ok());
  // Stopped while epoch 5's event is out: checkpoints of epochs 2 and 4 are listed.
  const std::string id = StartAndStop(ResumableSpec(), /*epoch=*/5, /*drain=*/false);
  ASSERT_FALSE(id.empty());
  const std::string newest = CheckpointFile(id, 4);
  absl::StatusOr<std::string> bytes = ReadFileToString(newest);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_TRUE(WriteFileAtomically(newest, {bytes->substr(0, bytes->size() / 2)}).ok());
  Restart();
  absl::StatusOr<JobSnapshot> resumed = WaitForEnd(*engine_, id);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->state, JobState::kSucceeded) << resumed->error;
  ASSERT_THAT(resumed->restarts, SizeIs(1));
  EXPECT_EQ(resumed->restarts[0].from_epoch, 2);
  EXPECT_EQ(Losses(*resumed), Losses(*reference));
}

// An unfinished job whose record cannot be read is set aside at the start (named in the log and
// counted); the jobs behind it run, and it can be deleted.
TEST_F(JobRecordsTest, AnUnfinishedJobWhoseRecordIsDamagedIsSetAsideAndTheOthersRun) {
  JobSpec spec = ResumableSpec();
  const std::string damaged = StartAndStop(spec, /*epoch=*/3, /*drain=*/false);
  ASSERT_FALSE(damaged.empty());
  engine_.reset();  // closes the records
  trainerd::testing::DamageJobRecord(dir_.path() + "/jobs.db", damaged);
  Restart();
  EXPECT_EQ(engine_->job_records_set_aside(), 1);
  absl::StatusOr<JobPage> page = engine_->ListJobs();
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_THAT(page->jobs, SizeIs(1));
  EXPECT_FALSE(page->jobs[0].record_damaged.empty());
  absl::StatusOr<JobSnapshot> next = RunJob(*engine_, spec);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->state, JobState::kSucceeded);
  EXPECT_TRUE(engine_->DeleteJob(damaged).ok());
  EXPECT_EQ(engine_->GetJob(damaged).status().code(), absl::StatusCode::kNotFound);
}

// The model's checksum is recorded with the job.
TEST_F(JobRecordsTest, AModelsChecksumIsRecordedWithItsJob) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<std::string> model = ReadFileToString(ModelFile(job->id));
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(job->model_sha256, Sha256Hex(*model));
  Restart();
  EXPECT_EQ(engine_->GetJob(job->id)->model_sha256, Sha256Hex(*model));
}

TEST_F(JobRecordsTest, DrainCheckpointsTheEpochInProgressAndRefusesNewJobs) {
  JobSpec spec = ResumableSpec();
  spec.checkpoint_every = 0;  // the drain writes the only checkpoint
  absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, spec);
  ASSERT_TRUE(reference.ok());

  const std::string id = StartAndStop(spec, /*epoch=*/3, /*drain=*/true);
  ASSERT_FALSE(id.empty());
  // Drained: the engine takes no job any more.
  EXPECT_EQ(engine_->SubmitJob(SeedSpec("seed")).status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<JobSnapshot> stopped = engine_->GetJob(id);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state, JobState::kRunning);  // not cancelled: it resumes
  ASSERT_THAT(stopped->checkpoints, SizeIs(1));
  const int32_t drained_at = stopped->checkpoints[0].epoch;
  EXPECT_GE(drained_at, 3);
  EXPECT_LT(drained_at, 8);
  EXPECT_EQ(stopped->epochs_completed, drained_at);

  Restart();
  absl::StatusOr<JobSnapshot> resumed = WaitForEnd(*engine_, id);
  ASSERT_TRUE(resumed.ok());
  ASSERT_EQ(resumed->state, JobState::kSucceeded) << resumed->error;
  ASSERT_THAT(resumed->restarts, SizeIs(1));
  EXPECT_EQ(resumed->restarts[0].from_epoch, drained_at);
  EXPECT_EQ(Losses(*resumed), Losses(*reference));
}

// A drain stops a pack whose epochs wait to be written together (the drain's checkpoints are
// listed under the ordering locks the pack already holds): every member stops with its
// checkpoint and its epochs recorded, and after the restart ends as it would have uninterrupted.
TEST_F(JobRecordsTest, DrainStopsAPackWhoseEpochsWaitAndEachMemberResumesBitForBit) {
  JobSpec base = ResumableSpec();
  base.checkpoint_every = 0;  // a pack's epochs are written together only without them
  base.epochs = 40;
  SweepAxes axes;
  axes.seeds = {1, 2, 3};
  absl::StatusOr<SweepSnapshot> reference = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<std::vector<double>> want;
  for (const JobSnapshot& member : reference->members) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, member.id);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
    want.push_back(Losses(*job));
  }

  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  // No pause: the drain comes while the pack runs. Epoch 3 is heard when the epochs that waited
  // are written; the drain comes an epoch or so later, most likely while the next ones wait.
  auto pause = std::make_shared<PauseAtEpoch>(3, absl::ZeroDuration());
  ASSERT_TRUE(engine_->SubscribeJob(sweep->members[0].id, pause).ok());
  ASSERT_TRUE(pause->WaitReached());
  absl::SleepFor(absl::Milliseconds(25));  // half of kPackEpochsHeldFor
  engine_->Drain(absl::Seconds(60));
  for (const JobSnapshot& member : sweep->members) {
    absl::StatusOr<JobSnapshot> stopped = engine_->GetJob(member.id);
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    EXPECT_EQ(stopped->state, JobState::kRunning);
    ASSERT_THAT(stopped->checkpoints, SizeIs(1));
    EXPECT_EQ(stopped->epochs_completed, stopped->checkpoints[0].epoch);
    EXPECT_LT(stopped->epochs_completed, 40);
  }
  Restart();
  for (size_t i = 0; i < sweep->members.size(); ++i) {
    absl::StatusOr<JobSnapshot> resumed = WaitForEnd(*engine_, sweep->members[i].id);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    ASSERT_EQ(resumed->state, JobState::kSucceeded) << resumed->error;
    ASSERT_THAT(resumed->restarts, SizeIs(1));
    EXPECT_EQ(Losses(*resumed), want[i]) << "member " << i;
  }
}

TEST_F(JobRecordsTest, JobWithoutCheckpointsStartsOverAndReportsEachEpochOnce) {
  JobSpec spec = ResumableSpec();
  spec.checkpoint_every = 0;
  absl::StatusOr<JobSnapshot> reference = RunJob(*engine_, spec);
  ASSERT_TRUE(reference.ok());

  const std::string id = StartAndStop(spec, /*epoch=*/3, /*drain=*/false);
  Restart();
  absl::StatusOr<JobSnapshot> again = WaitForEnd(*engine_, id);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->state, JobState::kSucceeded);
  ASSERT_THAT(again->restarts, SizeIs(1));
  EXPECT_EQ(again->restarts[0].from_epoch, 0);
  EXPECT_EQ(Losses(*again), Losses(*reference));  // the same seed: the same run
  std::vector<int32_t> numbers;
  for (const EpochResult& epoch : again->epochs) numbers.push_back(epoch.epoch);
  EXPECT_THAT(numbers, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
}

TEST_F(JobRecordsTest, QueuedJobsBehindARunningOneRunAfterARestart) {
  JobSpec first = ResumableSpec();
  absl::StatusOr<JobSnapshot> a = engine_->SubmitJob(first);
  ASSERT_TRUE(a.ok());
  JobSpec queued = SeedSpec("seed");
  queued.epochs = 3;
  absl::StatusOr<JobSnapshot> b = engine_->SubmitJob(queued);
  absl::StatusOr<JobSnapshot> c = engine_->SubmitJob(queued);
  ASSERT_TRUE(b.ok() && c.ok());
  auto pause = std::make_shared<PauseAtEpoch>(3);
  ASSERT_TRUE(engine_->SubscribeJob(a->id, pause).ok());
  ASSERT_TRUE(pause->WaitReached());
  engine_->Shutdown();
  EXPECT_EQ(engine_->GetJob(b->id)->state, JobState::kQueued);  // not cancelled

  Restart();
  for (const std::string& id : {a->id, b->id, c->id}) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, id);
    ASSERT_TRUE(job.ok()) << id;
    EXPECT_EQ(job->state, JobState::kSucceeded) << id << ": " << job->error;
    ASSERT_THAT(job->restarts, SizeIs(1));
  }
  absl::StatusOr<JobSnapshot> b_done = engine_->GetJob(b->id);
  EXPECT_EQ(b_done->restarts[0].previous_state, JobState::kQueued);
  EXPECT_EQ(b_done->restarts[0].from_epoch, 0);
  EXPECT_THAT(b_done->epochs, SizeIs(3));
}

// A pack's members' epochs are written together (one transaction a pack epoch) yet each member
// is recorded and heard exactly as alone: every epoch in its record after a restart, and a watcher
// gets epochs 1..N in order, then the end.
TEST_F(JobRecordsTest, APacksEpochsAreRecordedAndHeardAsEachMembersAlone) {
  // The one worker is busy until every member is watched, so that each watch begins while its
  // member is QUEUED (a watch that begins later has the epochs so far in its snapshot instead).
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(blocker.ok()) << blocker.status();
  JobSpec base = SeedSpec("seed");
  base.epochs = 6;
  SweepAxes axes;
  axes.learning_rates = {0.1, 0.05, 0.02};
  axes.seeds = {1, 2};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  std::vector<std::shared_ptr<EventRecorder>> recorders;
  for (const JobSnapshot& member : sweep->members) {
    recorders.push_back(std::make_shared<EventRecorder>());
    ASSERT_TRUE(engine_->SubscribeJob(member.id, recorders.back()).ok());
  }
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  std::vector<JobSnapshot> ended;
  for (size_t i = 0; i < recorders.size(); ++i) {
    std::optional<JobSnapshot> end = recorders[i]->WaitForTerminal();
    ASSERT_TRUE(end.has_value());
    ASSERT_EQ(end->state, JobState::kSucceeded) << end->error;
    EXPECT_EQ(end->report.packed_members, 6);
    std::vector<int32_t> epochs;
    for (const JobEvent& event : recorders[i]->events()) {
      if (event.kind == JobEvent::Kind::kEpoch) epochs.push_back(event.epoch.epoch);
    }
    // Whatever came before the watch began (none here: it began while QUEUED), then in order.
    EXPECT_THAT(epochs, ::testing::ElementsAre(1, 2, 3, 4, 5, 6)) << "member " << i;
    EXPECT_EQ(recorders[i]->events().back().kind, JobEvent::Kind::kState);
    ended.push_back(*end);
  }
  Restart();
  for (const JobSnapshot& member : ended) {
    absl::StatusOr<JobSnapshot> stored = engine_->GetJob(member.id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(Losses(*stored), Losses(member));
    ASSERT_THAT(stored->epochs, SizeIs(6));
    EXPECT_EQ(stored->final_loss, member.epochs.back().loss);
  }
}

// A pack's members that end together keep their model files in one batch: each member's model
// and state_dict whole and its own after a restart; a member whose model cannot be written fails
// alone, with the reason, and leaves no state_dict behind.
TEST_F(JobRecordsTest, APacksModelsAreKeptTogetherAndAMemberWhoseModelCannotBeKeptFailsAlone) {
  // The one worker is busy while the sweep is queued, so that a member's model path can be
  // blocked (a folder in its place) before the pack runs.
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(blocker.ok()) << blocker.status();
  JobSpec base = SeedSpec("seed");
  base.epochs = 3;
  SweepAxes axes;
  axes.learning_rates = {0.1, 0.05};
  axes.seeds = {1, 2};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  const std::string blocked = sweep->members[1].id;
  ASSERT_TRUE(std::filesystem::create_directories(ModelFile(blocked) + "/in-the-way"));
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  std::vector<JobSnapshot> ended;
  for (const JobSnapshot& member : sweep->members) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, member.id);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->report.packed_members, 4);
    ended.push_back(*job);
  }
  EXPECT_EQ(ended[1].state, JobState::kFailed);
  EXPECT_THAT(ended[1].error, HasSubstr("cannot keep the trained model: cannot rename"));
  EXPECT_EQ(ended[1].model_sha256, "");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/models/" + blocked + ".safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/models/" + blocked + ".safetensors.sha256"));
  Restart();
  for (size_t i : {0u, 2u, 3u}) {
    const std::string& id = ended[i].id;
    ASSERT_EQ(ended[i].state, JobState::kSucceeded) << ended[i].error;
    absl::StatusOr<JobSnapshot> stored = engine_->GetJob(id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->state, JobState::kSucceeded);
    EXPECT_EQ(Sha256Hex(*ReadFileToString(ModelFile(id))), stored->model_sha256);
    const absl::StatusOr<Engine::StateDictFile> state_dict = engine_->StateDictPath(id);
    ASSERT_TRUE(state_dict.ok()) << state_dict.status();
    EXPECT_EQ(Sha256Hex(*ReadFileToString(state_dict->path)), state_dict->sha256);
  }
  EXPECT_EQ(engine_->GetJob(blocked)->state, JobState::kFailed);
}

// Halving's rungs outlive a restart: a member taken up again is compared with what the others
// reached before it (read back from their records), not first at every rung as if alone.
TEST_F(JobRecordsTest, AMemberTakenUpAgainMeetsTheRungsItsSweepReachedBeforeTheRestart) {
  JobSpec base = SeedSpec("seed");
  base.epochs = 8;
  base.validation_fraction = 0.25;
  base.halving = HalvingSpec{2, 2};  // rungs at epochs 2 and 4
  JobSpec other_shape = base;        // its own pack, after the first (one worker: the fixture's)
  other_shape.batch_size = 8;
  SweepAxes axes;
  axes.points = {SweepPoint{0.1, std::nullopt, std::nullopt, std::nullopt, std::nullopt},
                 SweepPoint{1e-6, std::nullopt, std::nullopt, std::nullopt, other_shape}};
  absl::StatusOr<SweepSnapshot> sweep = engine_->SubmitSweep(base, axes);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  const std::string good = sweep->members[0].id, behind = sweep->members[1].id;
  auto pause = std::make_shared<PauseAtEpoch>(1);
  ASSERT_TRUE(engine_->SubscribeJob(behind, pause).ok());
  absl::StatusOr<JobSnapshot> first = WaitForEnd(*engine_, good);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->state, JobState::kSucceeded) << first->error;
  EXPECT_FALSE(first->stopped_early);
  ASSERT_TRUE(pause->WaitReached());  // the member behind, at epoch 1, before its first rung
  engine_->Shutdown();

  Restart();
  absl::StatusOr<JobSnapshot> taken_up = WaitForEnd(*engine_, behind);
  ASSERT_TRUE(taken_up.ok());
  ASSERT_EQ(taken_up->state, JobState::kSucceeded) << taken_up->error;
  ASSERT_THAT(taken_up->restarts, SizeIs(1));
  EXPECT_TRUE(taken_up->stopped_early);
  EXPECT_THAT(taken_up->epochs, SizeIs(2));
  EXPECT_THAT(taken_up->stop_reason, ::testing::HasSubstr("rung of epoch 2: validation loss"));
  EXPECT_THAT(taken_up->stop_reason, ::testing::HasSubstr("of the 1 members there before it"));
}

TEST_F(JobRecordsTest, JobThatCannotRunAgainFailsWithTheReason) {
  const std::string id = StartAndStop(ResumableSpec(), /*epoch=*/3, /*drain=*/false);
  engine_.reset();
  ASSERT_EQ(std::remove(DatasetPath("seed").c_str()), 0);
  Restart();
  absl::StatusOr<JobSnapshot> job = engine_->GetJob(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_THAT(job->error, HasSubstr("cannot run again after the daemon restarted"));
  EXPECT_THAT(job->error, HasSubstr("seed"));
}

// Uploads `table` as `owner`'s `name` (a tenant's upload), a copy for peers when `peer_copy`.
absl::Status UploadAs(Engine& engine, const std::string& owner, const std::string& name,
                      const Table& table, bool peer_copy = false) {
  CallContext caller;
  caller.owner = owner;
  caller.admin = false;
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine.BeginUpload(test_support::HeaderFor(name, table), caller, peer_copy);
  if (!upload.ok()) return upload.status();
  TRAINERD_RETURN_IF_ERROR((*upload)->Append(EncodePayload(table)));
  return engine.CommitUpload(*std::move(upload)).status();
}

// A data folder of the version before names were per owner: every dataset as
// datasets/<name>.trds (alice's "digits" among them, next to "seed", which has no owner), and the
// records naming them by bare name (bob's queued job on alice's shared "digits", validated on it
// too). The start rewrites the records to the key "alice/digits", moves the file into alice's
// folder, and takes bob's job up on that very dataset; "seed" stays as it was. A second start
// changes nothing.
TEST_F(JobRecordsTest, AnOlderFlatDataFolderIsMigratedToNamesPerOwner) {
  ASSERT_TRUE(UploadAs(*engine_, "alice", "digits", SeedTable(100)).ok());
  engine_.reset();
  const std::string owned = dir_.path() + "/datasets/alice/digits.trds";
  const std::string flat = DatasetPath("digits");
  ASSERT_EQ(std::rename(owned.c_str(), flat.c_str()), 0);
  ASSERT_EQ(::rmdir((dir_.path() + "/datasets/alice").c_str()), 0);
  {
    absl::StatusOr<std::unique_ptr<store::SqliteJobStore>> store =
        store::SqliteJobStore::Open(dir_.path() + "/jobs.db");
    ASSERT_TRUE(store.ok()) << store.status();
    JobSnapshot job;
    job.id = "job-from-before";
    job.owner = "bob";
    job.state = JobState::kQueued;
    job.spec = SeedSpec("digits");
    job.spec.validation_dataset = "digits";
    job.spec.epochs = 2;
    job.device = "cpu";
    job.create_time = absl::Now();
    ASSERT_TRUE((*store)->SaveJob(job).ok());
    JobSnapshot unowned = job;
    unowned.id = "job-on-seed";
    unowned.state = JobState::kSucceeded;
    unowned.spec = SeedSpec("seed");
    unowned.end_time = absl::Now();
    ASSERT_TRUE((*store)->SaveJob(unowned).ok());
  }
  Restart();
  EXPECT_TRUE(FileExists(owned));
  EXPECT_FALSE(FileExists(flat));
  EXPECT_TRUE(FileExists(DatasetPath("seed")));
  absl::StatusOr<JobSnapshot> ended = WaitForEnd(*engine_, "job-from-before");
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state, JobState::kSucceeded) << ended->error;
  EXPECT_EQ(ended->spec.dataset, "alice/digits");
  EXPECT_EQ(ended->spec.validation_dataset, "alice/digits");
  EXPECT_THAT(ended->epochs, SizeIs(2));
  Restart();
  EXPECT_EQ(engine_->GetJob("job-from-before")->spec.dataset, "alice/digits");
  EXPECT_EQ(engine_->GetJob("job-on-seed")->spec.dataset, "seed");
  EXPECT_EQ(engine_->GetDataset("alice/digits")->owner, "alice");
  JobQuery on_digits;
  on_digits.dataset = "alice/digits";
  absl::StatusOr<JobPage> listed = engine_->ListJobs(on_digits);
  ASSERT_TRUE(listed.ok());
  ASSERT_THAT(listed->jobs, SizeIs(1));
  EXPECT_EQ(listed->jobs[0].id, "job-from-before");
}

// A copy for peers that a queued job names stays past the retention, across a restart (the job
// is taken up before the first removal runs), and its clock starts again when the job is done.
TEST_F(JobRecordsTest, AQueuedJobsCopyForPeersOutlivesTheRetention) {
  EngineOptions options = DurableOptions();
  options.peer_copy_retention = absl::Hours(1);
  Restart(options);
  ASSERT_TRUE(UploadAs(*engine_, "alice", "queued", SeedTable(50), /*peer_copy=*/true).ok());
  ASSERT_TRUE(UploadAs(*engine_, "alice", "idle", SeedTable(50), /*peer_copy=*/true).ok());
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("seed"));
  JobSpec spec = SeedSpec("alice/queued");
  spec.epochs = 1;
  absl::StatusOr<JobSnapshot> waiting = engine_->SubmitJob(spec);
  ASSERT_TRUE(blocker.ok() && waiting.ok());
  engine_.reset();
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (const char* name : {"queued", "idle"}) {
    std::filesystem::last_write_time(dir_.path() + "/datasets/alice/" + name + ".trds",
                                     two_hours_ago);
  }
  options = DurableOptions();
  options.peer_copy_retention = absl::Hours(1);
  Restart(options);
  engine_->RemoveIdlePeerCopies();
  EXPECT_EQ(engine_->GetDataset("alice/idle").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetDataset("alice/queued").ok());
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  absl::StatusOr<JobSnapshot> done = WaitForEnd(*engine_, waiting->id);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state, JobState::kSucceeded) << done->error;
  EXPECT_EQ(engine_->RemoveIdlePeerCopies(), 0);  // used a moment ago
  EXPECT_TRUE(engine_->GetDataset("alice/queued").ok());
}

// An observer that throws once, at the first job's second epoch.
class ThrowingObserver final : public JobEventSink {
 public:
  explicit ThrowingObserver(std::function<void()> thrower) : thrower_(std::move(thrower)) {}
  void Push(const JobEvent& event) override {
    if (event.kind == JobEvent::Kind::kEpoch && event.epoch.epoch == 2 && !thrown_.exchange(true)) {
      thrower_();
    }
  }

 private:
  std::function<void()> thrower_;
  std::atomic<bool> thrown_{false};
};

TEST_F(JobRecordsTest, ExceptionInAWorkerFailsThatJobAndTheNextOneRuns) {
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[] { throw std::runtime_error("observer exploded"); }, "observer exploded"},
      {[] { throw std::bad_alloc(); }, "out of host memory"},
  };
  for (const auto& [thrower, expected] : cases) {
    EngineOptions options = DurableOptions();
    options.observer = std::make_shared<ThrowingObserver>(thrower);
    Restart(options);
    JobSpec spec = SeedSpec("seed");
    spec.epochs = 4;
    absl::StatusOr<JobSnapshot> failed = RunJob(*engine_, spec);
    ASSERT_TRUE(failed.ok());
    EXPECT_EQ(failed->state, JobState::kFailed);
    EXPECT_THAT(failed->error, HasSubstr(expected));
    absl::StatusOr<JobSnapshot> next = RunJob(*engine_, spec);
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(next->state, JobState::kSucceeded) << next->error;
  }
}

// Without a store (the fixture's engine), listings page over the jobs in memory the same way.
class InMemoryListingTest : public EngineFixture {};

TEST_F(InMemoryListingTest, PagesAndFiltersWithoutAStore) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id);
  }
  JobQuery query;
  query.page_size = 2;
  query.newest_first = true;
  absl::StatusOr<JobPage> page = engine_->ListJobs(query);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(2));
  EXPECT_EQ(page->jobs[0].id, ids[2]);
  EXPECT_EQ(page->jobs[1].id, ids[1]);
  EXPECT_TRUE(page->jobs[0].epochs.empty());
  EXPECT_EQ(page->jobs[0].epochs_completed, 1);
  query.page_token = page->next_page_token;
  page = engine_->ListJobs(query);
  ASSERT_TRUE(page.ok());
  ASSERT_THAT(page->jobs, SizeIs(1));
  EXPECT_EQ(page->jobs[0].id, ids[0]);
  EXPECT_TRUE(page->next_page_token.empty());
  // Deleting works without a store too.
  EXPECT_TRUE(engine_->DeleteJob(ids[0]).ok());
  EXPECT_EQ(engine_->GetJob(ids[0]).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainerd::engine
