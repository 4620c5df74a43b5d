#include "server/engine/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"

namespace trainerd::engine {

std::string DeviceName(const torch::Device& device) {
  if (device.is_cuda()) return absl::StrCat("cuda:", device.has_index() ? device.index() : 0);
  return "cpu";
}

std::vector<std::string> AvailableDeviceNames() {
  std::vector<std::string> names = {"cpu"};
  const int count = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int i = 0; i < count; ++i) names.push_back(absl::StrCat("cuda:", i));
  return names;
}

absl::StatusOr<torch::Device> ResolveDevice(const std::string& text) {
  const bool has_cuda = torch::cuda::is_available();
  const int count = has_cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (text == "auto") {
    return count > 0 ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  }
  if (text == "cpu") return torch::Device(torch::kCPU);
  int index = -1;
  if (text == "cuda") {
    index = 0;
  } else if (absl::StartsWith(text, "cuda:")) {
    if (!absl::SimpleAtoi(text.substr(5), &index) || index < 0) index = -2;
  } else {
    index = -2;
  }
  if (index == -2) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", text, "' is not a device name: use cpu, cuda or cuda:N"));
  }
  if (index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device '", text, "' is not available here; available: ",
        absl::StrJoin(AvailableDeviceNames(), ", ")));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace trainerd::engine
