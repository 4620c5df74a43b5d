// `trainctl job model` against a hostile daemon: a real gRPC server in this process whose
// DownloadModel lies about the model's size. trainctl keeps at most the size the daemon declared,
// refuses a declared size above --max-size, stops the call at once (the server sees it cancelled
// long before it ran out of chunks) and leaves no file behind; an honest daemon's model arrives
// whole.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "common/job_limits.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/client/run_captured.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::client {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kChunk = int64_t{1} << 20;
// What the server would send if nobody stopped it: 256 chunks of 1 MiB.
constexpr int kBudget = 256;
// The chunks a server may have written before it sees a cancel (gRPC's flow-control window): far
// below the budget.
constexpr int kSeenBeforeCancel = 64;

// DownloadModel declares `declared` bytes on its first chunk, then sends `chunks` chunks of
// `chunk_bytes` bytes ('P'), whatever it declared.
class HostileJobs final : public v1::JobService::Service {
 public:
  HostileJobs(int64_t declared, int chunks, int64_t chunk_bytes)
      : declared_(declared), chunks_(chunks), chunk_bytes_(chunk_bytes) {}

  grpc::Status DownloadModel(grpc::ServerContext* context, const v1::DownloadModelRequest*,
                             grpc::ServerWriter<v1::ModelChunk>* writer) override {
    v1::ModelChunk chunk;
    chunk.set_data(std::string(static_cast<size_t>(chunk_bytes_), 'P'));
    for (int i = 0; i < chunks_ && !context->IsCancelled(); ++i) {
      chunk.set_total_bytes(i == 0 ? declared_ : 0);
      if (!writer->Write(chunk)) break;
      ++sent;
    }
    ++ended;
    return grpc::Status::OK;
  }

  std::atomic<int> sent{0};   // chunks written, over every call
  std::atomic<int> ended{0};  // calls whose handler returned

 private:
  const int64_t declared_;
  const int chunks_;
  const int64_t chunk_bytes_;
};

class ModelDownloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("trainctl-download-", ::getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    std::filesystem::remove_all(dir_);
  }

  void Start(int64_t declared, int chunks = kBudget, int64_t chunk_bytes = kChunk) {
    jobs_ = std::make_unique<HostileJobs>(declared, chunks, chunk_bytes);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(jobs_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  // `trainctl job model job-0123456789ab` with `flags` against the server; stdout in out_, stderr
  // in err_.
  int Run(const std::vector<std::string>& flags) {
    std::vector<std::string> words = {"trainctl", "--addr", absl::StrCat("127.0.0.1:", port_),
                                      "job",      "model",  "job-0123456789ab"};
    words.insert(words.end(), flags.begin(), flags.end());
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    if (!invocation.ok()) {
      err_ = std::string(invocation.status().message());
      return -1;
    }
    CapturedRun run = RunCaptured(*invocation);
    out_ = std::move(run.out);
    err_ = std::move(run.err);
    return run.code;
  }

  // The server's stream ended (trainctl cancelled it) before the budget was spent.
  bool StoppedEarly() {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (jobs_->ended == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return jobs_->ended > 0 && jobs_->sent < kSeenBeforeCancel;
  }
  std::vector<std::string> FilesLeft() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }
  std::string File() const { return (dir_ / "model.pt").string(); }

  std::filesystem::path dir_;
  std::unique_ptr<HostileJobs> jobs_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string out_;
  std::string err_;
};

TEST_F(ModelDownloadTest, MoreThanDeclaredIsRefusedAndNothingIsKept) {
  Start(/*declared=*/100);
  EXPECT_EQ(Run({"-f", File()}), 1);
  EXPECT_THAT(err_, HasSubstr("the daemon sent more than the 100 bytes it declared for job "
                              "'job-0123456789ab''s model"));
  EXPECT_THAT(err_, HasSubstr("kept nothing"));
  EXPECT_THAT(FilesLeft(), IsEmpty());  // neither FILE nor its temporary file
  EXPECT_TRUE(StoppedEarly()) << jobs_->sent;
}

TEST_F(ModelDownloadTest, TheChunkThatGoesPastTheDeclaredSizeIsRefused) {
  Start(/*declared=*/2 * kChunk + kChunk / 2);
  EXPECT_EQ(Run({"-f", File()}), 1);
  EXPECT_THAT(err_, HasSubstr(absl::StrCat("(", 3 * kChunk, " so far)")));
  EXPECT_THAT(FilesLeft(), IsEmpty());
  EXPECT_TRUE(StoppedEarly()) << jobs_->sent;
}

TEST_F(ModelDownloadTest, ToStandardOutputAtMostTheDeclaredBytesAreWritten) {
  Start(/*declared=*/kChunk + 10, kBudget, /*chunk_bytes=*/kChunk / 4);
  EXPECT_EQ(Run({}), 1);
  EXPECT_THAT(err_, HasSubstr("sent more than the"));
  EXPECT_LE(static_cast<int64_t>(out_.size()), kChunk + 10);
  EXPECT_EQ(out_.size(), static_cast<size_t>(kChunk));  // four whole chunks fit, the fifth not
  EXPECT_TRUE(StoppedEarly()) << jobs_->sent;
}

TEST_F(ModelDownloadTest, ADeclaredSizeAboveTheMaximumIsRefusedBeforeAnyByteIsWritten) {
  Start(/*declared=*/kMaxModelDownloadBytes + 1);
  EXPECT_EQ(Run({"-f", File()}), 1);
  EXPECT_THAT(err_, HasSubstr(absl::StrCat("declared job 'job-0123456789ab''s model as ",
                                           kMaxModelDownloadBytes + 1,
                                           " bytes, more than "
                                           "--max-size allows")));
  EXPECT_THAT(FilesLeft(), IsEmpty());
  EXPECT_TRUE(StoppedEarly()) << jobs_->sent;
}

TEST_F(ModelDownloadTest, MaxSizeBoundsTheDownload) {
  Start(/*declared=*/3 * kChunk, /*chunks=*/3);
  EXPECT_EQ(Run({"-f", File(), "--max-size", "2MiB"}), 1);
  EXPECT_THAT(err_, HasSubstr("more than --max-size allows (2097152 bytes)"));
  EXPECT_THAT(FilesLeft(), IsEmpty());
  // The same daemon, honest, within the bound: the model arrives whole.
  EXPECT_EQ(Run({"-f", File(), "--max-size", "3MiB"}), 0) << err_;
  std::ifstream in(File(), std::ios::binary);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written, std::string(static_cast<size_t>(3 * kChunk), 'P'));
  for (const char* bad : {"0", "-1", "50%", "lots"}) {
    EXPECT_EQ(Run({"-f", File(), "--max-size", bad}), 2) << bad;
    EXPECT_THAT(err_, HasSubstr("--max-size takes a size in bytes above 0")) << bad;
  }
}

TEST_F(ModelDownloadTest, ANegativeSizeIsRefused) {
  Start(/*declared=*/-1);
  EXPECT_EQ(Run({"-f", File()}), 1);
  EXPECT_THAT(err_, HasSubstr("as -1 bytes, which is no size"));
  EXPECT_THAT(FilesLeft(), IsEmpty());
}

}  // namespace
}  // namespace trainerd::client
