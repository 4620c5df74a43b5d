// Tests for what a request may cost the engine: upload staging that grows with the bytes
// received and is bounded across uploads, uploads that are cancelled or end early, and Submit's
// bounds on model size, epochs, checkpoints and the queue.
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::BlockerSpec;
using test_support::EngineFixture;
using test_support::HeaderFor;
using test_support::RandomTable;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;

// A header that declares `rows` rows of 1024 float32 features and one float32 target.
DatasetHeader BigHeader(const std::string& name, int64_t rows) {
  DatasetHeader header;
  header.name = name;
  header.feature_shape = {1024};
  header.target_shape = {1};
  header.rows = rows;
  return header;
}

using EngineLimitsTest = EngineFixture;

// A header that declares 4 GiB and sends a kilobyte is charged a kilobyte: not 4 GiB, and not a
// block either (520 uploads trickling a byte each once held 8 GiB of budget between them).
TEST_F(EngineLimitsTest, StagingGrowsWithTheBytesReceivedNotTheDeclaredSize) {
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine_->BeginUpload(BigHeader("huge", int64_t{1} << 20));
  ASSERT_TRUE(upload.ok()) << upload.status();
  EXPECT_EQ((*upload)->expected_bytes(), (int64_t{1} << 20) * 1025 * 4);
  EXPECT_EQ((*upload)->staged_bytes(), 0);
  EXPECT_EQ(engine_->staged_upload_bytes(), 0);
  ASSERT_TRUE((*upload)->Append(std::string(1024, 'x')).ok());
  EXPECT_EQ((*upload)->staged_bytes(), 1024);
  EXPECT_EQ(engine_->staged_upload_bytes(), 1024);
  ASSERT_TRUE((*upload)->Append("y").ok());
  EXPECT_EQ(engine_->staged_upload_bytes(), 1025);
  upload->reset();
  EXPECT_EQ(engine_->staged_upload_bytes(), 0);
}

TEST_F(EngineLimitsTest, UploadsInFlightAreBoundedTogether) {
  EngineOptions options = Options();
  options.max_upload_bytes_in_flight = 2 * kStagingBlockBytes;
  engine_.reset();
  engine_ = StartEngine(options);
  absl::StatusOr<std::unique_ptr<UploadSession>> first =
      engine_->BeginUpload(BigHeader("first", 100000));
  absl::StatusOr<std::unique_ptr<UploadSession>> second =
      engine_->BeginUpload(BigHeader("second", 100000));
  ASSERT_TRUE(first.ok() && second.ok());
  // The first takes the whole bound; the second cannot stage a byte.
  ASSERT_TRUE((*first)->Append(std::string(2 * kStagingBlockBytes, 'a')).ok());
  const absl::Status refused = (*second)->Append("b");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("--max_upload_bytes_in_flight"));
  // Once the first is gone, the second goes on.
  first->reset();
  EXPECT_TRUE((*second)->Append("b").ok());
}

TEST_F(EngineLimitsTest, ACancelledUploadIsNeverRegisteredAndItsNameIsFree) {
  const Table table = SeedTable(100);
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine_->BeginUpload(HeaderFor("seed", table));
  ASSERT_TRUE(upload.ok());
  ASSERT_TRUE((*upload)->Append(EncodePayload(table)).ok());
  (*upload)->cancellation()->store(true);
  const absl::StatusOr<DatasetMeta> meta = engine_->CommitUpload(*std::move(upload));
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(engine_->ListDatasets().empty());
  EXPECT_NE(access(DatasetPath("seed").c_str(), F_OK), 0);
  EXPECT_TRUE(Upload(*engine_, "seed", table).ok());
}

TEST_F(EngineLimitsTest, AnUploadThatEndsEarlyIsDiscarded) {
  const Table table = SeedTable(100);
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine_->BeginUpload(HeaderFor("seed", table));
  ASSERT_TRUE(upload.ok());
  ASSERT_TRUE((*upload)->Append(EncodePayload(table).substr(0, 100)).ok());
  const absl::StatusOr<DatasetMeta> meta = engine_->CommitUpload(*std::move(upload));
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->ListDatasets().empty());
  EXPECT_EQ(engine_->staged_upload_bytes(), 0);
  EXPECT_TRUE(Upload(*engine_, "seed", table).ok());
}

TEST_F(EngineLimitsTest, TheUploaderIsRecordedAndSurvivesARestart) {
  const Table table = SeedTable(10);
  CallContext caller;
  caller.owner = "alice \"the\" admin";
  absl::StatusOr<std::unique_ptr<UploadSession>> upload =
      engine_->BeginUpload(HeaderFor("seed", table), caller);
  ASSERT_TRUE(upload.ok());
  ASSERT_TRUE((*upload)->Append(EncodePayload(table)).ok());
  ASSERT_TRUE(engine_->CommitUpload(*std::move(upload)).ok());
  // Its own by the bare name; anyone else's (here the unnamed local admin's) as OWNER/NAME.
  EXPECT_EQ(engine_->GetDataset("seed", caller)->owner, "alice \"the\" admin");
  engine_.reset();
  engine_ = StartEngine(Options());
  EXPECT_EQ(engine_->GetDataset("seed", caller)->owner, "alice \"the\" admin");
  EXPECT_EQ(engine_->GetDataset("alice \"the\" admin/seed")->owner, "alice \"the\" admin");
}

// ---- Submit's bounds -------------------------------------------------------------------------

TEST_F(EngineLimitsTest, AModelWithTooManyParametersIsResourceExhausted) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(10)).ok());
  JobSpec spec = SeedSpec("seed");
  spec.model = "linear:1048576,linear:4096,linear:1";
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(job.status().message(), HasSubstr("parameters; at most 2147483648 are allowed"));
  EXPECT_TRUE(engine_->ListJobs()->jobs.empty());
}

TEST_F(EngineLimitsTest, AModelWhoseWorkingSetIsTooLargeIsResourceExhausted) {
  // 512 rows of 1x16x16: conv2d's 65,536 channels make 64 MiB of activations per row and layer,
  // 32 GiB per layer for a batch of 512, and 41 layers of them well over the 1 TiB limit. (Few
  // parameters: the estimate, not the count, refuses it.)
  Table images = RandomTable(512, 256);
  images.feature_shape = {1, 16, 16};
  ASSERT_TRUE(Upload(*engine_, "images", images).ok());
  JobSpec spec = SeedSpec("images");
  spec.model = "conv2d:65536:1";
  for (int i = 0; i < 40; ++i) spec.model += ",relu";
  spec.model += ",flatten,linear:1";
  spec.batch_size = 512;
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(job.status().message(), HasSubstr("would need about"));
  EXPECT_THAT(job.status().message(), HasSubstr("at most 1024.0 GiB per job is allowed"));
  EXPECT_TRUE(engine_->ListJobs()->jobs.empty());
}

TEST_F(EngineLimitsTest, TooManyCheckpointsAreInvalid) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(10)).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5000;
  spec.checkpoint_every = 1;
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("at most 1000 are allowed"));
}

TEST_F(EngineLimitsTest, TheQueueIsBounded) {
  EngineOptions options = Options();
  options.jobs.max_queued_jobs = 1;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(10)).ok());
  const absl::StatusOr<JobSnapshot> running = engine_->SubmitJob(BlockerSpec("seed"));
  ASSERT_TRUE(running.ok());
  // Wait for the worker to take it, so that the queue is empty again.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (engine_->GetJob(running->id)->state == JobState::kQueued && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::StatusOr<JobSnapshot> queued = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(queued.ok()) << queued.status();
  const absl::StatusOr<JobSnapshot> refused = engine_->SubmitJob(SeedSpec("seed"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("1 jobs are already queued"));
  EXPECT_TRUE(engine_->CancelJob(queued->id).ok());
  EXPECT_TRUE(engine_->CancelJob(running->id).ok());
}

}  // namespace
}  // namespace trainerd::engine
