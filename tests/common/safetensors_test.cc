// Tests for common/safetensors.h: the bytes EncodeSafetensors writes, read back by hand (the size,
// the JSON, the padding, the tensors' bytes) and by ParseSafetensors; every rule ParseSafetensors
// enforces on a hostile file; SetSafetensorsMetadata keeping the tensors as they were.
#include "common/safetensors.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

// A file written by hand: `json` as the header (not padded), then `data`.
std::string HandMade(const std::string& json, const std::string& data) {
  const uint64_t n = json.size();
  return Bytes(&n, sizeof(n)) + json + data;
}

TEST(SafetensorsTest, WritesTheFormatsLayout) {
  const float weight[6] = {1.5f, -2.0f, 0.25f, 3.0f, 4.0f, -0.5f};
  const int64_t count = 7;
  const std::string w = Bytes(weight, sizeof(weight));
  const std::string c = Bytes(&count, sizeof(count));
  const absl::StatusOr<std::string> file =
      EncodeSafetensors({{"0.weight", "F32", {2, 3}, w}, {"1.num_batches_tracked", "I64", {}, c}},
                        {{"format", "pt"}, {"trainerd.model", "linear:3,batchnorm"}});
  ASSERT_TRUE(file.ok()) << file.status();

  uint64_t header_size = 0;
  std::memcpy(&header_size, file->data(), 8);
  EXPECT_EQ(header_size % 8, 0u);  // padded: the tensors start 8-byte aligned
  ASSERT_EQ(file->size(), 8 + header_size + sizeof(weight) + sizeof(count));
  const std::string header = file->substr(8, header_size);
  EXPECT_EQ(header.front(), '{');
  EXPECT_THAT(header, HasSubstr(R"("__metadata__":{"format":"pt","trainerd.model":"linear:3,batchnorm"})"));
  EXPECT_THAT(header,
              HasSubstr(R"("0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"));
  EXPECT_THAT(header, HasSubstr(
                          R"("1.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[24,32]})"));
  // The order given is the header's order, and the bytes' order.
  EXPECT_LT(header.find("0.weight"), header.find("1.num_batches_tracked"));
  EXPECT_EQ(file->substr(8 + header_size, sizeof(weight)), w);
  EXPECT_EQ(file->substr(8 + header_size + sizeof(weight)), c);

  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].name, "0.weight");
  EXPECT_EQ(parsed->tensors[0].dtype, "F32");
  EXPECT_THAT(parsed->tensors[0].shape, ElementsAre(2, 3));
  EXPECT_EQ(file->substr(parsed->tensors[0].offset, parsed->tensors[0].size), w);
  EXPECT_EQ(parsed->tensors[1].name, "1.num_batches_tracked");
  EXPECT_TRUE(parsed->tensors[1].shape.empty());
  EXPECT_EQ(file->substr(parsed->tensors[1].offset, parsed->tensors[1].size), c);
  EXPECT_THAT(parsed->metadata,
              ElementsAre(Pair("format", "pt"), Pair("trainerd.model", "linear:3,batchnorm")));
}

TEST(SafetensorsTest, NamesAreEscapedAsJson) {
  const float v = 1.0f;
  const absl::StatusOr<std::string> file =
      EncodeSafetensors({{"a\"b\\c\nd", "F32", {1}, Bytes(&v, sizeof(v))}}, {});
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.at(0).name, "a\"b\\c\nd");
  EXPECT_TRUE(parsed->metadata.empty());
}

TEST(SafetensorsTest, EncodeRefusesWhatTheFormatCannotHold) {
  const float v[2] = {1, 2};
  const std::string two = Bytes(v, sizeof(v));
  EXPECT_THAT(EncodeSafetensors({{"x", "F32", {3}, two}}, {}).status().message(),
              HasSubstr("has 8 bytes; F32 of shape [3] needs 12"));
  EXPECT_THAT(EncodeSafetensors({{"x", "F31", {2}, two}}, {}).status().message(),
              HasSubstr("unknown safetensors dtype"));
  EXPECT_THAT(EncodeSafetensors({{"x", "F32", {2}, two}, {"x", "F32", {2}, two}}, {})
                  .status()
                  .message(),
              HasSubstr("repeated"));
  EXPECT_FALSE(EncodeSafetensors({{"", "F32", {2}, two}}, {}).ok());
  EXPECT_FALSE(EncodeSafetensors({{"__metadata__", "F32", {2}, two}}, {}).ok());
  EXPECT_FALSE(EncodeSafetensors({{"x", "F32", {-2}, two}}, {}).ok());
}

TEST(SafetensorsTest, ParseRefusesHostileFiles) {
  const std::string eight(8, '\0');
  auto refused = [](const std::string& file, const std::string& why) {
    const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(file);
    EXPECT_FALSE(parsed.ok()) << why;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << why;
      EXPECT_THAT(parsed.status().message(), HasSubstr(why));
    }
  };
  refused("abc", "shorter than its 8-byte header size");
  const uint64_t huge = uint64_t{1} << 40;
  refused(Bytes(&huge, 8) + "{}", "at most 100000000");
  const uint64_t past = 100;
  refused(Bytes(&past, 8) + "{}", "the file has 2 after the size");
  refused(HandMade("[1, 2]", ""), "not a JSON object");
  refused(HandMade("{\"a\": ", ""), "not valid JSON");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234567"),
          "are not within the file's 7");
  refused(HandMade(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", eight),
          "unknown dtype");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
          "has 8 bytes; its dtype and shape need 12");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
          "other than a size");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
                   eight),
          "more bytes than a file can");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
          "are not within");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[2]}})", eight),
          "is not {dtype, shape, data_offsets}");
  // A gap, an overlap, and bytes after the last tensor.
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
          "'a''s bytes start at 4; the one before ends at 0");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   eight),
          "start at 4; the one before ends at 8");
  refused(HandMade(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
          "the tensors hold 4 bytes; the file has 8");
  refused(HandMade(R"({"__metadata__":{"k":1}})", ""), "metadata 'k' is not a string");
  // A TorchScript archive (a ZIP file) is no safetensors file.
  refused(std::string("PK\x03\x04", 4) + std::string(60, 'z'), "not a safetensors file");
}

TEST(SafetensorsTest, AFileOfTheLibraryWithoutPaddingParses) {
  const float v[2] = {1, 2};
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(
      HandMade(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
               R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
               Bytes(v, sizeof(v))));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // In the order of their bytes.
  EXPECT_EQ(parsed->tensors.at(0).name, "a");
  EXPECT_EQ(parsed->tensors.at(1).name, "b");
}

TEST(SafetensorsTest, SetMetadataKeepsTheTensors) {
  const double v[3] = {1.0, 2.0, 3.0};
  const absl::StatusOr<std::string> file =
      EncodeSafetensors({{"w", "F64", {3}, Bytes(v, sizeof(v))}}, {{"format", "pt"}});
  ASSERT_TRUE(file.ok());
  const absl::StatusOr<std::string> stamped =
      SetSafetensorsMetadata(*file, "trainerd.job", "job-0123456789ab");
  ASSERT_TRUE(stamped.ok()) << stamped.status();
  const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(*stamped);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->metadata,
              ElementsAre(Pair("format", "pt"), Pair("trainerd.job", "job-0123456789ab")));
  EXPECT_EQ(stamped->substr(parsed->tensors.at(0).offset, parsed->tensors.at(0).size),
            Bytes(v, sizeof(v)));
  EXPECT_FALSE(SetSafetensorsMetadata("nonsense", "k", "v").ok());
}

}  // namespace
}  // namespace trainerd
