// ParseMemorySize: bytes, units, shares, and the refusals.
#include "common/memory_size.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

int64_t Bytes(std::string_view text) {
  absl::StatusOr<MemorySize> size = ParseMemorySize(text);
  EXPECT_TRUE(size.ok()) << text << ": " << size.status();
  return size.ok() ? size->bytes : -1;
}

TEST(ParseMemorySizeTest, BytesAndUnits) {
  EXPECT_EQ(Bytes("0"), 0);
  EXPECT_EQ(Bytes("1073741824"), int64_t{1} << 30);
  EXPECT_EQ(Bytes("12GiB"), int64_t{12} << 30);
  EXPECT_EQ(Bytes("512mib"), int64_t{512} << 20);
  EXPECT_EQ(Bytes("4G"), int64_t{4'000'000'000});
  EXPECT_EQ(Bytes("500MB"), int64_t{500'000'000});
  EXPECT_EQ(Bytes("2 TiB"), int64_t{2} << 40);
  EXPECT_EQ(Bytes("64k"), 64'000);
  EXPECT_TRUE(ParseMemorySize("0")->unset());
}

TEST(ParseMemorySizeTest, ShareOfTheDevice) {
  absl::StatusOr<MemorySize> size = ParseMemorySize("80%");
  ASSERT_TRUE(size.ok());
  EXPECT_DOUBLE_EQ(size->fraction, 0.8);
  EXPECT_EQ(size->bytes, 0);
  EXPECT_EQ(size->Resolve(1000), 800);
  EXPECT_EQ(ParseMemorySize("12.5%")->Resolve(int64_t{8} << 30), int64_t{1} << 30);
  EXPECT_EQ(ParseMemorySize("100%")->Resolve(77), 77);
  EXPECT_EQ(ParseMemorySize("3GiB")->Resolve(1), int64_t{3} << 30);
}

TEST(ParseMemorySizeTest, RefusesWhatIsNotASize) {
  for (const char* text :
       {"", "-1", "GiB", "12XB", "0%", "101%", "abc%", "99999999999999999999", "9999999999TiB",
        "1.5GiB", "nan%", "inf%", "-5%", "1e400%", "12 GiB GiB"}) {
    absl::StatusOr<MemorySize> size = ParseMemorySize(text);
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_THAT(ParseMemorySize("12XB").status().message(), HasSubstr("unknown unit 'xb'"));
  EXPECT_THAT(ParseMemorySize("101%").status().message(), HasSubstr("at most 100%"));
}

}  // namespace
}  // namespace trainerd
