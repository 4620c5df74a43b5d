// Parsing of the text model spec and per-row shape inference.
#include "common/model_spec.h"

#include <charconv>
#include <cstdint>
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
#include "common/status_macros.h"

namespace trainerd {
namespace {

constexpr size_t kMaxLayers = 64;
constexpr int64_t kMaxLinearWidth = 1048576;

std::optional<LayerKind> KindFromName(absl::string_view lower_name) {
  if (lower_name == "linear") return LayerKind::kLinear;
  if (lower_name == "relu") return LayerKind::kRelu;
  if (lower_name == "tanh") return LayerKind::kTanh;
  if (lower_name == "sigmoid") return LayerKind::kSigmoid;
  return std::nullopt;
}

// "layer 2 (linear)".
std::string LayerName(size_t index, LayerKind kind) {
  return absl::StrCat("layer ", index + 1, " (", LayerKindName(kind), ")");
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
                                                   "' (known: linear, relu, tanh, sigmoid)"));
  }

  LayerSpec layer;
  layer.kind = *kind;
  if (layer.kind != LayerKind::kLinear) {
    if (argument.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(LayerName(index, layer.kind), " takes no arguments"));
    }
    return layer;
  }

  const std::string needs_width =
      absl::StrCat(LayerName(index, layer.kind), " needs a positive output width, as in linear:64");
  if (!argument.has_value() || argument->empty()) return absl::InvalidArgumentError(needs_width);
  int64_t width = 0;
  const char* end = argument->data() + argument->size();
  const auto [ptr, ec] = std::from_chars(argument->data(), end, width);
  const bool all_digits = (*argument)[0] >= '0' && (*argument)[0] <= '9' && ptr == end;
  if (all_digits &&
      (ec == std::errc::result_out_of_range || (ec == std::errc() && width > kMaxLinearWidth))) {
    return absl::InvalidArgumentError(absl::StrCat(LayerName(index, layer.kind), " output width ",
                                                   *argument, " is larger than the limit of ",
                                                   kMaxLinearWidth));
  }
  if (!all_digits || ec != std::errc() || width < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(needs_width, "; got '", absl::CHexEscape(*argument), "'"));
  }
  layer.args = {width};
  return layer;
}

}  // namespace

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kLinear:
      return "linear";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kTanh:
      return "tanh";
    case LayerKind::kSigmoid:
      return "sigmoid";
  }
  return "unknown";
}

std::string LayerSpec::ToString() const {
  std::string text = LayerKindName(kind);
  for (int64_t arg : args) absl::StrAppend(&text, ":", arg);
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

absl::StatusOr<std::vector<int64_t>> InferOutputShape(const ModelSpec& spec,
                                                      const std::vector<int64_t>& input_shape) {
  for (int64_t dim : input_shape) {
    if (dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the input shape ", absl::StrJoin(input_shape, "x"), " has a dimension below 1"));
    }
  }
  std::vector<int64_t> shape = input_shape;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    if (layer.kind != LayerKind::kLinear) continue;
    if (layer.args.size() != 1 || layer.args[0] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          LayerName(i, layer.kind), " needs a positive output width, as in linear:64"));
    }
    if (shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          LayerName(i, layer.kind), " needs at least one input dimension; the input is a scalar"));
    }
    shape.back() = layer.args[0];
  }
  return shape;
}

absl::StatusOr<int64_t> CountParameters(const ModelSpec& spec,
                                        const std::vector<int64_t>& input_shape) {
  // Validates the spec against the shape once; the loop below then cannot fail on shapes.
  TRAINERD_RETURN_IF_ERROR(InferOutputShape(spec, input_shape).status());
  int64_t in_features = input_shape.empty() ? 0 : input_shape.back();
  int64_t total = 0;
  for (const LayerSpec& layer : spec.layers) {
    if (layer.kind != LayerKind::kLinear) continue;
    const int64_t out_features = layer.args[0];
    int64_t layer_parameters = 0;  // weight (out x in) plus bias (out)
    if (__builtin_mul_overflow(in_features, out_features, &layer_parameters) ||
        __builtin_add_overflow(layer_parameters, out_features, &layer_parameters) ||
        __builtin_add_overflow(total, layer_parameters, &total)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model '", spec.ToString(), "' has too many parameters to count for input shape ",
          absl::StrJoin(input_shape, "x")));
    }
    in_features = out_features;
  }
  return total;
}

}  // namespace trainerd
