// The device memory budget (EngineOptions::device_memory_budget): uploads that cannot fit are
// refused with the numbers before any byte is kept, idle datasets are evicted least recently used
// first and loaded back when a job needs them, datasets load lazily at start (or eagerly with
// preload), Submit refuses a job that could never fit, and a job, or a rank run for a peer, waits
// while running jobs hold the memory it needs.
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/distributed/peers.h"
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

// One peer on loopback, which is asked nothing: what a daemon that runs ranks for a leader on
// 127.0.0.1 needs (RunRankForPeer checks that the leader's store is on one of its peers).
class LoopbackPeer final : public Peers {
 public:
  std::vector<std::string> peers() const override { return {"127.0.0.1:1"}; }
  absl::Status CheckVersion(const std::string&) override { return Unused(); }
  absl::Status CheckAdmin(const std::string&) override { return Unused(); }
  absl::Status CheckDataset(const std::string&, const std::string&, const std::string&) override {
    return Unused();
  }
  absl::Status CopyDataset(const std::string&, const std::string&, const DatasetMeta&,
                           const std::string&, int64_t) override {
    return Unused();
  }
  std::unique_ptr<Call> StartRank(const std::string&, const RemoteRankRequest&,
                                  std::function<void(RemoteRankResult)>) override {
    return nullptr;
  }
  RemoteJobResult RunJob(const std::string&, const RemoteJobRequest&,
                         const std::function<void(const std::string&, const std::string&)>&,
                         const std::function<void(const EpochResult&)>&,
                         const std::function<RemoteStop()>&) override {
    RemoteJobResult result;
    result.status = Unused();
    return result;
  }
  std::vector<RemoteJobResult> RunSweep(const std::string&, const RemoteSweepRequest&,
                                        const std::vector<RemoteMemberCalls>&) override {
    return {};
  }

 private:
  static absl::Status Unused() { return absl::UnimplementedError("not asked in this test"); }
};

class MemoryBudgetTest : public EngineFixture {
 protected:
  // Restarts the engine over the same folder with a budget of `budget` bytes.
  void Restart(int64_t budget, bool preload = false, int32_t max_concurrent_jobs = 0,
               std::shared_ptr<Peers> peers = nullptr) {
    engine_.reset();
    EngineOptions options = Options();
    options.device_memory_budget.bytes = budget;
    options.preload = preload;
    options.jobs.max_concurrent_jobs = max_concurrent_jobs;
    options.peers = std::move(peers);
    engine_ = StartEngine(options);
    ASSERT_NE(engine_, nullptr);
  }

  DatasetLocation Where(const std::string& name) {
    absl::StatusOr<DatasetMeta> meta = engine_->GetDataset(name);
    EXPECT_TRUE(meta.ok()) << meta.status();
    return meta.ok() ? meta->location : DatasetLocation::kHost;
  }

  // Two workers and room for one job's dataset and working set at a time: datasets "a" and "b"
  // uploaded (b evicted a), and a long job on "a" running. Its id, or "" when it did not start.
  std::string HoldTheBudget(std::shared_ptr<Peers> peers = nullptr) {
    Restart(/*budget=*/kSeedBytes + 3000, /*preload=*/false, /*max_concurrent_jobs=*/2,
            std::move(peers));
    if (engine_ == nullptr || !Upload(*engine_, "a", SeedTable(800, 1)).ok() ||
        !Upload(*engine_, "b", SeedTable(800, 2)).ok()) {
      return "";
    }
    absl::StatusOr<JobSnapshot> blocker = engine_->SubmitJob(BlockerSpec("a"));
    if (!blocker.ok()) return "";
    auto recorder = std::make_shared<EventRecorder>();
    if (!engine_->SubscribeJob(blocker->id, recorder).ok() || !recorder->WaitForEpochs(1)) {
      return "";
    }
    return blocker->id;
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
  const std::string blocker = HoldTheBudget();
  ASSERT_FALSE(blocker.empty());
  absl::StatusOr<JobSnapshot> waiting = engine_->SubmitJob(SmallJob("b"));
  ASSERT_TRUE(waiting.ok());
  // The second worker took it but it cannot start: it stays QUEUED while the blocker runs.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(engine_->GetJob(waiting->id)->state, JobState::kQueued);
  ASSERT_TRUE(engine_->CancelJob(blocker).ok());
  absl::StatusOr<JobSnapshot> ran = WaitForEnd(*engine_, waiting->id);
  ASSERT_TRUE(ran.ok());
  EXPECT_EQ(ran->state, JobState::kSucceeded) << ran->error;
}

TEST_F(MemoryBudgetTest, ARankForAPeerWaitsForMemoryAsAJobDoesAndGivesEverythingBack) {
  // Room for one job's dataset and working set at a time; a leader on loopback.
  const std::string blocker = HoldTheBudget(std::make_shared<LoopbackPeer>());
  ASSERT_FALSE(blocker.empty());

  // Rank 1 of a leader's job on dataset b, whose store on 127.0.0.1:1 nobody serves.
  RemoteRankRequest request;
  request.spec = SmallJob("b");
  request.spec.seed = 7;
  request.job_id = "job-of-the-leader";
  request.rank = 1;
  request.world_size = 2;
  request.store_host = "127.0.0.1";
  request.store_port = 1;
  request.store_secret = std::string(64, 'a');
  request.prefix = "job-of-the-leader/0";
  request.timeout_seconds = 1.0;
  request.dataset_sha256 = engine_->GetDataset("b")->sha256;
  CallContext admin;
  admin.admin = true;

  // The blocker holds the memory: the rank waits for it, as a queued job would, and gives up at
  // its timeout with nothing of it left here.
  const RemoteRankResult waited = engine_->RunRankForPeer(request, admin, nullptr);
  EXPECT_EQ(waited.status.code(), absl::StatusCode::kUnavailable) << waited.status;
  EXPECT_THAT(waited.status.message(), HasSubstr("rank 1 of job 'job-of-the-leader'"));
  EXPECT_EQ(engine_->GetJob(blocker)->state, JobState::kRunning);

  // With the memory given back the rank is admitted: it runs, fails to meet a leader that is
  // not there, and gives back its memory and its thread, so that a job runs after it.
  ASSERT_TRUE(engine_->CancelJob(blocker).ok());
  ASSERT_TRUE(WaitForEnd(*engine_, blocker).ok());
  const RemoteRankResult ran = engine_->RunRankForPeer(request, admin, nullptr);
  EXPECT_TRUE(ran.status.ok()) << ran.status;
  EXPECT_EQ(ran.state, JobState::kFailed);
  EXPECT_FALSE(ran.error.empty());
  for (const DeviceStatusInfo& device : engine_->ListDevices()) {
    EXPECT_TRUE(device.peer_ranks.empty()) << device.device;
  }
  absl::StatusOr<JobSnapshot> after = RunJob(*engine_, SmallJob("b"));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state, JobState::kSucceeded) << after->error;
}

}  // namespace
}  // namespace trainerd::engine
