#include "server/monitor/sampler.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/monitor/fake_nvml_control.h"

namespace trainerd::monitor {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kGiB = int64_t{1} << 30;

// Sampling driven by SampleNow(): the thread is not started and GPM may use any interval.
DeviceSampler::Options FakeOptions(std::optional<std::string> cuda_visible_devices = std::nullopt) {
  DeviceSampler::Options options;
  options.nvml_library = FAKE_NVML_PATH;
  options.gpm_min_interval = absl::ZeroDuration();
  options.cuda_visible_devices = std::move(cuda_visible_devices);
  return options;
}

std::vector<std::string> DeviceNames(const std::vector<DeviceReading>& readings) {
  std::vector<std::string> names;
  for (const DeviceReading& reading : readings) names.push_back(reading.device);
  return names;
}

TEST(DeviceSamplerTest, SamplesTheFakeGpusAndTheCpu) {
  FakeNvmlControl fake;
  DeviceSampler sampler(FakeOptions());
  ASSERT_TRUE(sampler.has_nvml()) << sampler.nvml_status();
  EXPECT_EQ(sampler.driver_version(), "999.99.99");
  EXPECT_THAT(sampler.Latest(), testing::IsEmpty());
  sampler.SampleNow();
  sampler.SampleNow();

  const std::vector<DeviceReading> latest = sampler.Latest();
  EXPECT_THAT(DeviceNames(latest), ElementsAre("cpu", "cuda:0", "cuda:1"));

  std::optional<DeviceReading> gpu0 = sampler.Latest("cuda:0");
  ASSERT_TRUE(gpu0.has_value());
  EXPECT_EQ(gpu0->name, "Fake GPU 0");
  EXPECT_EQ(gpu0->uuid, "GPU-fake-0000-0000-0000-000000000000");
  EXPECT_DOUBLE_EQ(gpu0->utilization.value_or(-1), 0.37);
  EXPECT_EQ(gpu0->memory_used_bytes, 1 * kGiB);
  EXPECT_EQ(gpu0->memory_total_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(gpu0->power_watts.value_or(-1), 123.456);
  EXPECT_DOUBLE_EQ(gpu0->temperature_celsius.value_or(-1), 55.0);
  EXPECT_DOUBLE_EQ(gpu0->sm_activity.value_or(-1), 0.425);
  EXPECT_NE(gpu0->time, absl::InfinitePast());

  std::optional<DeviceReading> gpu1 = sampler.Latest("cuda:1");
  ASSERT_TRUE(gpu1.has_value());
  EXPECT_EQ(gpu1->name, "Fake GPU 1");
  EXPECT_DOUBLE_EQ(gpu1->utilization.value_or(-1), 0.8);
  EXPECT_FALSE(gpu1->sm_activity.has_value());

  std::optional<DeviceReading> cpu = sampler.Latest("cpu");
  ASSERT_TRUE(cpu.has_value());
  EXPECT_FALSE(cpu->name.empty());
  EXPECT_TRUE(cpu->uuid.empty());
  EXPECT_GT(cpu->memory_used_bytes, 0);
  EXPECT_GT(cpu->memory_total_bytes, cpu->memory_used_bytes);
  EXPECT_FALSE(cpu->sm_activity.has_value());
  if (cpu->utilization.has_value()) {
    EXPECT_GE(*cpu->utilization, 0.0);
    EXPECT_LE(*cpu->utilization, 1.0);
  }
  EXPECT_FALSE(sampler.Latest("cuda:2").has_value());
}

TEST(DeviceSamplerTest, CudaVisibleDevicesRenumbersGpus) {
  FakeNvmlControl fake;
  DeviceSampler sampler(FakeOptions("GPU-fake-1"));
  sampler.SampleNow();
  EXPECT_THAT(DeviceNames(sampler.Latest()), ElementsAre("cpu", "cuda:0"));
  EXPECT_EQ(sampler.Latest("cuda:0")->name, "Fake GPU 1");
}

TEST(DeviceSamplerTest, WindowAveragesAndPeaksItsSamples) {
  FakeNvmlControl fake;
  DeviceSampler sampler(FakeOptions());
  sampler.SampleNow();  // before the window: not counted

  fake.SetUtilization(0, 20);
  const int64_t window = sampler.BeginWindow("cuda:0");  // samples 20%
  const int64_t other = sampler.BeginWindow("cuda:1");   // samples cuda:0 at 20% again
  fake.SetUtilization(0, 60);
  sampler.SampleNow();                                  // 60%
  const WindowStats stats = sampler.EndWindow(window);  // 60% once more

  EXPECT_EQ(stats.samples, 4);
  ASSERT_TRUE(stats.utilization_average.has_value());
  EXPECT_DOUBLE_EQ(*stats.utilization_average, 0.4);
  EXPECT_DOUBLE_EQ(stats.utilization_peak.value_or(-1), 0.6);
  EXPECT_DOUBLE_EQ(stats.sm_activity_average.value_or(-1), 0.425);
  EXPECT_EQ(stats.peak_memory_used_bytes, 1 * kGiB);

  const WindowStats other_stats = sampler.EndWindow(other);
  EXPECT_EQ(other_stats.samples, 4);
  EXPECT_DOUBLE_EQ(other_stats.utilization_average.value_or(-1), 0.8);
  EXPECT_FALSE(other_stats.sm_activity_average.has_value());

  // Ended windows are gone.
  EXPECT_EQ(sampler.EndWindow(window).samples, 0);
}

TEST(DeviceSamplerTest, CpuWindowHasSamplesAndMemory) {
  DeviceSampler::Options options = FakeOptions();
  options.nvml_library = "";
  DeviceSampler sampler(options);
  const int64_t window = sampler.BeginWindow("cpu");
  const WindowStats stats = sampler.EndWindow(window);
  EXPECT_EQ(stats.samples, 2);
  EXPECT_GT(stats.peak_memory_used_bytes, 0);
  EXPECT_LE(stats.utilization_peak.value_or(0.0), 1.0);
}

TEST(DeviceSamplerTest, WindowOnAnUnknownDeviceHasNoSamples) {
  FakeNvmlControl fake;
  DeviceSampler sampler(FakeOptions());
  const int64_t window = sampler.BeginWindow("cuda:7");
  sampler.SampleNow();
  const WindowStats stats = sampler.EndWindow(window);
  EXPECT_EQ(stats.samples, 0);
  EXPECT_FALSE(stats.utilization_average.has_value());
}

TEST(DeviceSamplerTest, WithoutNvmlOnlyTheCpu) {
  DeviceSampler::Options options = FakeOptions();
  options.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  DeviceSampler sampler(options);
  EXPECT_FALSE(sampler.has_nvml());
  EXPECT_EQ(sampler.nvml_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sampler.driver_version(), "");
  EXPECT_THAT(sampler.devices(), ElementsAre("cpu"));
  sampler.SampleNow();
  EXPECT_THAT(DeviceNames(sampler.Latest()), ElementsAre("cpu"));
}

TEST(DeviceSamplerTest, CpuUtilizationReflectsBusyWork) {
  DeviceSampler::Options options = FakeOptions();
  options.nvml_library = "";
  DeviceSampler sampler(options);
  sampler.SampleNow();
  // Spin on this thread for ~20 ms: at least one CPU's worth over that time, spread over the
  // online CPUs.
  const absl::Time end = absl::Now() + absl::Milliseconds(20);
  volatile uint64_t spins = 0;
  while (absl::Now() < end) spins = spins + 1;
  sampler.SampleNow();
  std::optional<DeviceReading> cpu = sampler.Latest("cpu");
  ASSERT_TRUE(cpu.has_value());
  ASSERT_TRUE(cpu->utilization.has_value());
  EXPECT_GT(*cpu->utilization, 0.0);
  EXPECT_LE(*cpu->utilization, 1.0);
}

TEST(DeviceSamplerTest, StartAndStopSampleInTheBackground) {
  FakeNvmlControl fake;
  DeviceSampler::Options options = FakeOptions();
  options.interval = absl::Milliseconds(1);
  DeviceSampler sampler(options);
  sampler.Start();
  sampler.Start();  // no-op while running
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!sampler.Latest("cuda:1").has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  sampler.Stop();
  sampler.Stop();  // no-op when stopped
  EXPECT_TRUE(sampler.Latest("cuda:1").has_value());
  EXPECT_TRUE(sampler.Latest("cpu").has_value());
  sampler.Start();  // restartable; the destructor stops it
}

}  // namespace
}  // namespace trainerd::monitor
