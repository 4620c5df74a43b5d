// Tests for common/checked_size.h: the one checked helper for products and byte sizes.
#include "common/checked_size.h"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedShapeElementsTest, MultipliesDimensions) {
  EXPECT_EQ(*CheckedShapeElements({}, "x"), 1);
  EXPECT_EQ(*CheckedShapeElements({1, 28, 28}, "x"), 784);
  EXPECT_EQ(*CheckedShapeElements({5, 0}, "x"), 0);
}

TEST(CheckedShapeElementsTest, OverflowIsInvalidArgumentNamingTheShape) {
  const absl::StatusOr<int64_t> n =
      CheckedShapeElements({int64_t{1} << 32, int64_t{1} << 32}, "the feature shape");
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(n.status().message(),
            "the feature shape 4294967296x4294967296 has too many values (the product overflows)");
}

// A product that wraps around to a small positive number is the attack: 2^33 * 2^31 * 2 wraps
// to 0 in 64 bits, and a multiplication that only checked the final sign would accept it.
TEST(CheckedShapeElementsTest, AProductThatWrapsToZeroIsStillRefused) {
  EXPECT_FALSE(CheckedShapeElements({int64_t{1} << 33, int64_t{1} << 31, 2}, "x").ok());
}

TEST(CheckedShapeElementsTest, NegativeDimensionIsRefused) {
  EXPECT_EQ(CheckedShapeElements({3, -1}, "the target shape").status().message(),
            "the target shape 3x-1 has a negative dimension");
}

TEST(CheckedByteSizeTest, MultipliesRowsValuesAndItemSize) {
  EXPECT_EQ(*CheckedByteSize(10, {3}, 4, "x"), 120);
  EXPECT_EQ(*CheckedByteSize(7, {}, 8, "x"), 56);
  EXPECT_EQ(*CheckedByteSize(0, {3}, 4, "x"), 0);
}

TEST(CheckedByteSizeTest, OverflowInTheByteSizeIsRefused) {
  const absl::StatusOr<int64_t> bytes = CheckedByteSize(kMax / 8, {3}, 4, "dataset 'd'");
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(), HasSubstr("dataset 'd' 3 x 1152921504606846975 rows"));
  EXPECT_THAT(bytes.status().message(), HasSubstr("overflows"));
  EXPECT_FALSE(CheckedByteSize(-1, {3}, 4, "x").ok());
  EXPECT_FALSE(CheckedByteSize(1, {3}, -4, "x").ok());
}

TEST(CheckedMulAddTest, RefuseOverflowAndNegatives) {
  EXPECT_EQ(*CheckedMul(1 << 20, 1 << 20, "x"), int64_t{1} << 40);
  EXPECT_EQ(*CheckedAdd(kMax - 1, 1, "x"), kMax);
  EXPECT_EQ(CheckedMul(kMax, 2, "the count").status().message(),
            "the count is too large (9223372036854775807 x 2 overflows a 64-bit count)");
  EXPECT_EQ(CheckedAdd(kMax, 1, "the sum").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedMul(-1, 2, "the count").status().message(), "the count is negative");
  EXPECT_EQ(CheckedAdd(1, -2, "the sum").status().message(), "the sum is negative");
}

}  // namespace
}  // namespace trainerd
