// libFuzzer target: the checks of an upload's header (and of a stored dataset file's), which run
// before the daemon allocates anything. Sizes must be exact or refused: an accepted header's
// layout is checked against 128-bit arithmetic.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/dataset_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  trainerd::DatasetHeader header;
  header.name = input.ConsumeRandomLengthString(160);
  const int feature_rank = input.ConsumeIntegralInRange<int>(0, 10);
  for (int i = 0; i < feature_rank; ++i) header.feature_shape.push_back(input.ConsumeIntegral<int64_t>());
  const int target_rank = input.ConsumeIntegralInRange<int>(0, 10);
  for (int i = 0; i < target_rank; ++i) header.target_shape.push_back(input.ConsumeIntegral<int64_t>());
  header.target_dtype = input.ConsumeBool() ? trainerd::TargetDType::kInt64
                                            : trainerd::TargetDType::kFloat32;
  header.rows = input.ConsumeIntegral<int64_t>();
  header.sha256 = input.ConsumeRandomLengthString(70);
  const int64_t limit = input.ConsumeIntegral<int64_t>();
  const absl::StatusOr<trainerd::DatasetLayout> layout =
      trainerd::CheckDatasetHeader(header, limit < 0 ? 0 : limit);
  if (!layout.ok()) {
    const absl::StatusCode code = layout.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kResourceExhausted) {
      std::abort();
    }
    return 0;
  }
  __int128 features = header.rows * static_cast<__int128>(4);
  for (int64_t d : header.feature_shape) features *= d;
  __int128 targets = header.rows * static_cast<__int128>(trainerd::TargetItemBytes(header.target_dtype));
  for (int64_t d : header.target_shape) targets *= d;
  if (features != layout->feature_bytes || targets != layout->target_bytes ||
      features + targets != layout->total_bytes || layout->total_bytes <= 0) {
    std::abort();
  }
  if (limit > 0 && layout->total_bytes > limit) std::abort();
  return 0;
}
