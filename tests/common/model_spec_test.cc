// Tests for common/model_spec.h: the parser's accepted forms and error messages, shape inference
// and parameter counts.
#include "common/model_spec.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::string ParseError(const std::string& text) {
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec(text);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(spec.status().message());
}

ModelSpec Parse(const std::string& text) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec();
}

TEST(LayerKindNameTest, NamesEveryKind) {
  EXPECT_STREQ(LayerKindName(LayerKind::kLinear), "linear");
  EXPECT_STREQ(LayerKindName(LayerKind::kRelu), "relu");
  EXPECT_STREQ(LayerKindName(LayerKind::kTanh), "tanh");
  EXPECT_STREQ(LayerKindName(LayerKind::kSigmoid), "sigmoid");
}

TEST(ParseModelSpecTest, ParsesLayersAndArguments) {
  const ModelSpec spec = Parse("linear:64,relu,linear:1");
  ASSERT_EQ(spec.layers.size(), 3u);
  EXPECT_EQ(spec.layers[0].kind, LayerKind::kLinear);
  EXPECT_THAT(spec.layers[0].args, ElementsAre(64));
  EXPECT_EQ(spec.layers[1].kind, LayerKind::kRelu);
  EXPECT_THAT(spec.layers[1].args, IsEmpty());
  EXPECT_EQ(spec.layers[2].kind, LayerKind::kLinear);
  EXPECT_THAT(spec.layers[2].args, ElementsAre(1));
  EXPECT_EQ(spec.ToString(), "linear:64,relu,linear:1");
}

TEST(ParseModelSpecTest, IgnoresCaseAndWhitespace) {
  const ModelSpec spec = Parse("  Linear : 8 , ReLU,\tTANH , sigmoid \n");
  ASSERT_EQ(spec.layers.size(), 4u);
  EXPECT_EQ(spec.layers[2].kind, LayerKind::kTanh);
  EXPECT_EQ(spec.layers[3].kind, LayerKind::kSigmoid);
  EXPECT_EQ(spec.ToString(), "linear:8,relu,tanh,sigmoid");
}

TEST(ParseModelSpecTest, AcceptsWidthLimitAndSingleLayer) {
  EXPECT_EQ(Parse("linear:1048576").ToString(), "linear:1048576");
  EXPECT_EQ(Parse("sigmoid").ToString(), "sigmoid");
}

TEST(ParseModelSpecTest, AcceptsSixtyFourLayers) {
  const std::vector<std::string> layers(64, "relu");
  EXPECT_EQ(Parse(absl::StrJoin(layers, ",")).layers.size(), 64u);
}

TEST(ParseModelSpecTest, LayerSpecToStringIsCanonical) {
  LayerSpec linear;
  linear.kind = LayerKind::kLinear;
  linear.args = {32};
  EXPECT_EQ(linear.ToString(), "linear:32");
  EXPECT_EQ(LayerSpec().ToString(), "relu");
  EXPECT_EQ(ModelSpec().ToString(), "");
}

TEST(ParseModelSpecTest, RejectsEmptySpec) {
  EXPECT_EQ(ParseError(""), "the model spec is empty");
  EXPECT_EQ(ParseError(" \t "), "the model spec is empty");
}

TEST(ParseModelSpecTest, RejectsEmptyLayer) {
  EXPECT_EQ(ParseError("linear:1,,relu"),
            "layer 2 is empty (layers are separated by single commas)");
  EXPECT_EQ(ParseError("relu,"), "layer 2 is empty (layers are separated by single commas)");
  EXPECT_EQ(ParseError(", relu"), "layer 1 is empty (layers are separated by single commas)");
}

TEST(ParseModelSpecTest, RejectsUnknownLayer) {
  EXPECT_EQ(ParseError("linear:4,relux"),
            "layer 2: unknown layer 'relux' (known: linear, relu, tanh, sigmoid)");
  EXPECT_EQ(ParseError("Conv:3"),
            "layer 1: unknown layer 'Conv' (known: linear, relu, tanh, sigmoid)");
}

TEST(ParseModelSpecTest, RejectsLinearWithoutWidth) {
  EXPECT_EQ(ParseError("linear"),
            "layer 1 (linear) needs a positive output width, as in linear:64");
  EXPECT_EQ(ParseError("relu,linear:"),
            "layer 2 (linear) needs a positive output width, as in linear:64");
}

TEST(ParseModelSpecTest, RejectsLinearWithBadWidthNamingIt) {
  EXPECT_EQ(ParseError("linear:0"),
            "layer 1 (linear) needs a positive output width, as in linear:64; got '0'");
  EXPECT_EQ(ParseError("linear:-3"),
            "layer 1 (linear) needs a positive output width, as in linear:64; got '-3'");
  EXPECT_EQ(ParseError("linear:abc"),
            "layer 1 (linear) needs a positive output width, as in linear:64; got 'abc'");
  EXPECT_EQ(ParseError("linear:2.5"),
            "layer 1 (linear) needs a positive output width, as in linear:64; got '2.5'");
  EXPECT_EQ(ParseError("linear:3:4"),
            "layer 1 (linear) needs a positive output width, as in linear:64; got '3:4'");
}

TEST(ParseModelSpecTest, RejectsLinearWiderThanTheLimit) {
  EXPECT_EQ(ParseError("linear:1048577"),
            "layer 1 (linear) output width 1048577 is larger than the limit of 1048576");
  EXPECT_EQ(ParseError("linear:99999999999999999999999"),
            "layer 1 (linear) output width 99999999999999999999999 is larger than the limit of "
            "1048576");
}

TEST(ParseModelSpecTest, RejectsActivationWithArguments) {
  EXPECT_EQ(ParseError("linear:1,relu:2"), "layer 2 (relu) takes no arguments");
  EXPECT_EQ(ParseError("TANH:"), "layer 1 (tanh) takes no arguments");
}

TEST(ParseModelSpecTest, RejectsMoreThanSixtyFourLayers) {
  const std::vector<std::string> layers(65, "relu");
  EXPECT_EQ(ParseError(absl::StrJoin(layers, ",")),
            "the model spec has 65 layers; at most 64 are allowed");
}

TEST(InferOutputShapeTest, LinearReplacesTheLastDimension) {
  const absl::StatusOr<std::vector<int64_t>> shape =
      InferOutputShape(Parse("linear:64,relu,linear:1"), {4});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(1));
}

TEST(InferOutputShapeTest, LinearActsOnTheLastOfSeveralDimensions) {
  const absl::StatusOr<std::vector<int64_t>> shape =
      InferOutputShape(Parse("linear:10,tanh"), {3, 28});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(3, 10));
}

TEST(InferOutputShapeTest, ActivationsKeepTheShape) {
  const absl::StatusOr<std::vector<int64_t>> shape =
      InferOutputShape(Parse("relu,sigmoid"), {2, 5});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(2, 5));
  const absl::StatusOr<std::vector<int64_t>> scalar = InferOutputShape(Parse("relu"), {});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_THAT(*scalar, IsEmpty());
}

TEST(InferOutputShapeTest, EmptyModelIsTheIdentity) {
  const absl::StatusOr<std::vector<int64_t>> shape = InferOutputShape(ModelSpec(), {7});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(7));
}

TEST(InferOutputShapeTest, RejectsLinearOnScalarInput) {
  const absl::StatusOr<std::vector<int64_t>> shape = InferOutputShape(Parse("relu,linear:3"), {});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shape.status().message(),
            "layer 2 (linear) needs at least one input dimension; the input is a scalar");
}

TEST(InferOutputShapeTest, RejectsNonPositiveInputDimension) {
  const absl::StatusOr<std::vector<int64_t>> shape = InferOutputShape(Parse("relu"), {3, 0});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shape.status().message(), "the input shape 3x0 has a dimension below 1");
}

TEST(InferOutputShapeTest, RejectsHandBuiltLinearWithoutWidth) {
  ModelSpec spec;
  spec.layers.push_back(LayerSpec{LayerKind::kLinear, {}});
  EXPECT_EQ(InferOutputShape(spec, {4}).status().message(),
            "layer 1 (linear) needs a positive output width, as in linear:64");
}

TEST(CountParametersTest, CountsWeightsAndBiases) {
  // 4*64 + 64 + 64*1 + 1
  const absl::StatusOr<int64_t> count = CountParameters(Parse("linear:64,relu,linear:1"), {4});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 385);
}

TEST(CountParametersTest, UsesTheLastInputDimension) {
  // 28*10 + 10 + 10*2 + 2
  const absl::StatusOr<int64_t> count = CountParameters(Parse("linear:10,relu,linear:2"), {3, 28});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 312);
}

TEST(CountParametersTest, ActivationsHaveNoParameters) {
  const absl::StatusOr<int64_t> count = CountParameters(Parse("relu,tanh"), {5});
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0);
}

TEST(CountParametersTest, RejectsLinearOnScalarInput) {
  EXPECT_EQ(CountParameters(Parse("linear:2"), {}).status().message(),
            "layer 1 (linear) needs at least one input dimension; the input is a scalar");
}

TEST(CountParametersTest, RejectsOverflow) {
  const absl::StatusOr<int64_t> count =
      CountParameters(Parse("linear:1048576"), {int64_t{1} << 62});
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(count.status().message(),
            "the model 'linear:1048576' has too many parameters to count for input shape "
            "4611686018427387904");
}

}  // namespace
}  // namespace trainerd
