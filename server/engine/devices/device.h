// Device names and availability: "cpu", "cuda", "cuda:N", and the daemon's "auto".
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd::engine {

// Parses and checks that the device exists here. "auto" means the first CUDA device LibTorch
// sees, otherwise the CPU; "cuda" means cuda:0. INVALID_ARGUMENT for malformed names or devices
// that are not present, naming the devices that are.
absl::StatusOr<torch::Device> ResolveDevice(const std::string& text);

// "cpu" or "cuda:N".
std::string DeviceName(const torch::Device& device);

// Every device a job may use: "cpu" and each CUDA device.
std::vector<std::string> AvailableDeviceNames();

// Bytes copied from the host to a device, process-wide (datasets made resident on a GPU, jobs
// whose dataset lives on another device). Thread-safe; a relaxed atomic, read by the metrics.
void CountHostToDeviceBytes(int64_t bytes);

// A CUDA device's caching-allocator figures (0 on the CPU): bytes allocated now, and the peak
// since the last ResetPeakMemory. Thread-safe (LibTorch's allocator statistics).
int64_t AllocatedBytes(const torch::Device& device);
int64_t PeakAllocatedBytes(const torch::Device& device);
void ResetPeakMemory(const torch::Device& device);
int64_t HostToDeviceBytesTotal();

// The device's memory in bytes: a CUDA device's global memory, or the host's physical memory for
// the CPU (what a percentage --device_memory_budget is of).
int64_t DeviceTotalMemory(const torch::Device& device);
// Gives a CUDA device's cached, unused blocks back to the driver (after a job ran out of memory,
// so that the next job starts from a clean slate); nothing on the CPU.
void ReleaseCachedMemory(const torch::Device& device);

}  // namespace trainerd::engine
