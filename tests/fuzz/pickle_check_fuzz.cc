// libFuzzer target: the check of TorchScript pickles (server/engine/pickle_check.h). The input is
// the pickle itself; the archive around it holds storage records "0" to "9" of fixed byte sizes
// (those of the "views" seed, whose nine storages cover shared, empty and scalar tensors), so that
// inputs derived from the seeds reach the tensor checks. The check must never crash, and refuse
// only with INVALID_ARGUMENT or PERMISSION_DENIED in a message that starts with the record's name.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "absl/strings/match.h"
#include "server/engine/torchscript/pickle_check.h"

namespace {

// data/0 ... data/8 of the "views" fixture (tests/engine/testdata/records.txt), and one more.
constexpr int64_t kRecordBytes[] = {48, 0, 4, 2, 4, 8, 4, 4, 8, 12};

std::optional<int64_t> RecordBytes(std::string_view key) {
  if (key.size() == 1 && key[0] >= '0' && key[0] <= '9') return kRecordBytes[key[0] - '0'];
  return std::nullopt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view pickle(reinterpret_cast<const char*>(data), size);
  const absl::Status status =
      trainerd::engine::CheckTorchScriptPickle(pickle, "data.pkl", RecordBytes);
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kInvalidArgument &&
        status.code() != absl::StatusCode::kPermissionDenied) {
      std::abort();
    }
    if (!absl::StartsWith(status.message(), "data.pkl: ")) std::abort();
  }
  return 0;
}
