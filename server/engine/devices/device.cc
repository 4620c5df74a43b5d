#include "server/engine/devices/device.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
        "device '", text,
        "' is not available here; available: ", absl::StrJoin(AvailableDeviceNames(), ", ")));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

namespace {
std::atomic<int64_t> host_to_device_bytes{0};
}  // namespace

void CountHostToDeviceBytes(int64_t bytes) {
  host_to_device_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

int64_t HostToDeviceBytesTotal() { return host_to_device_bytes.load(std::memory_order_relaxed); }

namespace {
const c10::CachingDeviceAllocator::Stat& AggregateAllocated(
    const c10::CachingDeviceAllocator::DeviceStats& stats) {
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace

int64_t DeviceTotalMemory(const torch::Device& device) {
  if (device.is_cuda()) {
    return static_cast<int64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

void ReleaseCachedMemory(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
}

int64_t AllocatedBytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  return AggregateAllocated(c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()))
      .current;
}

int64_t PeakAllocatedBytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  return AggregateAllocated(c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())).peak;
}

void ResetPeakMemory(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

}  // namespace trainerd::engine
