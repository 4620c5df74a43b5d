// A random search's members drawn from its space (SubmitSweepRequest.search): each a SweepPoint
// whose spec holds the drawn values and whose fields name their paths, as a caller's own points
// would. Every bound is checked before anything is drawn.
#include <google/protobuf/util/field_mask_util.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/safe_text.h"
#include "common/status_macros.h"
#include "server/convert/convert.h"

namespace trainerd::convert {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A choice's text (a model spec, a name, a number) is at most this long: every member drawn may
// copy it.
constexpr size_t kMaxChoiceBytes = 4096;

// A uniform double in [0, 1) from 53 bits of the generator: the same on every platform, which
// std::uniform_real_distribution does not promise.
double Unit(std::mt19937_64& generator) {
  return static_cast<double>(generator() >> 11) * (1.0 / 9007199254740992.0);
}

// The leaf field a path names, and the message in `spec` that holds it (created on the way).
struct Leaf {
  Message* message = nullptr;
  const FieldDescriptor* field = nullptr;
};

absl::StatusOr<Leaf> LeafOf(v1::JobSpec* spec, const std::string& path) {
  std::vector<const FieldDescriptor*> fields;
  if (!google::protobuf::util::FieldMaskUtil::GetFieldDescriptors(v1::JobSpec::descriptor(), path,
                                                                  &fields) ||
      fields.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", EscapeControls(absl::string_view(path).substr(0, 64)), "' names no field of JobSpec"));
  }
  Message* message = spec;
  for (size_t i = 0; i + 1 < fields.size(); ++i) {
    message = message->GetReflection()->MutableMessage(message, fields[i]);
  }
  const FieldDescriptor* leaf = fields.back();
  if (leaf->is_repeated() || leaf->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not a single value (a list or a message): search its fields"));
  }
  return Leaf{message, leaf};
}

bool IsFloating(const FieldDescriptor* field) {
  return field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ||
         field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT;
}

bool IsInteger(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return true;
    default:
      return false;
  }
}

void SetDouble(const Leaf& leaf, double value) {
  const Reflection* r = leaf.message->GetReflection();
  if (leaf.field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
    r->SetFloat(leaf.message, leaf.field, static_cast<float>(value));
  } else {
    r->SetDouble(leaf.message, leaf.field, value);
  }
}

// An integer into the field; INVALID_ARGUMENT when its type cannot hold it.
absl::Status SetInteger(const Leaf& leaf, int64_t value, const std::string& path) {
  const Reflection* r = leaf.message->GetReflection();
  const auto out_of_range = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("search: ", value, " does not fit field '", path, "'"));
  };
  switch (leaf.field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      if (value < std::numeric_limits<int32_t>::min() ||
          value > std::numeric_limits<int32_t>::max()) {
        return out_of_range();
      }
      r->SetInt32(leaf.message, leaf.field, static_cast<int32_t>(value));
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(leaf.message, leaf.field, value);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_UINT32:
      if (value < 0 || value > std::numeric_limits<uint32_t>::max()) return out_of_range();
      r->SetUInt32(leaf.message, leaf.field, static_cast<uint32_t>(value));
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_UINT64:
      if (value < 0) return out_of_range();
      r->SetUInt64(leaf.message, leaf.field, static_cast<uint64_t>(value));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not an integer field"));
  }
}

// A choice's text into the field, parsed by its type.
absl::Status SetFromText(const Leaf& leaf, const std::string& text, const std::string& path) {
  const Reflection* r = leaf.message->GetReflection();
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("search: choice '", EscapeControls(absl::string_view(text).substr(0, 64)),
                     "' of '", path, "' is not ", what));
  };
  if (IsFloating(leaf.field)) {
    double value = 0;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) return bad("a number");
    SetDouble(leaf, value);
    return absl::OkStatus();
  }
  if (IsInteger(leaf.field)) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(text, &value)) return bad("a whole number");
    return SetInteger(leaf, value, path);
  }
  switch (leaf.field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(leaf.message, leaf.field, text);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool value = false;
      if (!absl::SimpleAtob(text, &value)) return bad("true or false");
      r->SetBool(leaf.message, leaf.field, value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      // The value's full name (OPTIMIZER_KIND_ADAM) or its last part (adam), in any case.
      const std::string upper = absl::AsciiStrToUpper(text);
      const google::protobuf::EnumDescriptor* type = leaf.field->enum_type();
      for (int i = 0; i < type->value_count(); ++i) {
        const std::string& name = type->value(i)->name();
        if (type->value(i)->number() != 0 &&
            (name == upper || absl::EndsWith(name, absl::StrCat("_", upper)))) {
          r->SetEnum(leaf.message, leaf.field, type->value(i));
          return absl::OkStatus();
        }
      }
      return bad(absl::StrCat("a value of ", type->name()));
    }
    default:
      return bad("a value of this field");
  }
}

}  // namespace

absl::StatusOr<std::vector<v1::SweepPoint>> SamplePoints(const v1::SearchSpace& space) {
  if (space.trials() < 1 || space.trials() > engine::kMaxSweepMembers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "search: trials must be 1 to ", engine::kMaxSweepMembers, "; got ", space.trials()));
  }
  if (space.parameters_size() < 1 || space.parameters_size() > kMaxSearchParameters) {
    return absl::InvalidArgumentError(absl::StrCat("search: give 1 to ", kMaxSearchParameters,
                                                   " parameters; got ", space.parameters_size()));
  }
  // Every parameter checked before anything is drawn.
  v1::JobSpec probe;
  std::vector<std::string> seen;
  for (const v1::SearchParameter& parameter : space.parameters()) {
    const std::string& path = parameter.field();
    if (std::find(seen.begin(), seen.end(), path) != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("search: '", EscapeControls(absl::string_view(path).substr(0, 64)),
                       "' is searched twice"));
    }
    seen.push_back(path);
    absl::StatusOr<Leaf> leaf = LeafOf(&probe, path);
    if (!leaf.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("search: ", leaf.status().message()));
    }
    const std::string where = absl::StrCat("search: '", path, "': ");
    switch (parameter.distribution_case()) {
      case v1::SearchParameter::kUniform:
      case v1::SearchParameter::kLogUniform: {
        const v1::Range& range =
            parameter.has_uniform() ? parameter.uniform() : parameter.log_uniform();
        if (!IsFloating(leaf->field)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "a uniform draw needs a floating-point field"));
        }
        if (!std::isfinite(range.low()) || !std::isfinite(range.high()) ||
            !std::isfinite(range.high() - range.low()) || !(range.low() < range.high()) ||
            (parameter.has_log_uniform() && !(range.low() > 0))) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "the range needs finite low < high",
                           parameter.has_log_uniform() ? ", low > 0" : "", "; got [", range.low(),
                           ", ", range.high(), "]"));
        }
        break;
      }
      case v1::SearchParameter::kInteger: {
        const v1::IntegerRange& range = parameter.integer();
        if (!IsInteger(leaf->field)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "an integer draw needs an integer field"));
        }
        // Both within 2^52 before they are subtracted or made doubles.
        constexpr int64_t kMost = int64_t{1} << 52;
        if (range.low() < -kMost || range.high() > kMost || range.low() > range.high() ||
            (range.log() && range.low() < 1)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "the range needs low <= high", range.log() ? ", low >= 1" : "",
                           " within 2^52; got [", range.low(), ", ", range.high(), "]"));
        }
        break;
      }
      case v1::SearchParameter::kChoice: {
        const v1::Choices& choices = parameter.choice();
        if (choices.values_size() < 1 || choices.values_size() > engine::kMaxSweepMembers) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "give 1 to ", engine::kMaxSweepMembers, " choices"));
        }
        for (const std::string& value : choices.values()) {
          if (value.size() > kMaxChoiceBytes) {
            return absl::InvalidArgumentError(absl::StrCat(where, "a choice has ", value.size(),
                                                           " bytes; at most ", kMaxChoiceBytes));
          }
          TRAINERD_RETURN_IF_ERROR(SetFromText(*leaf, value, path));
        }
        break;
      }
      case v1::SearchParameter::DISTRIBUTION_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat(where, "give a distribution: uniform, log_uniform, integer or choice"));
    }
  }
  std::mt19937_64 generator(space.seed());
  std::vector<v1::SweepPoint> points;
  points.reserve(static_cast<size_t>(space.trials()));
  for (int32_t trial = 0; trial < space.trials(); ++trial) {
    v1::SweepPoint& point = points.emplace_back();
    for (const v1::SearchParameter& parameter : space.parameters()) {
      const std::string& path = parameter.field();
      TRAINERD_ASSIGN_OR_RETURN(const Leaf leaf, LeafOf(point.mutable_spec(), path));
      const double u = Unit(generator);
      switch (parameter.distribution_case()) {
        case v1::SearchParameter::kUniform: {
          const v1::Range& r = parameter.uniform();
          SetDouble(leaf, r.low() + (r.high() - r.low()) * u);
          break;
        }
        case v1::SearchParameter::kLogUniform: {
          const v1::Range& r = parameter.log_uniform();
          SetDouble(leaf,
                    std::exp(std::log(r.low()) + (std::log(r.high()) - std::log(r.low())) * u));
          break;
        }
        case v1::SearchParameter::kInteger: {
          const v1::IntegerRange& r = parameter.integer();
          double drawn = 0;
          if (r.log()) {
            const double low = std::log(static_cast<double>(r.low()) - 0.5);
            const double high = std::log(static_cast<double>(r.high()) + 0.5);
            drawn = std::round(std::exp(low + (high - low) * u));
          } else {
            drawn = std::floor(static_cast<double>(r.low()) +
                               static_cast<double>(r.high() - r.low() + 1) * u);
          }
          const int64_t value = std::clamp(static_cast<int64_t>(drawn), r.low(), r.high());
          TRAINERD_RETURN_IF_ERROR(SetInteger(leaf, value, path));
          break;
        }
        case v1::SearchParameter::kChoice: {
          const v1::Choices& c = parameter.choice();
          const int index = std::min(c.values_size() - 1, static_cast<int>(u * c.values_size()));
          TRAINERD_RETURN_IF_ERROR(SetFromText(leaf, c.values(index), path));
          break;
        }
        case v1::SearchParameter::DISTRIBUTION_NOT_SET:
          break;
      }
      point.mutable_fields()->add_paths(path);
    }
  }
  return points;
}

}  // namespace trainerd::convert
