// Tests for common/csv_reader.h: good files, header handling, line endings and every error path.
#include "common/csv_reader.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

CsvOptions Int64Targets() {
  CsvOptions options;
  options.target_dtype = TargetDType::kInt64;
  return options;
}

// The message of a parse that must fail with INVALID_ARGUMENT.
std::string ParseError(const std::string& text, const CsvOptions& options = CsvOptions()) {
  const absl::StatusOr<Table> table = ParseCsv(text, options);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(table.status().message());
}

TEST(ParseCsvTest, ParsesRowsWithoutHeader) {
  const absl::StatusOr<Table> table = ParseCsv("1,2,3\n4,5.5,-6\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->target_shape, ElementsAre(1));
  EXPECT_EQ(table->target_dtype, TargetDType::kFloat32);
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 4.0f, 5.5f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, -6.0f));
  EXPECT_THAT(table->targets_i64, IsEmpty());
  EXPECT_TRUE(ValidateTable(*table).ok());
}

TEST(ParseCsvTest, LastLineWithoutNewlineIsARow) {
  const absl::StatusOr<Table> table = ParseCsv("1,2\n3,4", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->targets_f32, ElementsAre(2.0f, 4.0f));
}

TEST(ParseCsvTest, SkipsHeaderLine) {
  const absl::StatusOr<Table> table = ParseCsv("sepal,petal,label\n1,2,0\n3,4,1\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 3.0f, 4.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(0.0f, 1.0f));
}

TEST(ParseCsvTest, HeaderWithOneNameAmongNumbersIsAHeader) {
  const absl::StatusOr<Table> table = ParseCsv("1,2,y\n5,6,7\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 1);
  EXPECT_THAT(table->features, ElementsAre(5.0f, 6.0f));
}

TEST(ParseCsvTest, PandasIndexHeaderWithEmptyFirstFieldIsAHeader) {
  const absl::StatusOr<Table> table = ParseCsv(",x,y\n0,1.5,2\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 1);
  EXPECT_THAT(table->features, ElementsAre(0.0f, 1.5f));
}

TEST(ParseCsvTest, HeaderAfterLeadingBlankLinesIsAHeader) {
  const absl::StatusOr<Table> table = ParseCsv("\n\na,b\n1,2\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 1);
}

TEST(ParseCsvTest, AcceptsCrLfAndBlankLines) {
  const absl::StatusOr<Table> table = ParseCsv("x,y\r\n1,2\r\n\r\n   \r\n3,4\r\n\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->features, ElementsAre(1.0f, 3.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(2.0f, 4.0f));
}

TEST(ParseCsvTest, TrimsSpacesAroundFields) {
  const absl::StatusOr<Table> table = ParseCsv("  1 ,\t2.5 , 3\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.5f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f));
}

TEST(ParseCsvTest, AcceptsSignsExponentsAndBareDecimals) {
  const absl::StatusOr<Table> table = ParseCsv("+1,-2,1e3,.5,5.,-1.5E-1\n", CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->features, ElementsAre(1.0f, -2.0f, 1000.0f, 0.5f, 5.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(-0.15f));
}

TEST(ParseCsvTest, SeveralTargetColumnsGiveVectorTargets) {
  CsvOptions options;
  options.target_columns = 2;
  const absl::StatusOr<Table> table = ParseCsv("1,2,3,4\n5,6,7,8\n", options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->target_shape, ElementsAre(2));
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 5.0f, 6.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, 4.0f, 7.0f, 8.0f));
}

TEST(ParseCsvTest, Int64TargetsAreScalarClassIndices) {
  const absl::StatusOr<Table> table = ParseCsv("0.5,1.5,2\n1,2,3.0\n-1,0,+4\n", Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->target_dtype, TargetDType::kInt64);
  EXPECT_THAT(table->target_shape, IsEmpty());
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->targets_i64, ElementsAre(2, 3, 4));
  EXPECT_THAT(table->targets_f32, IsEmpty());
  EXPECT_TRUE(ValidateTable(*table).ok());
}

TEST(ParseCsvTest, Int64TargetsKeepLargeIntegersExact) {
  const absl::StatusOr<Table> table = ParseCsv("1,9007199254740993\n", Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->targets_i64, ElementsAre(int64_t{9007199254740993}));
}

TEST(ParseCsvTest, RejectsFractionalInt64Target) {
  EXPECT_EQ(ParseError("1,2\n1,2.5\n", Int64Targets()),
            "line 2, column 2: 2.5 is not an integer (int64 targets are class indices)");
}

TEST(ParseCsvTest, RejectsInt64TargetOutOfRange) {
  EXPECT_EQ(ParseError("1,99999999999999999999\n", Int64Targets()),
            "line 1, column 2: 99999999999999999999 is out of range for int64");
  EXPECT_EQ(ParseError("1,1e19\n", Int64Targets()),
            "line 1, column 2: 1e19 is out of range for int64");
}

TEST(ParseCsvTest, RejectsInt64WithSeveralTargetColumns) {
  CsvOptions options = Int64Targets();
  options.target_columns = 2;
  EXPECT_EQ(ParseError("1,2,3\n", options), "int64 targets need exactly one target column; got 2");
}

TEST(ParseCsvTest, RejectsZeroTargetColumns) {
  CsvOptions options;
  options.target_columns = 0;
  EXPECT_EQ(ParseError("1,2\n", options), "target_columns must be at least 1; got 0");
}

TEST(ParseCsvTest, RejectsBadNumberNamingLineAndColumn) {
  EXPECT_EQ(ParseError("a,b\n1,2\n3,abc\n"), "line 3, column 2: 'abc' is not a number");
}

TEST(ParseCsvTest, RejectsNonNumericFieldAfterTheFirstLine) {
  EXPECT_EQ(ParseError("1,2\nx,y\n"), "line 2, column 1: 'x' is not a number");
}

TEST(ParseCsvTest, RejectsSecondHeaderLine) {
  EXPECT_EQ(ParseError("a,b\nc,d\n1,2\n"), "line 2, column 1: 'c' is not a number");
}

TEST(ParseCsvTest, RejectsTrailingGarbageAndHex) {
  EXPECT_EQ(ParseError("1,2\n1.5abc,2\n"), "line 2, column 1: '1.5abc' is not a number");
  EXPECT_EQ(ParseError("1,2\n0x10,2\n"), "line 2, column 1: '0x10' is not a number");
  EXPECT_EQ(ParseError("1,2\n1 2,3\n"), "line 2, column 1: '1 2' is not a number");
}

TEST(ParseCsvTest, LineNumbersCountBlankLines) {
  EXPECT_EQ(ParseError("\n\n1,2\n\n1,x\n"), "line 5, column 2: 'x' is not a number");
}

TEST(ParseCsvTest, LineNumbersCountCrLfLines) {
  EXPECT_EQ(ParseError("1,2\r\n3,4\r\n5,?\r\n"), "line 3, column 2: '?' is not a number");
}

TEST(ParseCsvTest, RejectsEmptyField) {
  EXPECT_EQ(ParseError("1,2,3\n4,,6\n"), "line 2, column 2: the field is empty");
  EXPECT_EQ(ParseError("1,,3\n"), "line 1, column 2: the field is empty");
}

TEST(ParseCsvTest, RejectsRaggedRow) {
  EXPECT_EQ(ParseError("1,2\n3,4\n5,6,7\n"), "line 3 has 3 columns; line 1 has 2");
  EXPECT_EQ(ParseError("1,2,3\n4,5\n"), "line 2 has 2 columns; line 1 has 3");
}

TEST(ParseCsvTest, RejectsRowNarrowerThanHeader) {
  EXPECT_EQ(ParseError("\na,b,c\n1,2\n"), "line 3 has 2 columns; line 2 has 3");
}

TEST(ParseCsvTest, RejectsTrailingComma) {
  EXPECT_EQ(ParseError("1,2\n3,4,\n"), "line 2 has 3 columns; line 1 has 2");
}

TEST(ParseCsvTest, RejectsNaN) {
  EXPECT_EQ(ParseError("1,2\n3,4\n5,6\nnan,1\n"), "line 4, column 1: nan is not a finite number");
  EXPECT_EQ(ParseError("NaN,1\n"), "line 1, column 1: NaN is not a finite number");
}

TEST(ParseCsvTest, RejectsInfinityInFeaturesAndTargets) {
  EXPECT_EQ(ParseError("inf,1\n"), "line 1, column 1: inf is not a finite number");
  EXPECT_EQ(ParseError("1,-Infinity\n"), "line 1, column 2: -Infinity is not a finite number");
  EXPECT_EQ(ParseError("1,inf\n", Int64Targets()), "line 1, column 2: inf is not a finite number");
}

TEST(ParseCsvTest, RejectsValuesOutOfFloat32Range) {
  EXPECT_EQ(ParseError("1e39,1\n"), "line 1, column 1: 1e39 is out of range for float32");
  EXPECT_EQ(ParseError("1e999,1\n"), "line 1, column 1: '1e999' is out of range");
}

TEST(ParseCsvTest, RejectsRowsWithoutAFeatureColumn) {
  EXPECT_EQ(ParseError("1\n2\n"),
            "line 1 has 1 column; with 1 column of targets a row needs at least 2");
  CsvOptions options;
  options.target_columns = 2;
  EXPECT_EQ(ParseError("x,y\n1,2\n", options),
            "line 1 has 2 columns; with 2 columns of targets a row needs at least 3");
}

TEST(ParseCsvTest, RejectsTextWithoutDataRows) {
  EXPECT_EQ(ParseError(""), "no data rows");
  EXPECT_EQ(ParseError("\n \r\n\n"), "no data rows");
  EXPECT_EQ(ParseError("x,y\n"), "no data rows");
}

// A file under the test's temporary directory, removed at the end of the test.
class CsvFileTest : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }

  const std::string& Write(const std::string& contents) {
    std::ofstream(path_, std::ios::binary) << contents;
    return path_;
  }

  // One file per test and process: ctest runs the tests of this fixture in parallel processes.
  std::string path_ = ::testing::TempDir() + "/csv_reader_test-" + std::to_string(::getpid()) +
                      "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                      ".csv";
};

TEST_F(CsvFileTest, ReadsFile) {
  const absl::StatusOr<Table> table = ReadCsvFile(Write("a,b,c\n1,2,3\n4,5,6\n"), CsvOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 4.0f, 5.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, 6.0f));
}

TEST_F(CsvFileTest, ParseErrorsStartWithThePath) {
  const std::string& path = Write("1,2\n3,x\n");
  const absl::StatusOr<Table> table = ReadCsvFile(path, CsvOptions());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.status().message(), path + ": line 2, column 2: 'x' is not a number");
}

TEST_F(CsvFileTest, EmptyFileHasNoDataRows) {
  const std::string& path = Write("");
  EXPECT_EQ(ReadCsvFile(path, CsvOptions()).status().message(), path + ": no data rows");
}

TEST(ReadCsvFileTest, MissingFileIsNotFound) {
  const std::string path = ::testing::TempDir() + "/no_such_dir/missing.csv";
  const absl::StatusOr<Table> table = ReadCsvFile(path, CsvOptions());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.status().message(), "cannot open '" + path + "': No such file or directory");
}

TEST(ReadCsvFileTest, DirectoryIsNotFound) {
  const std::string path = ::testing::TempDir();
  const absl::StatusOr<Table> table = ReadCsvFile(path, CsvOptions());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.status().message(), "cannot open '" + path + "': Is a directory");
}

TEST(InspectCsvTest, FindsPandasIndexAndClassColumn) {
  const CsvLayout layout = InspectCsv(",a,b,label\n0,1.5,2,3\n2,1,2,0\n1,0.5,1,3\n");
  EXPECT_TRUE(layout.index_column);
  EXPECT_EQ(layout.index_max, 2);
  EXPECT_EQ(layout.rows, 3);
  EXPECT_TRUE(layout.class_targets);
  EXPECT_EQ(layout.target_name, "label");
  EXPECT_THAT(layout.labels, ElementsAre(0, 3));
  // "Unnamed: 0" (pandas' name for it read back and written again) is an index too.
  EXPECT_TRUE(InspectCsv("Unnamed: 0,a,y\n5,1,2.5\n7,2,3.5\n").index_column);
}

TEST(InspectCsvTest, NamedRepeatedOrFractionalFirstColumnsAreFeatures) {
  EXPECT_FALSE(InspectCsv("id,a,y\n0,1,2\n1,2,3\n").index_column);        // named
  EXPECT_FALSE(InspectCsv(",a,y\n0,1,2\n0,2,3\n").index_column);          // repeated
  EXPECT_FALSE(InspectCsv(",a,y\n0.5,1,2\n1,2,3\n").index_column);        // not whole
  EXPECT_FALSE(InspectCsv("0,1,2\n1,2,3\n").index_column);               // no header
  EXPECT_FALSE(InspectCsv(",y\n0,1\n1,2\n").index_column);               // 2 columns
}

TEST(InspectCsvTest, ClassTargetsAreWholeNumbersWrittenAsSuch) {
  EXPECT_TRUE(InspectCsv("1.5,0\n2.5,1\n").class_targets);
  EXPECT_FALSE(InspectCsv("1.5,0.0\n2.5,1.0\n").class_targets);  // written as floats
  EXPECT_FALSE(InspectCsv("1.5,0\n2.5,-1\n").class_targets);     // negative
  EXPECT_FALSE(InspectCsv("1.5,0\n2.5,1e0\n").class_targets);
  EXPECT_FALSE(InspectCsv("1,2\n3\n").class_targets);            // ragged: ParseCsv says why
}

TEST(ParseCsvTest, SkipFirstColumnLeavesItOut) {
  CsvOptions options;
  options.skip_first_column = true;
  options.target_dtype = TargetDType::kInt64;
  const absl::StatusOr<Table> table = ParseCsv(",a,b,y\n0,1,2,3\n1,4,5,6\n", options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->features, ElementsAre(1, 2, 4, 5));
  EXPECT_THAT(table->targets_i64, ElementsAre(3, 6));
  options.target_dtype = TargetDType::kFloat32;
  EXPECT_THAT(ParseCsv(",y\n0,1\n", options).status().message(),
              HasSubstr("without its first column a row has no feature columns"));
}

}  // namespace
}  // namespace trainerd
