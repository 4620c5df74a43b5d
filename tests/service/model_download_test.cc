// Tests JobService.DownloadModel (server/service/job_service.h) through a real server and a real
// TCP channel: a succeeded job's model comes back as a TorchScript archive (a ZIP file, checked by
// its bytes only: service_test does not link LibTorch) equal to the file the daemon kept, or as
// its safetensors state_dict, and the errors come with their codes.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace trainerd::service::testing {
namespace {

using ::testing::HasSubstr;

class ModelDownloadTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    UploadSeed();
  }

  std::string Submit(int32_t epochs) {
    v1::Job job;
    const grpc::Status status = SubmitJob(LinearSpec("seed", epochs), &job);
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    return job.id();
  }

  // Reads the whole DownloadModel stream into *bytes, checking the chunks' contract on the way.
  grpc::Status Download(const std::string& id, std::string* bytes, int* chunks = nullptr,
                        v1::ModelFormat format = v1::MODEL_FORMAT_UNSPECIFIED) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::DownloadModelRequest request;
    request.set_id(id);
    request.set_format(format);
    std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader =
        jobs_->DownloadModel(&context, request);
    v1::ModelChunk chunk;
    int count = 0;
    int64_t total = -1;
    while (reader->Read(&chunk)) {
      EXPECT_LE(chunk.data().size(), size_t{1} << 20);
      if (count == 0) {
        total = chunk.total_bytes();
      } else {
        EXPECT_EQ(chunk.total_bytes(), 0) << "total_bytes on chunk " << count;
      }
      bytes->append(chunk.data());
      ++count;
    }
    const grpc::Status status = reader->Finish();
    if (status.ok()) {
      EXPECT_EQ(static_cast<int64_t>(bytes->size()), total);
    }
    if (chunks != nullptr) *chunks = count;
    return status;
  }
};

TEST_F(ModelDownloadTest, DownloadOfSucceededJobReturnsTheKeptTorchScriptArchive) {
  const std::string id = Submit(/*epochs=*/3);
  ASSERT_TRUE(Watch(id)->Finish().ok());

  std::string bytes;
  int chunks = 0;
  const grpc::Status status = Download(id, &bytes, &chunks);

  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ASSERT_GT(bytes.size(), 2u);
  EXPECT_EQ(bytes.substr(0, 2), "PK");  // TorchScript archives are ZIP files
  EXPECT_EQ(chunks, 1);                 // a linear:1 model is far below 1 MiB
  std::ifstream file(data_dir_ + "/models/" + id + ".pt", std::ios::binary);
  ASSERT_TRUE(file) << "the daemon keeps the model under its data folder";
  std::ostringstream kept;
  kept << file.rdbuf();
  EXPECT_EQ(bytes, kept.str());
}

// A model file damaged on disk (one flipped byte, or cut in half) no longer matches the checksum
// recorded when it was written: DATA_LOSS, never a download that looks fine.
TEST_F(ModelDownloadTest, ADamagedModelFileIsDataLoss) {
  const std::string id = Submit(2);
  ASSERT_TRUE(Watch(id)->Finish().ok());
  std::string good;
  ASSERT_TRUE(Download(id, &good).ok());
  const std::string path = data_dir_ + "/models/" + id + ".pt";
  for (const std::string& damaged :
       {std::string(good).replace(good.size() / 2, 1, 1, static_cast<char>(good[good.size() / 2] ^ 1)),
        good.substr(0, good.size() / 2)}) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << damaged;
    }
    std::string bytes;
    const grpc::Status status = Download(id, &bytes);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
    EXPECT_THAT(status.error_message(), HasSubstr("is damaged"));
  }
  // Put back, it downloads again.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << good;
  }
  std::string again;
  EXPECT_TRUE(Download(id, &again).ok());
  EXPECT_EQ(again, good);
}

// Reads the whole DownloadCheckpoint stream of `epoch` (0: the newest) into *bytes.
grpc::Status DownloadCheckpoint(v1::JobService::Stub* jobs, const std::string& id, int32_t epoch,
                                std::string* bytes) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  v1::DownloadCheckpointRequest request;
  request.set_id(id);
  request.set_epoch(epoch);
  std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader =
      jobs->DownloadCheckpoint(&context, request);
  v1::ModelChunk chunk;
  int64_t total = -1;
  while (reader->Read(&chunk)) {
    if (total < 0) total = chunk.total_bytes();
    bytes->append(chunk.data());
  }
  const grpc::Status status = reader->Finish();
  if (status.ok()) {
    EXPECT_EQ(static_cast<int64_t>(bytes->size()), total);
  }
  return status;
}

std::string ReadWhole(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file) << path;
  std::ostringstream out;
  out << file.rdbuf();
  return out.str();
}

// A job's checkpoints come back as the files the daemon wrote: the newest by default, any by its
// epoch; an epoch without one is NOT_FOUND naming those that have one, a job without any is
// NOT_FOUND, a negative epoch INVALID_ARGUMENT and a damaged file DATA_LOSS.
TEST_F(ModelDownloadTest, CheckpointsDownloadByEpoch) {
  v1::JobSpec spec = LinearSpec("seed", 4);
  spec.set_checkpoint_every(2);
  v1::Job job;
  ASSERT_TRUE(SubmitJob(spec, &job).ok());
  ASSERT_TRUE(Watch(job.id())->Finish().ok());
  const std::string folder = data_dir_ + "/checkpoints/" + job.id() + "/";

  std::string newest;
  grpc::Status status = DownloadCheckpoint(jobs_.get(), job.id(), 0, &newest);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(newest.substr(0, 2), "PK");  // a torch::serialize archive is a ZIP file
  EXPECT_EQ(newest, ReadWhole(folder + "epoch-000004.pt"));
  std::string second;
  ASSERT_TRUE(DownloadCheckpoint(jobs_.get(), job.id(), 2, &second).ok());
  EXPECT_EQ(second, ReadWhole(folder + "epoch-000002.pt"));
  EXPECT_NE(second, newest);

  std::string none;
  status = DownloadCheckpoint(jobs_.get(), job.id(), 3, &none);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(),
            "job '" + job.id() + "' has no checkpoint of epoch 3; it has epochs 2, 4");
  EXPECT_TRUE(none.empty());
  status = DownloadCheckpoint(jobs_.get(), job.id(), -1, &none);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "checkpoint epoch must be >= 1, or 0 for the newest; got -1");
  status = DownloadCheckpoint(jobs_.get(), "job-000000000000", 0, &none);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);

  const std::string without = Submit(/*epochs=*/1);
  ASSERT_TRUE(Watch(without)->Finish().ok());
  status = DownloadCheckpoint(jobs_.get(), without, 0, &none);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("has no checkpoints"));

  {
    std::ofstream out(folder + "epoch-000002.pt", std::ios::binary | std::ios::trunc);
    out << second.substr(0, second.size() / 2);
  }
  std::string cut;
  status = DownloadCheckpoint(jobs_.get(), job.id(), 2, &cut);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(),
              HasSubstr("the checkpoint file of job '" + job.id() + "' (epoch 2) is damaged"));
}

TEST_F(ModelDownloadTest, SafetensorsFormatReturnsTheKeptStateDict) {
  const std::string id = Submit(/*epochs=*/2);
  ASSERT_TRUE(Watch(id)->Finish().ok());
  std::string archive;
  ASSERT_TRUE(Download(id, &archive, nullptr, v1::MODEL_FORMAT_TORCHSCRIPT).ok());
  EXPECT_EQ(archive.substr(0, 2), "PK");

  std::string bytes;
  const grpc::Status status = Download(id, &bytes, nullptr, v1::MODEL_FORMAT_SAFETENSORS);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  std::ifstream file(data_dir_ + "/models/" + id + ".safetensors", std::ios::binary);
  ASSERT_TRUE(file);
  std::ostringstream kept;
  kept << file.rdbuf();
  EXPECT_EQ(bytes, kept.str());
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 2u);  // linear:1
  EXPECT_EQ(parsed->tensors[0].name, "0.weight");
  EXPECT_EQ(parsed->tensors[1].name, "0.bias");

  // Damaged on disk: DATA_LOSS, as for the archive.
  {
    std::ofstream out(data_dir_ + "/models/" + id + ".safetensors",
                      std::ios::binary | std::ios::trunc);
    out << bytes.substr(0, bytes.size() - 1) << static_cast<char>(bytes.back() ^ 1);
  }
  std::string damaged;
  const grpc::Status lost = Download(id, &damaged, nullptr, v1::MODEL_FORMAT_SAFETENSORS);
  EXPECT_EQ(lost.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(lost.error_message(), HasSubstr("is damaged"));
}

TEST_F(ModelDownloadTest, AFormatThatIsNotOneIsInvalidArgument) {
  const std::string id = Submit(/*epochs=*/1);
  ASSERT_TRUE(Watch(id)->Finish().ok());
  std::string bytes;
  const grpc::Status status = Download(id, &bytes, nullptr, static_cast<v1::ModelFormat>(7));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("format must be MODEL_FORMAT_TORCHSCRIPT (1), MODEL_FORMAT_SAFETENSORS "
                        "(2) or MODEL_FORMAT_PT2 (3); got 7"));
  EXPECT_TRUE(bytes.empty());
}

TEST_F(ModelDownloadTest, ASpecModelsPt2IsMadeOnceAndCheckedByItsDigest) {
  const std::string id = Submit(/*epochs=*/1);
  ASSERT_TRUE(Watch(id)->Finish().ok());
  std::string bytes;
  ASSERT_TRUE(Download(id, &bytes, nullptr, v1::MODEL_FORMAT_PT2).ok());
  // torch.export's archive of the spec's graph (training/sequential_pt2.h; its numbers are
  // tested there and loaded by torch in python/tests), kept beside the state_dict.
  EXPECT_EQ(bytes.substr(0, 2), "PK");
  EXPECT_NE(bytes.find("torch.ops.aten.linear.default"), std::string::npos);
  const std::string kept = data_dir_ + "/models/" + id + ".pt2";
  ASSERT_TRUE(std::filesystem::exists(kept));
  std::string again;
  ASSERT_TRUE(Download(id, &again, nullptr, v1::MODEL_FORMAT_PT2).ok());
  EXPECT_EQ(again, bytes);
  {  // damaged on disk after it was made: DATA_LOSS, as for the other formats
    std::ofstream out(kept, std::ios::binary | std::ios::trunc);
    out << bytes.substr(0, bytes.size() - 1) << static_cast<char>(bytes.back() ^ 1);
  }
  std::string damaged;
  const grpc::Status lost = Download(id, &damaged, nullptr, v1::MODEL_FORMAT_PT2);
  EXPECT_EQ(lost.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(lost.error_message(), HasSubstr("is damaged"));
}

TEST_F(ModelDownloadTest, DownloadOfRunningJobIsFailedPrecondition) {
  const std::string id = Submit(kLongJobEpochs);
  std::unique_ptr<JobWatch> watch = Watch(id);
  ASSERT_TRUE(watch->NextEpoch());

  std::string bytes;
  const grpc::Status status = Download(id, &bytes);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("is RUNNING; its model is available once it succeeds"));
  EXPECT_TRUE(bytes.empty());
  v1::Job job;
  ASSERT_TRUE(CancelJob(id, &job).ok());
  EXPECT_TRUE(watch->Finish().ok());
}

TEST_F(ModelDownloadTest, DownloadOfUnknownJobIsNotFound) {
  std::string bytes;
  const grpc::Status status = Download("job-000000000000", &bytes);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("'job-000000000000'"));
  EXPECT_TRUE(bytes.empty());
}

}  // namespace
}  // namespace trainerd::service::testing
