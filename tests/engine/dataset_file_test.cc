// Tests for server/engine/dataset_file.h: the on-disk form round-trips, and damage is DATA_LOSS.
#include "server/engine/datasets/dataset_file.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

class DatasetFileTest : public ::testing::Test {
 protected:
  DatasetFileTest() : path_(dir_.path() + "/d.trds") {
    meta_.name = "d";
    meta_.feature_shape = {2};
    meta_.target_shape = {};
    meta_.target_dtype = TargetDType::kInt64;
    meta_.rows = 2;
    meta_.size_bytes = 2 * (2 * 4 + 8);
    payload_ = std::string(static_cast<size_t>(meta_.size_bytes), '\x07');
    meta_.sha256 = Sha256Hex(payload_);
    meta_.create_time = absl::FromUnixNanos(1234567890123456789);
    meta_.target_min = 3;
    meta_.target_max = 9;
  }

  test_support::ScratchDir dir_;
  const std::string path_;
  DatasetMeta meta_;
  std::string payload_;
};

TEST_F(DatasetFileTest, WrittenFileReadsBackTheSameMetaAndPayload) {
  ASSERT_TRUE(WriteDatasetFile(path_, meta_, payload_.data(), payload_.size()).ok());

  absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->meta.name, "d");
  EXPECT_EQ(header->meta.feature_shape, meta_.feature_shape);
  EXPECT_TRUE(header->meta.target_shape.empty());
  EXPECT_EQ(header->meta.target_dtype, TargetDType::kInt64);
  EXPECT_EQ(header->meta.rows, 2);
  EXPECT_EQ(header->meta.sha256, meta_.sha256);
  EXPECT_EQ(header->meta.create_time, meta_.create_time);
  EXPECT_EQ(header->meta.target_min, 3);
  EXPECT_EQ(header->meta.target_max, 9);
  std::string read(payload_.size(), '\0');
  ASSERT_TRUE(ReadDatasetPayload(path_, *header, read.data(), read.size()).ok());
  EXPECT_EQ(read, payload_);
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
}

TEST_F(DatasetFileTest, HeaderIsPaddedToTheRoomKeptForItWhateverItsLateValues) {
  // An upload keeps DatasetFileHeaderBytes before it knows its checksum, create time or class
  // range; the header written at its end fills exactly that room, for the narrowest and the
  // widest values, and the payload starts there.
  const int64_t room = DatasetFileHeaderBytes(meta_);
  EXPECT_EQ(room % 4096, 0);
  EXPECT_GT(room, 0);
  DatasetMeta narrow = meta_;
  narrow.create_time = absl::UnixEpoch();
  narrow.target_min = 0;
  narrow.target_max = 0;
  DatasetMeta wide = meta_;
  wide.create_time = absl::FromUnixNanos(std::numeric_limits<int64_t>::min() + 1);
  wide.target_min = std::numeric_limits<int64_t>::min();
  wide.target_max = std::numeric_limits<int64_t>::max();
  for (const DatasetMeta& meta : {narrow, meta_, wide}) {
    const std::string text = DatasetFileHeaderText(meta);
    EXPECT_EQ(static_cast<int64_t>(text.size()), room);
    EXPECT_EQ(text.substr(text.size() - 2), "\n\n");
    ASSERT_TRUE(WriteDatasetFile(path_, meta, payload_.data(), payload_.size()).ok());
    absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->payload_offset, room);
    EXPECT_EQ(header->meta.target_min, meta.target_min);
    EXPECT_EQ(header->meta.target_max, meta.target_max);
    EXPECT_EQ(header->meta.create_time, meta.create_time);
  }
}

TEST_F(DatasetFileTest, LongOwnerTakesMorePadLinesAndStillReadsBack) {
  // An owner of 3900 characters (a long certificate subject; the reader takes lines of up to
  // 4096) makes the header span two pages and several pad lines, each under the line limit.
  meta_.owner = std::string(3900, 'o');
  const int64_t room = DatasetFileHeaderBytes(meta_);
  EXPECT_EQ(room, 8192);
  ASSERT_TRUE(WriteDatasetFile(path_, meta_, payload_.data(), payload_.size()).ok());
  absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->payload_offset, room);
  EXPECT_EQ(header->meta.owner, meta_.owner);
  std::string read(payload_.size(), '\0');
  ASSERT_TRUE(ReadDatasetPayload(path_, *header, read.data(), read.size()).ok());
  EXPECT_EQ(read, payload_);
}

TEST_F(DatasetFileTest, OwnerLongerThanAPageReadsBack) {
  // A certificate subject of 20,000 characters: once a line longer than the reader took, so that
  // the daemon's own file was quarantined at the next start.
  meta_.owner = std::string(20000, 'o');
  ASSERT_TRUE(WriteDatasetFile(path_, meta_, payload_.data(), payload_.size()).ok());
  absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->meta.owner, meta_.owner);
  EXPECT_EQ(header->payload_offset, DatasetFileHeaderBytes(meta_));
  EXPECT_EQ(header->payload_offset % 4096, 0);
}

TEST_F(DatasetFileTest, HeaderLineWithoutAnEndIsDataLossAfterABoundedRead) {
  // Not ours: the magic line, then 100,000 bytes without a newline. The reader stops at its line
  // limit (64 KiB) rather than reading the whole file into one line.
  std::ofstream(path_, std::ios::binary) << "TRAINERD-DATASET 1\nname=" << std::string(100000, 'x');
  absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(header.status().message(), HasSubstr("damaged"));
}

TEST_F(DatasetFileTest, ExtraTrailingBytesAreDataLoss) {
  ASSERT_TRUE(WriteDatasetFile(path_, meta_, payload_.data(), payload_.size()).ok());
  std::ofstream(path_, std::ios::app | std::ios::binary) << "x";

  absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);

  EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(header.status().message(), HasSubstr("payload size does not match"));
}

TEST_F(DatasetFileTest, PayloadThatDoesNotMatchItsChecksumIsDataLoss) {
  meta_.sha256 = Sha256Hex("not the payload");
  ASSERT_TRUE(WriteDatasetFile(path_, meta_, payload_.data(), payload_.size()).ok());
  absl::StatusOr<DatasetFileHeader> header = ReadDatasetFileHeader(path_);
  ASSERT_TRUE(header.ok()) << header.status();
  std::string read(payload_.size(), '\0');

  absl::Status status = ReadDatasetPayload(path_, *header, read.data(), read.size());

  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("checksum"));
}

TEST_F(DatasetFileTest, WriteIntoMissingFolderFailsAndLeavesNothing) {
  const std::string path = dir_.path() + "/missing/d.trds";
  EXPECT_FALSE(WriteDatasetFile(path, meta_, payload_.data(), payload_.size()).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace trainerd::engine
