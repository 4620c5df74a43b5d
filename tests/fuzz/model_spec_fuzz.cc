// libFuzzer target: the model-spec parser (trainctl and trainerd both run it on users' text), and
// what trainerd computes from a parsed spec for a declared row shape: the shapes through the
// model, the parameter count and the memory estimate. Nothing may crash or overflow; a parsed
// spec's canonical text must parse back to the same text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/job_limits.h"
#include "common/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Up to the first NUL: the spec; after it, up to four dimensions of 8 bytes each.
  const char* text = reinterpret_cast<const char*>(data);
  const size_t text_size = strnlen(text, size);
  const absl::StatusOr<trainerd::ModelSpec> spec =
      trainerd::ParseModelSpec(std::string_view(text, text_size));
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string canonical = spec->ToString();
  const absl::StatusOr<trainerd::ModelSpec> again = trainerd::ParseModelSpec(canonical);
  if (!again.ok() || again->ToString() != canonical) std::abort();
  std::vector<int64_t> shape;
  for (size_t at = text_size + 1; at + 8 <= size && shape.size() < 4; at += 8) {
    int64_t dim = 0;
    std::memcpy(&dim, data + at, 8);
    shape.push_back(dim);
  }
  if (shape.empty()) shape = {4};
  const auto shapes = trainerd::InferLayerShapes(*spec, shape);
  const auto parameters = trainerd::CountParameters(*spec, shape);
  const auto memory = trainerd::EstimateTrainingMemory(*spec, shape, /*batch=*/64, 2);
  // They agree on whether the spec fits the shape.
  if (shapes.ok() != parameters.ok() && shapes.ok()) {
    // CountParameters may still overflow where the shapes fit; it must then say so.
    if (parameters.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  }
  if (memory.ok() && (memory->total_bytes < 0 || memory->parameters != *parameters)) std::abort();
  if (memory.ok()) (void)trainerd::CheckModelSize(*memory, canonical);
  return 0;
}
