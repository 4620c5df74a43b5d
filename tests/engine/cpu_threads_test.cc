// Intra-op threads per job (server/engine/cpu_threads.h): the cost model, the budget that keeps the
// running CPU jobs within the cores, LibTorch's per-thread setting, and what jobs report.
#include "server/engine/devices/cpu_threads.h"

#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/engine/training/trainer.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::ClustersTable;
using test_support::EngineFixture;
using test_support::RandomTable;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::Upload;

TEST(IntraOpThreadsForTest, SmallOrUnknownStepsRunOnOneThread) {
  EXPECT_EQ(IntraOpThreadsFor(0.0, 8), 1);  // unknown (a TorchScript module without parameters)
  EXPECT_EQ(IntraOpThreadsFor(std::nan(""), 8), 1);
  EXPECT_EQ(IntraOpThreadsFor(-5.0, 8), 1);
  // The seed job (linear:1, batch 16) and the 3-class MLP of the issue (2-64-64-3, batch 32).
  EXPECT_EQ(IntraOpThreadsFor(3 * 2 * 16.0, 8), 1);
  EXPECT_EQ(IntraOpThreadsFor(3 * 2 * 32.0 * (2 * 64 + 64 * 64 + 64 * 3), 8), 1);
  EXPECT_EQ(IntraOpThreadsFor(kFlopsPerIntraOpThread * 0.99, 8), 1);
}

TEST(IntraOpThreadsForTest, LargerStepsGetAThreadPerShareUpToTheCores) {
  EXPECT_EQ(IntraOpThreadsFor(kFlopsPerIntraOpThread, 8), 1);
  EXPECT_EQ(IntraOpThreadsFor(kFlopsPerIntraOpThread * 2, 8), 2);
  EXPECT_EQ(IntraOpThreadsFor(kFlopsPerIntraOpThread * 5.5, 8), 5);
  EXPECT_EQ(IntraOpThreadsFor(kFlopsPerIntraOpThread * 100, 8), 8);
  EXPECT_EQ(IntraOpThreadsFor(std::numeric_limits<double>::infinity(), 4), 4);
  EXPECT_EQ(IntraOpThreadsFor(kFlopsPerIntraOpThread * 100, 0), 1);  // no cores known: one
}

TEST(CpuThreadBudgetTest, JobsShareTheCoresAndOneRunsAloneWhateverItAsks) {
  CpuThreadBudget budget(4);
  EXPECT_EQ(budget.cores(), 4);
  EXPECT_TRUE(budget.TryAcquire(1));
  EXPECT_TRUE(budget.TryAcquire(2));
  EXPECT_EQ(budget.in_use(), 3);
  EXPECT_FALSE(budget.TryAcquire(2));  // 3 + 2 > 4: it waits
  EXPECT_TRUE(budget.TryAcquire(1));
  EXPECT_EQ(budget.in_use(), 4);
  EXPECT_FALSE(budget.TryAcquire(1));
  budget.Release(2);
  EXPECT_TRUE(budget.TryAcquire(2));
  budget.Release(2);
  budget.Release(1);
  budget.Release(1);
  EXPECT_EQ(budget.in_use(), 0);
  // More than the cores (an operator's --intra_op_threads): it runs, but only alone.
  EXPECT_TRUE(budget.TryAcquire(6));
  EXPECT_FALSE(budget.TryAcquire(1));
  budget.Release(6);
  EXPECT_EQ(budget.in_use(), 0);
  // Zero and negative counts are one thread.
  EXPECT_TRUE(budget.TryAcquire(0));
  EXPECT_EQ(budget.in_use(), 1);
  budget.Release(0);
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_EQ(CpuThreadBudget(0).cores(), 1);
}

// A job that does not fit holds the next turn: small jobs that would fit beside the running ones
// do not overtake it, until it starts or withdraws.
TEST(CpuThreadBudgetTest, AJobThatWaitsIsNotOvertaken) {
  CpuThreadBudget budget(2);
  const uintptr_t small = 1, wide = 2, later = 3;
  EXPECT_TRUE(budget.TryAcquire(1, small));
  EXPECT_FALSE(budget.TryAcquire(2, wide));   // 1 + 2 > 2: it waits, first
  EXPECT_FALSE(budget.TryAcquire(1, later));  // it would fit, but the wide job waits before it
  budget.Release(1);
  EXPECT_FALSE(budget.TryAcquire(1, later));  // still the wide job's turn
  EXPECT_TRUE(budget.TryAcquire(2, wide));
  EXPECT_FALSE(budget.TryAcquire(1, later));  // 2 + 1 > 2: now it waits, first
  budget.Release(2);
  EXPECT_TRUE(budget.TryAcquire(1, later));
  // One that gives up waiting frees the turn.
  EXPECT_FALSE(budget.TryAcquire(2, wide));
  EXPECT_FALSE(budget.TryAcquire(1, small));
  budget.Withdraw(wide);
  EXPECT_TRUE(budget.TryAcquire(1, small));
  EXPECT_EQ(budget.in_use(), 2);
}

// A rank run for a peer's job takes its thread whatever runs (it must not wait on this daemon's
// jobs), and jobs asking after it wait for it as for any job.
TEST(CpuThreadBudgetTest, TakenThreadsAreCountedButNeverRefused) {
  CpuThreadBudget budget(2);
  EXPECT_TRUE(budget.TryAcquire(2));
  budget.Take(1);  // beyond the cores: counted, not refused
  EXPECT_EQ(budget.in_use(), 3);
  budget.Release(2);
  EXPECT_FALSE(budget.TryAcquire(2));  // 1 + 2 > 2: the job waits for the peer's rank
  EXPECT_TRUE(budget.TryAcquire(1));
  budget.Release(1);
  budget.Release(1);
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_TRUE(budget.TryAcquire(2));
  budget.Release(2);
}

TEST(SetIntraOpThreadsTest, EachThreadKeepsItsOwnSetting) {
  // Two job workers: one sets 1 thread, the other 2 afterwards; the first still runs on 1.
  absl::Notification first_set;
  absl::Notification second_set;
  int first_seen = 0;
  int second_seen = 0;
  std::thread first([&] {
    SetIntraOpThreads(1);
    first_set.Notify();
    second_set.WaitForNotification();
    first_seen = IntraOpThreads();
  });
  std::thread second([&] {
    first_set.WaitForNotification();
    SetIntraOpThreads(2);
    second_seen = IntraOpThreads();
    second_set.Notify();
  });
  first.join();
  second.join();
  EXPECT_EQ(first_seen, 1);
  EXPECT_EQ(second_seen, 2);
}

TEST(SetFlushDenormalTest, SubnormalResultsBecomeZeroOnThatThreadOnly) {
  // 1e-30 x 1e-10 = 1e-40, below float32's smallest normal (1.18e-38).
  auto product = [] {
    const torch::Tensor tiny = torch::full({4}, 1e-30f);
    return (tiny * 1e-10f)[0].item<float>();
  };
  float flushed = -1;
  float kept = -1;
  // Tests that trained on this thread before (RunTraining, a data-parallel job's rank 0) left it
  // flushing, as a job's worker thread does; LibTorch then flushes what a new thread computes too,
  // whatever that thread's own flag says. This thread stands for a daemon thread that never trains.
  SetFlushDenormal(false);
  std::thread([&] {
    SetFlushDenormal(true);
    flushed = product();
  }).join();
  std::thread([&] {
    SetFlushDenormal(false);
    kept = product();
  }).join();
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(flushed, 0.0f);
#endif
  EXPECT_GT(kept, 0.0f);
  EXPECT_LT(kept, 1e-38f);
}

// The calling thread's nice value (Linux keeps one per thread).
int ThreadNice() { return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())); }

TEST(LowerThreadPriorityTest, LowersTheCallingThreadOnlyNeverRaisesAndIsInherited) {
  const int main_before = ThreadNice();
  int lowered = -1;
  int kept = -1;
  int inherited = -1;
  std::thread([&] {
    LowerThreadPriority(main_before + 5);
    lowered = ThreadNice();
    LowerThreadPriority(main_before + 2);  // never back up
    kept = ThreadNice();
    std::thread([&] { inherited = ThreadNice(); }).join();  // as an OpenMP team's threads are
  }).join();
  EXPECT_EQ(lowered, main_before + 5);
  EXPECT_EQ(kept, main_before + 5);
  EXPECT_EQ(inherited, main_before + 5);
  EXPECT_EQ(ThreadNice(), main_before);
  // 0 does nothing.
  int untouched = -1;
  std::thread([&] {
    LowerThreadPriority(0);
    untouched = ThreadNice();
  }).join();
  EXPECT_EQ(untouched, main_before);
}

// A CPU job's training thread runs at TrainingRun::cpu_nice, from its first operator.
TEST(LowerThreadPriorityTest, ACpuJobTrainsAtItsNiceValue) {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "random";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = 32;
  dataset->meta.device = "cpu";
  dataset->features = torch::randn({32, 4});
  dataset->targets = torch::randn({32, 1});
  TrainingRun run;
  run.spec.dataset = "random";
  run.spec.model = "linear:1";
  run.spec.batch_size = 16;
  run.spec.epochs = 2;
  run.spec.device = "cpu";
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = dataset;
  run.cpu_nice = ThreadNice() + 7;
  int during = -1;
  run.on_epoch = [&](const EpochResult&, int64_t, int64_t) { during = ThreadNice(); };
  std::thread([&] {
    const TrainingOutcome outcome = RunTraining(run);
    EXPECT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
  }).join();
  EXPECT_EQ(during, run.cpu_nice);
}

TEST(UsableCoresTest, AtLeastOneAndNoMoreThanTheMachine) {
  const int cores = UsableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(static_cast<unsigned>(cores), std::max(1u, std::thread::hardware_concurrency()));
}

class JobThreadsTest : public EngineFixture {};

TEST_F(JobThreadsTest, ASmallModelRunsOnOneThreadAndALargeOneOnTheCores) {
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  JobSpec small = SeedSpec("clusters");
  small.model = "linear:64,relu,linear:64,relu,linear:3";
  small.loss = LossKind::kCrossEntropy;
  small.batch_size = 32;
  small.epochs = 2;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, small);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.intra_op_threads, 1);

  // 64 features, 512-wide: 3 x 2 x 256 x (64 x 512 + 512 x 512 + 512) = 453 MFLOPs per step,
  // four threads' worth: four, or the cores when there are fewer.
  ASSERT_TRUE(Upload(*engine_, "wide", RandomTable(256, 64)).ok());
  JobSpec large = SeedSpec("wide");
  large.model = "linear:512,relu,linear:512,relu,linear:1";
  large.batch_size = 256;
  large.epochs = 1;
  job = RunJob(*engine_, large);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.intra_op_threads, std::min(UsableCores(), 4));
}

TEST_F(JobThreadsTest, TheDaemonSettingGivesEveryCpuJobItsThreads) {
  EngineOptions options = Options();
  options.jobs.intra_op_threads = 2;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  ASSERT_TRUE(Upload(*engine_, "seed", test_support::SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 2;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.intra_op_threads, std::min(2, UsableCores()));

  // A hostile or mistaken count (a million threads) is capped at the usable cores.
  options.jobs.intra_op_threads = 1000000;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);  // the dataset is kept in the data folder
  job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  EXPECT_EQ(job->report.intra_op_threads, UsableCores());
}

TEST_F(JobThreadsTest, AJobsLossesDoNotDependOnWhatRunsBesideIt) {
  // Two small jobs side by side on a two-worker CPU take one thread each, as each would alone,
  // and report the losses of a run alone.
  ASSERT_TRUE(Upload(*engine_, "clusters", ClustersTable()).ok());
  JobSpec spec = SeedSpec("clusters");
  spec.model = "linear:16,tanh,linear:3";
  spec.loss = LossKind::kCrossEntropy;
  spec.epochs = 5;
  absl::StatusOr<JobSnapshot> alone = RunJob(*engine_, spec);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_EQ(alone->state, JobState::kSucceeded) << alone->error;

  EngineOptions options = Options();
  options.jobs.max_concurrent_jobs = 2;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  absl::StatusOr<JobSnapshot> a = engine_->SubmitJob(spec);
  absl::StatusOr<JobSnapshot> b = engine_->SubmitJob(spec);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<JobSnapshot> a_end = test_support::WaitForEnd(*engine_, a->id);
  absl::StatusOr<JobSnapshot> b_end = test_support::WaitForEnd(*engine_, b->id);
  ASSERT_TRUE(a_end.ok() && b_end.ok());
  EXPECT_EQ(a_end->report.intra_op_threads, 1);
  EXPECT_EQ(b_end->report.intra_op_threads, 1);
  EXPECT_EQ(test_support::Losses(*a_end), test_support::Losses(*alone));
  EXPECT_EQ(test_support::Losses(*b_end), test_support::Losses(*alone));
}

}  // namespace
}  // namespace trainerd::engine
