// Datasets through the Engine: uploads (staging, byte count, checksum, NaN scan, names, limits),
// persistence across restarts (and the quarantine of damaged files), and deletion.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::BlockerSpec;
using test_support::EngineFixture;
using test_support::EventRecorder;
using test_support::HeaderFor;
using test_support::Losses;
using test_support::RunJob;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

absl::StatusCode CodeOf(const absl::StatusOr<DatasetMeta>& meta) { return meta.status().code(); }

std::vector<std::string> Names(const std::vector<DatasetMeta>& datasets) {
  std::vector<std::string> names;
  for (const DatasetMeta& meta : datasets) names.push_back(meta.name);
  return names;
}

// --- Upload ---

class DatasetUploadTest : public EngineFixture {};

TEST_F(DatasetUploadTest, GoodUploadIsListedWithItsMeta) {
  const Table table = SeedTable(/*rows=*/100);
  const std::string payload = EncodePayload(table);

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", table, /*chunk_bytes=*/77);

  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->name, "seed");
  EXPECT_EQ(meta->rows, 100);
  EXPECT_EQ(meta->size_bytes, 100 * (4 + 4));
  EXPECT_EQ(meta->size_bytes, static_cast<int64_t>(payload.size()));
  EXPECT_EQ(meta->sha256, Sha256Hex(payload));
  EXPECT_EQ(meta->device, "cpu");
  EXPECT_EQ(meta->feature_shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(meta->target_shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(meta->target_dtype, TargetDType::kFloat32);
  EXPECT_NE(meta->create_time, absl::UnixEpoch());
  const std::vector<DatasetMeta> listed = engine_->ListDatasets();
  ASSERT_THAT(listed, SizeIs(1));
  EXPECT_EQ(listed[0].name, "seed");
  EXPECT_EQ(listed[0].sha256, meta->sha256);
  absl::StatusOr<DatasetMeta> got = engine_->GetDataset("seed");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->rows, 100);
  EXPECT_EQ(got->create_time, meta->create_time);
}

TEST_F(DatasetUploadTest, UploadWithoutChecksumIsAcceptedAndChecksummed) {
  const Table table = SeedTable(/*rows=*/10);
  DatasetHeader header = HeaderFor("seed", table);
  header.sha256.clear();
  absl::StatusOr<std::unique_ptr<UploadSession>> session = engine_->BeginUpload(header);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Append(EncodePayload(table)).ok());

  absl::StatusOr<DatasetMeta> meta = engine_->CommitUpload(*std::move(session));

  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->sha256, Sha256Hex(EncodePayload(table)));
}

// A table of `rows` rows of 5 features (an odd count: the int64 targets after them start at a
// 4-byte offset) and int64 class targets i % 7 - 3, over 16 MiB when rows is large.
Table OddFeatureClassTable(int64_t rows) {
  Table table;
  table.feature_shape = {5};
  table.target_dtype = TargetDType::kInt64;
  table.rows = rows;
  table.features.resize(static_cast<size_t>(rows * 5));
  for (size_t i = 0; i < table.features.size(); ++i) table.features[i] = 0.001f * (i % 1000);
  for (int64_t i = 0; i < rows; ++i) table.targets_i64.push_back(i % 7 - 3);
  return table;
}

TEST_F(DatasetUploadTest, LargeUploadIsWrittenAsItArrivesAndADroppedOneLeavesNothing) {
  const int64_t rows = 700001;  // 14 MB of features, 5.6 MB of targets: two staging blocks
  const Table table = OddFeatureClassTable(rows);
  const std::string payload = EncodePayload(table);
  constexpr size_t kChunk = size_t{1} << 20;
  const std::string tmp = DatasetPath("big") + ".tmp";
  {
    absl::StatusOr<std::unique_ptr<UploadSession>> session =
        engine_->BeginUpload(HeaderFor("big", table));
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_FALSE(std::filesystem::exists(tmp));  // nothing before the first byte
    for (size_t at = 0; at < 10 * kChunk; at += kChunk) {
      ASSERT_TRUE((*session)->Append(std::string_view(payload).substr(at, kChunk)).ok());
    }
    // 10 MiB received: at least 8 MiB of it is in the file already, after the header's room.
    ASSERT_TRUE(std::filesystem::exists(tmp));
    EXPECT_GE(std::filesystem::file_size(tmp), 4096u + 8 * kChunk);
    EXPECT_LE(std::filesystem::file_size(tmp), 8192u + 10 * kChunk);
  }  // dropped (a cancelled stream): the partial file goes, the name is free
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "big", table, kChunk);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->sha256, Sha256Hex(payload));
  EXPECT_EQ(meta->target_min, -3);
  EXPECT_EQ(meta->target_max, 3);
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_EQ(std::filesystem::file_size(DatasetPath("big")), 4096u + payload.size());
}

TEST_F(DatasetUploadTest, Int64TargetsAtAFourByteOffsetGetTheirRangeInSmallChunks) {
  // 3 rows x 5 features = 60 bytes, so the targets start at an offset that is not a multiple of
  // 8, and 7-byte chunks split every value.
  Table table = OddFeatureClassTable(3);
  table.targets_i64 = {41, -1234567890123, 7};
  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "odd", table, /*chunk_bytes=*/7);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->target_min, -1234567890123);
  EXPECT_EQ(meta->target_max, 41);
}

TEST_F(DatasetUploadTest, NonFiniteValueEndsTheUploadOnceItsBlockHasArrived) {
  // A NaN in row 11 is found when the first 16 MiB block is complete, not after the last byte:
  // the client hears at once and stops sending.
  Table table = OddFeatureClassTable(1000001);  // 20 MB of features, 8 MB of targets
  table.features[10 * 5 + 4] = std::numeric_limits<float>::quiet_NaN();
  const std::string payload = EncodePayload(table);
  constexpr size_t kChunk = size_t{1} << 20;
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("nan", table));
  ASSERT_TRUE(session.ok()) << session.status();
  size_t at = 0;
  absl::Status status;
  for (; at < payload.size() && status.ok(); at += kChunk) {
    status = (*session)->Append(std::string_view(payload).substr(at, kChunk));
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("row 11 has a non-finite feature value"));
  EXPECT_EQ(at, 16 * kChunk);  // refused with the chunk that completed the block
  session->reset();
  EXPECT_FALSE(std::filesystem::exists(DatasetPath("nan") + ".tmp"));
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
}

TEST_F(DatasetUploadTest, ListIsSortedByName) {
  ASSERT_TRUE(Upload(*engine_, "zeta", SeedTable(4)).ok());
  ASSERT_TRUE(Upload(*engine_, "alpha", SeedTable(4)).ok());
  ASSERT_TRUE(Upload(*engine_, "mid", SeedTable(4)).ok());
  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("alpha", "mid", "zeta"));
}

TEST_F(DatasetUploadTest, ShortPayloadIsInvalidArgumentAtCommit) {
  const Table table = SeedTable(/*rows=*/10);
  const std::string payload = EncodePayload(table);
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("seed", table));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Append(std::string_view(payload).substr(0, payload.size() - 4)).ok());
  EXPECT_EQ((*session)->received_bytes(), 76);
  EXPECT_EQ((*session)->expected_bytes(), 80);

  absl::StatusOr<DatasetMeta> meta = engine_->CommitUpload(*std::move(session));

  EXPECT_EQ(CodeOf(meta), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(meta.status().message(), HasSubstr("received 76 payload bytes"));
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
}

TEST_F(DatasetUploadTest, PayloadLongerThanHeaderIsInvalidArgumentOnAppend) {
  const Table table = SeedTable(/*rows=*/10);
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("seed", table));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Append(EncodePayload(table)).ok());

  const absl::Status extra = (*session)->Append("x");

  EXPECT_EQ(extra.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(extra.message(), HasSubstr("larger than the header declares"));
  EXPECT_EQ((*session)->received_bytes(), 80);  // the rejected byte was not taken
}

TEST_F(DatasetUploadTest, OversizedFirstChunkIsInvalidArgument) {
  const Table table = SeedTable(/*rows=*/10);
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("seed", table));
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->Append(EncodePayload(table) + "tail").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*session)->received_bytes(), 0);
}

TEST_F(DatasetUploadTest, WrongChecksumIsDataLoss) {
  const Table table = SeedTable(/*rows=*/10);
  DatasetHeader header = HeaderFor("seed", table);
  header.sha256 = Sha256Hex("something else");
  absl::StatusOr<std::unique_ptr<UploadSession>> session = engine_->BeginUpload(header);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Append(EncodePayload(table)).ok());

  absl::StatusOr<DatasetMeta> meta = engine_->CommitUpload(*std::move(session));

  EXPECT_EQ(CodeOf(meta), absl::StatusCode::kDataLoss);
  EXPECT_THAT(meta.status().message(), HasSubstr(header.sha256));
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
}

TEST_F(DatasetUploadTest, MalformedChecksumIsInvalidArgument) {
  DatasetHeader header = HeaderFor("seed", SeedTable(/*rows=*/10));
  header.sha256 = std::string(64, 'A');  // upper case
  EXPECT_EQ(engine_->BeginUpload(header).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DatasetUploadTest, NanFeatureIsInvalidArgumentNamingTheRow) {
  Table table = SeedTable(/*rows=*/10);
  table.features[5] = std::numeric_limits<float>::quiet_NaN();

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", table);

  EXPECT_EQ(CodeOf(meta), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(meta.status().message(), HasSubstr("row 6 has a non-finite feature value"));
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
}

TEST_F(DatasetUploadTest, InfiniteFeatureInWideRowNamesItsRow) {
  Table table = test_support::RandomTable(/*rows=*/10, /*features=*/3);
  table.features[3 * 4 + 2] = std::numeric_limits<float>::infinity();  // row 5, last feature

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "wide", table);

  EXPECT_EQ(CodeOf(meta), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(meta.status().message(), HasSubstr("row 5 has a non-finite feature value"));
}

TEST_F(DatasetUploadTest, NanTargetIsInvalidArgumentNamingTheRow) {
  Table table = SeedTable(/*rows=*/10);
  table.targets_f32[9] = std::numeric_limits<float>::quiet_NaN();

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", table);

  EXPECT_EQ(CodeOf(meta), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(meta.status().message(), HasSubstr("row 10 has a non-finite target value"));
}

TEST_F(DatasetUploadTest, NameOfUploadInProgressIsAlreadyExists) {
  absl::StatusOr<std::unique_ptr<UploadSession>> first =
      engine_->BeginUpload(HeaderFor("seed", SeedTable(10)));
  ASSERT_TRUE(first.ok()) << first.status();

  auto second = engine_->BeginUpload(HeaderFor("seed", SeedTable(10)));

  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(second.status().message(), HasSubstr("dataset 'seed' already exists"));
}

TEST_F(DatasetUploadTest, NameOfCommittedDatasetIsAlreadyExists) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(10)).ok());
  EXPECT_EQ(CodeOf(Upload(*engine_, "seed", SeedTable(10))), absl::StatusCode::kAlreadyExists);
}

TEST_F(DatasetUploadTest, DestroyedUploadReleasesTheName) {
  absl::StatusOr<std::unique_ptr<UploadSession>> abandoned =
      engine_->BeginUpload(HeaderFor("seed", SeedTable(10)));
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  ASSERT_TRUE((*abandoned)->Append("12345678").ok());
  abandoned->reset();

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", SeedTable(10));

  EXPECT_TRUE(meta.ok()) << meta.status();
}

TEST_F(DatasetUploadTest, FailedCommitReleasesTheName) {
  Table bad = SeedTable(10);
  bad.features[0] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(CodeOf(Upload(*engine_, "seed", bad)), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", SeedTable(10));

  EXPECT_TRUE(meta.ok()) << meta.status();
  EXPECT_FALSE(std::filesystem::exists(DatasetPath("seed") + ".tmp"));
}

TEST_F(DatasetUploadTest, InvalidNamesAreInvalidArgument) {
  const std::vector<std::string> names = {"",          "a/b",    "..",
                                          "../escape", "sp ace", std::string(129, 'n')};
  for (const std::string& name : names) {
    absl::StatusOr<std::unique_ptr<UploadSession>> session =
        engine_->BeginUpload(HeaderFor(name, SeedTable(4)));
    EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument) << "'" << name << "'";
  }
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
}

TEST_F(DatasetUploadTest, ZeroRowsIsInvalidArgument) {
  DatasetHeader header = HeaderFor("empty", SeedTable(4));
  header.rows = 0;
  absl::StatusOr<std::unique_ptr<UploadSession>> session = engine_->BeginUpload(header);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(session.status().message(), HasSubstr("at least one row"));
}

TEST_F(DatasetUploadTest, ZeroFeatureDimensionIsInvalidArgument) {
  DatasetHeader header = HeaderFor("flat", SeedTable(4));
  header.feature_shape = {0};
  EXPECT_EQ(engine_->BeginUpload(header).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DatasetUploadTest, PayloadOverTheLimitIsResourceExhausted) {
  engine_.reset();
  EngineOptions options = Options();
  options.max_dataset_bytes = 1024;
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);

  // 800 rows of 8 bytes: 6400 bytes.
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("seed", SeedTable()));

  EXPECT_EQ(session.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(session.status().message(), HasSubstr("at most 1024 bytes"));
  // The name was not reserved by the refused upload.
  EXPECT_TRUE(Upload(*engine_, "seed", SeedTable(/*rows=*/100)).ok());
}

TEST_F(DatasetUploadTest, Int64TargetsReportTheirClassRange) {
  absl::StatusOr<DatasetMeta> meta =
      Upload(*engine_, "classes", test_support::ClassTable(12, 2, 7));

  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->target_dtype, TargetDType::kInt64);
  EXPECT_EQ(meta->target_min, 2);
  EXPECT_EQ(meta->target_max, 7);
  EXPECT_EQ(meta->size_bytes, 12 * (2 * 4 + 8));
  EXPECT_EQ(engine_->GetDataset("classes")->target_max, 7);
}

TEST_F(DatasetUploadTest, AsyncCommitCallsDoneWithTheMeta) {
  const Table table = SeedTable(/*rows=*/10);
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("seed", table));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Append(EncodePayload(table)).ok());
  std::promise<absl::StatusOr<DatasetMeta>> done;
  std::future<absl::StatusOr<DatasetMeta>> result = done.get_future();

  engine_->CommitUploadAsync(*std::move(session), [&done](absl::StatusOr<DatasetMeta> meta) {
    done.set_value(std::move(meta));
  });

  ASSERT_EQ(result.wait_for(absl::ToChronoSeconds(test_support::kWaitTimeout)),
            std::future_status::ready);
  absl::StatusOr<DatasetMeta> meta = result.get();
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->rows, 10);
  EXPECT_TRUE(engine_->GetDataset("seed").ok());
}

TEST_F(DatasetUploadTest, AsyncCommitAfterShutdownIsUnavailable) {
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine_->BeginUpload(HeaderFor("seed", SeedTable(10)));
  ASSERT_TRUE(session.ok()) << session.status();
  engine_->Shutdown();
  absl::Status status;

  engine_->CommitUploadAsync(*std::move(session), [&status](absl::StatusOr<DatasetMeta> meta) {
    status = meta.status();  // called on this thread: the I/O thread has stopped
  });

  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

// --- Persistence ---

class DatasetPersistenceTest : public EngineFixture {
 protected:
  void Restart() {
    engine_.reset();
    engine_ = StartEngine(Options());
    ASSERT_NE(engine_, nullptr);
  }

  // Datasets load when first used: a job on `name` makes the engine read its payload. Returns how
  // the job ended.
  JobSnapshot RunJobOn(const std::string& name) {
    absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(SeedSpec(name));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    absl::StatusOr<JobSnapshot> ended = WaitForEnd(*engine_, job->id);
    EXPECT_TRUE(ended.ok()) << ended.status();
    return ended.ok() ? *ended : JobSnapshot{};
  }

  // Replaces the file's byte at `offset` (from the end when negative).
  void CorruptByte(const std::string& path, int64_t offset) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.is_open()) << path;
    file.seekg(0, std::ios::end);
    const int64_t size = static_cast<int64_t>(file.tellg());
    const int64_t at = offset < 0 ? size + offset : offset;
    file.seekg(at);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(at);
    file.write(&byte, 1);
    ASSERT_TRUE(file.good());
  }
};

TEST_F(DatasetPersistenceTest, DatasetsSurviveRestartWithTheSameMeta) {
  absl::StatusOr<DatasetMeta> seed = Upload(*engine_, "seed", SeedTable());
  absl::StatusOr<DatasetMeta> classes =
      Upload(*engine_, "classes", test_support::ClassTable(9, 1, 4));
  ASSERT_TRUE(seed.ok() && classes.ok());

  ASSERT_NO_FATAL_FAILURE(Restart());

  const std::vector<DatasetMeta> listed = engine_->ListDatasets();
  ASSERT_THAT(Names(listed), ElementsAre("classes", "seed"));
  for (const DatasetMeta* before : {&*classes, &*seed}) {
    absl::StatusOr<DatasetMeta> after = engine_->GetDataset(before->name);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->feature_shape, before->feature_shape);
    EXPECT_EQ(after->target_shape, before->target_shape);
    EXPECT_EQ(after->target_dtype, before->target_dtype);
    EXPECT_EQ(after->rows, before->rows);
    EXPECT_EQ(after->size_bytes, before->size_bytes);
    EXPECT_EQ(after->sha256, before->sha256);
    EXPECT_EQ(after->device, "cpu");
    EXPECT_EQ(after->create_time, before->create_time);
    EXPECT_EQ(after->target_min, before->target_min);
    EXPECT_EQ(after->target_max, before->target_max);
  }
}

TEST_F(DatasetPersistenceTest, ReloadedDatasetTrainsToTheSameLosses) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 5;
  absl::StatusOr<JobSnapshot> before = RunJob(*engine_, spec);
  ASSERT_TRUE(before.ok()) << before.status();

  ASSERT_NO_FATAL_FAILURE(Restart());
  absl::StatusOr<JobSnapshot> after = RunJob(*engine_, spec);

  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_THAT(Losses(*before), SizeIs(5));
  EXPECT_EQ(Losses(*after), Losses(*before));
}

TEST_F(DatasetPersistenceTest, TruncatedFileIsRenamedDamagedAndSkipped) {
  ASSERT_TRUE(Upload(*engine_, "good", SeedTable(20)).ok());
  ASSERT_TRUE(Upload(*engine_, "cut", SeedTable(20)).ok());
  engine_.reset();
  const std::string cut = DatasetPath("cut");
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 3);

  ASSERT_NO_FATAL_FAILURE(Restart());

  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("good"));
  EXPECT_FALSE(std::filesystem::exists(cut));
  EXPECT_TRUE(std::filesystem::exists(cut + ".damaged"));
  EXPECT_EQ(engine_->GetDataset("cut").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DatasetPersistenceTest, CorruptedPayloadIsRenamedDamagedAndSkipped) {
  ASSERT_TRUE(Upload(*engine_, "good", SeedTable(20)).ok());
  ASSERT_TRUE(Upload(*engine_, "flipped", SeedTable(20)).ok());
  engine_.reset();
  ASSERT_NO_FATAL_FAILURE(CorruptByte(DatasetPath("flipped"), -1));

  ASSERT_NO_FATAL_FAILURE(Restart());
  // The start reads headers only; the payload's checksum is checked when a job first needs it.
  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("flipped", "good"));
  const JobSnapshot job = RunJobOn("flipped");

  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.error, HasSubstr("cannot load dataset 'flipped'"));
  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("good"));
  EXPECT_TRUE(std::filesystem::exists(DatasetPath("flipped") + ".damaged"));
  EXPECT_EQ(RunJobOn("good").state, JobState::kSucceeded);
}

TEST_F(DatasetPersistenceTest, CorruptedHeaderIsRenamedDamagedAndSkipped) {
  ASSERT_TRUE(Upload(*engine_, "good", SeedTable(20)).ok());
  ASSERT_TRUE(Upload(*engine_, "magic", SeedTable(20)).ok());
  engine_.reset();
  ASSERT_NO_FATAL_FAILURE(CorruptByte(DatasetPath("magic"), 0));

  ASSERT_NO_FATAL_FAILURE(Restart());

  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("good"));
  EXPECT_TRUE(std::filesystem::exists(DatasetPath("magic") + ".damaged"));
}

TEST_F(DatasetPersistenceTest, DamagedFileThatCannotBeRenamedDoesNotStopTheStart) {
  ASSERT_TRUE(Upload(*engine_, "good", SeedTable(20)).ok());
  ASSERT_TRUE(Upload(*engine_, "stuck", SeedTable(20)).ok());
  engine_.reset();
  ASSERT_NO_FATAL_FAILURE(CorruptByte(DatasetPath("stuck"), -1));
  // A folder in the way makes the rename to stuck.trds.damaged fail.
  std::filesystem::create_directories(DatasetPath("stuck") + ".damaged/occupied");

  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(RunJobOn("stuck").state, JobState::kFailed);

  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("good"));
  EXPECT_TRUE(std::filesystem::exists(DatasetPath("stuck")));  // left where it was
}

TEST_F(DatasetPersistenceTest, FileUnderAnotherNameIsRenamedDamaged) {
  ASSERT_TRUE(Upload(*engine_, "original", SeedTable(20)).ok());
  engine_.reset();
  std::filesystem::rename(DatasetPath("original"), DatasetPath("renamed"));

  ASSERT_NO_FATAL_FAILURE(Restart());

  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
  EXPECT_TRUE(std::filesystem::exists(DatasetPath("renamed") + ".damaged"));
}

TEST_F(DatasetPersistenceTest, DamagedDatasetsNameCanBeUploadedAgain) {
  ASSERT_TRUE(Upload(*engine_, "seed", SeedTable(20)).ok());
  engine_.reset();
  ASSERT_NO_FATAL_FAILURE(CorruptByte(DatasetPath("seed"), -1));
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(RunJobOn("seed").state, JobState::kFailed);

  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", SeedTable(20));

  EXPECT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(std::filesystem::exists(DatasetPath("seed")));
}

TEST_F(DatasetPersistenceTest, LeftoverTemporaryFileIsRemovedAtStart) {
  engine_.reset();
  const std::string tmp = DatasetPath("half") + ".tmp";
  std::ofstream(tmp) << "TRAINERD-DATASET 1\nname=half\n";
  ASSERT_TRUE(std::filesystem::exists(tmp));

  ASSERT_NO_FATAL_FAILURE(Restart());

  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_THAT(engine_->ListDatasets(), IsEmpty());
}

TEST_F(DatasetPersistenceTest, EmptyDataDirIsInvalidArgument) {
  EngineOptions options = Options();
  options.data_dir = "";
  EXPECT_EQ(Engine::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// --- Delete ---

class DatasetDeleteTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "busy", SeedTable()).ok());
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
};

TEST_F(DatasetDeleteTest, DeletingDatasetOfQueuedJobIsFailedPrecondition) {
  ASSERT_TRUE(engine_->SubmitJob(BlockerSpec("busy")).ok());
  absl::StatusOr<JobSnapshot> queued = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_EQ(engine_->GetJob(queued->id)->state, JobState::kQueued);

  const absl::Status deleted = engine_->DeleteDataset("seed");

  EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(deleted.message(), HasSubstr(queued->id));
  EXPECT_TRUE(engine_->GetDataset("seed").ok());
  EXPECT_TRUE(std::filesystem::exists(DatasetPath("seed")));
}

TEST_F(DatasetDeleteTest, DeletingDatasetOfRunningJobIsFailedPrecondition) {
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(BlockerSpec("busy"));
  ASSERT_TRUE(job.ok()) << job.status();
  auto recorder = std::make_shared<EventRecorder>();
  ASSERT_TRUE(engine_->SubscribeJob(job->id, recorder).ok());
  // An epoch event proves it runs (the RUNNING event may precede the subscription).
  ASSERT_TRUE(recorder->WaitForEpochs(1));

  const absl::Status deleted = engine_->DeleteDataset("busy");

  EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(deleted.message(), HasSubstr("in use by job '" + job->id + "'"));
}

TEST_F(DatasetDeleteTest, DeletingAfterTheJobEndsRemovesDatasetAndFile) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(std::filesystem::exists(DatasetPath("seed")));

  const absl::Status deleted = engine_->DeleteDataset("seed");

  EXPECT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(engine_->GetDataset("seed").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("busy"));
  EXPECT_FALSE(std::filesystem::exists(DatasetPath("seed")));
}

TEST_F(DatasetDeleteTest, DeletingAfterQueuedJobIsCancelledWorks) {
  ASSERT_TRUE(engine_->SubmitJob(BlockerSpec("busy")).ok());
  absl::StatusOr<JobSnapshot> queued = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_TRUE(engine_->CancelJob(queued->id).ok());

  EXPECT_TRUE(engine_->DeleteDataset("seed").ok());
}

TEST_F(DatasetDeleteTest, DeletingUnknownDatasetIsNotFound) {
  const absl::Status deleted = engine_->DeleteDataset("nope");
  EXPECT_EQ(deleted.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(deleted.message(), HasSubstr("'nope'"));
}

TEST_F(DatasetDeleteTest, DeletedDatasetStaysGoneAfterRestart) {
  ASSERT_TRUE(engine_->DeleteDataset("seed").ok());
  engine_.reset();
  engine_ = StartEngine(Options());
  ASSERT_NE(engine_, nullptr);
  EXPECT_THAT(Names(engine_->ListDatasets()), ElementsAre("busy"));
}

TEST_F(DatasetDeleteTest, DeletedNameCanBeUploadedAgain) {
  ASSERT_TRUE(engine_->DeleteDataset("seed").ok());
  absl::StatusOr<DatasetMeta> meta = Upload(*engine_, "seed", SeedTable(10));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->rows, 10);
}

TEST_F(DatasetDeleteTest, EndedJobKeepsItsHistoryAfterItsDatasetIsDeleted) {
  JobSpec spec = SeedSpec("seed");
  spec.epochs = 1;
  absl::StatusOr<JobSnapshot> job = RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(engine_->DeleteDataset("seed").ok());

  absl::StatusOr<JobSnapshot> after = WaitForEnd(*engine_, job->id);

  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state, JobState::kSucceeded);
  EXPECT_EQ(Losses(*after), Losses(*job));
}

// --- Names per owner, copies for peers ---

class DatasetOwnersTest : public EngineFixture {
 protected:
  // Uploads `table` as `owner` (a tenant unless `admin`), as a copy for peers when `peer_copy`.
  absl::StatusOr<DatasetMeta> UploadAs(const std::string& owner, const std::string& name,
                                       const Table& table, bool peer_copy = false) {
    CallContext caller;
    caller.owner = owner;
    caller.admin = false;
    absl::StatusOr<std::unique_ptr<UploadSession>> upload =
        engine_->BeginUpload(HeaderFor(name, table), caller, peer_copy);
    if (!upload.ok()) return upload.status();
    TRAINERD_RETURN_IF_ERROR((*upload)->Append(EncodePayload(table)));
    return engine_->CommitUpload(*std::move(upload));
  }
  static CallContext Tenant(const std::string& name) {
    CallContext caller;
    caller.owner = name;
    caller.admin = false;
    return caller;
  }
  std::string OwnedPath(const std::string& owner, const std::string& name) const {
    return absl::StrCat(dir_.path(), "/datasets/", OwnerFolder(owner), "/", name, ".trds");
  }
};

// Two owners' "digits" are two datasets, each in its owner's folder, each its owner's by the bare
// name and the other's only as "OWNER/NAME" when shared; a restart keeps them apart.
TEST_F(DatasetOwnersTest, TwoOwnersEachHaveADatasetOfTheSameName) {
  ASSERT_TRUE(UploadAs("alice", "digits", SeedTable(10)).ok());
  ASSERT_TRUE(UploadAs("bob", "digits", test_support::ClassTable(6, 0, 2)).ok());
  EXPECT_EQ(UploadAs("bob", "digits", SeedTable(4)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(std::filesystem::exists(OwnedPath("alice", "digits")));
  EXPECT_TRUE(std::filesystem::exists(OwnedPath("bob", "digits")));
  for (int start = 0; start < 2; ++start) {
    EXPECT_EQ(engine_->GetDataset("digits", Tenant("alice"))->rows, 10);
    EXPECT_EQ(engine_->GetDataset("digits", Tenant("bob"))->rows, 6);
    const absl::StatusOr<DatasetMeta> hidden = engine_->GetDataset("alice/digits", Tenant("bob"));
    EXPECT_EQ(hidden.status().code(), absl::StatusCode::kNotFound);
    // Named as a name nobody has, followed by bob's own (never alice's unshared one).
    EXPECT_EQ(hidden.status().message(),
              "dataset 'alice/digits' not found (the datasets you can use: digits)");
    // An admin names each with its owner (the default caller is the local admin, unnamed).
    EXPECT_EQ(engine_->GetDataset("bob/digits")->target_dtype, TargetDType::kInt64);
    EXPECT_EQ(engine_->GetDataset("digits").status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(DatasetNameFor(DatasetKeyOf(*engine_->GetDataset("bob/digits")), "alice"),
              "bob/digits");
    engine_.reset();
    engine_ = StartEngine(Options());
    ASSERT_NE(engine_, nullptr);
  }
  ASSERT_TRUE(engine_->ShareDataset("digits", true, Tenant("alice")).ok());
  EXPECT_EQ(engine_->GetDataset("alice/digits", Tenant("bob"))->owner, "alice");
  // Each trains on its own "digits": a class loss fits only bob's.
  JobSpec classes = SeedSpec("digits");
  classes.model = "linear:3";
  classes.loss = LossKind::kCrossEntropy;
  classes.epochs = 1;
  EXPECT_TRUE(engine_->SubmitJob(classes, Tenant("bob")).ok());
  EXPECT_EQ(engine_->SubmitJob(classes, Tenant("alice")).status().code(),
            absl::StatusCode::kInvalidArgument);
  JobSpec regression = SeedSpec("alice/digits");
  regression.epochs = 1;
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(regression, Tenant("bob"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.dataset, "alice/digits");  // the key, whoever submitted
  EXPECT_EQ(WaitForEnd(*engine_, job->id)->state, JobState::kSucceeded);
}

// An owner's folder is one path segment that no owner's name can turn into another place.
TEST(OwnerFolderTest, EveryOwnerGetsOneSafeFolderOfItsOwn) {
  EXPECT_EQ(OwnerFolder("alice"), "alice");
  EXPECT_EQ(OwnerFolder("CN=alice,O=Acme"), "CN=alice,O=Acme");
  EXPECT_EQ(OwnerFolder("a/b"), "a%2Fb");
  EXPECT_EQ(OwnerFolder(".."), "%2E.");
  EXPECT_EQ(OwnerFolder(".hidden"), "%2Ehidden");
  EXPECT_EQ(OwnerFolder("100%"), "100%25");
  const std::string long_owner(300, 'x');
  const std::string folder = OwnerFolder(long_owner);
  EXPECT_LT(folder.size(), 255u);
  EXPECT_EQ(folder, std::string(64, 'x') + "~" + Sha256Hex(long_owner));
  EXPECT_NE(OwnerFolder(long_owner + "y"), folder);
}

// A dataset's last use is its upload until a job takes it, then when the last job took it; a
// restart reads it back from the file's modification time (the console and `trainctl dataset
// list -w` show it).
TEST_F(DatasetOwnersTest, ADatasetsLastUseIsWhenAJobLastTookItAcrossARestart) {
  const absl::Time before_upload = absl::Now();
  ASSERT_TRUE(UploadAs("alice", "seed", SeedTable(10)).ok());
  const absl::Time uploaded = engine_->GetDataset("alice/seed")->last_used;
  EXPECT_GE(uploaded, before_upload);
  EXPECT_LE(uploaded, absl::Now());
  // Two hours idle, as its file says after a restart.
  engine_.reset();
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  std::filesystem::last_write_time(OwnedPath("alice", "seed"), two_hours_ago);
  engine_ = StartEngine(Options());
  ASSERT_NE(engine_, nullptr);
  const absl::Time idle = engine_->GetDataset("alice/seed")->last_used;
  EXPECT_NEAR(absl::ToDoubleSeconds(absl::Now() - idle), 7200, 60);
  JobSpec spec = SeedSpec("alice/seed");
  spec.epochs = 1;
  const absl::Time before_job = absl::Now();
  absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec, Tenant("alice"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(WaitForEnd(*engine_, job->id)->state, JobState::kSucceeded);
  const absl::Time used = engine_->GetDataset("alice/seed")->last_used;
  EXPECT_GE(used, before_job);
  EXPECT_LE(used, absl::Now());
  EXPECT_EQ(engine_->ListDatasets().at(0).last_used, used);
  engine_.reset();
  engine_ = StartEngine(Options());
  ASSERT_NE(engine_, nullptr);
  // Kept to the file system's clock (nanoseconds here; a second on some).
  EXPECT_LE(absl::AbsDuration(engine_->GetDataset("alice/seed")->last_used - used),
            absl::Seconds(1));
}

// A copy made for a peer's jobs goes once no job has used it for the retention; its clock is the
// file's modification time, which a restart reads back. (A queued job's copy stays:
// JobRecordsTest.AQueuedJobsCopyForPeersOutlivesTheRetention.)
TEST_F(DatasetOwnersTest, IdleCopiesForPeersAreRemovedAfterTheRetentionAcrossARestart) {
  EngineOptions options = Options();
  options.peer_copy_retention = absl::Hours(1);
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_TRUE(UploadAs("alice", "idle", SeedTable(10), /*peer_copy=*/true).ok());
  ASSERT_TRUE(UploadAs("alice", "own", SeedTable(10)).ok());
  EXPECT_TRUE(engine_->GetDataset("alice/idle")->peer_copy);
  EXPECT_FALSE(engine_->GetDataset("alice/own")->peer_copy);
  EXPECT_EQ(engine_->RemoveIdlePeerCopies(), 0);  // just made
  engine_.reset();
  // Two hours idle, as the files say.
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (const char* name : {"idle", "own"}) {
    std::filesystem::last_write_time(OwnedPath("alice", name), two_hours_ago);
  }
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  engine_->RemoveIdlePeerCopies();  // (the I/O thread may have been first: either way)
  EXPECT_EQ(engine_->GetDataset("alice/idle").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(OwnedPath("alice", "idle")));
  EXPECT_TRUE(engine_->GetDataset("alice/own").ok());  // not a copy
  // Without a retention, copies stay.
  ASSERT_TRUE(UploadAs("alice", "kept", SeedTable(10), /*peer_copy=*/true).ok());
  engine_.reset();
  std::filesystem::last_write_time(OwnedPath("alice", "kept"), two_hours_ago);
  options.peer_copy_retention = absl::ZeroDuration();
  engine_ = StartEngine(options);
  EXPECT_EQ(engine_->RemoveIdlePeerCopies(), 0);
  EXPECT_TRUE(engine_->GetDataset("alice/kept").ok());
}

}  // namespace
}  // namespace trainerd::engine
