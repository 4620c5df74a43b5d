// DeviceSampler: samples every device a job may run on ("cpu" and each visible "cuda:N") on a
// background thread, keeps the latest reading of each, and folds samples into measurement
// windows that callers open around a piece of work (an epoch, a benchmark run).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/monitor/nvml.h"

namespace trainerd::monitor {

// One device at one time. Empty optionals: not reported by this device or driver.
struct DeviceReading {
  std::string device;  // "cpu" or "cuda:N" (N counts the devices CUDA_VISIBLE_DEVICES shows)
  std::string name;    // GPU product name, or the CPU model name
  std::string uuid;    // GPUs only
  // GPU: fraction of the driver's last period a kernel ran. CPU: this process's CPU time over
  // wall time and online CPUs since the previous CPU sample; empty on the first one.
  std::optional<double> utilization;
  int64_t memory_used_bytes = 0;   // GPU: all processes; CPU: this process's resident bytes
  int64_t memory_total_bytes = 0;  // GPU: device memory; CPU: MemTotal
  std::optional<double> power_watts;
  std::optional<double> temperature_celsius;
  std::optional<double> sm_activity;  // 0..1, GPM GPUs only
  absl::Time time;
};

// Aggregates of the samples taken while a window was open.
struct WindowStats {
  int samples = 0;
  std::optional<double> utilization_average;  // over the samples that had a utilization
  std::optional<double> utilization_peak;
  std::optional<double> sm_activity_average;
  int64_t peak_memory_used_bytes = 0;
};

// Owned by the engine (one per daemon). Thread-safe: every method may be called from any thread.
class DeviceSampler {
 public:
  struct Options {
    // Time between background samples. Must be positive.
    absl::Duration interval = absl::Milliseconds(200);
    // The NVML library to dlopen(); empty: none (CPU only).
    std::string nvml_library = kDefaultNvmlLibrary;
    // Shortest interval SM activity is computed over (see Nvml::Load); 0: any.
    absl::Duration gpm_min_interval = kDefaultGpmMinInterval;
    // CUDA_VISIBLE_DEVICES as the engine's CUDA runtime sees it; nullopt: unset.
    std::optional<std::string> cuda_visible_devices = CudaVisibleDevicesFromEnvironment();
  };

  static std::optional<std::string> CudaVisibleDevicesFromEnvironment() {
    const char* value = std::getenv("CUDA_VISIBLE_DEVICES");
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  }

  // Loads NVML (a failure leaves the sampler CPU-only; see nvml_status()) and takes the CPU's
  // baseline. Does not start the thread.
  explicit DeviceSampler(Options options);
  ~DeviceSampler();  // Stop()
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Starts the background thread (no-op when running) / stops and joins it (no-op when not).
  void Start();
  void Stop();

  // Samples every device now, on the calling thread.
  void SampleNow();

  // Opens a window on `device` and samples once, so that every window gets at least the samples
  // at its two ends. A device that is not sampled gets a window with no samples.
  int64_t BeginWindow(const std::string& device);
  // Samples once more, closes the window and returns its aggregates; an unknown id (or one
  // already ended) gives empty stats.
  WindowStats EndWindow(int64_t id);

  // "cpu" first, then cuda:0, cuda:1, ...; devices not yet sampled are absent.
  std::vector<DeviceReading> Latest() const;
  std::optional<DeviceReading> Latest(const std::string& device) const;
  // Every device sampled: "cpu", then "cuda:N".
  std::vector<std::string> devices() const;

  bool has_nvml() const { return nvml_ != nullptr; }
  // OK when NVML loaded; otherwise why not (for the daemon's start-up log).
  const absl::Status& nvml_status() const { return nvml_status_; }
  std::string driver_version() const;

 private:
  struct Window {
    std::string device;
    int samples = 0;
    double utilization_sum = 0;
    int utilization_count = 0;
    std::optional<double> utilization_peak;
    double sm_activity_sum = 0;
    int sm_activity_count = 0;
    int64_t peak_memory_used_bytes = 0;
  };

  std::optional<DeviceReading> SampleCpu() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sample_mu_);
  void Run();

  const Options options_;
  absl::Status nvml_status_;
  std::unique_ptr<Nvml> nvml_;
  // cuda_to_nvml_[N] is the NVML index of "cuda:N".
  std::vector<int> cuda_to_nvml_;
  const int online_cpus_;
  const std::string cpu_model_;
  const int64_t total_memory_bytes_;

  // Serialises whole samples (thread and SampleNow) so that CPU deltas are taken in order.
  absl::Mutex sample_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::optional<double> cpu_seconds_ ABSL_GUARDED_BY(sample_mu_);  // the CPU baseline
  absl::Time cpu_time_ ABSL_GUARDED_BY(sample_mu_);
  std::optional<double> cpu_utilization_ ABSL_GUARDED_BY(sample_mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, DeviceReading> latest_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Window> windows_ ABSL_GUARDED_BY(mu_);
  int64_t next_window_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex thread_mu_ ABSL_ACQUIRED_BEFORE(sample_mu_);  // Start/Stop
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace trainerd::monitor
