// The conversions of .npy values into a table's payload (common/npy_reader.h): float32 features
// and float32 or int64 targets from any dtype the reader takes, with NaN, Inf, fractions and
// out-of-range values named by element. Split from npy_reader.cc, which parses the format.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/npy_reader.h"

namespace trainerd {
namespace {

// The NumPy index of flat element `flat` of an array of `shape`, e.g. "features[3, 1]".
std::string ElementName(const char* array_name, const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return absl::StrCat(array_name, "[", absl::StrJoin(index, ", "), "]");
}

absl::Status NotFinite(const char* name, const std::vector<int64_t>& shape, int64_t flat,
                       double value) {
  return absl::InvalidArgumentError(
      absl::StrCat(ElementName(name, shape, flat), ": ", value, " is not a finite number"));
}

template <typename T>
T LoadAt(const char* in, int64_t i) {
  T value;
  std::memcpy(&value, in + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return value;
}

template <typename T>
void StoreAt(char* out, int64_t i, T value) {
  std::memcpy(out + i * static_cast<int64_t>(sizeof(T)), &value, sizeof(T));
}

// Converts `count` integer values of type `From` at `in` to `To` at `out` (no checks).
template <typename From, typename To>
void ConvertIntegers(const char* in, int64_t count, char* out) {
  for (int64_t i = 0; i < count; ++i) {
    StoreAt(out, i, static_cast<To>(LoadAt<From>(in, i)));
  }
}

// Calls fn(T{}) with T the C++ type of integer `dtype` (bool as uint8: NumPy
// stores it as one byte, 0 or 1).
template <typename Fn>
void WithIntegerType(NpyDType dtype, Fn&& fn) {
  switch (dtype) {
    case NpyDType::kInt64:
      return fn(int64_t{});
    case NpyDType::kInt32:
      return fn(int32_t{});
    case NpyDType::kInt16:
      return fn(int16_t{});
    case NpyDType::kInt8:
      return fn(int8_t{});
    case NpyDType::kUInt64:
      return fn(uint64_t{});
    case NpyDType::kUInt32:
      return fn(uint32_t{});
    case NpyDType::kUInt16:
      return fn(uint16_t{});
    case NpyDType::kUInt8:
    case NpyDType::kBool:
      return fn(uint8_t{});
    case NpyDType::kFloat32:
    case NpyDType::kFloat64:
      return;
  }
}

// Whether the `count` float32 values at `values` are all finite: none has an exponent of all
// ones (Inf or NaN). No branch per value, so that compilers vectorize it.
bool AllFinite(const char* values, int64_t count) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t bits = LoadAt<uint32_t>(values, i);
    bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return bad == 0;
}

}  // namespace

const char* NpyDTypeName(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat32:
      return "float32";
    case NpyDType::kFloat64:
      return "float64";
    case NpyDType::kInt64:
      return "int64";
    case NpyDType::kInt32:
      return "int32";
    case NpyDType::kInt16:
      return "int16";
    case NpyDType::kInt8:
      return "int8";
    case NpyDType::kUInt64:
      return "uint64";
    case NpyDType::kUInt32:
      return "uint32";
    case NpyDType::kUInt16:
      return "uint16";
    case NpyDType::kUInt8:
      return "uint8";
    case NpyDType::kBool:
      return "bool";
  }
  return "unknown";
}

bool NpyIsInteger(NpyDType dtype) {
  return dtype != NpyDType::kFloat32 && dtype != NpyDType::kFloat64;
}

size_t NpyItemSize(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat64:
    case NpyDType::kInt64:
    case NpyDType::kUInt64:
      return 8;
    case NpyDType::kFloat32:
    case NpyDType::kInt32:
    case NpyDType::kUInt32:
      return 4;
    case NpyDType::kInt16:
    case NpyDType::kUInt16:
      return 2;
    case NpyDType::kInt8:
    case NpyDType::kUInt8:
    case NpyDType::kBool:
      return 1;
  }
  return 8;
}

absl::Status NpyValuesToFloat32(NpyDType from, const char* in, int64_t count, char* out,
                                const char* name, const std::vector<int64_t>& shape,
                                int64_t first) {
  // Floats are converted (or copied) first and checked after, in loops without a branch per
  // value that compilers vectorize; only a block with a bad value is gone through again, value by
  // value, for the first one and its message. A float64 that is NaN, Inf or beyond float32's
  // range gives a float32 that is not finite, so checking the float32 values covers them all.
  switch (from) {
    case NpyDType::kFloat32:
      if (count > 0) std::memcpy(out, in, static_cast<size_t>(count) * sizeof(float));
      if (AllFinite(out, count)) return absl::OkStatus();
      for (int64_t i = 0; i < count; ++i) {
        const float value = LoadAt<float>(in, i);
        if (!std::isfinite(value)) return NotFinite(name, shape, first + i, value);
      }
      break;
    case NpyDType::kFloat64:
      for (int64_t i = 0; i < count; ++i) {
        StoreAt(out, i, static_cast<float>(LoadAt<double>(in, i)));
      }
      if (AllFinite(out, count)) return absl::OkStatus();
      for (int64_t i = 0; i < count; ++i) {
        const double wide = LoadAt<double>(in, i);
        if (!std::isfinite(wide)) return NotFinite(name, shape, first + i, wide);
        const float value = static_cast<float>(wide);
        if (!std::isfinite(value)) {
          return absl::InvalidArgumentError(absl::StrCat(ElementName(name, shape, first + i), ": ",
                                                         wide, " is out of range for float32"));
        }
      }
      break;
    default:
      // Integers (and bool): every value has a float32, rounded to 24 bits beyond 2^24.
      WithIntegerType(from,
                      [&](auto type) { ConvertIntegers<decltype(type), float>(in, count, out); });
      break;
  }
  return absl::OkStatus();
}

absl::Status NpyValuesToInt64(NpyDType from, const char* in, int64_t count, char* out,
                              const char* name, const std::vector<int64_t>& shape, int64_t first) {
  if (from == NpyDType::kInt64) {
    if (count > 0) std::memcpy(out, in, static_cast<size_t>(count) * sizeof(int64_t));
    return absl::OkStatus();
  }
  if (from == NpyDType::kUInt64) {
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t value = LoadAt<uint64_t>(in, i);
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(ElementName(name, shape, first + i), ": ",
                                                       value, " is out of range for int64"));
      }
      StoreAt(out, i, static_cast<int64_t>(value));
    }
    return absl::OkStatus();
  }
  if (NpyIsInteger(from)) {
    // Every value of the narrower integers (and bool) is an int64.
    WithIntegerType(from,
                    [&](auto type) { ConvertIntegers<decltype(type), int64_t>(in, count, out); });
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < count; ++i) {
    const double value = from == NpyDType::kFloat32 ? LoadAt<float>(in, i) : LoadAt<double>(in, i);
    if (!std::isfinite(value)) return NotFinite(name, shape, first + i, value);
    if (value != std::trunc(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ElementName(name, shape, first + i), ": ", value,
                       " is not an integer (int64 targets are class indices)"));
    }
    // [-2^63, 2^63): both bounds are exact doubles.
    if (value < -9223372036854775808.0 || value >= 9223372036854775808.0) {
      return absl::InvalidArgumentError(absl::StrCat(ElementName(name, shape, first + i), ": ",
                                                     value, " is out of range for int64"));
    }
    StoreAt(out, i, static_cast<int64_t>(value));
  }
  return absl::OkStatus();
}

}  // namespace trainerd
