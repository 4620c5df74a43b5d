// DiskQuota on real files in a scratch folder: a caller's datasets, modules, checkpoints and
// models summed; the refusal names the quota; charges count until the next walk; Forget walks
// again; another caller's files are not counted.
#include "server/engine/datasets/disk_quota.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

void WriteBytes(const std::filesystem::path& path, size_t n) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << std::string(n, 'x');
}

class DiskQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_.path();
    WriteBytes(dir_ / "modules" / "job-a.pt", 100);
    WriteBytes(dir_ / "checkpoints" / "job-a" / "epoch-1.pt", 200);
    WriteBytes(dir_ / "checkpoints" / "job-a" / "epoch-2.pt", 300);
    WriteBytes(dir_ / "models" / "job-a.pt", 400);
    WriteBytes(dir_ / "models" / "job-b.pt", 5000);  // bob's
  }

  DiskQuota::Sources Sources() {
    DiskQuota::Sources sources;
    sources.data_dir = dir_.string();
    sources.dataset_bytes = [this](const std::string& owner) {
      return owner == "alice" ? dataset_bytes_ : 0;
    };
    sources.job_ids = [this](const std::string& owner) {
      ++walks_;
      return owner == "alice" ? std::vector<std::string>{"job-a", "job-missing"}
                              : std::vector<std::string>{"job-b"};
    };
    return sources;
  }

  test_support::ScratchDir scratch_;
  std::filesystem::path dir_;
  int64_t dataset_bytes_ = 1000;
  int walks_ = 0;
};

TEST_F(DiskQuotaTest, SumsTheCallersFilesAndRefusesPastTheQuota) {
  DiskQuota quota(2500, Sources(), absl::Hours(1));
  EXPECT_EQ(quota.Used("alice"), 1000 + 100 + 200 + 300 + 400);
  EXPECT_EQ(quota.Used("bob"), 5000);
  EXPECT_TRUE(quota.Check("alice", 500, "this upload").ok());
  const absl::Status refused = quota.Check("alice", 501, "this upload");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("caller 'alice' holds 2000 bytes"));
  EXPECT_THAT(refused.message(), HasSubstr("this upload needs 501"));
  EXPECT_THAT(refused.message(),
              HasSubstr("its quota is 2500 bytes (--max_disk_bytes_per_caller)"));
  // At or past the quota, nothing more, not even a checkpoint of unknown size.
  EXPECT_EQ(quota.Check("bob", 0, "a checkpoint").code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(DiskQuotaTest, ChargesCountUntilTheNextWalkAndForgetWalksAgain) {
  DiskQuota quota(2500, Sources(), absl::Hours(1));
  EXPECT_EQ(quota.Used("alice"), 2000);
  EXPECT_EQ(walks_, 1);
  quota.Charge("alice", 450);
  EXPECT_EQ(quota.Used("alice"), 2450);
  EXPECT_EQ(walks_, 1);  // cached
  EXPECT_TRUE(quota.Check("alice", 0, "a checkpoint").ok());
  quota.Charge("alice", 50);
  EXPECT_EQ(quota.Check("alice", 0, "a checkpoint").code(), absl::StatusCode::kResourceExhausted);
  // The files are deleted; once forgotten, the next call walks and sees it.
  // (POSIX calls: std::filesystem::remove_all resolves to LibTorch's copy here, which crashes.)
  ASSERT_EQ(::unlink((dir_ / "checkpoints" / "job-a" / "epoch-1.pt").c_str()), 0);
  ASSERT_EQ(::unlink((dir_ / "checkpoints" / "job-a" / "epoch-2.pt").c_str()), 0);
  quota.Forget();
  EXPECT_EQ(quota.Used("alice"), 1500);
  EXPECT_EQ(walks_, 2);
}

TEST_F(DiskQuotaTest, NoQuotaMeansNoWalk) {
  DiskQuota quota(0, Sources());
  EXPECT_FALSE(quota.enabled());
  EXPECT_TRUE(quota.Check("bob", int64_t{1} << 60, "this upload").ok());
  EXPECT_EQ(walks_, 0);
}

}  // namespace
}  // namespace trainerd::engine
