// Parsing of the text model spec and per-row shape inference.
#include "common/model_spec.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/checked_size.h"
#include "common/status_macros.h"

namespace trainerd {
namespace {

constexpr size_t kMaxLayers = 64;
constexpr int64_t kMaxLinearWidth = 1048576;
constexpr int64_t kMaxChannels = 65536;
// Kernel sizes, strides and paddings: far beyond any useful value, small enough that the shape
// arithmetic cannot overflow.
constexpr int64_t kMaxWindow = 1048576;

// Every kind in the order the error for an unknown layer lists them.
constexpr LayerKind kAllKinds[] = {
    LayerKind::kLinear,  LayerKind::kConv2d,    LayerKind::kMaxPool2d, LayerKind::kAvgPool2d,
    LayerKind::kFlatten, LayerKind::kDropout,   LayerKind::kBatchNorm, LayerKind::kLayerNorm,
    LayerKind::kRelu,    LayerKind::kGelu,      LayerKind::kTanh,      LayerKind::kSigmoid,
    LayerKind::kSoftmax, LayerKind::kLogSoftmax};

std::optional<LayerKind> KindFromName(absl::string_view lower_name) {
  for (LayerKind kind : kAllKinds) {
    if (lower_name == LayerKindName(kind)) return kind;
  }
  return std::nullopt;
}

std::string KnownLayers() {
  std::vector<std::string> names;
  for (LayerKind kind : kAllKinds) names.push_back(LayerKindName(kind));
  return absl::StrJoin(names, ", ");
}

// "layer 2 (linear)": for errors in a layer's arguments.
std::string LayerName(size_t index, LayerKind kind) {
  return absl::StrCat("layer ", index + 1, " (", LayerKindName(kind), ")");
}

// "layer 2 (conv2d:8:3)": for errors in shapes, which depend on the arguments.
std::string LayerNameWithArgs(size_t index, const LayerSpec& layer) {
  return absl::StrCat("layer ", index + 1, " (", layer.ToString(), ")");
}

std::string ShapeText(const std::vector<int64_t>& shape) { return absl::StrJoin(shape, "x"); }

// "784", "1x28x28" or "a scalar".
std::string DescribeShape(const std::vector<int64_t>& shape) {
  return shape.empty() ? "a scalar" : ShapeText(shape);
}

// Parses a decimal integer with an optional '-'; nullopt when `text` is not one. Values beyond
// int64 saturate, which every range check refuses.
std::optional<int64_t> ParseInteger(absl::string_view text) {
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ptr != end) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    return text[0] == '-' ? std::numeric_limits<int64_t>::min()
                          : std::numeric_limits<int64_t>::max();
  }
  if (ec != std::errc()) return std::nullopt;
  return value;
}

// "layer 1 (conv2d) kernel size must be between 1 and 1048576; got 0".
absl::Status CheckRange(size_t index, LayerKind kind, absl::string_view what, int64_t value,
                        int64_t low, int64_t high, absl::string_view shown) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      LayerName(index, kind), " ", what, " must be between ", low, " and ", high, "; got ", shown));
}

std::string Conv2dUsage(size_t index) {
  return absl::StrCat(LayerName(index, LayerKind::kConv2d),
                      " needs integer arguments C:K[:stride[:padding]], as in conv2d:8:3");
}

std::string PoolUsage(size_t index, LayerKind kind) {
  return absl::StrCat(LayerName(index, kind), " needs a kernel size, as in ", LayerKindName(kind),
                      ":2");
}

// Checks a layer's arguments (count and ranges), for parsed and hand-built specs alike. `shown`
// holds the text the user wrote for each argument, when there is one, so that an error quotes it.
absl::Status CheckArguments(const LayerSpec& layer, size_t index,
                            const std::vector<std::string>& shown = {}) {
  const auto show = [&](size_t k) {
    return k < shown.size() ? shown[k] : absl::StrCat(layer.args[k]);
  };
  switch (layer.kind) {
    case LayerKind::kLinear:
      if (layer.args.size() != 1 || layer.args[0] < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            LayerName(index, layer.kind), " needs a positive output width, as in linear:64"));
      }
      return absl::OkStatus();
    case LayerKind::kConv2d:
      if (layer.args.size() < 2 || layer.args.size() > 4) {
        return absl::InvalidArgumentError(Conv2dUsage(index));
      }
      TRAINERD_RETURN_IF_ERROR(CheckRange(index, layer.kind, "output channels", layer.args[0], 1,
                                          kMaxChannels, show(0)));
      TRAINERD_RETURN_IF_ERROR(
          CheckRange(index, layer.kind, "kernel size", layer.args[1], 1, kMaxWindow, show(1)));
      if (layer.args.size() > 2) {
        TRAINERD_RETURN_IF_ERROR(
            CheckRange(index, layer.kind, "stride", layer.args[2], 1, kMaxWindow, show(2)));
      }
      if (layer.args.size() > 3) {
        TRAINERD_RETURN_IF_ERROR(
            CheckRange(index, layer.kind, "padding", layer.args[3], 0, kMaxWindow, show(3)));
      }
      return absl::OkStatus();
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d:
      if (layer.args.size() != 1) {
        return absl::InvalidArgumentError(PoolUsage(index, layer.kind));
      }
      return CheckRange(index, layer.kind, "kernel size", layer.args[0], 1, kMaxWindow, show(0));
    case LayerKind::kDropout:
      if (!layer.args.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            LayerName(index, layer.kind), " takes one drop probability, as in dropout:0.5"));
      }
      if (!(layer.rate >= 0.0 && layer.rate < 1.0)) {  // also refuses NaN
        return absl::InvalidArgumentError(absl::StrCat(
            LayerName(index, layer.kind), " drop probability must be at least 0 and below 1; got ",
            shown.empty() ? absl::StrCat(layer.rate) : shown[0]));
      }
      return absl::OkStatus();
    case LayerKind::kFlatten:
    case LayerKind::kBatchNorm:
    case LayerKind::kLayerNorm:
    case LayerKind::kRelu:
    case LayerKind::kGelu:
    case LayerKind::kTanh:
    case LayerKind::kSigmoid:
    case LayerKind::kSoftmax:
    case LayerKind::kLogSoftmax:
      if (!layer.args.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(LayerName(index, layer.kind), " takes no arguments"));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("layer ", index + 1, " has an unknown kind"));
}

absl::StatusOr<LayerSpec> ParseLinear(std::optional<absl::string_view> argument, size_t index) {
  const std::string needs_width = absl::StrCat(LayerName(index, LayerKind::kLinear),
                                               " needs a positive output width, as in linear:64");
  if (!argument.has_value() || argument->empty()) return absl::InvalidArgumentError(needs_width);
  int64_t width = 0;
  const char* end = argument->data() + argument->size();
  const auto [ptr, ec] = std::from_chars(argument->data(), end, width);
  const bool all_digits = (*argument)[0] >= '0' && (*argument)[0] <= '9' && ptr == end;
  if (all_digits &&
      (ec == std::errc::result_out_of_range || (ec == std::errc() && width > kMaxLinearWidth))) {
    return absl::InvalidArgumentError(
        absl::StrCat(LayerName(index, LayerKind::kLinear), " output width ", *argument,
                     " is larger than the limit of ", kMaxLinearWidth));
  }
  if (!all_digits || ec != std::errc() || width < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(needs_width, "; got '", absl::CHexEscape(*argument), "'"));
  }
  LayerSpec layer;
  layer.kind = LayerKind::kLinear;
  layer.args = {width};
  return layer;
}

// conv2d:C:K[:stride[:padding]], maxpool2d:K, avgpool2d:K.
absl::StatusOr<LayerSpec> ParseIntegers(LayerKind kind, std::optional<absl::string_view> argument,
                                        size_t index) {
  const bool conv = kind == LayerKind::kConv2d;
  const std::string usage = conv ? Conv2dUsage(index) : PoolUsage(index, kind);
  if (!argument.has_value() || argument->empty()) return absl::InvalidArgumentError(usage);
  const std::string got = absl::StrCat(usage, "; got '", absl::CHexEscape(*argument), "'");
  const std::vector<absl::string_view> parts = absl::StrSplit(*argument, ':');
  const size_t min_args = conv ? 2 : 1;
  const size_t max_args = conv ? 4 : 1;
  if (parts.size() < min_args || parts.size() > max_args) return absl::InvalidArgumentError(got);

  LayerSpec layer;
  layer.kind = kind;
  std::vector<std::string> shown;
  for (absl::string_view part : parts) {
    part = absl::StripAsciiWhitespace(part);
    const std::optional<int64_t> value = ParseInteger(part);
    if (!value.has_value()) return absl::InvalidArgumentError(got);
    layer.args.push_back(*value);
    shown.emplace_back(part);
  }
  if (conv) {
    if (layer.args.size() < 3) layer.args.push_back(1);  // stride
    if (layer.args.size() < 4) layer.args.push_back(0);  // padding
  }
  TRAINERD_RETURN_IF_ERROR(CheckArguments(layer, index, shown));
  return layer;
}

absl::StatusOr<LayerSpec> ParseDropout(std::optional<absl::string_view> argument, size_t index) {
  const std::string usage = absl::StrCat(LayerName(index, LayerKind::kDropout),
                                         " needs a drop probability, as in dropout:0.5");
  if (!argument.has_value() || argument->empty()) return absl::InvalidArgumentError(usage);
  double rate = 0.0;
  const char* end = argument->data() + argument->size();
  const auto [ptr, ec] = std::from_chars(argument->data(), end, rate, std::chars_format::general);
  // Out of range (1e999, 1e-999) leaves `rate` unchanged: refused like any other non-number.
  if (ptr != end || ec != std::errc()) {
    return absl::InvalidArgumentError(
        absl::StrCat(usage, "; got '", absl::CHexEscape(*argument), "'"));
  }
  LayerSpec layer;
  layer.kind = LayerKind::kDropout;
  // "-0" reads as -0.0, which would print as "dropout:-0".
  layer.rate = rate == 0.0 ? 0.0 : rate;
  TRAINERD_RETURN_IF_ERROR(CheckArguments(layer, index, {std::string(*argument)}));
  return layer;
}

// Parses one trimmed, non-empty layer; `index` is 0-based.
absl::StatusOr<LayerSpec> ParseLayer(absl::string_view text, size_t index) {
  absl::string_view name = text;
  std::optional<absl::string_view> argument;
  if (const size_t colon = text.find(':'); colon != absl::string_view::npos) {
    name = absl::StripAsciiWhitespace(text.substr(0, colon));
    argument = absl::StripAsciiWhitespace(text.substr(colon + 1));
  }
  const std::optional<LayerKind> kind = KindFromName(absl::AsciiStrToLower(name));
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", index + 1, ": unknown layer '",
                                                   absl::CHexEscape(name),
                                                   "' (known: ", KnownLayers(), ")"));
  }
  switch (*kind) {
    case LayerKind::kLinear:
      return ParseLinear(argument, index);
    case LayerKind::kConv2d:
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d:
      return ParseIntegers(*kind, argument, index);
    case LayerKind::kDropout:
      return ParseDropout(argument, index);
    case LayerKind::kFlatten:
    case LayerKind::kBatchNorm:
    case LayerKind::kLayerNorm:
    case LayerKind::kRelu:
    case LayerKind::kGelu:
    case LayerKind::kTanh:
    case LayerKind::kSigmoid:
    case LayerKind::kSoftmax:
    case LayerKind::kLogSoftmax:
      break;
  }
  if (argument.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(LayerName(index, *kind), " takes no arguments"));
  }
  LayerSpec layer;
  layer.kind = *kind;
  return layer;
}

// The per-row output of one layer whose arguments passed CheckArguments.
absl::StatusOr<std::vector<int64_t>> LayerOutputShape(const LayerSpec& layer, size_t index,
                                                      const std::vector<int64_t>& shape) {
  const auto needs = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(LayerNameWithArgs(index, layer), " needs ", what,
                                                   "; the input is ", DescribeShape(shape)));
  };
  switch (layer.kind) {
    case LayerKind::kLinear: {
      if (shape.empty()) return needs("at least one input dimension");
      std::vector<int64_t> out = shape;
      out.back() = layer.args[0];
      return out;
    }
    case LayerKind::kConv2d:
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      if (shape.size() != 3) return needs("a per-row input of shape CxHxW");
      const bool conv = layer.kind == LayerKind::kConv2d;
      const int64_t kernel = layer.args[conv ? 1 : 0];
      const int64_t stride = conv ? (layer.args.size() > 2 ? layer.args[2] : 1) : kernel;
      const int64_t padding = conv && layer.args.size() > 3 ? layer.args[3] : 0;
      std::vector<int64_t> out = {conv ? layer.args[0] : shape[0], 0, 0};
      for (size_t d = 1; d < 3; ++d) {
        int64_t span = 0;  // H + 2 * padding; padding is at most kMaxWindow
        if (__builtin_add_overflow(shape[d], 2 * padding, &span) || span < kernel) {
          return absl::InvalidArgumentError(absl::StrCat(
              LayerNameWithArgs(index, layer), " would shrink ", ShapeText(shape), " below 1x1"));
        }
        out[d] = (span - kernel) / stride + 1;
      }
      return out;
    }
    case LayerKind::kFlatten: {
      if (shape.empty()) return needs("at least one input dimension");
      const absl::StatusOr<int64_t> size = CheckedShapeElements(shape, "the input");
      if (!size.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(LayerNameWithArgs(index, layer),
                                                       " cannot flatten ", ShapeText(shape),
                                                       ": too many values per row"));
      }
      return std::vector<int64_t>{*size};
    }
    case LayerKind::kBatchNorm:
      if (shape.size() != 1 && shape.size() != 3) {
        return needs("a per-row input of shape F (batchnorm 1d) or CxHxW (batchnorm 2d)");
      }
      return shape;
    case LayerKind::kLayerNorm:
      if (shape.empty()) return needs("at least one input dimension");
      return shape;
    case LayerKind::kSoftmax:
    case LayerKind::kLogSoftmax:
      if (shape.size() != 1) return needs("a per-row vector of class scores (shape N)");
      return shape;
    case LayerKind::kDropout:
    case LayerKind::kRelu:
    case LayerKind::kGelu:
    case LayerKind::kTanh:
    case LayerKind::kSigmoid:
      return shape;
  }
  return absl::InvalidArgumentError(absl::StrCat("layer ", index + 1, " has an unknown kind"));
}

}  // namespace

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kLinear:
      return "linear";
    case LayerKind::kConv2d:
      return "conv2d";
    case LayerKind::kMaxPool2d:
      return "maxpool2d";
    case LayerKind::kAvgPool2d:
      return "avgpool2d";
    case LayerKind::kFlatten:
      return "flatten";
    case LayerKind::kDropout:
      return "dropout";
    case LayerKind::kBatchNorm:
      return "batchnorm";
    case LayerKind::kLayerNorm:
      return "layernorm";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kGelu:
      return "gelu";
    case LayerKind::kTanh:
      return "tanh";
    case LayerKind::kSigmoid:
      return "sigmoid";
    case LayerKind::kSoftmax:
      return "softmax";
    case LayerKind::kLogSoftmax:
      return "logsoftmax";
  }
  return "unknown";
}

std::string LayerSpec::ToString() const {
  std::string text = LayerKindName(kind);
  if (kind == LayerKind::kDropout) {
    char buffer[32];  // the shortest round-trip form of a double fits in 24
    const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), rate);
    if (ec == std::errc()) absl::StrAppend(&text, ":", absl::string_view(buffer, end - buffer));
    return text;
  }
  size_t count = args.size();
  if (kind == LayerKind::kConv2d) {  // leave out padding 0, then stride 1
    if (count == 4 && args[3] == 0) --count;
    if (count == 3 && args[2] == 1) --count;
  }
  for (size_t i = 0; i < count; ++i) absl::StrAppend(&text, ":", args[i]);
  return text;
}

std::string ModelSpec::ToString() const {
  return absl::StrJoin(
      layers, ",", [](std::string* out, const LayerSpec& layer) { out->append(layer.ToString()); });
}

absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view std_text) {
  // Debian's Abseil has its own absl::string_view (not std::string_view): convert once.
  const absl::string_view text(std_text.data(), std_text.size());
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("the model spec is empty");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  if (parts.size() > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model spec has ", parts.size(), " layers; at most ", kMaxLayers, " are allowed"));
  }
  ModelSpec spec;
  for (size_t i = 0; i < parts.size(); ++i) {
    const absl::string_view part = absl::StripAsciiWhitespace(parts[i]);
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", i + 1, " is empty (layers are separated by single commas)"));
    }
    TRAINERD_ASSIGN_OR_RETURN(LayerSpec layer, ParseLayer(part, i));
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> InferLayerShapes(
    const ModelSpec& spec, const std::vector<int64_t>& input_shape) {
  for (int64_t dim : input_shape) {
    if (dim < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the input shape ", ShapeText(input_shape), " has a dimension below 1"));
    }
  }
  std::vector<std::vector<int64_t>> shapes = {input_shape};
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    TRAINERD_RETURN_IF_ERROR(CheckArguments(spec.layers[i], i));
    TRAINERD_ASSIGN_OR_RETURN(std::vector<int64_t> out,
                              LayerOutputShape(spec.layers[i], i, shapes.back()));
    shapes.push_back(std::move(out));
  }
  return shapes;
}

absl::StatusOr<std::vector<int64_t>> InferOutputShape(const ModelSpec& spec,
                                                      const std::vector<int64_t>& input_shape) {
  TRAINERD_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> shapes,
                            InferLayerShapes(spec, input_shape));
  return std::move(shapes.back());
}

absl::StatusOr<int64_t> CountParameters(const ModelSpec& spec,
                                        const std::vector<int64_t>& input_shape) {
  // Validates the spec against the shape once; the loop below then cannot fail on shapes.
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> shapes,
                            InferLayerShapes(spec, input_shape));
  const std::string what = absl::StrCat("the parameter count of '", spec.ToString(),
                                        "' for input shape ", ShapeText(input_shape));
  int64_t total = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    const std::vector<int64_t>& in = shapes[i];
    int64_t weights = 0;  // the layer's weight values
    int64_t biases = 0;   // and its other parameters
    switch (layer.kind) {
      case LayerKind::kLinear: {  // weight (N x in) plus bias (N)
        TRAINERD_ASSIGN_OR_RETURN(weights, CheckedMul(in.back(), layer.args[0], what));
        biases = layer.args[0];
        break;
      }
      case LayerKind::kConv2d: {  // weight (C x C_in x K x K) plus bias (C)
        TRAINERD_ASSIGN_OR_RETURN(
            const int64_t per_channel,
            CheckedShapeElements({in[0], layer.args[1], layer.args[1]}, what));
        TRAINERD_ASSIGN_OR_RETURN(weights, CheckedMul(per_channel, layer.args[0], what));
        biases = layer.args[0];
        break;
      }
      case LayerKind::kBatchNorm: {  // weight and bias per channel (feature)
        TRAINERD_ASSIGN_OR_RETURN(biases, CheckedMul(in[0], 2, what));
        break;
      }
      case LayerKind::kLayerNorm: {  // weight and bias per value of the row
        TRAINERD_ASSIGN_OR_RETURN(const int64_t values, CheckedShapeElements(in, what));
        TRAINERD_ASSIGN_OR_RETURN(biases, CheckedMul(values, 2, what));
        break;
      }
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d:
      case LayerKind::kFlatten:
      case LayerKind::kDropout:
      case LayerKind::kRelu:
      case LayerKind::kGelu:
      case LayerKind::kTanh:
      case LayerKind::kSigmoid:
      case LayerKind::kSoftmax:
      case LayerKind::kLogSoftmax:
        break;
    }
    TRAINERD_ASSIGN_OR_RETURN(total, CheckedAdd(total, weights, what));
    TRAINERD_ASSIGN_OR_RETURN(total, CheckedAdd(total, biases, what));
  }
  return total;
}

}  // namespace trainerd
