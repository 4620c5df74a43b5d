// Tests trainerd.v1.DatasetService (server/service/dataset_service.h) through a real server and a
// real TCP channel: uploads, their errors and codes, listing, lookup, deletion and persistence.
#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "common/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace trainerd::service::testing {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class DatasetServiceTest : public ServiceTest {};

TEST_F(DatasetServiceTest, UploadOfSeedDataReturnsResidentDataset) {
  const Table table = SeedTable();
  const std::string payload = EncodePayload(table);

  v1::Dataset dataset;
  grpc::Status status = UploadTable("seed", table, &dataset);

  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(dataset.name(), "seed");
  EXPECT_EQ(dataset.row_count(), 800);
  EXPECT_EQ(dataset.size_bytes(), 6400);
  EXPECT_EQ(dataset.sha256(), Sha256Hex(payload));
  EXPECT_EQ(dataset.device(), "cpu");
  EXPECT_THAT(dataset.feature_shape(), ElementsAre(1));
  EXPECT_THAT(dataset.target_shape(), ElementsAre(1));
  EXPECT_EQ(dataset.target_dtype(), v1::DTYPE_FLOAT32);
  EXPECT_GT(dataset.create_time().seconds(), 0);
}

TEST_F(DatasetServiceTest, UploadWithTheSha256AsTheLastMessageIsVerifiedAndKept) {
  const Table table = SeedTable();
  const std::string payload = EncodePayload(table);
  v1::DatasetHeader header = HeaderFor("trailed", table);
  header.clear_sha256();
  std::vector<v1::UploadDatasetRequest> messages = UploadMessages(header, payload);
  v1::UploadDatasetRequest trailer;
  trailer.set_sha256(Sha256Hex(payload));
  messages.push_back(trailer);
  v1::Dataset dataset;
  grpc::Status status = Upload(messages, &dataset);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(dataset.sha256(), Sha256Hex(payload));
  EXPECT_EQ(dataset.row_count(), table.rows);
}

TEST_F(DatasetServiceTest, UploadedDatasetIsListedAndFound) {
  v1::Dataset uploaded;
  ASSERT_TRUE(UploadTable("seed", SeedTable(), &uploaded).ok());

  v1::ListDatasetsResponse list;
  ASSERT_TRUE(ListDatasets(&list).ok());
  ASSERT_EQ(list.datasets_size(), 1);
  EXPECT_EQ(list.datasets(0).name(), "seed");
  EXPECT_EQ(list.datasets(0).sha256(), uploaded.sha256());
  EXPECT_EQ(list.datasets(0).row_count(), 800);

  v1::Dataset found;
  grpc::Status status = GetDataset("seed", &found);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(found.sha256(), uploaded.sha256());
  EXPECT_EQ(found.size_bytes(), 6400);
  EXPECT_EQ(found.device(), "cpu");
}

TEST_F(DatasetServiceTest, ListIsSortedByName) {
  v1::Dataset dataset;
  ASSERT_TRUE(UploadTable("zeta", SeedTable(), &dataset).ok());
  ASSERT_TRUE(UploadTable("alpha", ClassTable(8), &dataset).ok());

  EXPECT_THAT(ListedNames(), ElementsAre("alpha", "zeta"));
}

TEST_F(DatasetServiceTest, UploadStartingWithChunkIsInvalidArgument) {
  v1::UploadDatasetRequest chunk;
  chunk.set_chunk(EncodePayload(SeedTable()));

  v1::Dataset dataset;
  grpc::Status status = Upload({chunk}, &dataset);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("header"));
  EXPECT_THAT(ListedNames(), ::testing::IsEmpty());
}

TEST_F(DatasetServiceTest, UploadOfNoMessagesIsInvalidArgument) {
  v1::Dataset dataset;
  grpc::Status status = Upload({}, &dataset);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("no header"));
}

TEST_F(DatasetServiceTest, UploadWithBadNameIsInvalidArgument) {
  const Table table = SeedTable();

  v1::Dataset dataset;
  grpc::Status status =
      Upload(UploadMessages(HeaderFor("a b", table), EncodePayload(table)), &dataset);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("'a b'"));
  EXPECT_THAT(ListedNames(), ::testing::IsEmpty());
}

TEST_F(DatasetServiceTest, UploadOfExistingNameIsAlreadyExists) {
  v1::Dataset first;
  ASSERT_TRUE(UploadTable("seed", SeedTable(), &first).ok());

  v1::Dataset second;
  grpc::Status status = UploadTable("seed", ClassTable(8), &second);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("'seed'"));
  v1::Dataset found;
  ASSERT_TRUE(GetDataset("seed", &found).ok());
  EXPECT_EQ(found.sha256(), first.sha256());  // the first upload is untouched
}

TEST_F(DatasetServiceTest, GetOfUnknownDatasetIsNotFound) {
  v1::Dataset dataset;
  grpc::Status status = GetDataset("missing", &dataset);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'missing'"));
}

TEST_F(DatasetServiceTest, DeleteOfUnknownDatasetIsNotFound) {
  grpc::Status status = DeleteDataset("missing");

  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'missing'"));
}

TEST_F(DatasetServiceTest, DeleteRemovesDatasetFromList) {
  v1::Dataset dataset;
  ASSERT_TRUE(UploadTable("seed", SeedTable(), &dataset).ok());

  grpc::Status status = DeleteDataset("seed");

  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(ListedNames(), ::testing::IsEmpty());
  EXPECT_EQ(GetDataset("seed", &dataset).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DatasetServiceTest, DatasetSurvivesServerRestart) {
  v1::Dataset uploaded;
  ASSERT_TRUE(UploadTable("seed", SeedTable(), &uploaded).ok());

  StopServer();
  ASSERT_NO_FATAL_FAILURE(StartServer());  // same data_dir_

  v1::Dataset found;
  grpc::Status status = GetDataset("seed", &found);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(found.sha256(), uploaded.sha256());
  EXPECT_EQ(found.row_count(), 800);
  EXPECT_EQ(found.size_bytes(), 6400);
  EXPECT_EQ(found.device(), "cpu");
}

// An upload that the daemon rejects after reading (part of) it: the code, a message that names
// the fault, and no trace left (the name is free again, List does not show it).
struct RejectedUpload {
  std::string name;  // the test's name
  std::function<std::vector<v1::UploadDatasetRequest>(const std::string& dataset)> messages;
  grpc::StatusCode code;
  std::string message_part;
};

void PrintTo(const RejectedUpload& rejected, std::ostream* os) { *os << rejected.name; }

std::vector<v1::UploadDatasetRequest> SeedMessages(const std::string& dataset) {
  const Table table = SeedTable();
  return UploadMessages(HeaderFor(dataset, table), EncodePayload(table));
}

std::vector<RejectedUpload> RejectedUploads() {
  std::vector<RejectedUpload> cases;
  cases.push_back({"UnspecifiedTargetDtype",
                   [](const std::string& dataset) {
                     auto messages = SeedMessages(dataset);
                     messages[0].mutable_header()->set_target_dtype(v1::DTYPE_UNSPECIFIED);
                     return messages;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "target_dtype"});
  cases.push_back({"BytesShortOfHeader",
                   [](const std::string& dataset) {
                     auto messages = SeedMessages(dataset);
                     std::string* chunk = messages.back().mutable_chunk();
                     chunk->resize(chunk->size() - 4);
                     return messages;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "ended after 6396 of the 6400 payload bytes"});
  cases.push_back({"BytesOverHeader",
                   [](const std::string& dataset) {
                     auto messages = SeedMessages(dataset);
                     messages.emplace_back().set_chunk(std::string(4, '\0'));
                     return messages;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "larger than the header declares"});
  cases.push_back({"ChunkOverOneMebibyte",
                   [](const std::string& dataset) {
                     // 131073 rows of 8 bytes: the payload has room for the oversized chunk.
                     Table table = SeedTable();
                     table.rows = 131073;
                     table.features.assign(table.rows, 0.5f);
                     table.targets_f32.assign(table.rows, 2.0f);
                     return UploadMessages(HeaderFor(dataset, table), EncodePayload(table),
                                           /*chunk_bytes=*/(size_t{1} << 20) + 1);
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "a chunk of 1048577 bytes"});
  cases.push_back({"NanFeature",
                   [](const std::string& dataset) {
                     Table table = SeedTable();
                     table.features[17] = std::numeric_limits<float>::quiet_NaN();
                     return UploadMessages(HeaderFor(dataset, table), EncodePayload(table));
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "row 18 has a non-finite feature"});
  cases.push_back({"WrongSha256",
                   [](const std::string& dataset) {
                     auto messages = SeedMessages(dataset);
                     messages[0].mutable_header()->set_sha256(Sha256Hex("other bytes"));
                     return messages;
                   },
                   grpc::StatusCode::DATA_LOSS, "sha256"});
  // The payload's sha256 as the last message (a client that checksums a file as it streams it).
  auto trailed = [](const std::string& dataset, const std::string& sha256) {
    auto messages = SeedMessages(dataset);
    messages[0].mutable_header()->clear_sha256();
    v1::UploadDatasetRequest trailer;
    trailer.set_sha256(sha256);
    messages.push_back(trailer);
    return messages;
  };
  cases.push_back(
      {"WrongTrailingSha256",
       [trailed](const std::string& dataset) { return trailed(dataset, Sha256Hex("other bytes")); },
       grpc::StatusCode::DATA_LOSS, "the payload's sha256 is"});
  cases.push_back(
      {"TrailingSha256NotHex",
       [trailed](const std::string& dataset) { return trailed(dataset, std::string(64, 'Z')); },
       grpc::StatusCode::INVALID_ARGUMENT, "64 lower-case hex digits"});
  cases.push_back({"TrailingSha256AfterTheHeaders",
                   [](const std::string& dataset) {
                     auto messages = SeedMessages(dataset);
                     const std::string sha256 = Sha256Hex(EncodePayload(SeedTable()));
                     messages[0].mutable_header()->set_sha256(sha256);
                     v1::UploadDatasetRequest trailer;
                     trailer.set_sha256(sha256);
                     messages.push_back(trailer);
                     return messages;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "was given already"});
  cases.push_back({"ChunkAfterTrailingSha256",
                   [trailed](const std::string& dataset) {
                     auto messages = trailed(dataset, std::string(64, 'a'));
                     std::swap(messages[messages.size() - 1], messages[messages.size() - 2]);
                     return messages;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "came after the payload's sha256"});
  return cases;
}

class RejectedUploadTest : public ServiceTest,
                           public ::testing::WithParamInterface<RejectedUpload> {};

TEST_P(RejectedUploadTest, FailsWithItsCodeAndLeavesNameFree) {
  const RejectedUpload& rejected = GetParam();

  v1::Dataset dataset;
  grpc::Status status = Upload(rejected.messages("rejected"), &dataset);

  EXPECT_EQ(status.error_code(), rejected.code) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(rejected.message_part));
  EXPECT_THAT(ListedNames(), Not(Contains("rejected")));
  grpc::Status retry = UploadTable("rejected", SeedTable(), &dataset);
  EXPECT_TRUE(retry.ok()) << retry.error_code() << ": " << retry.error_message();
  EXPECT_THAT(ListedNames(), ElementsAre("rejected"));
}

INSTANTIATE_TEST_SUITE_P(Uploads, RejectedUploadTest, ::testing::ValuesIn(RejectedUploads()),
                         [](const ::testing::TestParamInfo<RejectedUpload>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace trainerd::service::testing
