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
  EXPECT_STREQ(LayerKindName(LayerKind::kConv2d), "conv2d");
  EXPECT_STREQ(LayerKindName(LayerKind::kMaxPool2d), "maxpool2d");
  EXPECT_STREQ(LayerKindName(LayerKind::kAvgPool2d), "avgpool2d");
  EXPECT_STREQ(LayerKindName(LayerKind::kFlatten), "flatten");
  EXPECT_STREQ(LayerKindName(LayerKind::kDropout), "dropout");
  EXPECT_STREQ(LayerKindName(LayerKind::kBatchNorm), "batchnorm");
  EXPECT_STREQ(LayerKindName(LayerKind::kLayerNorm), "layernorm");
  EXPECT_STREQ(LayerKindName(LayerKind::kGelu), "gelu");
  EXPECT_STREQ(LayerKindName(LayerKind::kSoftmax), "softmax");
  EXPECT_STREQ(LayerKindName(LayerKind::kLogSoftmax), "logsoftmax");
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

constexpr char kKnownLayers[] =
    "(known: linear, conv2d, maxpool2d, avgpool2d, flatten, dropout, batchnorm, layernorm, relu, "
    "gelu, tanh, sigmoid, softmax, logsoftmax)";

TEST(ParseModelSpecTest, RejectsUnknownLayer) {
  EXPECT_EQ(ParseError("linear:4,relux"),
            std::string("layer 2: unknown layer 'relux' ") + kKnownLayers);
  EXPECT_EQ(ParseError("Conv:3"), std::string("layer 1: unknown layer 'Conv' ") + kKnownLayers);
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
            "layer 2 (linear:3) needs at least one input dimension; the input is a scalar");
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
            "layer 1 (linear:2) needs at least one input dimension; the input is a scalar");
}

TEST(CountParametersTest, RejectsOverflow) {
  const absl::StatusOr<int64_t> count =
      CountParameters(Parse("linear:1048576"), {int64_t{1} << 62});
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(count.status().message(),
            "the parameter count of 'linear:1048576' for input shape 4611686018427387904 is too "
            "large (4611686018427387904 x 1048576 overflows a 64-bit count)");
}

// --- Layers beyond linear and the activations. ---

std::vector<int64_t> Shape(const std::string& text, const std::vector<int64_t>& input) {
  const absl::StatusOr<std::vector<int64_t>> shape = InferOutputShape(Parse(text), input);
  EXPECT_TRUE(shape.ok()) << text << ": " << shape.status();
  return shape.value_or(std::vector<int64_t>{-1});
}

std::string ShapeError(const std::string& text, const std::vector<int64_t>& input) {
  const absl::StatusOr<std::vector<int64_t>> shape = InferOutputShape(Parse(text), input);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(shape.status().message());
}

int64_t Count(const std::string& text, const std::vector<int64_t>& input) {
  const absl::StatusOr<int64_t> count = CountParameters(Parse(text), input);
  EXPECT_TRUE(count.ok()) << text << ": " << count.status();
  return count.value_or(-1);
}

TEST(ParseModelSpecTest, ParsesEveryLayerKind) {
  const ModelSpec spec = Parse(
      "conv2d:8:3,maxpool2d:2,avgpool2d:3,flatten,dropout:0.25,batchnorm,layernorm,gelu,softmax,"
      "LogSoftmax");
  ASSERT_EQ(spec.layers.size(), 10u);
  EXPECT_EQ(spec.layers[0].kind, LayerKind::kConv2d);
  EXPECT_THAT(spec.layers[0].args, ElementsAre(8, 3, 1, 0));
  EXPECT_EQ(spec.layers[1].kind, LayerKind::kMaxPool2d);
  EXPECT_THAT(spec.layers[1].args, ElementsAre(2));
  EXPECT_EQ(spec.layers[2].kind, LayerKind::kAvgPool2d);
  EXPECT_THAT(spec.layers[2].args, ElementsAre(3));
  EXPECT_EQ(spec.layers[3].kind, LayerKind::kFlatten);
  EXPECT_EQ(spec.layers[4].kind, LayerKind::kDropout);
  EXPECT_THAT(spec.layers[4].args, IsEmpty());
  EXPECT_EQ(spec.layers[4].rate, 0.25);
  EXPECT_EQ(spec.layers[5].kind, LayerKind::kBatchNorm);
  EXPECT_EQ(spec.layers[6].kind, LayerKind::kLayerNorm);
  EXPECT_EQ(spec.layers[7].kind, LayerKind::kGelu);
  EXPECT_EQ(spec.layers[8].kind, LayerKind::kSoftmax);
  EXPECT_EQ(spec.layers[9].kind, LayerKind::kLogSoftmax);
  EXPECT_EQ(spec.ToString(),
            "conv2d:8:3,maxpool2d:2,avgpool2d:3,flatten,dropout:0.25,batchnorm,layernorm,gelu,"
            "softmax,logsoftmax");
}

TEST(ParseModelSpecTest, Conv2dFillsInStrideAndPadding) {
  EXPECT_THAT(Parse("conv2d:8:3").layers[0].args, ElementsAre(8, 3, 1, 0));
  EXPECT_THAT(Parse("conv2d:8:3:2").layers[0].args, ElementsAre(8, 3, 2, 0));
  EXPECT_THAT(Parse("Conv2D : 16 : 5 : 1 : 2").layers[0].args, ElementsAre(16, 5, 1, 2));
}

TEST(ParseModelSpecTest, CanonicalTextLeavesOutDefaultsAndRoundTrips) {
  EXPECT_EQ(Parse("conv2d:8:3:1:0").ToString(), "conv2d:8:3");
  EXPECT_EQ(Parse("conv2d:8:3:2:0").ToString(), "conv2d:8:3:2");
  EXPECT_EQ(Parse("conv2d:8:3:1:1").ToString(), "conv2d:8:3:1:1");
  EXPECT_EQ(Parse("conv2d:8:3:02").ToString(), "conv2d:8:3:2");
  EXPECT_EQ(Parse("dropout:0.50").ToString(), "dropout:0.5");
  EXPECT_EQ(Parse("dropout:.1").ToString(), "dropout:0.1");
  EXPECT_EQ(Parse("dropout:1e-3").ToString(), "dropout:0.001");
  EXPECT_EQ(Parse("dropout:0").ToString(), "dropout:0");
  EXPECT_EQ(Parse("dropout:-0").ToString(), "dropout:0");
  for (const std::string text : {"conv2d:8:3:2:1,maxpool2d:2,flatten", "dropout:0.123456789",
                                 "avgpool2d:4,batchnorm,layernorm,softmax"}) {
    const ModelSpec spec = Parse(text);
    EXPECT_EQ(Parse(spec.ToString()).ToString(), spec.ToString()) << text;
  }
  EXPECT_EQ(Parse("dropout:0.123456789").layers[0].rate, 0.123456789);
}

TEST(ParseModelSpecTest, AcceptsArgumentLimits) {
  EXPECT_EQ(Parse("conv2d:65536:1048576:1048576:1048576").ToString(),
            "conv2d:65536:1048576:1048576:1048576");
  EXPECT_EQ(Parse("conv2d:1:1:1:0,maxpool2d:1,avgpool2d:1048576").ToString(),
            "conv2d:1:1,maxpool2d:1,avgpool2d:1048576");
  EXPECT_EQ(Parse("dropout:0.999").ToString(), "dropout:0.999");
}

TEST(ParseModelSpecTest, RejectsConv2dWithoutTwoToFourIntegers) {
  const std::string usage =
      "layer 1 (conv2d) needs integer arguments C:K[:stride[:padding]], as in conv2d:8:3";
  EXPECT_EQ(ParseError("conv2d"), usage);
  EXPECT_EQ(ParseError("conv2d:"), usage);
  EXPECT_EQ(ParseError("conv2d:8"), usage + "; got '8'");
  EXPECT_EQ(ParseError("conv2d:8:3:1:1:1"), usage + "; got '8:3:1:1:1'");
  EXPECT_EQ(ParseError("conv2d:8:x"), usage + "; got '8:x'");
  EXPECT_EQ(ParseError("conv2d:8:2.5"), usage + "; got '8:2.5'");
  EXPECT_EQ(ParseError("conv2d:8::1"), usage + "; got '8::1'");
}

TEST(ParseModelSpecTest, RejectsConv2dArgumentsOutOfRange) {
  EXPECT_EQ(ParseError("conv2d:0:3"),
            "layer 1 (conv2d) output channels must be between 1 and 65536; got 0");
  EXPECT_EQ(ParseError("relu,conv2d:65537:3"),
            "layer 2 (conv2d) output channels must be between 1 and 65536; got 65537");
  EXPECT_EQ(ParseError("conv2d:8:0"),
            "layer 1 (conv2d) kernel size must be between 1 and 1048576; got 0");
  EXPECT_EQ(ParseError("conv2d:8:99999999999999999999"),
            "layer 1 (conv2d) kernel size must be between 1 and 1048576; got 99999999999999999999");
  EXPECT_EQ(ParseError("conv2d:8:3:0"),
            "layer 1 (conv2d) stride must be between 1 and 1048576; got 0");
  EXPECT_EQ(ParseError("conv2d:8:3:1:-1"),
            "layer 1 (conv2d) padding must be between 0 and 1048576; got -1");
}

TEST(ParseModelSpecTest, RejectsPoolWithoutOneKernelSize) {
  EXPECT_EQ(ParseError("maxpool2d"), "layer 1 (maxpool2d) needs a kernel size, as in maxpool2d:2");
  EXPECT_EQ(ParseError("avgpool2d:2:2"),
            "layer 1 (avgpool2d) needs a kernel size, as in avgpool2d:2; got '2:2'");
  EXPECT_EQ(ParseError("maxpool2d:two"),
            "layer 1 (maxpool2d) needs a kernel size, as in maxpool2d:2; got 'two'");
  EXPECT_EQ(ParseError("maxpool2d:0"),
            "layer 1 (maxpool2d) kernel size must be between 1 and 1048576; got 0");
}

TEST(ParseModelSpecTest, RejectsDropoutOutsideZeroToOne) {
  const std::string usage = "layer 1 (dropout) needs a drop probability, as in dropout:0.5";
  EXPECT_EQ(ParseError("dropout"), usage);
  EXPECT_EQ(ParseError("dropout:abc"), usage + "; got 'abc'");
  EXPECT_EQ(ParseError("dropout:0.5:1"), usage + "; got '0.5:1'");
  EXPECT_EQ(ParseError("dropout:1e999"), usage + "; got '1e999'");
  const std::string range = "layer 1 (dropout) drop probability must be at least 0 and below 1";
  EXPECT_EQ(ParseError("dropout:1"), range + "; got 1");
  EXPECT_EQ(ParseError("dropout:-0.1"), range + "; got -0.1");
  EXPECT_EQ(ParseError("dropout:nan"), range + "; got nan");
  EXPECT_EQ(ParseError("dropout:inf"), range + "; got inf");
}

TEST(ParseModelSpecTest, RejectsArgumentsOnLayersThatTakeNone) {
  EXPECT_EQ(ParseError("flatten:1"), "layer 1 (flatten) takes no arguments");
  EXPECT_EQ(ParseError("relu,batchnorm:4"), "layer 2 (batchnorm) takes no arguments");
  EXPECT_EQ(ParseError("softmax:1"), "layer 1 (softmax) takes no arguments");
}

TEST(InferOutputShapeTest, CnnOnImageRowsEndsInClassScores) {
  const absl::StatusOr<std::vector<std::vector<int64_t>>> shapes =
      InferLayerShapes(Parse("conv2d:8:3:1:1,relu,maxpool2d:2,flatten,linear:10"), {1, 28, 28});
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_THAT(*shapes, ElementsAre(std::vector<int64_t>{1, 28, 28}, std::vector<int64_t>{8, 28, 28},
                                   std::vector<int64_t>{8, 28, 28}, std::vector<int64_t>{8, 14, 14},
                                   std::vector<int64_t>{1568}, std::vector<int64_t>{10}));
  EXPECT_THAT(Shape("conv2d:8:3:1:1,relu,maxpool2d:2,flatten,linear:10", {1, 28, 28}),
              ElementsAre(10));
}

TEST(InferOutputShapeTest, Conv2dAppliesStrideAndPadding) {
  EXPECT_THAT(Shape("conv2d:4:3", {3, 7, 9}), ElementsAre(4, 5, 7));
  EXPECT_THAT(Shape("conv2d:4:3:2", {3, 7, 8}), ElementsAre(4, 3, 3));
  EXPECT_THAT(Shape("conv2d:4:5:1:2", {3, 7, 9}), ElementsAre(4, 7, 9));
  EXPECT_THAT(Shape("conv2d:4:5:1:1", {1, 3, 3}), ElementsAre(4, 1, 1));
}

TEST(InferOutputShapeTest, PoolsUseStrideKAndFloor) {
  EXPECT_THAT(Shape("maxpool2d:2", {3, 7, 5}), ElementsAre(3, 3, 2));
  EXPECT_THAT(Shape("avgpool2d:3", {2, 9, 9}), ElementsAre(2, 3, 3));
  EXPECT_THAT(Shape("maxpool2d:4", {1, 4, 4}), ElementsAre(1, 1, 1));
}

TEST(InferOutputShapeTest, FlattenMakesOneDimension) {
  EXPECT_THAT(Shape("flatten", {2, 3, 4}), ElementsAre(24));
  EXPECT_THAT(Shape("flatten", {5}), ElementsAre(5));
  EXPECT_THAT(Shape("flatten,linear:3", {2, 3}), ElementsAre(3));
}

TEST(InferOutputShapeTest, NormsDropoutAndActivationsKeepTheShape) {
  EXPECT_THAT(Shape("batchnorm", {8}), ElementsAre(8));
  EXPECT_THAT(Shape("batchnorm", {3, 4, 4}), ElementsAre(3, 4, 4));
  EXPECT_THAT(Shape("layernorm,gelu,dropout:0.5,tanh,sigmoid,relu", {2, 3}), ElementsAre(2, 3));
  EXPECT_THAT(Shape("softmax", {5}), ElementsAre(5));
  EXPECT_THAT(Shape("logsoftmax", {5}), ElementsAre(5));
  EXPECT_THAT(Shape("dropout:0.1,gelu", {}), IsEmpty());
}

TEST(InferOutputShapeTest, RejectsConv2dOnFlatRowsNamingLayerAndShape) {
  EXPECT_EQ(ShapeError("conv2d:8:3", {784}),
            "layer 1 (conv2d:8:3) needs a per-row input of shape CxHxW; the input is 784");
  EXPECT_EQ(ShapeError("relu,conv2d:8:3:1:1", {28, 28}),
            "layer 2 (conv2d:8:3:1:1) needs a per-row input of shape CxHxW; the input is 28x28");
  EXPECT_EQ(ShapeError("avgpool2d:2", {}),
            "layer 1 (avgpool2d:2) needs a per-row input of shape CxHxW; the input is a scalar");
}

TEST(InferOutputShapeTest, RejectsWindowLargerThanTheImage) {
  EXPECT_EQ(ShapeError("conv2d:8:3,relu,maxpool2d:4", {1, 4, 4}),
            "layer 3 (maxpool2d:4) would shrink 8x2x2 below 1x1");
  EXPECT_EQ(ShapeError("conv2d:4:5", {1, 3, 3}),
            "layer 1 (conv2d:4:5) would shrink 1x3x3 below 1x1");
  EXPECT_EQ(ShapeError("avgpool2d:3", {1, 3, 2}),
            "layer 1 (avgpool2d:3) would shrink 1x3x2 below 1x1");
}

TEST(InferOutputShapeTest, RejectsBatchNormOnRankTwoRows) {
  EXPECT_EQ(ShapeError("batchnorm", {3, 28}),
            "layer 1 (batchnorm) needs a per-row input of shape F (batchnorm 1d) or CxHxW "
            "(batchnorm 2d); the input is 3x28");
  EXPECT_EQ(ShapeError("batchnorm", {}),
            "layer 1 (batchnorm) needs a per-row input of shape F (batchnorm 1d) or CxHxW "
            "(batchnorm 2d); the input is a scalar");
}

TEST(InferOutputShapeTest, RejectsSoftmaxOverMoreThanOneDimension) {
  EXPECT_EQ(ShapeError("conv2d:2:3,softmax", {1, 5, 5}),
            "layer 2 (softmax) needs a per-row vector of class scores (shape N); the input is "
            "2x3x3");
  EXPECT_EQ(ShapeError("logsoftmax", {}),
            "layer 1 (logsoftmax) needs a per-row vector of class scores (shape N); the input is "
            "a scalar");
}

TEST(InferOutputShapeTest, RejectsFlattenAndLayerNormOnScalarRows) {
  EXPECT_EQ(ShapeError("flatten", {}),
            "layer 1 (flatten) needs at least one input dimension; the input is a scalar");
  EXPECT_EQ(ShapeError("relu,layernorm", {}),
            "layer 2 (layernorm) needs at least one input dimension; the input is a scalar");
}

TEST(InferOutputShapeTest, RejectsHandBuiltLayersWithBadArguments) {
  ModelSpec conv;
  conv.layers.push_back(LayerSpec{LayerKind::kConv2d, {0, 3}});
  EXPECT_EQ(InferOutputShape(conv, {1, 4, 4}).status().message(),
            "layer 1 (conv2d) output channels must be between 1 and 65536; got 0");
  ModelSpec short_conv;
  short_conv.layers.push_back(LayerSpec{LayerKind::kConv2d, {4}});
  EXPECT_EQ(InferOutputShape(short_conv, {1, 4, 4}).status().message(),
            "layer 1 (conv2d) needs integer arguments C:K[:stride[:padding]], as in conv2d:8:3");
  ModelSpec dropout;
  dropout.layers.push_back(LayerSpec{LayerKind::kDropout, {}, 1.5});
  EXPECT_EQ(InferOutputShape(dropout, {4}).status().message(),
            "layer 1 (dropout) drop probability must be at least 0 and below 1; got 1.5");
  ModelSpec relu;
  relu.layers.push_back(LayerSpec{LayerKind::kRelu, {2}});
  EXPECT_EQ(InferOutputShape(relu, {4}).status().message(), "layer 1 (relu) takes no arguments");
}

TEST(InferOutputShapeTest, HandBuiltConv2dWithoutStrideAndPaddingUsesDefaults) {
  ModelSpec conv;
  conv.layers.push_back(LayerSpec{LayerKind::kConv2d, {4, 3}});
  EXPECT_EQ(conv.ToString(), "conv2d:4:3");
  const absl::StatusOr<std::vector<int64_t>> shape = InferOutputShape(conv, {1, 5, 6});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(4, 3, 4));
}

TEST(CountParametersTest, CountsConvolutionWeightsAndBiases) {
  // conv 1*8*3*3 + 8, linear 8*14*14*10 + 10.
  EXPECT_EQ(Count("conv2d:8:3:1:1,relu,maxpool2d:2,flatten,linear:10", {1, 28, 28}), 80 + 15690);
  // 3*4*5*5 + 4
  EXPECT_EQ(Count("conv2d:4:5:2:2", {3, 10, 10}), 304);
}

TEST(CountParametersTest, CountsNormWeightsAndBiases) {
  EXPECT_EQ(Count("batchnorm", {8}), 16);
  EXPECT_EQ(Count("batchnorm", {3, 4, 4}), 6);
  EXPECT_EQ(Count("layernorm", {3, 4, 4}), 96);
  EXPECT_EQ(Count("linear:5,layernorm", {2, 3}), 3 * 5 + 5 + 2 * 10);
}

TEST(CountParametersTest, PoolsFlattenDropoutAndActivationsHaveNone) {
  EXPECT_EQ(Count("maxpool2d:2,avgpool2d:2,flatten,dropout:0.5,gelu,softmax,logsoftmax", {2, 8, 8}),
            0);
}

TEST(CountParametersTest, RejectsConvolutionOverflow) {
  const absl::StatusOr<int64_t> count =
      CountParameters(Parse("conv2d:65536:1048576"), {int64_t{1} << 40, 1048576, 1048576});
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(count.status().message(),
            "the parameter count of 'conv2d:65536:1048576' for input shape "
            "1099511627776x1048576x1048576 1099511627776x1048576x1048576 has too many values (the "
            "product overflows)");
}

}  // namespace
}  // namespace trainerd
