// Checked shape products and byte sizes (see checked_size.h).
#include "common/checked_size.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainerd {
namespace {

absl::Status Negative(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is negative"));
}

std::string Shape(const std::vector<int64_t>& shape) {
  return shape.empty() ? std::string("scalar") : absl::StrJoin(shape, "x");
}

}  // namespace

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view what) {
  if (a < 0 || b < 0) return Negative(what);
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is too large (", a, " x ", b, " overflows a 64-bit count)"));
  }
  return product;
}

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, absl::string_view what) {
  if (a < 0 || b < 0) return Negative(what);
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is too large (", a, " + ", b, " overflows a 64-bit count)"));
  }
  return sum;
}

absl::StatusOr<int64_t> CheckedShapeElements(const std::vector<int64_t>& shape,
                                             absl::string_view what) {
  int64_t product = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Shape(shape), " has a negative dimension"));
    }
    if (__builtin_mul_overflow(product, dim, &product)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Shape(shape), " has too many values (the product overflows)"));
    }
  }
  return product;
}

absl::StatusOr<int64_t> CheckedByteSize(int64_t rows, const std::vector<int64_t>& shape,
                                        int64_t item_bytes, absl::string_view what) {
  if (rows < 0 || item_bytes < 0) return Negative(what);
  absl::StatusOr<int64_t> per_row = CheckedShapeElements(shape, what);
  if (!per_row.ok()) return per_row.status();
  int64_t bytes = 0;
  if (__builtin_mul_overflow(*per_row, item_bytes, &bytes) ||
      __builtin_mul_overflow(bytes, rows, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Shape(shape), " x ", rows,
                                                   " rows is too large (the byte size overflows a "
                                                   "64-bit count)"));
  }
  return bytes;
}

}  // namespace trainerd
