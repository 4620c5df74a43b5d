// Tests for server/engine/device.h: device names and what exists here.
#include "server/engine/devices/device.h"

#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

TEST(EngineDeviceTest, CpuResolvesToTheCpu) {
  absl::StatusOr<torch::Device> device = ResolveDevice("cpu");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_TRUE(device->is_cpu());
  EXPECT_EQ(DeviceName(*device), "cpu");
}

TEST(EngineDeviceTest, AutoIsTheFirstCudaDeviceElseTheCpu) {
  absl::StatusOr<torch::Device> device = ResolveDevice("auto");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(DeviceName(*device), torch::cuda::is_available() ? "cuda:0" : "cpu");
}

TEST(EngineDeviceTest, MalformedNamesAreInvalidArgument) {
  for (const char* name : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    absl::StatusOr<torch::Device> device = ResolveDevice(name);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument) << "'" << name << "'";
    EXPECT_THAT(device.status().message(), HasSubstr("use cpu, cuda or cuda:N")) << name;
  }
}

TEST(EngineDeviceTest, MissingCudaDeviceNamesTheAvailableOnes) {
  const int count = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const std::string name = "cuda:" + std::to_string(count);
  absl::StatusOr<torch::Device> device = ResolveDevice(name);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(device.status().message(), HasSubstr("available: cpu"));
}

TEST(EngineDeviceTest, AvailableDevicesStartWithTheCpu) {
  const std::vector<std::string> names = AvailableDeviceNames();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "cpu");
  EXPECT_EQ(names.size(), 1u + (torch::cuda::is_available() ? torch::cuda::device_count() : 0));
}

TEST(EngineDeviceTest, CudaDeviceNameCarriesItsIndex) {
  EXPECT_EQ(DeviceName(torch::Device(torch::kCUDA, 3)), "cuda:3");
  EXPECT_EQ(DeviceName(torch::Device(torch::kCUDA)), "cuda:0");
}

}  // namespace
}  // namespace trainerd::engine
