// libFuzzer target: the safetensors check the daemon runs on the state_dict a worker process or a
// peer sends before it keeps and serves it. Any input must parse or fail with INVALID_ARGUMENT; a
// parsed file's tensors must lie back to back inside it with the bytes their dtype and shape say;
// writing it again (as the job manager does to stamp the job's id) must parse to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<trainerd::SafetensorsFile> file = trainerd::ParseSafetensors(bytes);
  if (!file.ok()) {
    if (file.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  int64_t end = -1;
  for (const trainerd::SafetensorsEntry& e : file->tensors) {
    if (e.offset < 8 || e.size < 0 || e.offset + e.size > static_cast<int64_t>(size)) std::abort();
    if (end >= 0 && e.offset != end) std::abort();
    end = e.offset + e.size;
  }
  if (end >= 0 && end != static_cast<int64_t>(size)) std::abort();
  const absl::StatusOr<std::string> stamped =
      trainerd::SetSafetensorsMetadata(bytes, "trainerd.job", "job-0123456789ab");
  if (!stamped.ok()) std::abort();
  const absl::StatusOr<trainerd::SafetensorsFile> again = trainerd::ParseSafetensors(*stamped);
  if (!again.ok() || again->tensors.size() != file->tensors.size()) std::abort();
  for (size_t i = 0; i < file->tensors.size(); ++i) {
    const trainerd::SafetensorsEntry& a = file->tensors[i];
    const trainerd::SafetensorsEntry& b = again->tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape ||
        bytes.substr(a.offset, a.size) != std::string_view(*stamped).substr(b.offset, b.size)) {
      std::abort();
    }
  }
  return 0;
}
