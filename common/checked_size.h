// The one place where trainerd multiplies and adds numbers that came from outside: shape products,
// value counts and byte sizes declared by upload headers, stored dataset files, NPY headers and
// model specs. Every function refuses negative inputs and turns an overflowing result into
// INVALID_ARGUMENT naming `what`, so that no caller ever does the arithmetic itself (and no
// declared size can wrap around into a small allocation).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainerd {

// a * b for a, b >= 0. INVALID_ARGUMENT "<what> is too large (a x b overflows a 64-bit count)"
// on overflow, "<what> is negative" for a negative operand.
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view what);

// a + b for a, b >= 0, with the same errors.
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, absl::string_view what);

// The product of the dimensions (1 for a scalar, 0 when a dimension is 0). A negative dimension
// or an overflowing product is INVALID_ARGUMENT naming `what` and the shape ("the feature shape
// 1x28x28").
absl::StatusOr<int64_t> CheckedShapeElements(const std::vector<int64_t>& shape,
                                             absl::string_view what);

// rows * prod(shape) * item_bytes: the bytes of `rows` rows of `shape`, each value item_bytes
// long. Errors as CheckedShapeElements, naming `what`.
absl::StatusOr<int64_t> CheckedByteSize(int64_t rows, const std::vector<int64_t>& shape,
                                        int64_t item_bytes, absl::string_view what);

}  // namespace trainerd
