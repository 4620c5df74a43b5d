// Runs `job list` and `job rm` (client/commands.h) against a fake trainerd in this process that
// pages and filters like the real one: what each sends, and what it prints.
#include <algorithm>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/requests.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/client/run_captured.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Jobs job-00 .. job-NN in creation order; every third one RUNNING, the rest SUCCEEDED. Pages of
// at most `max_page` jobs whatever the request asks, so that paging shows with few jobs.
class FakeJobs final : public v1::JobService::Service {
 public:
  explicit FakeJobs(int count) {
    for (int i = 0; i < count; ++i) {
      v1::Job job;
      job.set_id(absl::StrCat("job-", i < 10 ? "0" : "", i));
      job.set_state(i % 3 == 0 ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_SUCCEEDED);
      job.mutable_spec()->set_dataset(i % 2 == 0 ? "even" : "odd");
      job.mutable_spec()->set_epochs(10);
      job.set_epochs_completed(i % 3 == 0 ? 4 : 10);
      jobs_.push_back(job);
    }
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests.push_back(*request);
    std::vector<v1::Job> order = jobs_;
    if (request->newest_first()) std::reverse(order.begin(), order.end());
    size_t start = 0;
    if (!request->page_token().empty() && !absl::SimpleAtoi(request->page_token(), &start)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad token");
    }
    const int size = std::min(request->page_size() == 0 ? 100 : request->page_size(), max_page);
    size_t i = start;
    for (; i < order.size() && response->jobs_size() < size; ++i) {
      const v1::Job& job = order[i];
      if (request->state() != v1::JOB_STATE_UNSPECIFIED && job.state() != request->state())
        continue;
      if (!request->dataset().empty() && job.spec().dataset() != request->dataset()) continue;
      *response->add_jobs() = job;
    }
    if (i < order.size()) response->set_next_page_token(absl::StrCat(i));
    return grpc::Status::OK;
  }

  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    deleted.push_back(request->id());
    if (request->id() == "job-running") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "job 'job-running' is RUNNING; cancel it first");
    }
    return grpc::Status::OK;
  }

  int max_page = 1000;
  std::vector<v1::ListJobsRequest> requests;
  std::vector<std::string> deleted;

 private:
  std::mutex mu_;
  std::vector<v1::Job> jobs_;
};

class JobCommandsTest : public ::testing::Test {
 protected:
  void Start(int jobs) {
    jobs_ = std::make_unique<FakeJobs>(jobs);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(jobs_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Runs trainctl with `words` against the fake; its stdout in out_, its stderr in err_.
  int Run(std::vector<std::string> words) {
    words.insert(words.begin(), {"trainctl", "--addr", absl::StrCat("127.0.0.1:", port_)});
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    if (!invocation.ok()) return -1;
    CapturedRun run = RunCaptured(*invocation);
    out_ = std::move(run.out);
    err_ = std::move(run.err);
    return run.code;
  }

  // The job ids in a printed table, top to bottom.
  std::vector<std::string> ListedIds() const {
    std::vector<std::string> ids;
    std::istringstream lines(out_);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("job-", 0) == 0) ids.push_back(line.substr(0, line.find(' ')));
    }
    return ids;
  }

  std::unique_ptr<FakeJobs> jobs_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string out_;
  std::string err_;
};

TEST_F(JobCommandsTest, ListAsksForTheNewestFiftyAndShowsThemOldestFirst) {
  Start(60);
  EXPECT_EQ(Run({"job", "list"}), kExitOk) << err_;
  ASSERT_EQ(jobs_->requests.size(), 1u);
  EXPECT_TRUE(jobs_->requests[0].newest_first());
  EXPECT_EQ(jobs_->requests[0].page_size(), 50);
  const std::vector<std::string> ids = ListedIds();
  ASSERT_EQ(ids.size(), 50u);
  EXPECT_EQ(ids.front(), "job-10");
  EXPECT_EQ(ids.back(), "job-59");  // the newest at the bottom
  EXPECT_THAT(err_, HasSubstr("showing the newest 50 jobs; older ones exist"));
  // The basic view's count of epochs is shown, though no epoch came with the jobs.
  EXPECT_THAT(out_, HasSubstr(" 4/10 "));
}

TEST_F(JobCommandsTest, ListFiltersByStateAndDatasetUpToTheLimit) {
  Start(12);
  EXPECT_EQ(Run({"job", "list", "--state", "Running", "--dataset", "even", "--limit", "3"}),
            kExitOk)
      << err_;
  ASSERT_EQ(jobs_->requests.size(), 1u);
  EXPECT_EQ(jobs_->requests[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->requests[0].dataset(), "even");
  EXPECT_EQ(jobs_->requests[0].page_size(), 3);
  // Running and even: 0, 6 of 0..11.
  EXPECT_THAT(ListedIds(), ElementsAre("job-00", "job-06"));
  EXPECT_THAT(err_, IsEmpty());
}

TEST_F(JobCommandsTest, ListAllFollowsEveryPageInCreationOrder) {
  Start(8);
  jobs_->max_page = 3;
  EXPECT_EQ(Run({"job", "list", "--all"}), kExitOk) << err_;
  ASSERT_EQ(jobs_->requests.size(), 3u);
  EXPECT_FALSE(jobs_->requests[0].newest_first());
  EXPECT_EQ(jobs_->requests[1].page_token(), "3");
  EXPECT_THAT(ListedIds(), ElementsAre("job-00", "job-01", "job-02", "job-03", "job-04", "job-05",
                                       "job-06", "job-07"));
  EXPECT_THAT(err_, IsEmpty());
}

TEST_F(JobCommandsTest, ListRefusesABadStateAndLimitWithAll) {
  Start(1);
  EXPECT_EQ(Run({"job", "list", "--state", "sleeping"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("--state must be queued, running, succeeded, failed or cancelled"));
  EXPECT_EQ(Run({"job", "list", "--all", "--limit", "5"}), kExitUsage);
  EXPECT_EQ(Run({"job", "list", "--limit", "0"}), kExitUsage);
  EXPECT_TRUE(jobs_->requests.empty());  // nothing was sent
}

TEST_F(JobCommandsTest, RmDeletesTheJobAndSaysSo) {
  Start(1);
  EXPECT_EQ(Run({"job", "rm", "job-done"}), kExitOk) << err_;
  EXPECT_THAT(jobs_->deleted, ElementsAre("job-done"));
  EXPECT_EQ(out_, "deleted job 'job-done' with its model and checkpoints\n");
  EXPECT_EQ(Run({"job", "rm", "job-running"}), kExitFailure);
  EXPECT_THAT(err_, HasSubstr("cancel it first"));
}

TEST(ParseJobStateTest, AcceptsEveryStateInAnyCase) {
  EXPECT_EQ(*ParseJobState("queued"), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(*ParseJobState("RUNNING"), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*ParseJobState("Succeeded"), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(*ParseJobState("failed"), v1::JOB_STATE_FAILED);
  EXPECT_EQ(*ParseJobState("cancelled"), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(*ParseJobState("canceled"), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ParseJobState("done").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainerd::client
