// Tests server/service/server.h: the standard health and reflection services beside the API, and
// an orderly Shutdown while a job runs and a client watches it.
#include <algorithm>
#include <future>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace trainerd::service::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr int64_t kServing = 1;     // grpc.health.v1.HealthCheckResponse.SERVING
constexpr int64_t kNotServing = 2;  // grpc.health.v1.HealthCheckResponse.NOT_SERVING

class ServerTest : public ServiceTest {};

TEST_F(ServerTest, HealthIsServingWhileRunning) {
  int64_t serving_status = -1;
  grpc::Status status = CheckHealth(channel_, "", &serving_status);

  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(serving_status, kServing);
}

TEST_F(ServerTest, HealthOfJobServiceIsServingWhileRunning) {
  int64_t serving_status = -1;
  grpc::Status status = CheckHealth(channel_, "trainerd.v1.JobService", &serving_status);

  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(serving_status, kServing);
}

TEST_F(ServerTest, HealthFailsOrIsNotServingAfterShutdown) {
  server_->Shutdown(absl::Seconds(5));

  int64_t serving_status = -1;
  grpc::Status status = CheckHealth(channel_, "", &serving_status);

  EXPECT_TRUE(!status.ok() || serving_status == kNotServing)
      << "the health check after Shutdown answered status " << serving_status;
}

TEST_F(ServerTest, ReflectionListsTheApiServices) {
  std::vector<std::string> services;
  grpc::Status status = ListReflectedServices(channel_, &services);

  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_THAT(services, Contains("trainerd.v1.JobService"));
  EXPECT_THAT(services, Contains("trainerd.v1.DatasetService"));
}

// With job records (the default), Shutdown leaves a running job to resume at the next start: it
// is not cancelled, and its watch ends at once with UNAVAILABLE saying so.
TEST_F(ServerTest, ShutdownLeavesRunningJobToResumeAndEndsItsWatch) {
  UploadSeed();
  v1::Job job;
  ASSERT_TRUE(SubmitJob(LinearSpec("seed", kLongJobEpochs), &job).ok());
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->NextEpoch()) << "the stream ended before the first epoch";
  auto watch_done = std::async(std::launch::async, [&] { return watch->Finish(); });

  // The watch ends by itself, with a status that says why (how fast is for `make bench`, not for
  // a test: no test asserts a wall time).
  server_->Shutdown(absl::Seconds(20));
  grpc::Status status = watch_done.get();

  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("resumes when it starts again"));
  absl::StatusOr<engine::JobSnapshot> stopped = server_->engine()->GetJob(job.id());
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state, engine::JobState::kRunning);
}

// Without job records nothing could resume it: Shutdown cancels the job, and its watch receives
// that and ends.
TEST_F(ServerTest, ShutdownWithoutJobRecordsCancelsRunningJobAndEndsItsWatch) {
  server_.reset();
  ServerOptions options = Options();
  options.keep_job_records = false;
  StartServer(options);
  UploadSeed();
  v1::Job job;
  ASSERT_TRUE(SubmitJob(LinearSpec("seed", kLongJobEpochs), &job).ok());
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->NextEpoch()) << "the stream ended before the first epoch";
  auto watch_done = std::async(std::launch::async, [&] { return watch->Finish(); });

  server_->Shutdown(absl::Seconds(20));
  grpc::Status status = watch_done.get();

  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ASSERT_FALSE(watch->events().empty());
  const v1::JobEvent& last = watch->events().back();
  ASSERT_TRUE(last.has_job()) << last.ShortDebugString();
  EXPECT_EQ(v1::JobState_Name(last.job().state()), v1::JobState_Name(v1::JOB_STATE_CANCELLED));
  EXPECT_THAT(last.job().error(), HasSubstr("shut down"));
  EXPECT_LT(last.job().epochs_size(), kLongJobEpochs);
}

// SIGTERM's path: health turns NOT_SERVING and submissions are refused while the running job
// finishes its epoch and checkpoints; the job then stays RUNNING, with the drain's checkpoint.
TEST_F(ServerTest, DrainCheckpointsTheRunningJobAndRefusesNewOnes) {
  UploadSeed();
  v1::Job job;
  ASSERT_TRUE(SubmitJob(LinearSpec("seed", kLongJobEpochs), &job).ok());
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  ASSERT_TRUE(watch->NextEpoch());
  server_->Drain(absl::Seconds(30), absl::Seconds(5));

  absl::StatusOr<engine::JobSnapshot> stopped = server_->engine()->GetJob(job.id());
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state, engine::JobState::kRunning);
  ASSERT_EQ(stopped->checkpoints.size(), 1u);
  EXPECT_EQ(stopped->checkpoints[0].epoch, stopped->epochs_completed);
  EXPECT_EQ(server_->engine()->SubmitJob(engine::JobSpec()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace trainerd::service::testing
