// End to end, the daemon's resources run out and it survives: the real trainerd and trainctl.
// - A full disk: the data folder on a 2.5 MiB tmpfs. An upload larger than the room left is
//   refused with RESOURCE_EXHAUSTED naming the disk (not INTERNAL), nothing of it stays behind,
//   and the daemon serves on; a job whose checkpoints do not fit goes on without them, says why,
//   and succeeds with its model, which downloads. Mounting needs CAP_SYS_ADMIN (root, as in CI);
//   that test skips without it.
// - No file descriptor left: the daemon under a hard limit of 256 open files (prlimit), filled
//   with small datasets (two descriptors each while resident). The upload that finds none is
//   RESOURCE_EXHAUSTED naming the limit; the daemon serves, and deleting datasets makes room.
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/file_io.h"
#include "tests/e2e/subprocess.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class FullDiskEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-full-disk-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    data_ = dir_ / "data";
    std::filesystem::create_directories(data_);
    if (::mount("trainerd-test", data_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                "size=2560k,mode=0700") != 0) {
      const int error = errno;
      std::filesystem::remove_all(dir_);
      GTEST_SKIP() << "cannot mount a small tmpfs (" << std::strerror(error)
                   << "); this test needs CAP_SYS_ADMIN";
    }
    mounted_ = true;
  }
  void TearDown() override {
    daemon_.reset();
    if (mounted_) ::umount2(data_.c_str(), MNT_DETACH);
    std::filesystem::remove_all(dir_);
  }

  void StartDaemon() {
    daemon_ = std::make_unique<Daemon>(std::vector<std::string>{
        TRAINERD_BIN, "--data_dir=" + data_.string(), "--listen=127.0.0.1:0", "--device=cpu",
        "--metrics_listen=", "--diagnose_at_start=false"});
    std::string line;
    ASSERT_TRUE(daemon_->ReadLine(&line)) << "trainerd exited: " << daemon_->Stderr();
    addr_ = ListeningAddress(line);
    ASSERT_FALSE(addr_.empty()) << line;
  }
  RunResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr_});
    return e2e::Run(args);
  }
  // A two-column CSV of `rows` rows (y = 2x + 1), on the test's own disk, not the tmpfs.
  std::string WriteCsv(const std::string& name, int rows) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path);
    out << "x,y\n";
    for (int i = 0; i < rows; ++i) {
      const double x = static_cast<double>(i % 1000) / 1000.0;
      out << x << "," << 2 * x + 1 << "\n";
    }
    return path;
  }
  int64_t FreeBytes() const {
    struct statvfs fs {};
    if (::statvfs(data_.c_str(), &fs) != 0) return -1;
    return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }

  std::filesystem::path dir_;
  std::filesystem::path data_;
  bool mounted_ = false;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
};

TEST_F(FullDiskEndToEndTest, AnUploadThatDoesNotFitIsRefusedNamingTheDiskAndJobsGoOn) {
  StartDaemon();
  // 500,000 rows of two float32 columns: 4 MB, more than the whole disk.
  const std::string big = WriteCsv("big.csv", 500000);
  const RunResult refused = Ctl({"dataset", "upload", "big", big});
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("is full"));
  EXPECT_THAT(refused.err, HasSubstr("free space there or delete datasets"));
  EXPECT_THAT(refused.err, Not(HasSubstr("INTERNAL")));
  // Nothing of it stays behind (no partial or temporary file), and the daemon serves on.
  EXPECT_LT(BytesOnDisk((data_ / "datasets").string()), 4096);
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
  const RunResult listed = Ctl({"dataset", "list"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, Not(HasSubstr("big")));

  // A small dataset still fits. A job of 252,001 parameters with Adam: its model (about 1 MB)
  // fits the room left, its checkpoints (parameters and two moments, about 3 MB) do not.
  const RunResult small = Ctl({"dataset", "upload", "small", WriteCsv("small.csv", 64)});
  ASSERT_EQ(small.exit_code, 0) << small.err;
  const int64_t free_bytes = FreeBytes();
  ASSERT_GT(free_bytes, 1200000) << "the tmpfs has less room than the test assumes";
  ASSERT_LT(free_bytes, 2900000) << "the tmpfs has more room than the test assumes";
  const RunResult submit = Ctl({"submit", "--dataset", "small", "--model",
                                "linear:500,relu,linear:500,relu,linear:1", "--optimizer", "adam",
                                "--lr", "0.001", "--epochs", "3", "--batch-size", "16",
                                "--checkpoint-every", "1", "--watch"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  const RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  EXPECT_EQ(job.epochs_completed(), 3);
  EXPECT_EQ(job.checkpoints_size(), 0);
  EXPECT_THAT(job.checkpoint_error(), HasSubstr("cannot write the checkpoint of epoch 3"));
  EXPECT_THAT(job.checkpoint_error(), HasSubstr("is full"));
  // No partial checkpoint takes the room, and the model downloads whole (checked against the
  // checksum kept with the record).
  EXPECT_EQ(BytesOnDisk((data_ / "checkpoints").string()), 0);
  const std::string model = (dir_ / "model.pt").string();
  const RunResult fetched = Ctl({"job", "model", id, "-f", model});
  ASSERT_EQ(fetched.exit_code, 0) << fetched.err;
  EXPECT_GT(std::filesystem::file_size(model), 1000000u);
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
}

TEST(DescriptorsEndToEndTest, NoDescriptorLeftIsABoundThatDeletingDatasetsLifts) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("trainerd-descriptors-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string csv = (dir / "seed.csv").string();
  std::ofstream(csv) << "x,y\n0,1\n0.5,2\n1,3\n0.25,1.5\n";
  // The hard limit is what the daemon raises its soft limit to; it says at start that the limit
  // is short of what --max_datasets may take.
  Daemon daemon({"/usr/bin/prlimit", "--nofile=256:256", TRAINERD_BIN, "--data_dir=" + (dir / "data").string(),
                 "--listen=127.0.0.1:0", "--device=cpu", "--metrics_listen=",
                 "--diagnose_at_start=false", "--max_datasets=1000"});
  std::string line;
  ASSERT_TRUE(daemon.ReadLine(&line)) << "trainerd exited: " << daemon.Stderr();
  const std::string marker = "listening on ";
  const size_t at = line.find(marker);
  ASSERT_NE(at, std::string::npos) << line;
  const size_t start = at + marker.size();
  const std::string addr = line.substr(start, line.find(' ', start) - start);
  EXPECT_THAT(daemon.Stderr(), HasSubstr("the open-file limit is 256, short of the 3024"));
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr});
    return e2e::Run(args, {}, 30);
  };
  int uploaded = 0;
  RunResult refused;
  for (int i = 0; i < 200; ++i) {
    RunResult upload = ctl({"dataset", "upload", "d" + std::to_string(i), csv});
    if (upload.exit_code != 0) {
      refused = upload;
      break;
    }
    ++uploaded;
  }
  ASSERT_GT(uploaded, 20) << "the limit was reached too early: " << refused.err;
  ASSERT_LT(uploaded, 200) << "256 descriptors held more than 200 datasets";
  EXPECT_THAT(refused.err, HasSubstr("no file descriptor left"));
  EXPECT_THAT(refused.err, Not(HasSubstr("INTERNAL")));
  // The daemon serves on, with every dataset it accepted.
  EXPECT_EQ(ctl({"health"}).exit_code, 0);
  const RunResult listed = ctl({"dataset", "list"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("d" + std::to_string(uploaded - 1)));
  // Deleting some makes room again.
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(ctl({"dataset", "delete", "d" + std::to_string(i)}).exit_code, 0);
  }
  const RunResult again = ctl({"dataset", "upload", "again", csv});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(daemon.Stop(SIGTERM), 0) << daemon.Stderr();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainerd::e2e
