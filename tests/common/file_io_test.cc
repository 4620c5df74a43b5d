// Tests for common/file_io.h's atomic writer (reads are covered through the CSV and NPY readers).
#include "common/file_io.h"

#include <unistd.h>

#include <cstdio>
#include <string>

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

}  // namespace
}  // namespace trainerd
