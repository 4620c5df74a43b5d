// The device memory budget (EngineOptions::device_memory_budget): uploads that cannot fit are
// refused with the numbers before any byte is kept, idle datasets are evicted least recently used
// first and loaded back when a job needs them, datasets load lazily at start (or eagerly with
// preload), Submit refuses a job that could never fit, and a job waits while running jobs hold
// the memory it needs.
#include <sys/stat.h>

#include <filesystem>
#include <memory>
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
using test_support::HeaderFor;
using test_support::kWaitTimeout;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::HasSubstr;

// The seed table of 800 rows: 6,400 payload bytes (one float32 feature and target per row).
constexpr int64_t kSeedBytes = 6400;

class MemoryBudgetTest : public EngineFixture {
 protected:
  // Restarts the engine over the same folder with a budget of `budget` bytes.
  void Restart(int64_t budget, bool preload = false, int32_t max_concurrent_jobs = 0) {
    engine_.reset();
    EngineOptions options = Options();
    options.device_memory_budget.bytes = budget;
    options.preload = preload;
    options.jobs.max_concurrent_jobs = max_concurrent_jobs;
    engine_ = StartEngine(options);
    ASSERT_NE(engine_, nullptr);
  }

  DatasetLocation Where(const std::string& name) {
    absl::StatusOr<DatasetMeta> meta = engine_->GetDataset(name);
    EXPECT_TRUE(meta.ok()) << meta.status();
    return meta.ok() ? meta->location : DatasetLocation::kHost;
  }

  // A short job on `dataset`: linear:1, its working set a few hundred bytes.
  JobSpec SmallJob(const std::string& dataset) {
    JobSpec spec = SeedSpec(dataset);
    spec.epochs = 2;
    return spec;
  }
};

TEST_F(MemoryBudgetTest, UploadThatCannotFitIsRefusedWithTheNumbersBeforeAnyByteIsKept) {
  Restart(/*budget=*/kSeedBytes - 1);
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine_->BeginUpload(HeaderFor("big", SeedTable()));
  ASSERT_EQ(upload.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(upload.status().message(), HasSubstr("needs 6400 bytes on cpu"));
  EXPECT_THAT(upload.status().message(), HasSubstr("budget is 6399 bytes"));
  EXPECT_FALSE(std::filesystem::exists(DatasetPath("big")));
  EXPECT_TRUE(engine_->ListDatasets().empty());
}

TEST_F(MemoryBudgetTest, IdleDatasetsAreEvictedLeastRecentlyUsedFirstAndLoadedBackForAJob) {
  // Room for two of the three datasets, and a small job beside them.
  Restart(/*budget=*/2 * kSeedBytes + 3000);
  ASSERT_TRUE(Upload(*engine_, "a", SeedTable(800, 1)).ok());
  ASSERT_TRUE(Upload(*engine_, "b", SeedTable(800, 2)).ok());
  EXPECT_EQ(Where("a"), DatasetLocation::kDevice);
  ASSERT_TRUE(Upload(*engine_, "c", SeedTable(800, 3)).ok());
  // a was the least recently used.
  EXPECT_EQ(Where("a"), DatasetLocation::kDisk);
  EXPECT_EQ(Where("b"), DatasetLocation::kDevice);
  EXPECT_EQ(Where("c"), DatasetLocation::kDevice);
  EXPECT_EQ(engine_->memory_account().evictions, 1);
  EXPECT_EQ(engine_->memory_account().resident_dataset_bytes, 2 * kSeedBytes);

  // A job on a loads it back; b, now the least recently used, makes room.
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, SmallJob("a"));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_GT(job->estimated_memory_bytes, 0);
  EXPECT_EQ(Where("a"), DatasetLocation::kDevice);
  EXPECT_EQ(Where("b"), DatasetLocation::kDisk);
  EXPECT_EQ(Where("c"), DatasetLocation::kDevice);
  EXPECT_EQ(engine_->memory_account().evictions, 2);
  EXPECT_EQ(engine_->memory_account().reserved_job_bytes, 0);  // given back at the end
}

TEST_F(MemoryBudgetTest, DatasetsLoadWhenFirstUsedAfterARestartOrAtStartWithPreload) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  Restart(/*budget=*/0);
  EXPECT_EQ(Where("seed"), DatasetLocation::kDisk);  // registered, not loaded
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, SmallJob("seed"));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(Where("seed"), DatasetLocation::kDevice);

  Restart(/*budget=*/0, /*preload=*/true);
  const absl::Time deadline = absl::Now() + kWaitTimeout;
  while (Where("seed") != DatasetLocation::kDevice && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Where("seed"), DatasetLocation::kDevice);
}

TEST_F(MemoryBudgetTest, SubmitRefusesAJobThatCouldNeverFitNamingTheEstimate) {
  Restart(/*budget=*/4 * kSeedBytes);
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SmallJob("seed");
  spec.model = "linear:512,relu,linear:1";  // 1,537 parameters: ~6 KiB each for weights, grads
  spec.optimizer = OptimizerKind::kAdam;    // and two Adam slots, plus activations
  spec.batch_size = 64;
  absl::StatusOr<JobSnapshot> refused = engine_->SubmitJob(spec);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("an estimated working set of"));
  EXPECT_THAT(refused.status().message(), HasSubstr("parameters 6148"));
  EXPECT_THAT(refused.status().message(), HasSubstr("budget is 25600 bytes"));
  // A small job fits.
  absl::StatusOr<JobSnapshot> small = RunJob(*engine_, SmallJob("seed"));
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->state, JobState::kSucceeded) << small->error;
}

TEST_F(MemoryBudgetTest, ARunningJobsDatasetIsNeverEvicted) {
  Restart(/*budget=*/2 * kSeedBytes + 3000);
  ASSERT_TRUE(Upload(*engine_, "a", SeedTable(800, 1)).ok());
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("a"));
  ASSERT_TRUE(blocker.ok());
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(blocker->id, recorder).ok());
  ASSERT_TRUE(recorder->WaitForEpochs(1));
  ASSERT_TRUE(Upload(*engine_, "b", SeedTable(800, 2)).ok());
  ASSERT_TRUE(Upload(*engine_, "c", SeedTable(800, 3)).ok());
  // b went to make room for c, though a was used longer ago: a's job runs.
  EXPECT_EQ(Where("a"), DatasetLocation::kDevice);
  EXPECT_EQ(Where("b"), DatasetLocation::kDisk);
  EXPECT_EQ(Where("c"), DatasetLocation::kDevice);
  // Something that would fit only without a is refused at once.
  Table big = SeedTable(/*rows=*/1500, 4);  // 12,000 bytes
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine_->BeginUpload(HeaderFor("big", big));
  ASSERT_EQ(upload.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(upload.status().message(), HasSubstr("running jobs hold"));
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  ASSERT_TRUE(WaitForEnd(*engine_, blocker->id).ok());
}

TEST_F(MemoryBudgetTest, AJobWaitsWhileRunningJobsHoldTheMemoryItNeeds) {
  // Two workers, but room for one job's dataset and working set at a time.
  Restart(/*budget=*/kSeedBytes + 3000, /*preload=*/false, /*max_concurrent_jobs=*/2);
  ASSERT_TRUE(Upload(*engine_, "a", SeedTable(800, 1)).ok());
  ASSERT_TRUE(Upload(*engine_, "b", SeedTable(800, 2)).ok());  // a evicted: one fits
  absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("a"));
  ASSERT_TRUE(blocker.ok());
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(blocker->id, recorder).ok());
  ASSERT_TRUE(recorder->WaitForEpochs(1));
  absl::StatusOr<JobSnapshot> waiting = engine_->SubmitJob(SmallJob("b"));
  ASSERT_TRUE(waiting.ok());
  // The second worker took it but it cannot start: it stays QUEUED while the blocker runs.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(engine_->GetJob(waiting->id)->state, JobState::kQueued);
  ASSERT_TRUE(engine_->CancelJob(blocker->id).ok());
  absl::StatusOr<JobSnapshot> ran = WaitForEnd(*engine_, waiting->id);
  ASSERT_TRUE(ran.ok());
  EXPECT_EQ(ran->state, JobState::kSucceeded) << ran->error;
}

}  // namespace
}  // namespace trainerd::engine
