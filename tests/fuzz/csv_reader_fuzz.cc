// libFuzzer target: the CSV reader trainctl runs on users' files. Any input must parse or fail
// with INVALID_ARGUMENT, and a parsed table must be consistent (ValidateTable) and encodable; its
// layout (InspectCsv) is read without a crash and within its own bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/csv_reader.h"
#include "common/table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the options, the rest is the file.
  trainerd::CsvOptions options;
  options.target_columns = 1 + (data[0] & 0x3);
  options.target_dtype = (data[0] & 0x4) ? trainerd::TargetDType::kInt64
                                         : trainerd::TargetDType::kFloat32;
  options.skip_first_column = (data[0] & 0x8) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const trainerd::CsvLayout layout = trainerd::InspectCsv(text);
  if (layout.rows < 0 || layout.labels.size() > 9 || (layout.index_column && layout.rows == 0)) {
    std::abort();
  }
  const absl::StatusOr<trainerd::Table> table = trainerd::ParseCsv(text, options);
  if (!table.ok()) {
    if (table.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (!trainerd::ValidateTable(*table).ok()) std::abort();
  (void)trainerd::EncodePayload(*table);
  return 0;
}
