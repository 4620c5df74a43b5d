#include "server/monitor/sampler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/monitor/process_stats.h"

namespace trainerd::monitor {
namespace {

constexpr char kCpu[] = "cpu";

// CPU utilization over a shorter interval is mostly noise (scheduler granularity); a sample
// taken sooner than this after the baseline repeats the last value instead.
constexpr absl::Duration kMinCpuInterval = absl::Milliseconds(10);

std::string CudaName(int ordinal) { return absl::StrCat("cuda:", ordinal); }

DeviceReading FromGpu(int ordinal, const GpuReading& gpu, absl::Time time) {
  DeviceReading reading;
  reading.device = CudaName(ordinal);
  reading.name = gpu.name;
  reading.uuid = gpu.uuid;
  reading.utilization = gpu.utilization;
  reading.memory_used_bytes = gpu.memory_used_bytes;
  reading.memory_total_bytes = gpu.memory_total_bytes;
  reading.power_watts = gpu.power_watts;
  reading.temperature_celsius = gpu.temperature_celsius;
  reading.sm_activity = gpu.sm_activity;
  reading.time = time;
  return reading;
}

}  // namespace

DeviceSampler::DeviceSampler(Options options)
    : options_(std::move(options)),
      online_cpus_(OnlineCpus()),
      cpu_model_(CpuModelName()),
      total_memory_bytes_(TotalMemoryBytes()) {
  if (options_.nvml_library.empty()) {
    nvml_status_ = absl::UnavailableError("no NVML library configured");
  } else {
    absl::StatusOr<std::unique_ptr<Nvml>> nvml =
        Nvml::Load(options_.nvml_library, options_.gpm_min_interval);
    nvml_status_ = nvml.status();
    if (nvml.ok()) {
      nvml_ = std::move(*nvml);
      cuda_to_nvml_ = CudaToNvmlIndices(
          *nvml_, options_.cuda_visible_devices ? options_.cuda_visible_devices->c_str() : nullptr);
    }
  }
  // The baseline, so that the first sample already has a CPU utilization.
  absl::MutexLock lock(&sample_mu_);
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  if (stats.ok()) {
    cpu_seconds_ = stats->cpu_seconds;
    cpu_time_ = absl::Now();
  }
}

DeviceSampler::~DeviceSampler() { Stop(); }

void DeviceSampler::Start() {
  absl::MutexLock thread_lock(&thread_mu_);
  if (thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Run(); });
}

void DeviceSampler::Stop() {
  absl::MutexLock thread_lock(&thread_mu_);
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void DeviceSampler::Run() {
  while (true) {
    SampleNow();
    absl::MutexLock lock(&mu_);
    // Wakes early when Stop() sets stop_.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.interval);
    if (stop_) return;
  }
}

std::optional<DeviceReading> DeviceSampler::SampleCpu() {
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  if (!stats.ok()) return std::nullopt;
  const absl::Time now = absl::Now();
  if (!cpu_seconds_.has_value()) {
    cpu_seconds_ = stats->cpu_seconds;
    cpu_time_ = now;
  } else if (now - cpu_time_ >= kMinCpuInterval) {
    const double wall = absl::ToDoubleSeconds(now - cpu_time_);
    const double busy = (stats->cpu_seconds - *cpu_seconds_) / (wall * online_cpus_);
    cpu_utilization_ = std::clamp(busy, 0.0, 1.0);
    cpu_seconds_ = stats->cpu_seconds;
    cpu_time_ = now;
  }
  DeviceReading reading;
  reading.device = kCpu;
  reading.name = cpu_model_;
  reading.utilization = cpu_utilization_;
  reading.memory_used_bytes = stats->resident_bytes;
  reading.memory_total_bytes = total_memory_bytes_;
  reading.time = now;
  return reading;
}

void DeviceSampler::SampleNow() {
  absl::MutexLock sample_lock(&sample_mu_);
  // Read everything first: NVML calls take a while and must not block Latest().
  std::vector<DeviceReading> readings;
  if (std::optional<DeviceReading> cpu = SampleCpu()) readings.push_back(std::move(*cpu));
  for (int ordinal = 0; ordinal < static_cast<int>(cuda_to_nvml_.size()); ++ordinal) {
    absl::StatusOr<GpuReading> gpu = nvml_->Read(cuda_to_nvml_[ordinal]);
    // A device that fails this time keeps its previous reading rather than vanish.
    if (gpu.ok()) readings.push_back(FromGpu(ordinal, *gpu, absl::Now()));
  }

  absl::MutexLock lock(&mu_);
  for (DeviceReading& reading : readings) {
    for (auto& [id, window] : windows_) {
      if (window.device != reading.device) continue;
      ++window.samples;
      if (reading.utilization.has_value()) {
        window.utilization_sum += *reading.utilization;
        ++window.utilization_count;
        window.utilization_peak =
            std::max(window.utilization_peak.value_or(0.0), *reading.utilization);
      }
      if (reading.sm_activity.has_value()) {
        window.sm_activity_sum += *reading.sm_activity;
        ++window.sm_activity_count;
      }
      window.peak_memory_used_bytes =
          std::max(window.peak_memory_used_bytes, reading.memory_used_bytes);
    }
    std::string device = reading.device;
    latest_[device] = std::move(reading);
  }
}

int64_t DeviceSampler::BeginWindow(const std::string& device) {
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_window_id_++;
    windows_[id].device = device;
  }
  SampleNow();
  return id;
}

WindowStats DeviceSampler::EndWindow(int64_t id) {
  {
    absl::MutexLock lock(&mu_);
    if (windows_.count(id) == 0) return WindowStats();
  }
  SampleNow();
  absl::MutexLock lock(&mu_);
  auto it = windows_.find(id);
  // A concurrent EndWindow of the same id may have taken it meanwhile.
  if (it == windows_.end()) return WindowStats();
  const Window window = std::move(it->second);
  windows_.erase(it);

  WindowStats stats;
  stats.samples = window.samples;
  if (window.utilization_count > 0) {
    stats.utilization_average = window.utilization_sum / window.utilization_count;
    stats.utilization_peak = window.utilization_peak;
  }
  if (window.sm_activity_count > 0) {
    stats.sm_activity_average = window.sm_activity_sum / window.sm_activity_count;
  }
  stats.peak_memory_used_bytes = window.peak_memory_used_bytes;
  return stats;
}

std::vector<std::string> DeviceSampler::devices() const {
  std::vector<std::string> names = {kCpu};
  for (int ordinal = 0; ordinal < static_cast<int>(cuda_to_nvml_.size()); ++ordinal) {
    names.push_back(CudaName(ordinal));
  }
  return names;
}

std::vector<DeviceReading> DeviceSampler::Latest() const {
  std::vector<DeviceReading> result;
  absl::MutexLock lock(&mu_);
  for (const std::string& device : devices()) {
    auto it = latest_.find(device);
    if (it != latest_.end()) result.push_back(it->second);
  }
  return result;
}

std::optional<DeviceReading> DeviceSampler::Latest(const std::string& device) const {
  absl::MutexLock lock(&mu_);
  auto it = latest_.find(device);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

std::string DeviceSampler::driver_version() const {
  return nvml_ != nullptr ? nvml_->driver_version() : std::string();
}

}  // namespace trainerd::monitor
