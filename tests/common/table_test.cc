// Tests for common/table.h: shapes, ValidateTable, the payload layout, dataset names.
#include "common/table.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::HasSubstr;

// A consistent table: 2 rows of 2 features, float32 targets of shape {1}.
Table FloatTable() {
  Table table;
  table.feature_shape = {2};
  table.target_shape = {1};
  table.target_dtype = TargetDType::kFloat32;
  table.rows = 2;
  table.features = {1.0f, 2.0f, 3.0f, 4.0f};
  table.targets_f32 = {0.5f, 1.5f};
  return table;
}

TEST(TargetDTypeNameTest, NamesBothDTypes) {
  EXPECT_STREQ(TargetDTypeName(TargetDType::kFloat32), "float32");
  EXPECT_STREQ(TargetDTypeName(TargetDType::kInt64), "int64");
}

TEST(ShapeToStringTest, JoinsDimensionsWithX) {
  EXPECT_EQ(ShapeToString({1, 28, 28}), "1x28x28");
  EXPECT_EQ(ShapeToString({4}), "4");
}

TEST(ShapeToStringTest, EmptyShapeIsScalar) { EXPECT_EQ(ShapeToString({}), "scalar"); }

TEST(ValidateTableTest, AcceptsConsistentFloatTable) {
  EXPECT_TRUE(ValidateTable(FloatTable()).ok());
}

TEST(ValidateTableTest, AcceptsConsistentInt64TableWithScalarTargets) {
  Table table;
  table.feature_shape = {3};
  table.target_dtype = TargetDType::kInt64;
  table.rows = 2;
  table.features = {1, 2, 3, 4, 5, 6};
  table.targets_i64 = {0, 7};
  EXPECT_TRUE(ValidateTable(table).ok());
}

TEST(ValidateTableTest, AcceptsEmptyTable) {
  Table table;
  table.feature_shape = {3};
  table.target_shape = {1};
  EXPECT_TRUE(ValidateTable(table).ok());
}

TEST(ValidateTableTest, RejectsFeatureCountMismatch) {
  Table table = FloatTable();
  table.features.pop_back();
  const absl::Status status = ValidateTable(table);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "the table has 2 rows of 2 features (4 values) but holds 3 feature values");
}

TEST(ValidateTableTest, RejectsTargetCountMismatch) {
  Table table = FloatTable();
  table.targets_f32.push_back(2.5f);
  const absl::Status status = ValidateTable(table);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "the table has 2 rows of 1 float32 targets (2 values) but holds 3 float32 target "
            "values");
}

TEST(ValidateTableTest, RejectsTargetsOfTheOtherDType) {
  Table table = FloatTable();
  table.targets_i64 = {1};
  const absl::Status status = ValidateTable(table);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "the table has float32 targets but also holds 1 int64 target values");
}

TEST(ValidateTableTest, RejectsInt64TableWithFloatTargetsOnly) {
  Table table = FloatTable();
  table.target_dtype = TargetDType::kInt64;
  const absl::Status status = ValidateTable(table);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("but holds 0 int64 target values"));
}

TEST(ValidateTableTest, RejectsNegativeRows) {
  Table table = FloatTable();
  table.rows = -1;
  EXPECT_EQ(ValidateTable(table).message(), "the table has a negative row count (-1)");
}

TEST(ValidateTableTest, RejectsNegativeDimension) {
  Table table = FloatTable();
  table.feature_shape = {-2};
  EXPECT_EQ(ValidateTable(table).message(), "the feature shape -2 has a negative dimension");
}

TEST(ValidateTableTest, RejectsShapeWhoseSizeOverflows) {
  Table table = FloatTable();
  table.feature_shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THAT(ValidateTable(table).message(), HasSubstr("has too many values"));
}

TEST(EncodePayloadTest, WritesFeaturesThenFloatTargetsLittleEndian) {
  Table table;
  table.feature_shape = {2};
  table.target_shape = {1};
  table.rows = 1;
  table.features = {1.0f, -2.5f};  // 0x3f800000, 0xc0200000
  table.targets_f32 = {3.0f};      // 0x40400000
  ASSERT_TRUE(ValidateTable(table).ok());
  const std::string expected(
      "\x00\x00\x80\x3f"
      "\x00\x00\x20\xc0"
      "\x00\x00\x40\x40",
      12);
  EXPECT_EQ(EncodePayload(table), expected);
}

TEST(EncodePayloadTest, WritesInt64TargetsLittleEndian) {
  Table table;
  table.feature_shape = {1};
  table.target_dtype = TargetDType::kInt64;
  table.rows = 2;
  table.features = {0.0f, 1.0f};  // 0x00000000, 0x3f800000
  table.targets_i64 = {258, -1};
  ASSERT_TRUE(ValidateTable(table).ok());
  const std::string expected(
      "\x00\x00\x00\x00"
      "\x00\x00\x80\x3f"
      "\x02\x01\x00\x00\x00\x00\x00\x00"
      "\xff\xff\xff\xff\xff\xff\xff\xff",
      24);
  EXPECT_EQ(EncodePayload(table), expected);
}

TEST(EncodePayloadTest, SizeIsFeatureBytesPlusTargetBytes) {
  EXPECT_EQ(EncodePayload(FloatTable()).size(), 4 * 4 + 2 * 4);
}

TEST(EncodePayloadTest, EmptyTableGivesEmptyPayload) { EXPECT_EQ(EncodePayload(Table()), ""); }

TEST(ValidateDatasetNameTest, AcceptsNamesOfAllowedCharacters) {
  EXPECT_TRUE(ValidateDatasetName("iris").ok());
  EXPECT_TRUE(ValidateDatasetName("a").ok());
  EXPECT_TRUE(ValidateDatasetName("MNIST_train-v1.2").ok());
  EXPECT_TRUE(ValidateDatasetName("...a").ok());
  EXPECT_TRUE(ValidateDatasetName(std::string(128, 'x')).ok());
}

TEST(ParseDatasetReferenceTest, ABareNameIsTheCallersAndOwnerSlashNameAnothers) {
  absl::StatusOr<DatasetReference> own = ParseDatasetReference("digits");
  ASSERT_TRUE(own.ok());
  EXPECT_FALSE(own->qualified);
  EXPECT_EQ(own->name, "digits");
  absl::StatusOr<DatasetReference> other = ParseDatasetReference("alice/digits");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->qualified);
  EXPECT_EQ(other->owner, "alice");
  EXPECT_EQ(other->name, "digits");
  // A certificate's subject may hold '/': a name cannot, so the last one splits.
  absl::StatusOr<DatasetReference> subject = ParseDatasetReference("/O=Acme/CN=alice/digits");
  ASSERT_TRUE(subject.ok());
  EXPECT_EQ(subject->owner, "/O=Acme/CN=alice");
  EXPECT_EQ(subject->name, "digits");
  // "/NAME": the dataset of that name that has no owner.
  absl::StatusOr<DatasetReference> unowned = ParseDatasetReference("/digits");
  ASSERT_TRUE(unowned.ok());
  EXPECT_TRUE(unowned->qualified);
  EXPECT_EQ(unowned->owner, "");
}

TEST(ParseDatasetReferenceTest, RefusesBadNamesAndOwnersWithoutEchoingThem) {
  for (const std::string& bad :
       {std::string(""), std::string("alice/"), std::string("alice/.."), std::string("alice/a b"),
        std::string("al\nice/digits"), std::string(2000, 'o') + "/digits"}) {
    const absl::Status status = ParseDatasetReference(bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_LT(status.message().size(), 300u) << bad;
  }
  EXPECT_THAT(ParseDatasetReference(std::string(2000, 'o') + "/digits").status().message(),
              HasSubstr("(2007 characters)"));
  EXPECT_TRUE(ParseDatasetReference(std::string(kMaxDatasetOwnerLength, 'o') + "/d").ok());
}

TEST(ValidateDatasetNameTest, RejectsSpaceAndNamesTheValue) {
  const absl::Status status = ValidateDatasetName("a b");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "dataset name 'a b' is invalid: use 1 to 128 of A-Z a-z 0-9 . _ -");
}

TEST(ValidateDatasetNameTest, RejectsEmptyAndTooLongNames) {
  EXPECT_EQ(ValidateDatasetName("").message(),
            "dataset name '' is invalid: use 1 to 128 of A-Z a-z 0-9 . _ -");
  EXPECT_EQ(ValidateDatasetName(std::string(129, 'x')).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateDatasetNameTest, RejectsPathAndNonAsciiCharacters) {
  EXPECT_FALSE(ValidateDatasetName("a/b").ok());
  EXPECT_FALSE(ValidateDatasetName("caf\xc3\xa9").ok());
  EXPECT_FALSE(ValidateDatasetName("tab\there").ok());
  EXPECT_EQ(ValidateDatasetName("new\nline").message(),
            "dataset name 'new\\nline' is invalid: use 1 to 128 of A-Z a-z 0-9 . _ -");
}

TEST(ValidateDatasetNameTest, RejectsDotAndDotDot) {
  EXPECT_EQ(ValidateDatasetName(".").message(),
            "dataset name '.' is invalid: '.' and '..' are reserved");
  EXPECT_EQ(ValidateDatasetName("..").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainerd
