// Tests for common/file_io.h's atomic writer (reads are covered through the CSV and NPY readers).
#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

class WriteFileAtomicallyTest : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }
  const std::string path_ = ::testing::TempDir() + "/atomic-" + std::to_string(::getpid()) + "-" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
};

TEST_F(WriteFileAtomicallyTest, WritesThePartsInOrderAndReplacesAnOldFile) {
  ASSERT_TRUE(WriteFileAtomically(path_, {"old contents, longer than the new"}).ok());
  ASSERT_TRUE(WriteFileAtomically(path_, {"head\n", "", std::string_view("pay\0load", 8)}).ok());
  EXPECT_EQ(*ReadFileToString(path_), std::string("head\npay\0load", 13));
  // Nothing is left under the temporary name.
  EXPECT_NE(::access((path_ + ".tmp").c_str(), F_OK), 0);
}

TEST_F(WriteFileAtomicallyTest, AFolderThatDoesNotExistIsAnErrorNamingTheFile) {
  const absl::Status status = WriteFileAtomically("/nonexistent-folder/x.pt", {"bytes"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("cannot create '/nonexistent-folder/x.pt.tmp'"));
}

// /dev/full answers every write with ENOSPC, as a full disk does.
TEST(FileErrorTest, AFullDiskIsResourceExhaustedNamingTheDisk) {
  ScopedFd full(::open("/dev/full", O_WRONLY | O_CLOEXEC));
  ASSERT_GE(full.get(), 0);
  const absl::Status status = WriteAt(full.get(), "/data/datasets/x.tmp", "bytes", 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("the disk holding '/data/datasets/x.tmp' is full"));
  EXPECT_EQ(FileError(EDQUOT, "cannot write", "/q").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FileError(EIO, "cannot write", "/q").code(), absl::StatusCode::kInternal);
}

// Out of descriptors is a bound, not damage: RESOURCE_EXHAUSTED naming the open-file limit, for a
// write, an open and a read alike.
TEST(FileErrorTest, NoDescriptorLeftIsResourceExhaustedNamingTheLimit) {
  for (int error_number : {EMFILE, ENFILE}) {
    const absl::Status written = FileError(error_number, "cannot create", "/data/x.tmp");
    EXPECT_EQ(written.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(written.message(), HasSubstr("no file descriptor left"));
    EXPECT_THAT(written.message(), HasSubstr("cannot create '/data/x.tmp' failed"));
    EXPECT_THAT(written.message(), HasSubstr("LimitNOFILE="));
    const absl::Status opened = CannotOpen("/data/m.pt", error_number);
    EXPECT_EQ(opened.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(opened.message(), HasSubstr("opening '/data/m.pt'"));
  }
  EXPECT_EQ(CannotOpen("/data/m.pt", ENOENT).code(), absl::StatusCode::kNotFound);
}

// A batch: more files than are held open at once and than sync at once, one in a missing folder
// (it fails alone), one that replaces an old file; each whole under its name, nothing under the
// temporary names.
TEST_F(WriteFileAtomicallyTest, ABatchWritesEachFileAndFailsOnlyTheOneThatCannotBeWritten) {
  const size_t count = kFilesOpenAtOnce + kParallelFileSyncs + 3;
  ASSERT_TRUE(WriteFileAtomically(path_ + "-1", {"old contents, longer than the new"}).ok());
  std::vector<std::string> contents;
  for (size_t i = 0; i < count; ++i) contents.push_back("file " + std::to_string(i));
  std::vector<FileToWrite> files;
  for (size_t i = 0; i < count; ++i) {
    files.push_back({path_ + "-" + std::to_string(i), contents[i]});
  }
  files[5].path = "/nonexistent-folder/x.pt";
  const std::vector<absl::Status> status = WriteFilesAtomically(files);
  ASSERT_EQ(status.size(), count);
  for (size_t i = 0; i < count; ++i) {
    if (i == 5) {
      EXPECT_EQ(status[i].code(), absl::StatusCode::kInternal);
      EXPECT_THAT(status[i].message(), HasSubstr("cannot create '/nonexistent-folder/x.pt.tmp'"));
      continue;
    }
    ASSERT_TRUE(status[i].ok()) << i << ": " << status[i];
    EXPECT_EQ(*ReadFileToString(files[i].path), contents[i]);
    EXPECT_NE(::access((files[i].path + ".tmp").c_str(), F_OK), 0);
    std::remove(files[i].path.c_str());
  }
  EXPECT_TRUE(WriteFilesAtomically({}).empty());
}

TEST_F(WriteFileAtomicallyTest, FoldersAreMadeWithTheirParentsAndAFileInTheWayIsAnError) {
  const std::string root = path_ + "-folders";
  ASSERT_TRUE(MakeFoldersDurably(root + "/a/b/c").ok());
  EXPECT_TRUE(WriteFileAtomically(root + "/a/b/c/file", {"x"}).ok());
  EXPECT_TRUE(MakeFoldersDurably(root + "/a/b/c").ok());  // already there
  ASSERT_TRUE(WriteFileAtomically(root + "/a/plain", {"x"}).ok());
  EXPECT_FALSE(MakeFoldersDurably(root + "/a/plain/d").ok());
  EXPECT_FALSE(MakeFoldersDurably(root + "/a/plain").ok());
  std::remove((root + "/a/b/c/file").c_str());
  std::remove((root + "/a/plain").c_str());
  for (const char* dir : {"/a/b/c", "/a/b", "/a", ""}) ::rmdir((root + dir).c_str());
}

}  // namespace
}  // namespace trainerd
