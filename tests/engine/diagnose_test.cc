// Tests for server/engine/diagnose.h on the CPU, with small sizes so that they take well under a
// second. The CUDA path runs in engine_gpu_test's environment only (it needs a device).
#include "server/engine/devices/diagnose.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::MatchesRegex;
using ::testing::StartsWith;

bool PositiveFinite(double x) { return std::isfinite(x) && x > 0.0; }

DiagnoseOptions SmallOptions() {
  DiagnoseOptions options;
  options.matmul_size = 256;
  options.matmul_seconds = 0.05;
  options.copy_bytes = int64_t{4} << 20;
  options.launch_repeats = 500;
  return options;
}

TEST(DiagnoseDeviceTest, CpuFiguresAreSane) {
  int calls = 0;
  DiagnoseOptions options = SmallOptions();
  options.sample_during_matmul = [&calls](DeviceDiagnosis& d) {
    ++calls;
    EXPECT_EQ(d.device, "cpu");  // filled in before the products start
    d.utilization_during_matmul = 0.75;
  };
  const DeviceDiagnosis d = DiagnoseDevice(torch::Device(torch::kCPU), options);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(d.device, "cpu");
  EXPECT_FALSE(d.name.empty());
  EXPECT_GT(d.memory_total_bytes, int64_t{64} << 20);
  EXPECT_EQ(d.matmul_size, 256);
  // Measured figures: present and sane, never judged by how fast this machine is (that is for
  // `make bench`).
  EXPECT_TRUE(PositiveFinite(d.matmul_flops_per_second));
  EXPECT_TRUE(PositiveFinite(d.host_to_device_bytes_per_second));
  EXPECT_TRUE(PositiveFinite(d.launch_seconds));
  EXPECT_EQ(d.sync_seconds, 0.0);
  ASSERT_TRUE(d.utilization_during_matmul.has_value());  // what the callback set is kept
  EXPECT_EQ(*d.utilization_during_matmul, 0.75);
  EXPECT_FALSE(d.sm_activity_during_matmul.has_value());
}

// A measurement draws from a generator of its own: LibTorch's global one, from which jobs'
// initial weights come, is where it was before (two of 25 same-seed jobs once got other losses
// while Diagnose ran beside them).
TEST(DiagnoseDeviceTest, LeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(1234);
  const torch::Tensor expected = torch::randn({8});
  torch::manual_seed(1234);
  DiagnoseDevice(torch::Device(torch::kCPU), SmallOptions());
  EXPECT_TRUE(torch::equal(torch::randn({8}), expected));
}

TEST(DiagnoseDeviceTest, FixedRepeatsAndNoCallback) {
  DiagnoseOptions options = SmallOptions();
  options.matmul_size = 64;
  options.matmul_repeats = 1;  // the callback's "halfway" is before the only product
  int calls = 0;
  options.sample_during_matmul = [&calls](DeviceDiagnosis&) { ++calls; };
  EXPECT_TRUE(PositiveFinite(
      DiagnoseDevice(torch::Device(torch::kCPU), options).matmul_flops_per_second));
  EXPECT_EQ(calls, 1);

  options.sample_during_matmul = nullptr;
  EXPECT_TRUE(PositiveFinite(
      DiagnoseDevice(torch::Device(torch::kCPU), options).matmul_flops_per_second));
}

TEST(VersionsTest, LibTorchAndCuda) {
  EXPECT_THAT(LibTorchVersion(), StartsWith("2.11.0"));
  // The pinned wheel is a CUDA build ("13.0"); a CPU-only LibTorch gives "".
  const std::string cuda = CudaBuildVersion();
  if (!cuda.empty()) {
    EXPECT_THAT(cuda, MatchesRegex("[0-9]+\\.[0-9]+"));
  }
  std::cout << "CUDA build version: '" << cuda << "'\n";
}

}  // namespace
}  // namespace trainerd::engine
