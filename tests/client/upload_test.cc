// Tests for `trainctl dataset upload` of .npy files, streamed (client/upload_stream.h): the bytes
// NpyUploadStream gives against EncodePayload of the table ReadUploadInput reads from the same
// files (and their SHA-256), its errors against ReadUploadInput's, and the command against a fake
// DatasetService in this process: the header without a checksum, chunks of at most 1 MiB, the
// SHA-256 last; a bad value mid-stream cancels the call.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/requests.h"
#include "client/upload_input.h"
#include "client/upload_stream.h"
#include "common/sha256.h"
#include "common/table.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/client/run_captured.h"
#include "trainerd/v1/datasets.grpc.pb.h"

namespace trainerd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr size_t kMiB = size_t{1} << 20;

// The raw little-endian bytes of `values`.
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A .npy file as numpy/lib/format.py writes it (version 1.0): magic, version, header length, the
// header dict padded with spaces and a newline to a multiple of 64 bytes, then `data`.
std::string MakeNpy(const std::string& descr, const std::vector<int64_t>& shape,
                    const std::string& data) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  return file + header + data;
}

// `count` values that float32 holds exactly, varied (negative, fractional): 0.25 * (i % 2001 -
// 1000) + i / 1024 (mod 4096).
template <typename T>
std::vector<T> Values(int64_t count) {
  std::vector<T> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    values[i] = static_cast<T>(0.25 * static_cast<double>(i % 2001 - 1000) +
                               static_cast<double>((i / 1024) % 4096));
  }
  return values;
}

// Class indices 0..classes-1.
template <typename T>
std::vector<T> Classes(int64_t count, int64_t classes = 10) {
  std::vector<T> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<T>((i * 7) % classes);
  return values;
}

// A folder of its own per test and process (ctest runs tests in parallel processes), named after
// the test ('/' of a parameterized test's name made '-', so that it is one folder).
class TempFolder {
 public:
  TempFolder()
      : path_(std::filesystem::path(::testing::TempDir()) /
              absl::StrCat("upload_test-", ::getpid(), "-",
                           absl::StrReplaceAll(
                               ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                               {{"/", "-"}}))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempFolder() { std::filesystem::remove_all(path_); }

  std::string Write(const std::string& name, const std::string& contents) const {
    const std::string path = (path_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

 private:
  std::filesystem::path path_;
};

UploadInput NpyInput(const std::string& features, std::optional<std::string> targets,
                     TargetDType dtype, int target_columns = 1) {
  UploadInput input;
  input.features_path = features;
  input.targets_path = std::move(targets);
  input.target_dtype = dtype;
  input.target_dtype_given = true;  // as with --target-dtype
  input.target_columns = target_columns;
  input.npy = true;
  return input;
}

// The whole payload through NpyUploadStream, `piece` bytes a Read.
absl::StatusOr<std::string> StreamAll(const UploadInput& input, size_t piece) {
  absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream = NpyUploadStream::Open(input);
  if (!stream.ok()) return stream.status();
  std::string payload;
  std::string buffer(piece, '\0');
  while (true) {
    absl::StatusOr<size_t> n = (*stream)->Read(buffer.data(), piece);
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    payload.append(buffer.data(), *n);
  }
  if (static_cast<int64_t>(payload.size()) != (*stream)->total_bytes()) {
    return absl::InternalError(
        absl::StrCat("streamed ", payload.size(), " bytes of ", (*stream)->total_bytes()));
  }
  return payload;
}

// What today's in-memory path sends for `input`: EncodePayload of ReadUploadInput's table.
std::string InMemoryPayload(const UploadInput& input) {
  absl::StatusOr<Table> table = ReadUploadInput(input);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? EncodePayload(*table) : "";
}

// ---- NpyUploadStream: the same bytes as the in-memory path ---------------------------------

struct SameBytesCase {
  std::string name;
  std::string features;  // file contents
  std::optional<std::string> targets;
  TargetDType dtype = TargetDType::kFloat32;
  int target_columns = 1;
  // What the header must say.
  std::vector<int64_t> feature_shape;
  std::vector<int64_t> target_shape;
  int64_t rows = 0;
};

std::vector<SameBytesCase> SameBytesCases() {
  std::vector<SameBytesCase> cases;
  // float32 features, float32 targets (1-D: shape {1} per row).
  cases.push_back({"Float32FeaturesFloat32Targets",
                   MakeNpy("<f4", {1000, 8}, Bytes(Values<float>(8000))),
                   MakeNpy("<f4", {1000}, Bytes(Values<float>(1000))),
                   TargetDType::kFloat32,
                   1,
                   {8},
                   {1},
                   1000});
  // float64 N-D features to float32, int64 targets: 3 MiB of features over several blocks.
  cases.push_back({"Float64NdFeaturesInt64Targets",
                   MakeNpy("<f8", {16384, 4, 2, 3}, Bytes(Values<double>(16384 * 24))),
                   MakeNpy("<i8", {16384}, Bytes(Classes<int64_t>(16384))),
                   TargetDType::kInt64,
                   1,
                   {4, 2, 3},
                   {},
                   16384});
  // 1-D features (one per row) and 2-D float32 targets kept as they are.
  cases.push_back({"OneDimensionalFeaturesTwoDimensionalTargets",
                   MakeNpy("<f4", {777}, Bytes(Values<float>(777))),
                   MakeNpy("<f8", {777, 3}, Bytes(Values<double>(777 * 3))),
                   TargetDType::kFloat32,
                   1,
                   {1},
                   {3},
                   777});
  // Integral float64 targets as int64 class indices; int64 features as float32. The features'
  // bytes (70001 x 5 x 4) are not a multiple of 8: 1 MiB chunks split int64 targets.
  cases.push_back({"Int64FeaturesFloat64ClassTargets",
                   MakeNpy("<i8", {70001, 5}, Bytes(Classes<int64_t>(70001 * 5))),
                   MakeNpy("<f8", {70001, 1}, Bytes(Classes<double>(70001))),
                   TargetDType::kInt64,
                   1,
                   {5},
                   {1},
                   70001});
  // uint8 images (one-byte values: a block converts to eight times its size) with int32 labels,
  // as scikit-learn and NumPy users have them: float32 features and int64 class indices.
  cases.push_back({"Uint8FeaturesInt32ClassTargets",
                   MakeNpy("|u1", {300001, 7}, Bytes(Classes<uint8_t>(300001 * 7))),
                   MakeNpy("<i4", {300001}, Bytes(Classes<int32_t>(300001))),
                   TargetDType::kInt64,
                   1,
                   {7},
                   {},
                   300001});
  // int16 values asked for as float32 targets; a bool feature column.
  cases.push_back({"BoolFeaturesInt16FloatTargets",
                   MakeNpy("|b1", {4099, 3}, Bytes(Classes<uint8_t>(4099 * 3, 2))),
                   MakeNpy("<i2", {4099}, Bytes(Classes<int16_t>(4099))),
                   TargetDType::kFloat32,
                   1,
                   {3},
                   {1},
                   4099});
  // No targets file: the last 3 columns of a 2-D float64 array (rows straddle the read blocks).
  cases.push_back({"LastColumnsOfFloat64Array",
                   MakeNpy("<f8", {50001, 7}, Bytes(Values<double>(50001 * 7))),
                   std::nullopt,
                   TargetDType::kFloat32,
                   3,
                   {4},
                   {3},
                   50001});
  // No targets file: the last column of a float32 array as int64 class indices.
  std::vector<float> table = Values<float>(300000 * 3);
  for (size_t i = 2; i < table.size(); i += 3) table[i] = static_cast<float>((i / 3) % 10);
  cases.push_back({"LastColumnAsInt64Targets",
                   MakeNpy("<f4", {300000, 3}, Bytes(table)),
                   std::nullopt,
                   TargetDType::kInt64,
                   1,
                   {2},
                   {},
                   300000});
  return cases;
}

class SameBytesTest : public ::testing::TestWithParam<SameBytesCase> {};

TEST_P(SameBytesTest, StreamedBytesAndChecksumEqualEncodePayloads) {
  const SameBytesCase& test = GetParam();
  TempFolder folder;
  const UploadInput input = NpyInput(
      folder.Write("x.npy", test.features),
      test.targets.has_value() ? std::optional(folder.Write("y.npy", *test.targets)) : std::nullopt,
      test.dtype, test.target_columns);
  const std::string expected = InMemoryPayload(input);
  ASSERT_FALSE(expected.empty());

  absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream = NpyUploadStream::Open(input);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const DatasetHeader& header = (*stream)->header();
  EXPECT_EQ(header.feature_shape, test.feature_shape);
  EXPECT_EQ(header.target_shape, test.target_shape);
  EXPECT_EQ(header.target_dtype, test.dtype);
  EXPECT_EQ(header.rows, test.rows);
  EXPECT_THAT(header.sha256, IsEmpty());
  EXPECT_EQ((*stream)->total_bytes(), static_cast<int64_t>(expected.size()));
  // The header the in-memory path makes for the same files.
  const absl::StatusOr<Table> table = ReadUploadInput(input);
  ASSERT_TRUE(table.ok()) << table.status();
  const DatasetHeader from_table = HeaderForTable("", *table);
  EXPECT_EQ(header.feature_shape, from_table.feature_shape);
  EXPECT_EQ(header.target_shape, from_table.target_shape);
  EXPECT_EQ(header.target_dtype, from_table.target_dtype);
  EXPECT_EQ(header.rows, from_table.rows);

  // In upload chunks, in odd pieces that split values, and in pieces over a block.
  for (const size_t piece : {kMiB, size_t{7}, kMiB + 3}) {
    const absl::StatusOr<std::string> streamed = StreamAll(input, piece);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(streamed->size(), expected.size()) << "piece " << piece;
    EXPECT_TRUE(*streamed == expected) << "piece " << piece;
    EXPECT_EQ(Sha256Hex(*streamed), Sha256Hex(expected));
  }
}

INSTANTIATE_TEST_SUITE_P(NpyInputs, SameBytesTest, ::testing::ValuesIn(SameBytesCases()),
                         [](const ::testing::TestParamInfo<SameBytesCase>& info) {
                           return info.param.name;
                         });

TEST(NpyUploadStreamTest, ReadAfterTheEndGivesNothing) {
  TempFolder folder;
  const UploadInput input = NpyInput(
      folder.Write("x.npy", MakeNpy("<f4", {2}, Bytes<float>({1, 2}))),
      folder.Write("y.npy", MakeNpy("<i8", {2}, Bytes<int64_t>({3, 4}))), TargetDType::kInt64);
  absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream = NpyUploadStream::Open(input);
  ASSERT_TRUE(stream.ok()) << stream.status();
  char out[64];
  absl::StatusOr<size_t> n = (*stream)->Read(out, sizeof(out));
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 2 * 4 + 2 * 8u);
  float features[2];
  int64_t targets[2];
  std::memcpy(features, out, sizeof(features));
  std::memcpy(targets, out + 8, sizeof(targets));
  EXPECT_THAT(features, ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(targets, ElementsAre(3, 4));
  EXPECT_EQ(*(*stream)->Read(out, sizeof(out)), 0u);
}

// ---- NpyUploadStream: the same errors as the in-memory path --------------------------------

// The error ReadUploadInput gives for `input`; the stream's (at Open or on the way) must equal it.
void ExpectSameError(const UploadInput& input, const std::string& message) {
  const absl::StatusOr<Table> table = ReadUploadInput(input);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(std::string(table.status().message()), message);
  const absl::StatusOr<std::string> streamed = StreamAll(input, kMiB);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status(), table.status());
}

TEST(NpyUploadStreamErrorTest, NaNInTheMiddleOfAFloat64FileNamesTheElement) {
  TempFolder folder;
  std::vector<double> x = Values<double>(65536 * 6);  // 3 MiB
  // Past the first MiB of float32 output (262144 values), in the second.
  x[50000 * 6 + 3] = std::numeric_limits<double>::quiet_NaN();
  const UploadInput input =
      NpyInput(folder.Write("x.npy", MakeNpy("<f8", {65536, 6}, Bytes(x))),
               folder.Write("y.npy", MakeNpy("<i8", {65536}, Bytes(Classes<int64_t>(65536)))),
               TargetDType::kInt64);
  ExpectSameError(input, input.features_path + " and " + *input.targets_path +
                             ": features[50000, 3]: nan is not a finite number");
  // The bytes before it come out first; the error when the stream reaches it.
  absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream = NpyUploadStream::Open(input);
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::string chunk(kMiB, '\0');
  const absl::StatusOr<size_t> first = (*stream)->Read(chunk.data(), kMiB);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, kMiB);
  float value = 0;
  std::memcpy(&value, chunk.data() + 4 * 1001, 4);
  EXPECT_EQ(value, 0.25f);  // Values<double>: 0.25 * (1001 - 1000)
  const absl::StatusOr<size_t> second = (*stream)->Read(chunk.data(), kMiB);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.status().message(), input.features_path + " and " + *input.targets_path +
                                           ": features[50000, 3]: nan is not a finite number");
  // And again: the stream stays failed.
  EXPECT_EQ((*stream)->Read(chunk.data(), kMiB).status(), second.status());
}

TEST(NpyUploadStreamErrorTest, ValueErrorsOfTargetsAreTableFromNpys) {
  TempFolder folder;
  const std::string x = folder.Write("x.npy", MakeNpy("<f4", {3}, Bytes<float>({1, 2, 3})));
  const std::string y = folder.Write("y.npy", MakeNpy("<f4", {3}, Bytes<float>({0, 1.5f, 2})));
  ExpectSameError(NpyInput(x, y, TargetDType::kInt64),
                  x + " and " + y +
                      ": targets[1]: 1.5 is not an integer (int64 targets are class "
                      "indices)");
  const std::string big =
      folder.Write("big.npy", MakeNpy("<f8", {2, 2}, Bytes<double>({1, 2, 3, 1e300})));
  ExpectSameError(NpyInput(big, std::nullopt, TargetDType::kFloat32),
                  big + ": features[1, 1]: 1e+300 is out of range for float32");
  const std::string inf = folder.Write(
      "inf.npy",
      MakeNpy("<f4", {2, 2}, Bytes<float>({1, 2, -std::numeric_limits<float>::infinity(), 1})));
  ExpectSameError(NpyInput(inf, std::nullopt, TargetDType::kInt64),
                  inf + ": features[1, 0]: -inf is not a finite number");
}

TEST(NpyUploadStreamErrorTest, TruncatedFileIsRefusedAtOpenNamingIt) {
  TempFolder folder;
  std::string file = MakeNpy("<f8", {1000, 4}, Bytes(Values<double>(4000)));
  file.resize(file.size() - 8 * 10);
  const std::string x = folder.Write("x.npy", file);
  const std::string y =
      folder.Write("y.npy", MakeNpy("<i8", {1000}, Bytes(Classes<int64_t>(1000))));
  const UploadInput input = NpyInput(x, y, TargetDType::kInt64);
  EXPECT_EQ(NpyUploadStream::Open(input).status().message(),
            x + ": npy data has 31920 bytes; shape (1000, 4) of float64 needs 32000");
  ExpectSameError(input, x + ": npy data has 31920 bytes; shape (1000, 4) of float64 needs 32000");
}

TEST(NpyUploadStreamErrorTest, FileThatShrinksAfterOpenIsAnError) {
  TempFolder folder;
  const std::string x =
      folder.Write("x.npy", MakeNpy("<f4", {300000, 2}, Bytes(Values<float>(600000))));
  absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream =
      NpyUploadStream::Open(NpyInput(x, std::nullopt, TargetDType::kFloat32));
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::filesystem::resize_file(x, 100000);
  std::string chunk(kMiB, '\0');
  const absl::StatusOr<size_t> n = (*stream)->Read(chunk.data(), kMiB);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(n.status().message(), x + ": the file ended before its data did (did it change while "
                                      "it was being uploaded?)");
}

TEST(NpyUploadStreamErrorTest, LayoutAndFileErrorsAreReadUploadInputs) {
  TempFolder folder;
  const std::string x = folder.Write("x.npy", MakeNpy("<f4", {3}, Bytes<float>({1, 2, 3})));
  const std::string y = folder.Write("y.npy", MakeNpy("<i8", {2}, Bytes<int64_t>({1, 2})));
  ExpectSameError(NpyInput(x, y, TargetDType::kInt64),
                  x + " and " + y + ": the features array has 3 rows but the targets array has 2");
  ExpectSameError(NpyInput(x, std::nullopt, TargetDType::kFloat32),
                  x + ": without a targets array the features array must be 2-D (rows, columns); "
                      "its shape is (3,)");
  const std::string missing = x + ".missing";
  ExpectSameError(NpyInput(missing, std::nullopt, TargetDType::kFloat32),
                  "cannot open '" + missing + "': No such file or directory");
  const std::string garbage = folder.Write("g.npy", "garbage");
  ExpectSameError(NpyInput(x, garbage, TargetDType::kFloat32),
                  garbage + ": not an npy file: it does not start with \\x93NUMPY");
}

TEST(CanStreamUploadTest, NpyFilesStreamCsvAndPipesDoNot) {
  TempFolder folder;
  const std::string x = folder.Write("x.npy", MakeNpy("<f4", {2, 2}, Bytes<float>({1, 2, 3, 4})));
  EXPECT_TRUE(CanStreamUpload(NpyInput(x, std::nullopt, TargetDType::kFloat32)));
  EXPECT_TRUE(CanStreamUpload(NpyInput(x + ".missing", std::nullopt, TargetDType::kFloat32)));
  EXPECT_FALSE(CanStreamUpload(NpyInput(x, "/dev/null", TargetDType::kFloat32)));
  UploadInput csv =
      NpyInput(folder.Write("x.csv", "a,b\n1,2\n"), std::nullopt, TargetDType::kFloat32);
  csv.npy = false;
  EXPECT_FALSE(CanStreamUpload(csv));
}

TEST(CheckUploadAgainstLimitsTest, TakesTheHeaderFiguresOfAStreamedUpload) {
  DatasetHeader header;
  header.name = "big";
  header.feature_shape = {64};
  header.rows = 4 << 20;
  EXPECT_TRUE(CheckUploadAgainstLimits(header).ok());
  header.name = "../big";
  EXPECT_THAT(CheckUploadAgainstLimits(header).message(), HasSubstr("is invalid"));
  header.name = "big";
  header.feature_shape = {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31};
  EXPECT_THAT(CheckUploadAgainstLimits(header).message(), HasSubstr("overflow"));
}

// ---- The command against a fake trainerd ---------------------------------------------------

// Records every UploadDataset stream: its messages, and whether the client cancelled it. Answers
// with the Dataset the header describes, its sha256 computed over the chunks received, unless
// `reject` is set (then it answers that after the header).
class FakeDatasets final : public v1::DatasetService::Service {
 public:
  struct Upload {
    std::vector<v1::UploadDatasetRequest> messages;
    bool cancelled = false;
  };

  grpc::Status UploadDataset(grpc::ServerContext* context,
                             grpc::ServerReader<v1::UploadDatasetRequest>* reader,
                             v1::Dataset* response) override {
    Upload upload;
    v1::UploadDatasetRequest request;
    std::string payload;
    grpc::Status status = grpc::Status::OK;
    while (reader->Read(&request)) {
      upload.messages.push_back(request);
      if (request.has_chunk()) payload += request.chunk();
      if (upload.messages.size() == 1 && !reject.ok()) {
        status = reject;
        break;
      }
    }
    upload.cancelled = context->IsCancelled();
    if (status.ok() && !upload.messages.empty() && upload.messages[0].has_header()) {
      const v1::DatasetHeader& header = upload.messages[0].header();
      response->set_name(header.name());
      *response->mutable_feature_shape() = header.feature_shape();
      *response->mutable_target_shape() = header.target_shape();
      response->set_target_dtype(header.target_dtype());
      response->set_row_count(header.row_count());
      response->set_size_bytes(static_cast<int64_t>(payload.size()));
      response->set_sha256(Sha256Hex(payload));
      response->set_device("cpu");
    }
    std::lock_guard<std::mutex> lock(mu_);
    uploads_.push_back(std::move(upload));
    done_.notify_all();
    return status;
  }

  // Waits (up to 10 s) until `count` streams ended on this side, and returns them.
  std::vector<Upload> Uploads(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait_for(lock, std::chrono::seconds(10), [&] { return uploads_.size() >= count; });
    return uploads_;
  }

  grpc::Status reject = grpc::Status::OK;

 private:
  std::mutex mu_;
  std::condition_variable done_;
  std::vector<Upload> uploads_;
};

class UploadCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&datasets_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs `trainctl --addr ... dataset upload` followed by `args` against the fake; its stdout in
  // out_, its stderr in err_.
  int Run(const std::vector<std::string>& args) {
    std::vector<std::string> words = {"trainctl", "--addr", absl::StrCat("127.0.0.1:", port_),
                                      "dataset", "upload"};
    words.insert(words.end(), args.begin(), args.end());
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    EXPECT_TRUE(invocation.ok()) << invocation.status();
    if (!invocation.ok()) return -1;
    CapturedRun run = RunCaptured(*invocation);
    out_ = std::move(run.out);
    err_ = std::move(run.err);
    return run.code;
  }

  TempFolder folder_;
  FakeDatasets datasets_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string out_;
  std::string err_;
};

TEST_F(UploadCommandTest, SendsHeaderWithoutChecksumThenChunksThenTheirSha256Last) {
  const int64_t rows = 65536;  // 3 MiB of float64 features, sent as 1.5 MiB of float32
  const std::string x =
      folder_.Write("x.npy", MakeNpy("<f8", {rows, 6}, Bytes(Values<double>(rows * 6))));
  const std::string y =
      folder_.Write("y.npy", MakeNpy("<i8", {rows}, Bytes(Classes<int64_t>(rows))));
  const std::string expected = InMemoryPayload(NpyInput(x, y, TargetDType::kInt64));
  ASSERT_EQ(expected.size(), static_cast<size_t>(rows * 6 * 4 + rows * 8));

  ASSERT_EQ(Run({"cls", x, "--targets", y, "--target-dtype", "int64", "-o", "json"}), kExitOk)
      << err_;
  const std::vector<FakeDatasets::Upload> uploads = datasets_.Uploads(1);
  ASSERT_EQ(uploads.size(), 1u);
  const std::vector<v1::UploadDatasetRequest>& messages = uploads[0].messages;
  EXPECT_FALSE(uploads[0].cancelled);
  // 2 MiB of payload: the header, two chunks of 1 MiB, the checksum; nothing after it.
  ASSERT_EQ(messages.size(), 4u);
  ASSERT_TRUE(messages[0].has_header());
  const v1::DatasetHeader& header = messages[0].header();
  EXPECT_EQ(header.name(), "cls");
  EXPECT_THAT(header.feature_shape(), ElementsAre(6));
  EXPECT_THAT(header.target_shape(), IsEmpty());
  EXPECT_EQ(header.target_dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(header.row_count(), rows);
  EXPECT_THAT(header.sha256(), IsEmpty());
  std::string payload;
  for (size_t i = 1; i + 1 < messages.size(); ++i) {
    ASSERT_TRUE(messages[i].has_chunk()) << i;
    EXPECT_LE(messages[i].chunk().size(), kMiB);
    payload += messages[i].chunk();
  }
  EXPECT_EQ(messages[1].chunk().size(), kMiB);
  EXPECT_TRUE(payload == expected);
  ASSERT_EQ(messages.back().data_case(), v1::UploadDatasetRequest::kSha256);
  EXPECT_EQ(messages.back().sha256(), Sha256Hex(expected));
  EXPECT_EQ(messages.back().sha256().size(), 64u);

  v1::Dataset printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &printed).ok()) << out_;
  EXPECT_EQ(printed.sha256(), Sha256Hex(expected));
  EXPECT_EQ(printed.size_bytes(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(err_, "trainctl: features: float64 values sent as float32\n");
}

TEST_F(UploadCommandTest, ChunksOfALargerUploadAreEachAtMostOneMiB) {
  // 70001 x 5 float32 features (not a multiple of 8 bytes), then int64 targets: 4.2 MB.
  const int64_t rows = 70001;
  const std::string x =
      folder_.Write("x.npy", MakeNpy("<f4", {rows, 5}, Bytes(Values<float>(rows * 5))));
  const std::string y =
      folder_.Write("y.npy", MakeNpy("<f8", {rows}, Bytes(Classes<double>(rows))));
  const std::string expected = InMemoryPayload(NpyInput(x, y, TargetDType::kInt64));
  ASSERT_EQ(Run({"big", x, "--targets", y, "--target-dtype", "int64"}), kExitOk) << err_;
  const std::vector<v1::UploadDatasetRequest> messages = datasets_.Uploads(1).at(0).messages;
  const size_t chunks = (expected.size() + kMiB - 1) / kMiB;
  ASSERT_EQ(messages.size(), chunks + 2);
  std::string payload;
  for (size_t i = 1; i <= chunks; ++i) {
    ASSERT_TRUE(messages[i].has_chunk());
    // Full chunks but the last.
    EXPECT_EQ(messages[i].chunk().size(),
              i < chunks ? kMiB : expected.size() - (chunks - 1) * kMiB);
    payload += messages[i].chunk();
  }
  EXPECT_TRUE(payload == expected);
  EXPECT_EQ(messages.back().sha256(), Sha256Hex(expected));
  EXPECT_THAT(out_, HasSubstr("big"));
}

TEST_F(UploadCommandTest, NaNMidStreamCancelsTheCallWithoutATrailerAndExitsTwo) {
  const int64_t rows = 65536;
  std::vector<double> values = Values<double>(rows * 6);
  values[50000 * 6 + 2] = std::numeric_limits<double>::quiet_NaN();  // in the third MiB read
  const std::string x = folder_.Write("x.npy", MakeNpy("<f8", {rows, 6}, Bytes(values)));
  const std::string y =
      folder_.Write("y.npy", MakeNpy("<i8", {rows}, Bytes(Classes<int64_t>(rows))));
  EXPECT_EQ(Run({"cls", x, "--targets", y, "--target-dtype", "int64"}), kExitUsage);
  EXPECT_EQ(err_,
            "trainctl: " + x + " and " + y + ": features[50000, 2]: nan is not a finite number\n");
  EXPECT_THAT(out_, IsEmpty());
  // A cancelled call may reach the fake with none, some or all of what was written before the
  // cancellation (gRPC drops what it had not delivered; under load the fake saw no message at all
  // in about one run in eight), so the test asserts only what must hold: the call ended cancelled,
  // nothing after the header but chunks, at most the header and two chunks, never a checksum.
  const std::vector<FakeDatasets::Upload> uploads = datasets_.Uploads(1);
  ASSERT_LE(uploads.size(), 1u);
  if (uploads.empty()) return;  // cancelled before the fake's handler ran
  EXPECT_TRUE(uploads[0].cancelled);
  const std::vector<v1::UploadDatasetRequest>& messages = uploads[0].messages;
  EXPECT_LE(messages.size(), 3u);
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_NE(messages[i].data_case(), v1::UploadDatasetRequest::kSha256) << i;
    EXPECT_EQ(messages[i].data_case(),
              i == 0 ? v1::UploadDatasetRequest::kHeader : v1::UploadDatasetRequest::kChunk)
        << i;
  }
}

TEST_F(UploadCommandTest, TargetsTakeTheirDTypeFromTheNpyFileUnlessTheFlagSaysOtherwise) {
  const int64_t rows = 40;
  const std::string x = folder_.Write("x.npy", MakeNpy("<f4", {rows, 2}, Bytes(Values<float>(80))));
  const std::string labels =
      folder_.Write("labels.npy", MakeNpy("<i8", {rows}, Bytes(Classes<int64_t>(rows))));
  const std::string values =
      folder_.Write("values.npy", MakeNpy("<f8", {rows}, Bytes(Values<double>(rows))));
  const std::string labels32 =
      folder_.Write("labels32.npy", MakeNpy("<i4", {rows}, Bytes(Classes<int32_t>(rows))));
  struct Case {
    std::vector<std::string> args;
    v1::DType dtype;
    std::vector<int> target_shape;
  };
  const Case cases[] = {
      // An int64 label file: int64 class indices, one scalar per row, without --target-dtype.
      {{"a", x, "--targets", labels}, v1::DTYPE_INT64, {}},
      // A float file: float32 values shaped {1}.
      {{"b", x, "--targets", values}, v1::DTYPE_FLOAT32, {1}},
      // The flag still wins.
      {{"c", x, "--targets", labels, "--target-dtype", "float32"}, v1::DTYPE_FLOAT32, {1}},
      // An int32 label file (NumPy's int on some platforms, many a loader's): class indices too.
      {{"d", x, "--targets", labels32}, v1::DTYPE_INT64, {}},
      {{"e", x, "--targets", labels32, "--target-dtype", "int64"}, v1::DTYPE_INT64, {}},
  };
  size_t done = 0;
  for (const Case& c : cases) {
    ASSERT_EQ(Run(c.args), kExitOk) << err_;
    const std::vector<FakeDatasets::Upload> uploads = datasets_.Uploads(++done);
    ASSERT_EQ(uploads.size(), done);
    const v1::DatasetHeader& header = uploads.back().messages.at(0).header();
    EXPECT_EQ(header.name(), c.args[0]);
    EXPECT_EQ(header.target_dtype(), c.dtype) << c.args[0];
    EXPECT_THAT(header.target_shape(), ElementsAreArray(c.target_shape)) << c.args[0];
  }
}

// One line on stdout suits a loop of uploads; what was converted is said on stderr; -o wide shows
// the whole description.
TEST_F(UploadCommandTest, PrintsOneLineAndSaysWhatItConverted) {
  const std::string x = folder_.Write("x.npy", MakeNpy("<f8", {3, 2}, Bytes(Values<double>(6))));
  const std::string y =
      folder_.Write("y.npy", MakeNpy("<i4", {3}, Bytes(std::vector<int32_t>({0, 2, 1}))));
  ASSERT_EQ(Run({"digits", x, "--targets", y}), kExitOk) << err_;
  EXPECT_EQ(out_,
            "uploaded dataset 'digits': 3 rows, features 2, targets scalar int64 classes "
            "0..0, 48 B on cpu\n");
  EXPECT_EQ(err_,
            "trainctl: features: float64 values sent as float32\n"
            "trainctl: targets: int32 values sent as int64 class indices\n");

  ASSERT_EQ(Run({"digits", x, "--targets", y, "-o", "wide"}), kExitOk) << err_;
  EXPECT_THAT(out_, HasSubstr("\nsha256:    1aad05f4"));
  EXPECT_THAT(out_, HasSubstr("\nrows:      3\n"));
  // float32 features and int64 targets are sent as they are: nothing to say.
  const std::string x32 = folder_.Write("x32.npy", MakeNpy("<f4", {3, 2}, Bytes(Values<float>(6))));
  const std::string y64 =
      folder_.Write("y64.npy", MakeNpy("<i8", {3}, Bytes(std::vector<int64_t>({0, 2, 1}))));
  ASSERT_EQ(Run({"plain", x32, "--targets", y64}), kExitOk) << err_;
  EXPECT_EQ(err_, "");
}

TEST(NpyConversionNotesTest, NamesEachConversion) {
  EXPECT_THAT(NpyConversionNotes(NpyDType::kFloat32, NpyDType::kInt64, TargetDType::kInt64),
              IsEmpty());
  EXPECT_THAT(NpyConversionNotes(NpyDType::kUInt8, NpyDType::kBool, TargetDType::kInt64),
              ElementsAre("features: uint8 values sent as float32",
                          "targets: bool values sent as int64 class indices"));
  EXPECT_THAT(NpyConversionNotes(NpyDType::kFloat32, NpyDType::kInt64, TargetDType::kFloat32),
              ElementsAre("targets: int64 values sent as float32"));
  // Targets in the features array's last columns: their dtype is the features'.
  EXPECT_THAT(NpyConversionNotes(NpyDType::kFloat64, std::nullopt, TargetDType::kInt64),
              ElementsAre("features: float64 values sent as float32",
                          "targets: float64 values sent as int64 class indices"));
}

TEST(UploadInputTest, CsvAndTargetColumnsStayFloat32UnlessAsked) {
  UploadInput input;
  input.features_path = "data.csv";
  EXPECT_EQ(EffectiveTargetDType(input, std::nullopt), TargetDType::kFloat32);
  // A .npy whose last column holds the targets: its dtype is the features', so no hint.
  input.npy = true;
  EXPECT_EQ(EffectiveTargetDType(input, std::nullopt), TargetDType::kFloat32);
  EXPECT_EQ(EffectiveTargetDType(input, NpyDType::kInt64), TargetDType::kInt64);
  EXPECT_EQ(EffectiveTargetDType(input, NpyDType::kFloat64), TargetDType::kFloat32);
  EXPECT_EQ(EffectiveTargetDType(input, NpyDType::kInt32), TargetDType::kInt64);
  EXPECT_EQ(EffectiveTargetDType(input, NpyDType::kUInt8), TargetDType::kInt64);
  EXPECT_EQ(EffectiveTargetDType(input, NpyDType::kBool), TargetDType::kFloat32);
  input.target_dtype = TargetDType::kInt64;
  input.target_dtype_given = true;
  EXPECT_EQ(EffectiveTargetDType(input, NpyDType::kFloat32), TargetDType::kInt64);
}

TEST_F(UploadCommandTest, BadValueInTheFirstChunkIsRefusedBeforeAnyCall) {
  const std::string x = folder_.Write(
      "x.npy",
      MakeNpy("<f4", {2, 2}, Bytes<float>({1, std::numeric_limits<float>::infinity(), 3, 4})));
  EXPECT_EQ(Run({"bad", x}), kExitUsage);
  EXPECT_EQ(err_, "trainctl: " + x + ": features[0, 1]: inf is not a finite number\n");
  EXPECT_THAT(datasets_.Uploads(0), IsEmpty());
}

TEST_F(UploadCommandTest, TruncatedFileIsALocalErrorBeforeAnyCall) {
  std::string file = MakeNpy("<f4", {100, 3}, Bytes(Values<float>(300)));
  file.resize(file.size() - 4);
  const std::string x = folder_.Write("x.npy", file);
  EXPECT_EQ(Run({"short", x}), kExitUsage);
  EXPECT_EQ(err_,
            "trainctl: " + x + ": npy data has 1196 bytes; shape (100, 3) of float32 needs 1200\n");
  EXPECT_THAT(datasets_.Uploads(0), IsEmpty());
}

TEST_F(UploadCommandTest, DaemonRefusalEndsTheStreamWithItsMessage) {
  datasets_.reject = grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "dataset 'cls' already exists");
  const int64_t rows = 65536;
  const std::string x =
      folder_.Write("x.npy", MakeNpy("<f8", {rows, 6}, Bytes(Values<double>(rows * 6))));
  EXPECT_EQ(Run({"cls", x}), kExitFailure);
  EXPECT_THAT(err_, HasSubstr("dataset 'cls' already exists"));
  const std::vector<FakeDatasets::Upload> uploads = datasets_.Uploads(1);
  ASSERT_EQ(uploads.size(), 1u);
  EXPECT_EQ(uploads[0].messages.size(), 1u);
}

TEST_F(UploadCommandTest, CsvIsReadWholeAndCarriesItsChecksumInTheHeader) {
  const std::string csv = folder_.Write("x.csv", "a,b,y\n1,2,3.5\n4,5,6\n");
  ASSERT_EQ(Run({"small", csv}), kExitOk) << err_;
  const std::vector<v1::UploadDatasetRequest> messages = datasets_.Uploads(1).at(0).messages;
  ASSERT_EQ(messages.size(), 2u);
  const std::string expected = Bytes<float>({1, 2, 4, 5, 3.5, 6});
  EXPECT_EQ(messages[0].header().sha256(), Sha256Hex(expected));
  EXPECT_EQ(messages[1].chunk(), expected);
}

// What DataFrame.to_csv writes by default (its index first) of a frame with an integer class
// column: the index is left out and the classes go as int64, as the Python client uploads the
// same file, each said on stderr.
TEST_F(UploadCommandTest, CsvOfAPandasFrameLosesItsIndexAndKeepsItsClasses) {
  const std::string csv =
      folder_.Write("wine.csv", ",alcohol,hue,class\n0,14.2,1.04,0\n1,13.2,1.05,0\n2,12.4,0.9,2\n");
  ASSERT_EQ(Run({"wine", csv}), kExitOk) << err_;
  const std::vector<v1::UploadDatasetRequest> messages = datasets_.Uploads(1).at(0).messages;
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_THAT(messages[0].header().feature_shape(), ElementsAre(2));
  EXPECT_EQ(messages[0].header().target_dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(messages[1].chunk(), Bytes<float>({14.2f, 1.04f, 13.2f, 1.05f, 12.4f, 0.9f}) +
                                     Bytes<int64_t>({0, 0, 2}));
  EXPECT_THAT(err_, HasSubstr(csv + " starts with an unnamed column of distinct whole numbers "
                                    "(0 to 2 over 3 rows)"));
  EXPECT_THAT(err_, HasSubstr(csv + ": its target column 'class' holds whole numbers only "
                                    "(0, 2): uploaded as int64 class indices"));

  // --target-dtype float32 regresses on the same column; the index still goes.
  ASSERT_EQ(Run({"wine-r", csv, "--target-dtype", "float32"}), kExitOk) << err_;
  const std::vector<v1::UploadDatasetRequest> again = datasets_.Uploads(2).at(1).messages;
  EXPECT_EQ(again[0].header().target_dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(again[1].chunk(),
            Bytes<float>({14.2f, 1.04f, 13.2f, 1.05f, 12.4f, 0.9f}) + Bytes<float>({0, 0, 2}));
  EXPECT_THAT(err_, Not(HasSubstr("int64 class indices")));
}

}  // namespace
}  // namespace trainerd::client
