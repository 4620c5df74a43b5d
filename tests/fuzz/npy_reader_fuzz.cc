// libFuzzer target: the NPY reader trainctl runs on users' files, and the NPY-to-table
// conversion. Any input must parse or fail with INVALID_ARGUMENT; a parsed array's data must have
// the size its shape and dtype say; a table made from it must be consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "common/checked_size.h"
#include "common/npy_reader.h"
#include "common/table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const absl::StatusOr<trainerd::NpyArray> array = trainerd::ParseNpy(bytes);
  if (!array.ok()) {
    if (array.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const int64_t item = static_cast<int64_t>(trainerd::NpyItemSize(array->dtype));
  const absl::StatusOr<int64_t> expected =
      trainerd::CheckedByteSize(1, array->shape, item, "the array");
  if (!expected.ok() || *expected != static_cast<int64_t>(array->data.size())) std::abort();
  trainerd::NpyTableOptions options;
  options.target_columns = 1 + (data[0] & 0x3);
  options.target_dtype = (data[0] & 0x4) ? trainerd::TargetDType::kInt64
                                         : trainerd::TargetDType::kFloat32;
  // The array as features alone, and as its own targets.
  for (const bool with_targets : {false, true}) {
    const absl::StatusOr<trainerd::Table> table = trainerd::TableFromNpy(
        *array, with_targets ? std::optional<trainerd::NpyArray>(*array) : std::nullopt, options);
    if (table.ok() && !trainerd::ValidateTable(*table).ok()) std::abort();
    if (!table.ok() && table.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  }
  return 0;
}
