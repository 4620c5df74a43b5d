// NVML (the NVIDIA Management Library) loaded with dlopen() at run time, so that trainerd builds
// without the CUDA toolkit and runs, CPU-only, where no NVIDIA driver is installed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/monitor/nvml_api.h"

namespace trainerd::monitor {

// The soname the NVIDIA driver installs; the unversioned libnvidia-ml.so is only in -dev packages.
inline constexpr char kDefaultNvmlLibrary[] = "libnvidia-ml.so.1";

// NVIDIA asks for at least 100 ms between the two GPM samples that a metric is computed over;
// shorter intervals give noisy values.
inline constexpr absl::Duration kDefaultGpmMinInterval = absl::Milliseconds(100);

// One reading of one GPU. Fields that the driver does not report for this device (or that the
// loaded library lacks) are empty.
struct GpuReading {
  int nvml_index = 0;
  std::string name;
  std::string uuid;                   // "GPU-xxxxxxxx-..."
  std::optional<double> utilization;  // 0..1: time a kernel ran over the driver's last period
  int64_t memory_used_bytes = 0;      // reserved + allocated, all processes
  int64_t memory_total_bytes = 0;
  std::optional<double> power_watts;
  std::optional<double> temperature_celsius;
  // 0..1: fraction of SMs busy (GPM, Hopper and newer) over the interval between this device's
  // last two GPM samples; empty until a device has been read twice, at least the minimum GPM
  // interval apart.
  std::optional<double> sm_activity;
};

// A loaded and initialised NVML. Owned by whoever loaded it (the DeviceSampler); thread-safe.
class Nvml {
 public:
  // Loads `library`, resolves its entry points and calls nvmlInit_v2. UNAVAILABLE, naming the
  // library and the reason, when it cannot be loaded, lacks a required entry point or fails to
  // initialise (no driver, no GPU): callers then report no GPUs. Optional entry points that are
  // missing (power, temperature, GPM on drivers older than 520) leave those fields empty.
  // `gpm_min_interval` is the shortest interval SM activity is computed over (0: any).
  static absl::StatusOr<std::unique_ptr<Nvml>> Load(
      const std::string& library = kDefaultNvmlLibrary,
      absl::Duration gpm_min_interval = kDefaultGpmMinInterval);

  ~Nvml();  // frees GPM samples, nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Devices as NVML counts them at load time (NVML orders them by PCI bus id).
  int device_count() const { return static_cast<int>(devices_.size()); }
  const std::string& driver_version() const { return driver_version_; }
  const std::string& name(int index) const { return devices_[index].name; }
  const std::string& uuid(int index) const { return devices_[index].uuid; }
  std::vector<std::string> uuids() const;
  bool gpm_supported(int index) const { return devices_[index].gpm_supported; }

  // Reads device `index` now. OUT_OF_RANGE for a bad index, UNAVAILABLE when NVML gave no handle
  // for it (no permission) or fails on memory. For GPM devices, keeps the previous sample and
  // reports SM activity since then; a read sooner than gpm_min_interval after the previous sample
  // repeats the last value rather than measure a too-short interval.
  absl::StatusOr<GpuReading> Read(int index);

 private:
  struct Api;
  struct Device {
    nvmlDevice_t handle = nullptr;
    std::string name;
    std::string uuid;
    bool gpm_supported = false;
    // Guarded by Nvml::mu_.
    nvmlGpmSample_t previous = nullptr;  // GPM sample the next metric starts from
    nvmlGpmSample_t current = nullptr;   // scratch buffer for the next sample
    std::optional<absl::Time> previous_time;
    std::optional<double> last_sm_activity;
  };

  Nvml(void* library_handle, std::unique_ptr<Api> api, absl::Duration gpm_min_interval);
  std::string ErrorString(nvmlReturn_t result) const;
  std::optional<double> ReadSmActivity(Device& device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void* library_handle_;
  std::unique_ptr<Api> api_;
  absl::Duration gpm_min_interval_;
  std::string driver_version_;
  std::vector<Device> devices_;  // fixed after Load; the GPM fields are guarded by mu_
  absl::Mutex mu_;               // serialises GPM sample bookkeeping
};

// Maps CUDA ordinals to NVML indices: element N is the NVML index of "cuda:N". With
// CUDA_VISIBLE_DEVICES unset (nullptr), the identity over every NVML device. Otherwise, as CUDA
// does, its comma-separated entries are integers (NVML/PCI order) or UUID prefixes ("GPU-..."),
// and the list stops at the first entry that names no device (out of range, unknown, ambiguous or
// repeated UUID prefix, a MIG UUID, "-1", anything else); "" hides every device.
//
// Assumes CUDA_DEVICE_ORDER=PCI_BUS_ID order for integers (what NVML uses); CUDA's default,
// FASTEST_FIRST, orders identical GPUs by PCI bus id too, so only mixed-model machines may differ.
std::vector<int> CudaToNvmlIndices(const std::vector<std::string>& nvml_uuids,
                                   const char* cuda_visible_devices);
std::vector<int> CudaToNvmlIndices(const Nvml& nvml, const char* cuda_visible_devices);

}  // namespace trainerd::monitor
