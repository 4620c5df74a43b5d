// Device names and availability: "cpu", "cuda", "cuda:N", and the daemon's "auto".
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include <torch/torch.h>

namespace trainerd::engine {

// Parses and checks that the device exists here. "auto" means the first CUDA device LibTorch
// sees, otherwise the CPU; "cuda" means cuda:0. INVALID_ARGUMENT for malformed names or devices
// that are not present, naming the devices that are.
absl::StatusOr<torch::Device> ResolveDevice(const std::string& text);

// "cpu" or "cuda:N".
std::string DeviceName(const torch::Device& device);

// Every device a job may use: "cpu" and each CUDA device.
std::vector<std::string> AvailableDeviceNames();

}  // namespace trainerd::engine
