// Scheduling on one device: priorities (high, normal, low; first come first served within one),
// several jobs at once (EngineOptions::max_concurrent_jobs), and each job's own random generators:
// the same spec and seed give the same losses whatever else runs beside them.
#include <algorithm>
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
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::ElementsAre;

class SchedulingTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }

  std::string Submit(JobSpec spec) {
    absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(std::move(spec));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id : "";
  }
};

TEST_F(SchedulingTest, HigherPriorityRunsFirstAndFirstComeFirstServedWithinOne) {
  // One job at a time (the fixture's): a blocker holds the CPU while the others queue.
  const std::string blocker = Submit(BlockerSpec("seed"));
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(blocker, recorder).ok());
  ASSERT_TRUE(recorder->WaitForEpochs(1));

  JobSpec spec = SeedSpec("seed");
  spec.epochs = 2;
  std::vector<std::pair<std::string, std::string>> submitted;  // name, id
  for (const auto& [name, priority] :
       std::vector<std::pair<std::string, JobPriority>>{{"low", JobPriority::kLow},
                                                        {"normal-1", JobPriority::kNormal},
                                                        {"high-1", JobPriority::kHigh},
                                                        {"normal-2", JobPriority::kNormal},
                                                        {"high-2", JobPriority::kHigh}}) {
    spec.priority = priority;
    submitted.emplace_back(name, Submit(spec));
  }
  ASSERT_TRUE(engine_->CancelJob(blocker).ok());

  std::vector<std::pair<absl::Time, std::string>> starts;
  for (const auto& [name, id] : submitted) {
    absl::StatusOr<JobSnapshot> job = WaitForEnd(*engine_, id);
    ASSERT_TRUE(job.ok());
    ASSERT_EQ(job->state, JobState::kSucceeded) << name;
    EXPECT_EQ(job->spec.priority, name == "low"    ? JobPriority::kLow
                                  : name[0] == 'h' ? JobPriority::kHigh
                                                   : JobPriority::kNormal);
    starts.emplace_back(job->start_time, name);
  }
  std::sort(starts.begin(), starts.end());
  std::vector<std::string> order;
  for (const auto& [time, name] : starts) order.push_back(name);
  EXPECT_THAT(order, ElementsAre("high-1", "high-2", "normal-1", "normal-2", "low"));
}

// Dropout and a shuffle per epoch: the losses depend on every draw from the job's generator.
JobSpec RandomSpec() {
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:32,relu,dropout:0.3,linear:1";
  spec.optimizer = OptimizerKind::kAdam;
  spec.learning_rate = 0.01;
  spec.epochs = 30;
  spec.validation_fraction = 0.25;
  return spec;
}

TEST_F(SchedulingTest, IdenticalJobsRunTogetherReportTheLossesOfOneRunAlone) {
  absl::StatusOr<JobSnapshot> alone = RunJob(*engine_, RandomSpec());
  ASSERT_TRUE(alone.ok());
  ASSERT_EQ(alone->state, JobState::kSucceeded) << alone->error;

  EngineOptions options = Options();
  options.jobs.max_concurrent_jobs = 2;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  const std::string first = Submit(RandomSpec());
  const std::string second = Submit(RandomSpec());
  absl::StatusOr<JobSnapshot> a = WaitForEnd(*engine_, first);
  absl::StatusOr<JobSnapshot> b = WaitForEnd(*engine_, second);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->state, JobState::kSucceeded) << a->error;
  ASSERT_EQ(b->state, JobState::kSucceeded) << b->error;
  // They ran at the same time (two workers on the one device)...
  EXPECT_LT(b->start_time, a->end_time);
  EXPECT_LT(a->start_time, b->end_time);
  // ...and each drew only from its own generator.
  EXPECT_EQ(Losses(*a), Losses(*alone));
  EXPECT_EQ(Losses(*b), Losses(*alone));
  ASSERT_EQ(a->epochs.size(), alone->epochs.size());
  for (size_t i = 0; i < a->epochs.size(); ++i) {
    EXPECT_EQ(a->epochs[i].validation_loss, alone->epochs[i].validation_loss);
    EXPECT_EQ(b->epochs[i].validation_loss, alone->epochs[i].validation_loss);
  }
}

TEST_F(SchedulingTest, TheCpuRunsAJobPerCoreByDefaultAndOneWithMaxConcurrentJobsOne) {
  // Two cores (the fixture's) and the default workers, two one-thread jobs: side by side.
  EngineOptions options = Options();
  options.jobs.max_concurrent_jobs = 0;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 200;
  std::string first = Submit(spec);
  std::string second = Submit(spec);
  absl::StatusOr<JobSnapshot> a = WaitForEnd(*engine_, first);
  absl::StatusOr<JobSnapshot> b = WaitForEnd(*engine_, second);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->report.intra_op_threads, 1);
  EXPECT_LT(b->start_time, a->end_time);
  EXPECT_LT(a->start_time, b->end_time);

  options.jobs.max_concurrent_jobs = 1;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  spec.epochs = 20;
  first = Submit(spec);
  second = Submit(spec);
  a = WaitForEnd(*engine_, first);
  b = WaitForEnd(*engine_, second);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GE(b->start_time, a->end_time);
}

}  // namespace
}  // namespace trainerd::engine
