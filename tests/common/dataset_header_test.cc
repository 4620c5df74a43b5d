// Tests for common/dataset_header.h: an upload's declaration is checked, with checked sizes,
// before anything is allocated for it.
#include "common/dataset_header.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

DatasetHeader Header() {
  DatasetHeader header;
  header.name = "iris";
  header.feature_shape = {4};
  header.target_shape = {};
  header.target_dtype = TargetDType::kInt64;
  header.rows = 150;
  return header;
}

TEST(CheckDatasetHeaderTest, ComputesTheLayout) {
  const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(Header(), 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->feature_values_per_row, 4);
  EXPECT_EQ(layout->target_values_per_row, 1);
  EXPECT_EQ(layout->feature_bytes, 150 * 4 * 4);
  EXPECT_EQ(layout->target_bytes, 150 * 8);
  EXPECT_EQ(layout->total_bytes, 150 * 4 * 4 + 150 * 8);
}

TEST(CheckDatasetHeaderTest, NamesThatCouldEscapeTheDataFolderAreRefused) {
  for (const std::string& name : std::vector<std::string>{"../etc", "a/b", "..", ".", "", "x\ny",
                                                          std::string(129, 'a')}) {
    DatasetHeader header = Header();
    header.name = name;
    EXPECT_EQ(CheckDatasetHeader(header, 0).status().code(), absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(CheckDatasetHeaderTest, ShapesAndRowsAreChecked) {
  DatasetHeader no_features = Header();
  no_features.feature_shape = {};
  EXPECT_THAT(CheckDatasetHeader(no_features, 0).status().message(),
              HasSubstr("needs at least one dimension"));
  DatasetHeader zero_dim = Header();
  zero_dim.feature_shape = {4, 0};
  EXPECT_THAT(CheckDatasetHeader(zero_dim, 0).status().message(),
              HasSubstr("every dimension must be between 1 and 2147483648"));
  DatasetHeader rank9 = Header();
  rank9.feature_shape = std::vector<int64_t>(9, 1);
  EXPECT_THAT(CheckDatasetHeader(rank9, 0).status().message(), HasSubstr("at most 8"));
  DatasetHeader zero_rows = Header();
  zero_rows.rows = 0;
  EXPECT_THAT(CheckDatasetHeader(zero_rows, 0).status().message(),
              HasSubstr("must have at least one row"));
  DatasetHeader bad_sha = Header();
  bad_sha.sha256 = "ABC";
  EXPECT_EQ(CheckDatasetHeader(bad_sha, 0).status().message(),
            "sha256 must be 64 lower-case hex digits");
}

// Each dimension is legal, yet together they overflow 64 bits: INVALID_ARGUMENT, never a wrapped
// size that would allocate a small buffer.
TEST(CheckDatasetHeaderTest, SizesThatOverflowAreInvalidArgument) {
  DatasetHeader header = Header();
  header.feature_shape = {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31};
  const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(header, 0);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("overflows"));
  DatasetHeader rows = Header();
  rows.rows = int64_t{1} << 60;
  EXPECT_EQ(CheckDatasetHeader(rows, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckDatasetHeaderTest, APayloadOverTheLimitIsResourceExhausted) {
  const absl::StatusOr<DatasetLayout> layout = CheckDatasetHeader(Header(), 1000);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(layout.status().message(),
            "dataset 'iris' would take 3600 bytes (150 rows of 24 bytes); this daemon accepts at "
            "most 1000 bytes per dataset");
}

}  // namespace
}  // namespace trainerd
