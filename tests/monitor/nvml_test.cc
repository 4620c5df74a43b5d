#include "server/monitor/nvml.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/monitor/fake_nvml_control.h"

namespace trainerd::monitor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(NvmlTest, LoadOfMissingLibraryIsUnavailableAndNamesIt) {
  absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("'/nonexistent/libnvidia-ml.so.1'"));
}

TEST(NvmlTest, LoadOfLibraryWithoutNvmlIsUnavailable) {
  // The C library loads but has none of NVML's entry points.
  absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load("libc.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("nvmlInit_v2"));
}

TEST(NvmlTest, InitFailureIsUnavailableWithNvmlsReason) {
  FakeNvmlControl fake;
  fake.SetInitResult(NVML_ERROR_DRIVER_NOT_LOADED);
  absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load(FAKE_NVML_PATH);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("nvmlInit_v2"));
  EXPECT_THAT(nvml.status().message(), HasSubstr("Driver Not Loaded"));
  EXPECT_EQ(fake.initialized(), 0);
}

TEST(NvmlTest, ReadsBothFakeDevicesWithUnitsConverted) {
  FakeNvmlControl fake;
  {
    absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load(FAKE_NVML_PATH);
    ASSERT_TRUE(nvml.ok()) << nvml.status();
    EXPECT_EQ(fake.initialized(), 1);
    ASSERT_EQ((*nvml)->device_count(), 2);
    EXPECT_EQ((*nvml)->driver_version(), "999.99.99");
    EXPECT_TRUE((*nvml)->gpm_supported(0));
    EXPECT_FALSE((*nvml)->gpm_supported(1));

    absl::StatusOr<GpuReading> gpu0 = (*nvml)->Read(0);
    ASSERT_TRUE(gpu0.ok()) << gpu0.status();
    EXPECT_EQ(gpu0->nvml_index, 0);
    EXPECT_EQ(gpu0->name, "Fake GPU 0");
    EXPECT_EQ(gpu0->uuid, "GPU-fake-0000-0000-0000-000000000000");
    ASSERT_TRUE(gpu0->utilization.has_value());
    EXPECT_DOUBLE_EQ(*gpu0->utilization, 0.37);
    EXPECT_EQ(gpu0->memory_used_bytes, 1 * kGiB);
    EXPECT_EQ(gpu0->memory_total_bytes, 80 * kGiB);
    ASSERT_TRUE(gpu0->power_watts.has_value());
    EXPECT_DOUBLE_EQ(*gpu0->power_watts, 123.456);
    ASSERT_TRUE(gpu0->temperature_celsius.has_value());
    EXPECT_DOUBLE_EQ(*gpu0->temperature_celsius, 55.0);

    absl::StatusOr<GpuReading> gpu1 = (*nvml)->Read(1);
    ASSERT_TRUE(gpu1.ok()) << gpu1.status();
    EXPECT_EQ(gpu1->name, "Fake GPU 1");
    EXPECT_EQ(gpu1->uuid, "GPU-fake-1111-1111-1111-111111111111");
    EXPECT_DOUBLE_EQ(gpu1->utilization.value_or(-1), 0.8);

    EXPECT_EQ((*nvml)->Read(2).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ((*nvml)->Read(-1).status().code(), absl::StatusCode::kOutOfRange);
  }
  // The destructor shut NVML down.
  EXPECT_EQ(fake.initialized(), 0);
}

TEST(NvmlTest, SmActivityNeedsTwoSamplesAndOnlyOnGpmDevices) {
  FakeNvmlControl fake;
  absl::StatusOr<std::unique_ptr<Nvml>> nvml =
      Nvml::Load(FAKE_NVML_PATH, /*gpm_min_interval=*/absl::ZeroDuration());
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  Nvml& n = **nvml;

  // The first read only takes the sample the interval starts from.
  EXPECT_FALSE(n.Read(0)->sm_activity.has_value());
  EXPECT_EQ(fake.gpm_metrics_calls(), 0);
  absl::StatusOr<GpuReading> second = n.Read(0);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->sm_activity.has_value());
  EXPECT_DOUBLE_EQ(*second->sm_activity, 0.425);

  fake.SetSmUtil(0, 90.0);
  EXPECT_DOUBLE_EQ(n.Read(0)->sm_activity.value_or(-1), 0.9);

  EXPECT_FALSE(n.Read(1)->sm_activity.has_value());
  EXPECT_FALSE(n.Read(1)->sm_activity.has_value());
}

TEST(NvmlTest, SmActivityRepeatsTheLastValueWithinTheMinimumInterval) {
  FakeNvmlControl fake;
  absl::StatusOr<std::unique_ptr<Nvml>> nvml =
      Nvml::Load(FAKE_NVML_PATH, /*gpm_min_interval=*/absl::Hours(1));
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_FALSE((*nvml)->Read(0)->sm_activity.has_value());
  EXPECT_FALSE((*nvml)->Read(0)->sm_activity.has_value());
  EXPECT_EQ(fake.gpm_metrics_calls(), 0);
}

TEST(NvmlTest, LibraryWithoutGpmReportsNoSmActivity) {
  FakeNvmlControl fake(FAKE_NVML_NOGPM_PATH);
  absl::StatusOr<std::unique_ptr<Nvml>> nvml =
      Nvml::Load(FAKE_NVML_NOGPM_PATH, /*gpm_min_interval=*/absl::ZeroDuration());
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_FALSE((*nvml)->gpm_supported(0));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<GpuReading> gpu0 = (*nvml)->Read(0);
    ASSERT_TRUE(gpu0.ok()) << gpu0.status();
    EXPECT_FALSE(gpu0->sm_activity.has_value());
    EXPECT_DOUBLE_EQ(gpu0->utilization.value_or(-1), 0.37);
  }
}

const std::vector<std::string> kUuids = {"GPU-fake-0000-0000-0000-000000000000",
                                         "GPU-fake-1111-1111-1111-111111111111"};

TEST(CudaToNvmlIndicesTest, UnsetIsTheIdentity) {
  EXPECT_THAT(CudaToNvmlIndices(kUuids, nullptr), ElementsAre(0, 1));
  EXPECT_THAT(CudaToNvmlIndices(std::vector<std::string>{}, nullptr), IsEmpty());
}

TEST(CudaToNvmlIndicesTest, IntegersReorder) {
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "1,0"), ElementsAre(1, 0));
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "1"), ElementsAre(1));
  EXPECT_THAT(CudaToNvmlIndices(kUuids, " 1 , 0 "), ElementsAre(1, 0));
}

TEST(CudaToNvmlIndicesTest, UuidsAndUniquePrefixesMatch) {
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "GPU-fake-1111-1111-1111-111111111111,GPU-fake-0"),
              ElementsAre(1, 0));
  // "GPU-fake-" fits both devices: CUDA stops there.
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "GPU-fake-1,GPU-fake-"), ElementsAre(1));
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "GPU-nope"), IsEmpty());
}

TEST(CudaToNvmlIndicesTest, StopsAtTheFirstInvalidEntry) {
  EXPECT_THAT(CudaToNvmlIndices(kUuids, ""), IsEmpty());
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "-1"), IsEmpty());
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "0,7,1"), ElementsAre(0));
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "1,1,0"), ElementsAre(1));
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "0,MIG-abc"), ElementsAre(0));
  EXPECT_THAT(CudaToNvmlIndices(kUuids, "x"), IsEmpty());
}

TEST(CudaToNvmlIndicesTest, UsesTheLoadedLibrarysUuids) {
  FakeNvmlControl fake;
  absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_THAT(CudaToNvmlIndices(**nvml, "GPU-fake-1"), ElementsAre(1));
  EXPECT_THAT(CudaToNvmlIndices(**nvml, nullptr), ElementsAre(0, 1));
}

}  // namespace
}  // namespace trainerd::monitor
