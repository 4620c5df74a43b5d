// Tests for common/npy_reader.h. The .npy bytes are built here, the way numpy/lib/format.py
// writes them, so that no NumPy is needed.
#include "common/npy_reader.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
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
using ::testing::StartsWith;

// The raw little-endian bytes of `values`.
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A .npy file: magic, version, header length (2 bytes for 1.0, 4 for 2.0 and 3.0), the header
// dict padded with spaces and a newline to a multiple of 64 bytes, then `data`.
std::string MakeNpyWithHeader(int major, const std::string& dict, const std::string& data) {
  const size_t length_size = major == 1 ? 2 : 4;
  const size_t preamble = 6 + 2 + length_size;
  std::string header = dict;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file("\x93NUMPY", 6);
  file += static_cast<char>(major);
  file += '\0';
  for (size_t i = 0; i < length_size; ++i) {
    file += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  return file + header + data;
}

std::string MakeNpy(int major, const std::string& descr, const std::string& shape,
                    const std::string& data, bool fortran_order = false) {
  return MakeNpyWithHeader(major,
                           "{'descr': '" + descr + "', 'fortran_order': " +
                               (fortran_order ? "True" : "False") + ", 'shape': " + shape + ", }",
                           data);
}

std::string ParseError(const std::string& bytes) {
  const absl::StatusOr<NpyArray> array = ParseNpy(bytes);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(array.status().message());
}

template <typename T>
std::vector<T> Values(const NpyArray& array) {
  std::vector<T> values(array.data.size() / sizeof(T));
  std::memcpy(values.data(), array.data.data(), values.size() * sizeof(T));
  return values;
}

template <typename T>
NpyArray Array(NpyDType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = std::move(shape);
  const std::string bytes = Bytes(values);
  array.data.assign(bytes.begin(), bytes.end());
  return array;
}

TEST(ParseNpyTest, ParsesFloat32Version1) {
  const std::string file =
      MakeNpy(1, "<f4", "(2, 3)", Bytes<float>({0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.5f}));
  ASSERT_EQ(file.size() % 64, 24u);  // header padded to 64 bytes, then 24 bytes of data
  const absl::StatusOr<NpyArray> array = ParseNpy(file);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDType::kFloat32);
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(*array), ElementsAre(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.5f));
}

TEST(ParseNpyTest, ParsesFloat64Version2) {
  const absl::StatusOr<NpyArray> array =
      ParseNpy(MakeNpy(2, "<f8", "(3,)", Bytes<double>({1.25, -2.0, 1e300})));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDType::kFloat64);
  EXPECT_THAT(array->shape, ElementsAre(3));
  EXPECT_THAT(Values<double>(*array), ElementsAre(1.25, -2.0, 1e300));
}

TEST(ParseNpyTest, ParsesInt64Version1) {
  const absl::StatusOr<NpyArray> array =
      ParseNpy(MakeNpy(1, "<i8", "(2, 1)", Bytes<int64_t>({7, -9000000000})));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDType::kInt64);
  EXPECT_THAT(array->shape, ElementsAre(2, 1));
  EXPECT_THAT(Values<int64_t>(*array), ElementsAre(7, -9000000000));
}

TEST(ParseNpyTest, ParsesInt64Version2AndVersion3) {
  for (int major : {2, 3}) {
    const absl::StatusOr<NpyArray> array =
        ParseNpy(MakeNpy(major, "<i8", "(1, 2)", Bytes<int64_t>({1, 2})));
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_THAT(Values<int64_t>(*array), ElementsAre(1, 2));
  }
}

TEST(ParseNpyTest, AcceptsNativeAndNotApplicableByteOrder) {
  for (const char* descr : {"=f4", "|f4"}) {
    const absl::StatusOr<NpyArray> array = ParseNpy(MakeNpy(1, descr, "(1,)", Bytes<float>({2})));
    ASSERT_TRUE(array.ok()) << descr << ": " << array.status();
    EXPECT_EQ(array->dtype, NpyDType::kFloat32);
  }
}

TEST(ParseNpyTest, AcceptsKeysInAnyOrderAndDoubleQuotes) {
  const absl::StatusOr<NpyArray> array = ParseNpy(MakeNpyWithHeader(
      1, R"({"shape": (2,), "fortran_order": False, "descr": "<f8"})", Bytes<double>({1, 2})));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDType::kFloat64);
  EXPECT_THAT(array->shape, ElementsAre(2));
}

TEST(ParseNpyTest, AcceptsPython2LongDimensions) {
  const absl::StatusOr<NpyArray> array =
      ParseNpy(MakeNpy(1, "<f4", "(1L, 2L)", Bytes<float>({1, 2})));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(1, 2));
}

TEST(ParseNpyTest, ParsesZeroDimensionalArray) {
  const absl::StatusOr<NpyArray> array = ParseNpy(MakeNpy(1, "<f8", "()", Bytes<double>({4.5})));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, IsEmpty());
  EXPECT_EQ(array->data.size(), 8u);
}

TEST(ParseNpyTest, ParsesEmptyArray) {
  const absl::StatusOr<NpyArray> array = ParseNpy(MakeNpy(1, "<f4", "(0, 3)", ""));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(0, 3));
  EXPECT_THAT(array->data, IsEmpty());
}

TEST(ParseNpyTest, RejectsBadMagic) {
  std::string file = MakeNpy(1, "<f4", "(1,)", Bytes<float>({1}));
  file[1] = 'X';
  EXPECT_EQ(ParseError(file), "not an npy file: it does not start with \\x93NUMPY");
  EXPECT_EQ(ParseError("a,b\n1,2\n"), "not an npy file: it does not start with \\x93NUMPY");
  EXPECT_EQ(ParseError(""), "not an npy file: it does not start with \\x93NUMPY");
}

TEST(ParseNpyTest, RejectsUnsupportedVersion) {
  EXPECT_EQ(ParseError(MakeNpy(4, "<f4", "(1,)", Bytes<float>({1}))),
            "unsupported npy format version 4.0 (supported: 1.0, 2.0, 3.0)");
  std::string file = MakeNpy(1, "<f4", "(1,)", Bytes<float>({1}));
  file[7] = 1;
  EXPECT_EQ(ParseError(file), "unsupported npy format version 1.1 (supported: 1.0, 2.0, 3.0)");
}

TEST(ParseNpyTest, RejectsBigEndian) {
  EXPECT_EQ(ParseError(MakeNpy(1, ">f8", "(1,)", Bytes<double>({1}))),
            "big-endian npy dtype '>f8' is not supported; save with arr.astype('<f8')");
}

TEST(ParseNpyTest, RejectsUnsupportedDType) {
  EXPECT_EQ(ParseError(MakeNpy(1, "<f2", "(1,)", Bytes<uint16_t>({1}))),
            "unsupported npy dtype '<f2' (supported: float32, float64, int8-int64, uint8-uint64 "
            "and bool; convert others with arr.astype('<f4'))");
  EXPECT_THAT(ParseError(MakeNpy(1, "<c8", "(1,)", Bytes<float>({1, 2}))),
              HasSubstr("unsupported npy dtype '<c8'"));
  EXPECT_THAT(ParseError(MakeNpy(1, "|O", "(1,)", "12345678")),
              HasSubstr("unsupported npy dtype '|O'"));
  EXPECT_EQ(ParseError(MakeNpy(1, ">i4", "(1,)", Bytes<int32_t>({1}))),
            "big-endian npy dtype '>i4' is not supported; save with arr.astype('<i4')");
}

// What scikit-learn and NumPy users have: int32 labels (np.int32, the default int on Windows),
// uint8 images, bool masks.
TEST(ParseNpyTest, ParsesIntegersOfEveryWidthAndBool) {
  const struct {
    const char* descr;
    NpyDType dtype;
    std::string data;
  } cases[] = {
      {"<i4", NpyDType::kInt32, Bytes<int32_t>({-3, 7})},
      {"<i2", NpyDType::kInt16, Bytes<int16_t>({-3, 7})},
      {"|i1", NpyDType::kInt8, Bytes<int8_t>({-3, 7})},
      {"<u8", NpyDType::kUInt64, Bytes<uint64_t>({3, 7})},
      {"<u4", NpyDType::kUInt32, Bytes<uint32_t>({3, 7})},
      {"<u2", NpyDType::kUInt16, Bytes<uint16_t>({3, 7})},
      {"|u1", NpyDType::kUInt8, Bytes<uint8_t>({3, 7})},
      {"|b1", NpyDType::kBool, Bytes<uint8_t>({0, 1})},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<NpyArray> array = ParseNpy(MakeNpy(1, c.descr, "(2,)", c.data));
    ASSERT_TRUE(array.ok()) << c.descr << ": " << array.status();
    EXPECT_EQ(array->dtype, c.dtype) << c.descr;
    EXPECT_EQ(array->data.size(), c.data.size()) << c.descr;
    EXPECT_TRUE(NpyIsInteger(c.dtype)) << c.descr;
  }
  EXPECT_EQ(NpyItemSize(NpyDType::kInt32), 4u);
  EXPECT_EQ(NpyItemSize(NpyDType::kUInt8), 1u);
  EXPECT_EQ(std::string(NpyDTypeName(NpyDType::kUInt16)), "uint16");
  EXPECT_FALSE(NpyIsInteger(NpyDType::kFloat64));
}

TEST(ParseNpyTest, RejectsStructuredDType) {
  EXPECT_EQ(ParseError(MakeNpyWithHeader(
                1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                Bytes<float>({1}))),
            "unsupported npy dtype: structured arrays are not supported");
}

TEST(ParseNpyTest, RejectsFortranOrder) {
  EXPECT_EQ(ParseError(MakeNpy(1, "<f4", "(2, 2)", Bytes<float>({1, 2, 3, 4}),
                               /*fortran_order=*/true)),
            "npy arrays in Fortran order are not supported; save np.ascontiguousarray(arr) "
            "instead");
}

TEST(ParseNpyTest, RejectsTruncatedData) {
  std::string file = MakeNpy(1, "<f4", "(2, 3)", Bytes<float>({0, 1, 2, 3, 4, 5}));
  file.pop_back();
  EXPECT_EQ(ParseError(file), "npy data has 23 bytes; shape (2, 3) of float32 needs 24");
}

TEST(ParseNpyTest, RejectsExtraData) {
  EXPECT_EQ(ParseError(MakeNpy(2, "<i8", "(1,)", Bytes<int64_t>({1, 2}))),
            "npy data has 16 bytes; shape (1,) of int64 needs 8");
}

TEST(ParseNpyTest, RejectsTruncatedHeader) {
  const std::string file = MakeNpy(1, "<f4", "(1,)", "");
  EXPECT_EQ(ParseError(file.substr(0, 40)),
            "truncated npy file: the header length is 118 bytes but only 30 follow");
  EXPECT_EQ(ParseError(file.substr(0, 9)), "truncated npy file: no header length");
  EXPECT_EQ(ParseError(file.substr(0, 7)), "truncated npy file: no format version");
}

TEST(ParseNpyTest, RejectsHeaderWithoutShape) {
  EXPECT_THAT(ParseError(MakeNpyWithHeader(1, "{'descr': '<f4', 'fortran_order': False}", "")),
              StartsWith("malformed npy header (no 'shape' key at character "));
}

TEST(ParseNpyTest, RejectsMalformedHeaders) {
  EXPECT_THAT(ParseError(MakeNpyWithHeader(1, "not a dict", "")),
              StartsWith("malformed npy header (expected '{' at character 1): not a dict"));
  EXPECT_THAT(
      ParseError(MakeNpyWithHeader(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': ()}", "")),
      StartsWith("malformed npy header (expected True or False at character 35)"));
  EXPECT_THAT(ParseError(MakeNpyWithHeader(
                  1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "")),
              StartsWith("malformed npy header (expected a non-negative integer dimension"));
  EXPECT_THAT(ParseError(MakeNpyWithHeader(
                  1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "")),
              StartsWith("malformed npy header (unexpected key 'x'"));
  EXPECT_THAT(ParseError(MakeNpyWithHeader(
                  1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", "")),
              StartsWith("malformed npy header (duplicate key 'descr'"));
}

TEST(ParseNpyTest, RejectsShapeTooLarge) {
  EXPECT_EQ(ParseError(MakeNpy(1, "<f8", "(4294967296, 4294967296)", "")),
            "npy shape 4294967296x4294967296 has too many values (the product overflows)");
  EXPECT_EQ(ParseError(MakeNpy(1, "<f8", "(2305843009213693952,)", "")),
            "npy shape 2305843009213693952 x 1 rows is too large (the byte size overflows a "
            "64-bit count)");
}

class NpyFileTest : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }

  const std::string& Write(const std::string& contents) {
    std::ofstream(path_, std::ios::binary) << contents;
    return path_;
  }

  // One file per test and process: ctest runs the tests of this fixture in parallel processes.
  std::string path_ = ::testing::TempDir() + "/npy_reader_test-" + std::to_string(::getpid()) +
                      "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                      ".npy";
};

TEST_F(NpyFileTest, ReadsFile) {
  const absl::StatusOr<NpyArray> array =
      ReadNpyFile(Write(MakeNpy(1, "<f4", "(2,)", Bytes<float>({1, 2}))));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(Values<float>(*array), ElementsAre(1.0f, 2.0f));
}

TEST_F(NpyFileTest, ParseErrorsStartWithThePath) {
  const std::string& path = Write("garbage");
  EXPECT_EQ(ReadNpyFile(path).status().message(),
            path + ": not an npy file: it does not start with \\x93NUMPY");
}

TEST(ReadNpyFileTest, MissingFileIsNotFound) {
  const std::string path = ::testing::TempDir() + "/missing.npy";
  const absl::StatusOr<NpyArray> array = ReadNpyFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(array.status().message(), "cannot open '" + path + "': No such file or directory");
}

// --- ParseNpyHeader and ReadNpyHeader: the header alone, for a reader that streams the data ---

TEST(ParseNpyHeaderTest, GivesShapeDTypeAndWhereTheDataIs) {
  const std::string file = MakeNpy(1, "<f8", "(3, 2)", Bytes<double>({1, 2, 3, 4, 5, 6}));
  const absl::StatusOr<NpyHeaderInfo> info = ParseNpyHeader(file);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->shape, ElementsAre(3, 2));
  EXPECT_EQ(info->dtype, NpyDType::kFloat64);
  EXPECT_EQ(info->data_offset, 128);  // MakeNpy pads the header to 64-byte multiples
  EXPECT_EQ(info->data_bytes, 48);
  EXPECT_EQ(file.size(), 128u + 48u);
}

TEST(ParseNpyHeaderTest, NeedsOnlyTheHeaderBytes) {
  const std::string file = MakeNpy(2, "<i8", "(5,)", Bytes<int64_t>({1, 2, 3, 4, 5}));
  const absl::StatusOr<NpyHeaderInfo> whole = ParseNpyHeader(file);
  ASSERT_TRUE(whole.ok()) << whole.status();
  // Version 2.0: a 4-byte header length; the header padded to 128 bytes in all.
  EXPECT_EQ(whole->data_offset, 128);
  const absl::StatusOr<NpyHeaderInfo> prefix = ParseNpyHeader(file.substr(0, 128));
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_THAT(prefix->shape, ElementsAre(5));
  EXPECT_EQ(prefix->dtype, NpyDType::kInt64);
  EXPECT_EQ(prefix->data_bytes, 40);
}

TEST(ParseNpyHeaderTest, RefusesWhatParseNpyRefusesWithItsMessages) {
  const std::string good = MakeNpy(1, "<f4", "(1,)", Bytes<float>({1}));
  for (const std::string& bad :
       {std::string("garbage"), good.substr(0, 7), good.substr(0, 9), good.substr(0, 40),
        MakeNpy(4, "<f4", "(1,)", ""), MakeNpy(1, ">f8", "(1,)", ""),
        MakeNpy(1, "<f4", "(2, 2)", "", /*fortran_order=*/true),
        MakeNpyWithHeader(1, "{'descr': '<f4', 'fortran_order': False}", ""),
        MakeNpy(1, "<f8", "(4294967296, 4294967296)", "")}) {
    const absl::StatusOr<NpyHeaderInfo> info = ParseNpyHeader(bad);
    EXPECT_EQ(info.status(), ParseNpy(bad).status());
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(NpyFileTest, ReadNpyHeaderReadsTheHeaderOfAFile) {
  const absl::StatusOr<NpyHeaderInfo> info =
      ReadNpyHeader(Write(MakeNpy(3, "<f4", "(2, 1, 2)", Bytes<float>({1, 2, 3, 4}))));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->shape, ElementsAre(2, 1, 2));
  EXPECT_EQ(info->dtype, NpyDType::kFloat32);
  EXPECT_EQ(info->data_offset, 128);
  EXPECT_EQ(info->data_bytes, 16);
}

TEST_F(NpyFileTest, ReadNpyHeaderRefusesATruncatedFileNamingIt) {
  std::string file = MakeNpy(1, "<f8", "(1000, 3)", std::string(3000 * 8, '\0'));
  file.resize(file.size() - 100);
  const std::string& path = Write(file);
  const absl::StatusOr<NpyHeaderInfo> info = ReadNpyHeader(path);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(info.status().message(),
            path + ": npy data has 23900 bytes; shape (1000, 3) of float64 needs 24000");
  EXPECT_EQ(info.status(), ReadNpyFile(path).status());
}

// Every file ReadNpyFile refuses, ReadNpyHeader refuses with the same status, without reading the
// data (a longer file, a truncated header, one shorter than its preamble...).
TEST_F(NpyFileTest, ReadNpyHeaderRefusesWhatReadNpyFileRefuses) {
  const std::string good = MakeNpy(1, "<f4", "(1,)", Bytes<float>({1}));
  for (const std::string& bad :
       {std::string(), std::string("garbage"), good.substr(0, 7), good.substr(0, 9),
        good.substr(0, 11), good.substr(0, 40), good.substr(0, good.size() - 1), good + "x",
        MakeNpy(2, "<i8", "(1,)", Bytes<int64_t>({1, 2})), MakeNpy(4, "<f4", "(1,)", ""),
        MakeNpy(1, "<f2", "(1,)", Bytes<uint16_t>({1}))}) {
    const std::string& path = Write(bad);
    const absl::StatusOr<NpyHeaderInfo> info = ReadNpyHeader(path);
    EXPECT_FALSE(info.ok());
    EXPECT_EQ(info.status(), ReadNpyFile(path).status());
    EXPECT_THAT(std::string(info.status().message()), StartsWith(path + ": "));
  }
}

TEST(ReadNpyHeaderTest, MissingFileAndFolderAreNotFoundAsForReadNpyFile) {
  const std::string path = ::testing::TempDir() + "/missing.npy";
  EXPECT_EQ(ReadNpyHeader(path).status(), ReadNpyFile(path).status());
  EXPECT_EQ(ReadNpyHeader(path).status().code(), absl::StatusCode::kNotFound);
  const std::string folder = ::testing::TempDir();
  EXPECT_EQ(ReadNpyHeader(folder).status(), ReadNpyFile(folder).status());
}

// --- TableFromNpy ---

NpyTableOptions Int64Targets() {
  NpyTableOptions options;
  options.target_dtype = TargetDType::kInt64;
  return options;
}

std::string TableError(const NpyArray& features, const std::optional<NpyArray>& targets,
                       const NpyTableOptions& options = NpyTableOptions()) {
  const absl::StatusOr<Table> table = TableFromNpy(features, targets, options);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(table.status().message());
}

TEST(TableFromNpyTest, SplitsLastColumnOfFloat64ArrayIntoFloatTargets) {
  const NpyArray features = Array<double>(NpyDType::kFloat64, {2, 3}, {1, 2, 3, 4, 5, 6.5});
  const absl::StatusOr<Table> table = TableFromNpy(features, std::nullopt, NpyTableOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->target_shape, ElementsAre(1));
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 4.0f, 5.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, 6.5f));
  EXPECT_TRUE(ValidateTable(*table).ok());
}

TEST(TableFromNpyTest, SplitsSeveralTargetColumns) {
  NpyTableOptions options;
  options.target_columns = 2;
  const NpyArray features = Array<float>(NpyDType::kFloat32, {1, 4}, {1, 2, 3, 4});
  const absl::StatusOr<Table> table = TableFromNpy(features, std::nullopt, options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->feature_shape, ElementsAre(2));
  EXPECT_THAT(table->target_shape, ElementsAre(2));
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(3.0f, 4.0f));
}

TEST(TableFromNpyTest, SplitsIntegralLastColumnIntoInt64Targets) {
  const NpyArray features = Array<double>(NpyDType::kFloat64, {2, 2}, {0.5, 1, 1.5, 2});
  const absl::StatusOr<Table> table = TableFromNpy(features, std::nullopt, Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->target_shape, IsEmpty());
  EXPECT_THAT(table->features, ElementsAre(0.5f, 1.5f));
  EXPECT_THAT(table->targets_i64, ElementsAre(1, 2));
  EXPECT_TRUE(ValidateTable(*table).ok());
}

TEST(TableFromNpyTest, IntegerArraysConvertToInt64TargetsAndFloat32Features) {
  const NpyArray features = Array<uint8_t>(NpyDType::kUInt8, {2, 2}, {0, 255, 17, 3});
  const NpyArray targets = Array<int32_t>(NpyDType::kInt32, {2}, {9, -1});
  const absl::StatusOr<Table> table = TableFromNpy(features, targets, Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->features, ElementsAre(0.0f, 255.0f, 17.0f, 3.0f));
  EXPECT_THAT(table->targets_i64, ElementsAre(9, -1));

  const NpyArray mask = Array<uint8_t>(NpyDType::kBool, {3}, {1, 0, 1});
  const NpyArray x = Array<int16_t>(NpyDType::kInt16, {3}, {-2, 0, 2});
  const absl::StatusOr<Table> bools = TableFromNpy(x, mask, Int64Targets());
  ASSERT_TRUE(bools.ok()) << bools.status();
  EXPECT_THAT(bools->features, ElementsAre(-2.0f, 0.0f, 2.0f));
  EXPECT_THAT(bools->targets_i64, ElementsAre(1, 0, 1));
}

TEST(TableFromNpyTest, Uint64TargetsBeyondInt64AreRefusedNamingTheElement) {
  const NpyArray features = Array<float>(NpyDType::kFloat32, {2}, {1, 2});
  const NpyArray targets = Array<uint64_t>(NpyDType::kUInt64, {2}, {5, uint64_t{1} << 63});
  EXPECT_EQ(TableError(features, targets, Int64Targets()),
            "targets[1]: 9223372036854775808 is out of range for int64");
  const NpyArray fits = Array<uint64_t>(NpyDType::kUInt64, {2}, {5, (uint64_t{1} << 63) - 1});
  const absl::StatusOr<Table> table = TableFromNpy(features, fits, Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->targets_i64, ElementsAre(5, std::numeric_limits<int64_t>::max()));
}

TEST(TableFromNpyTest, RejectsFractionalInt64TargetNamingTheElement) {
  const NpyArray features = Array<double>(NpyDType::kFloat64, {2, 3}, {1, 2, 3, 4, 5, 2.5});
  EXPECT_EQ(TableError(features, std::nullopt, Int64Targets()),
            "features[1, 2]: 2.5 is not an integer (int64 targets are class indices)");
}

TEST(TableFromNpyTest, SeparateArraysKeepPerRowShapes) {
  const NpyArray features = Array<float>(NpyDType::kFloat32, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const NpyArray targets = Array<int64_t>(NpyDType::kInt64, {2}, {3, 9});
  const absl::StatusOr<Table> table = TableFromNpy(features, targets, Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rows, 2);
  EXPECT_THAT(table->feature_shape, ElementsAre(2, 2));
  EXPECT_THAT(table->target_shape, IsEmpty());
  EXPECT_THAT(table->features, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  EXPECT_THAT(table->targets_i64, ElementsAre(3, 9));
  EXPECT_TRUE(ValidateTable(*table).ok());
}

TEST(TableFromNpyTest, OneDimensionalArraysGiveOneFeatureAndFloatTargetShapeOne) {
  const NpyArray features = Array<double>(NpyDType::kFloat64, {3}, {1, 2, 3});
  const NpyArray targets = Array<float>(NpyDType::kFloat32, {3}, {2, 4, 6});
  const absl::StatusOr<Table> table = TableFromNpy(features, targets, NpyTableOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->feature_shape, ElementsAre(1));
  EXPECT_THAT(table->target_shape, ElementsAre(1));
  EXPECT_THAT(table->features, ElementsAre(1.0f, 2.0f, 3.0f));
  EXPECT_THAT(table->targets_f32, ElementsAre(2.0f, 4.0f, 6.0f));
}

TEST(TableFromNpyTest, MultiDimensionalFloatTargetsKeepTheirShape) {
  const NpyArray features = Array<float>(NpyDType::kFloat32, {1, 1}, {1});
  const NpyArray targets = Array<int64_t>(NpyDType::kInt64, {1, 2, 2}, {1, 2, 3, 4});
  const absl::StatusOr<Table> table = TableFromNpy(features, targets, NpyTableOptions());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->target_shape, ElementsAre(2, 2));
  EXPECT_THAT(table->targets_f32, ElementsAre(1.0f, 2.0f, 3.0f, 4.0f));
}

TEST(TableFromNpyTest, IgnoresTargetColumnsWhenTargetsAreGiven) {
  NpyTableOptions options;
  options.target_columns = 0;
  const NpyArray features = Array<float>(NpyDType::kFloat32, {1, 1}, {1});
  const NpyArray targets = Array<float>(NpyDType::kFloat32, {1}, {2});
  EXPECT_TRUE(TableFromNpy(features, targets, options).ok());
}

TEST(TableFromNpyTest, RejectsRowCountMismatch) {
  const NpyArray features = Array<float>(NpyDType::kFloat32, {3, 1}, {1, 2, 3});
  const NpyArray targets = Array<int64_t>(NpyDType::kInt64, {2}, {0, 1});
  EXPECT_EQ(TableError(features, targets, Int64Targets()),
            "the features array has 3 rows but the targets array has 2");
}

TEST(TableFromNpyTest, RejectsZeroDimensionalArrays) {
  const NpyArray scalar = Array<double>(NpyDType::kFloat64, {}, {1});
  EXPECT_EQ(TableError(scalar, std::nullopt),
            "the features array is 0-d (a single value); it needs a first dimension of rows");
  const NpyArray features = Array<float>(NpyDType::kFloat32, {1}, {1});
  EXPECT_EQ(TableError(features, scalar),
            "the targets array is 0-d (a single value); it needs a first dimension of rows");
}

TEST(TableFromNpyTest, RejectsArraysWithoutRowsOrValues) {
  EXPECT_EQ(TableError(Array<float>(NpyDType::kFloat32, {0, 3}, {}), std::nullopt),
            "the features array has no rows (shape (0, 3))");
  EXPECT_EQ(TableError(Array<float>(NpyDType::kFloat32, {2, 0}, {}), std::nullopt),
            "the features array has no values per row (shape (2, 0))");
}

TEST(TableFromNpyTest, RejectsDataThatDoesNotMatchTheShape) {
  EXPECT_EQ(TableError(Array<float>(NpyDType::kFloat32, {2, 2}, {1, 2, 3}), std::nullopt),
            "the features array has 12 bytes of data; shape (2, 2) of float32 needs 16");
}

TEST(TableFromNpyTest, RejectsNaNAndInfNamingTheElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(TableError(Array<float>(NpyDType::kFloat32, {2, 2}, {1, nan, 3, 4}), std::nullopt),
            "features[0, 1]: nan is not a finite number");
  const double inf = std::numeric_limits<double>::infinity();
  const NpyArray features = Array<float>(NpyDType::kFloat32, {2}, {1, 2});
  EXPECT_EQ(TableError(features, Array<double>(NpyDType::kFloat64, {2}, {0, -inf}), Int64Targets()),
            "targets[1]: -inf is not a finite number");
}

TEST(TableFromNpyTest, RejectsFloat64OutOfFloat32Range) {
  EXPECT_EQ(TableError(Array<double>(NpyDType::kFloat64, {1, 2}, {1e300, 1}), std::nullopt),
            "features[0, 0]: 1e+300 is out of range for float32");
}

TEST(TableFromNpyTest, RejectsNon2DArrayWithoutTargets) {
  EXPECT_EQ(TableError(Array<float>(NpyDType::kFloat32, {3}, {1, 2, 3}), std::nullopt),
            "without a targets array the features array must be 2-D (rows, columns); its shape "
            "is (3,)");
}

TEST(TableFromNpyTest, RejectsTooFewColumnsForTargets) {
  EXPECT_EQ(TableError(Array<float>(NpyDType::kFloat32, {2, 1}, {1, 2}), std::nullopt),
            "the features array has 1 column; with 1 column of targets it needs at least 2");
}

TEST(TableFromNpyTest, RejectsBadTargetColumnOptions) {
  const NpyArray features = Array<float>(NpyDType::kFloat32, {1, 3}, {1, 2, 3});
  NpyTableOptions options;
  options.target_columns = 0;
  EXPECT_EQ(TableError(features, std::nullopt, options),
            "target_columns must be at least 1; got 0");
  options = Int64Targets();
  options.target_columns = 2;
  EXPECT_EQ(TableError(features, std::nullopt, options),
            "int64 targets need exactly one target column; got 2");
}

TEST(TableFromNpyTest, ParsedFileBecomesTable) {
  const absl::StatusOr<NpyArray> features =
      ParseNpy(MakeNpy(1, "<f8", "(2, 2)", Bytes<double>({0.25, 0, 0.75, 1})));
  ASSERT_TRUE(features.ok()) << features.status();
  const absl::StatusOr<Table> table = TableFromNpy(*features, std::nullopt, Int64Targets());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_THAT(table->features, ElementsAre(0.25f, 0.75f));
  EXPECT_THAT(table->targets_i64, ElementsAre(0, 1));
}

// --- LayOutNpyTable and the conversions: TableFromNpy's parts, for a reader that streams ---

NpyArrayInfo Info(NpyDType dtype, std::vector<int64_t> shape, int64_t data_bytes) {
  return {std::move(shape), dtype, data_bytes};
}

TEST(LayOutNpyTableTest, SeparateTargetsAreWholeRowsOfEachArray) {
  const absl::StatusOr<NpyTableLayout> layout =
      LayOutNpyTable(Info(NpyDType::kFloat64, {4, 2, 3}, 4 * 6 * 8),
                     Info(NpyDType::kInt64, {4}, 4 * 8), Int64Targets());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->rows, 4);
  EXPECT_THAT(layout->feature_shape, ElementsAre(2, 3));
  EXPECT_THAT(layout->target_shape, IsEmpty());
  EXPECT_EQ(layout->target_dtype, TargetDType::kInt64);
  EXPECT_FALSE(layout->targets_in_features);
  EXPECT_EQ(layout->feature_columns.stride, 6);
  EXPECT_EQ(layout->feature_columns.begin, 0);
  EXPECT_EQ(layout->feature_columns.end, 6);
  EXPECT_EQ(layout->target_columns.stride, 1);
  EXPECT_EQ(layout->target_columns.begin, 0);
  EXPECT_EQ(layout->target_columns.end, 1);
}

TEST(LayOutNpyTableTest, WithoutTargetsTheLastColumnsAreTheTargets) {
  NpyTableOptions options;
  options.target_columns = 2;
  const absl::StatusOr<NpyTableLayout> layout =
      LayOutNpyTable(Info(NpyDType::kFloat32, {3, 5}, 60), std::nullopt, options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(layout->feature_shape, ElementsAre(3));
  EXPECT_THAT(layout->target_shape, ElementsAre(2));
  EXPECT_TRUE(layout->targets_in_features);
  EXPECT_EQ(layout->feature_columns.stride, 5);
  EXPECT_EQ(layout->feature_columns.end, 3);
  EXPECT_EQ(layout->target_columns.begin, 3);
  EXPECT_EQ(layout->target_columns.end, 5);
}

TEST(LayOutNpyTableTest, RefusesAsTableFromNpyDoes) {
  EXPECT_EQ(LayOutNpyTable(Info(NpyDType::kFloat32, {3}, 12), Info(NpyDType::kInt64, {2}, 16),
                           Int64Targets())
                .status()
                .message(),
            "the features array has 3 rows but the targets array has 2");
  EXPECT_EQ(LayOutNpyTable(Info(NpyDType::kFloat32, {2, 2}, 12), std::nullopt, NpyTableOptions())
                .status()
                .message(),
            "the features array has 12 bytes of data; shape (2, 2) of float32 needs 16");
}

TEST(NpyValuesTest, ConvertsIntoUnalignedOutputAndNamesElementsFromFirst) {
  const std::string in = Bytes<double>({1.5, -2, 3});
  char out[1 + 3 * 4];
  ASSERT_TRUE(
      NpyValuesToFloat32(NpyDType::kFloat64, in.data(), 3, out + 1, "features", {2, 3}, 3).ok());
  float values[3];
  std::memcpy(values, out + 1, sizeof(values));
  EXPECT_THAT(values, ElementsAre(1.5f, -2.0f, 3.0f));

  const std::string bad = Bytes<double>({1, std::numeric_limits<double>::quiet_NaN()});
  EXPECT_EQ(
      NpyValuesToFloat32(NpyDType::kFloat64, bad.data(), 2, out, "features", {2, 3}, 3).message(),
      "features[1, 1]: nan is not a finite number");
  EXPECT_EQ(NpyValuesToInt64(NpyDType::kFloat32, Bytes<float>({2, 2.5f}).data(), 2, out, "targets",
                             {7}, 4)
                .message(),
            "targets[5]: 2.5 is not an integer (int64 targets are class indices)");
  char wide[1 + 2 * 8];
  ASSERT_TRUE(NpyValuesToInt64(NpyDType::kFloat64, Bytes<double>({7, -1}).data(), 2, wide + 1,
                               "targets", {2}, 0)
                  .ok());
  int64_t classes[2];
  std::memcpy(classes, wide + 1, sizeof(classes));
  EXPECT_THAT(classes, ElementsAre(7, -1));
}

}  // namespace
}  // namespace trainerd
