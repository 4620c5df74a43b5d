#include "server/monitor/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace trainerd::monitor {

// Entry points resolved with dlsym(); the optional ones stay null when the library lacks them.
struct Nvml::Api {
  // Required.
  nvmlInit_v2_fn init = nullptr;
  nvmlShutdown_fn shutdown = nullptr;
  nvmlDeviceGetCount_v2_fn get_count = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn get_handle = nullptr;
  nvmlDeviceGetMemoryInfo_fn get_memory = nullptr;
  // Optional.
  nvmlErrorString_fn error_string = nullptr;
  nvmlSystemGetDriverVersion_fn get_driver_version = nullptr;
  nvmlDeviceGetName_fn get_name = nullptr;
  nvmlDeviceGetUUID_fn get_uuid = nullptr;
  nvmlDeviceGetUtilizationRates_fn get_utilization = nullptr;
  nvmlDeviceGetPowerUsage_fn get_power = nullptr;
  nvmlDeviceGetTemperature_fn get_temperature = nullptr;
  // GPM: all five or none.
  nvmlGpmQueryDeviceSupport_fn gpm_query_support = nullptr;
  nvmlGpmSampleAlloc_fn gpm_sample_alloc = nullptr;
  nvmlGpmSampleFree_fn gpm_sample_free = nullptr;
  nvmlGpmSampleGet_fn gpm_sample_get = nullptr;
  nvmlGpmMetricsGet_fn gpm_metrics_get = nullptr;

  bool has_gpm() const {
    return gpm_query_support && gpm_sample_alloc && gpm_sample_free && gpm_sample_get &&
           gpm_metrics_get;
  }
};

namespace {

// The layouts nvml.h gives on LP64 Linux; a slip in nvml_api.h would corrupt what the driver
// writes.
static_assert(sizeof(nvmlUtilization_t) == 8);
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlGpmSupport_t) == 8);
static_assert(sizeof(nvmlGpmMetric_t) == 40);
static_assert(offsetof(nvmlGpmMetric_t, value) == 8);
static_assert(offsetof(nvmlGpmMetricsGet_t, sample1) == 8);
static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24);

template <typename Fn>
void Resolve(void* handle, const char* symbol, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
}

// Buffers NVML fills are NUL-terminated, but a misbehaving library should not make us overread.
std::string FromBuffer(const char* buffer, size_t size) {
  return std::string(buffer, strnlen(buffer, size));
}

std::optional<double> Clamp01(double value) { return std::clamp(value, 0.0, 1.0); }

}  // namespace

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library,
                                                 absl::Duration gpm_min_interval) {
  // RTLD_LOCAL: NVML's symbols must not satisfy anyone else's references (or ours by name).
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::UnavailableError(absl::StrCat("cannot load NVML library '", library,
                                               "': ", error != nullptr ? error : "unknown"));
  }
  auto api = std::make_unique<Api>();
  Resolve(handle, "nvmlInit_v2", &api->init);
  Resolve(handle, "nvmlShutdown", &api->shutdown);
  Resolve(handle, "nvmlDeviceGetCount_v2", &api->get_count);
  Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", &api->get_handle);
  Resolve(handle, "nvmlDeviceGetMemoryInfo", &api->get_memory);
  Resolve(handle, "nvmlErrorString", &api->error_string);
  Resolve(handle, "nvmlSystemGetDriverVersion", &api->get_driver_version);
  Resolve(handle, "nvmlDeviceGetName", &api->get_name);
  Resolve(handle, "nvmlDeviceGetUUID", &api->get_uuid);
  Resolve(handle, "nvmlDeviceGetUtilizationRates", &api->get_utilization);
  Resolve(handle, "nvmlDeviceGetPowerUsage", &api->get_power);
  Resolve(handle, "nvmlDeviceGetTemperature", &api->get_temperature);
  Resolve(handle, "nvmlGpmQueryDeviceSupport", &api->gpm_query_support);
  Resolve(handle, "nvmlGpmSampleAlloc", &api->gpm_sample_alloc);
  Resolve(handle, "nvmlGpmSampleFree", &api->gpm_sample_free);
  Resolve(handle, "nvmlGpmSampleGet", &api->gpm_sample_get);
  Resolve(handle, "nvmlGpmMetricsGet", &api->gpm_metrics_get);

  const std::pair<const char*, bool> required[] = {
      {"nvmlInit_v2", api->init != nullptr},
      {"nvmlShutdown", api->shutdown != nullptr},
      {"nvmlDeviceGetCount_v2", api->get_count != nullptr},
      {"nvmlDeviceGetHandleByIndex_v2", api->get_handle != nullptr},
      {"nvmlDeviceGetMemoryInfo", api->get_memory != nullptr}};
  for (const auto& [symbol, present] : required) {
    if (!present) {
      dlclose(handle);
      return absl::UnavailableError(
          absl::StrCat("NVML library '", library, "' has no '", symbol, "'"));
    }
  }

  const nvmlReturn_t init = api->init();
  if (init != NVML_SUCCESS) {
    std::string reason = api->error_string != nullptr && api->error_string(init) != nullptr
                             ? api->error_string(init)
                             : absl::StrCat("error ", static_cast<int>(init));
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat("nvmlInit_v2 in '", library, "' failed: ", reason));
  }
  // From here on the destructor shuts NVML down and closes the library.
  std::unique_ptr<Nvml> nvml(new Nvml(handle, std::move(api), gpm_min_interval));
  const Api& a = *nvml->api_;

  if (a.get_driver_version != nullptr) {
    char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
    if (a.get_driver_version(version, sizeof(version)) == NVML_SUCCESS) {
      nvml->driver_version_ = FromBuffer(version, sizeof(version));
    }
  }
  unsigned int count = 0;
  const nvmlReturn_t counted = a.get_count(&count);
  if (counted != NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount_v2 in '", library,
                                               "' failed: ", nvml->ErrorString(counted)));
  }
  nvml->devices_.resize(count);
  for (unsigned int i = 0; i < count; ++i) {
    Device& device = nvml->devices_[i];
    // A device we may not open (NVML_ERROR_NO_PERMISSION) keeps its index but no handle, so
    // that indices still match NVML's and CUDA_VISIBLE_DEVICES.
    if (a.get_handle(i, &device.handle) != NVML_SUCCESS) {
      device.handle = nullptr;
      continue;
    }
    if (a.get_name != nullptr) {
      char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
      if (a.get_name(device.handle, name, sizeof(name)) == NVML_SUCCESS) {
        device.name = FromBuffer(name, sizeof(name));
      }
    }
    if (a.get_uuid != nullptr) {
      char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
      if (a.get_uuid(device.handle, uuid, sizeof(uuid)) == NVML_SUCCESS) {
        device.uuid = FromBuffer(uuid, sizeof(uuid));
      }
    }
    if (a.has_gpm()) {
      nvmlGpmSupport_t support = {};
      support.version = NVML_GPM_SUPPORT_VERSION;
      if (a.gpm_query_support(device.handle, &support) == NVML_SUCCESS &&
          support.isSupportedDevice != 0 && a.gpm_sample_alloc(&device.previous) == NVML_SUCCESS &&
          a.gpm_sample_alloc(&device.current) == NVML_SUCCESS) {
        device.gpm_supported = true;
      }
    }
  }
  return nvml;
}

Nvml::Nvml(void* library_handle, std::unique_ptr<Api> api, absl::Duration gpm_min_interval)
    : library_handle_(library_handle), api_(std::move(api)), gpm_min_interval_(gpm_min_interval) {}

Nvml::~Nvml() {
  for (Device& device : devices_) {
    if (device.previous != nullptr) api_->gpm_sample_free(device.previous);
    if (device.current != nullptr) api_->gpm_sample_free(device.current);
  }
  api_->shutdown();
  dlclose(library_handle_);
}

std::vector<std::string> Nvml::uuids() const {
  std::vector<std::string> result;
  result.reserve(devices_.size());
  for (const Device& device : devices_) result.push_back(device.uuid);
  return result;
}

std::string Nvml::ErrorString(nvmlReturn_t result) const {
  const char* text = api_->error_string != nullptr ? api_->error_string(result) : nullptr;
  return text != nullptr ? std::string(text) : absl::StrCat("error ", static_cast<int>(result));
}

absl::StatusOr<GpuReading> Nvml::Read(int index) {
  if (index < 0 || index >= device_count()) {
    return absl::OutOfRangeError(
        absl::StrCat("no NVML device ", index, "; there are ", device_count()));
  }
  Device& device = devices_[index];
  if (device.handle == nullptr) {
    return absl::UnavailableError(absl::StrCat("NVML gave no handle for device ", index));
  }
  const Api& a = *api_;
  GpuReading reading;
  reading.nvml_index = index;
  reading.name = device.name;
  reading.uuid = device.uuid;

  nvmlMemory_t memory = {};
  const nvmlReturn_t memory_result = a.get_memory(device.handle, &memory);
  if (memory_result != NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetMemoryInfo for device ", index,
                                               " failed: ", ErrorString(memory_result)));
  }
  reading.memory_used_bytes = static_cast<int64_t>(memory.used);
  reading.memory_total_bytes = static_cast<int64_t>(memory.total);

  // NOT_SUPPORTED is normal for these (utilization under MIG, power on some boards): leave empty.
  nvmlUtilization_t utilization = {};
  if (a.get_utilization != nullptr &&
      a.get_utilization(device.handle, &utilization) == NVML_SUCCESS) {
    reading.utilization = Clamp01(utilization.gpu / 100.0);
  }
  unsigned int milliwatts = 0;
  if (a.get_power != nullptr && a.get_power(device.handle, &milliwatts) == NVML_SUCCESS) {
    reading.power_watts = milliwatts / 1000.0;
  }
  unsigned int celsius = 0;
  if (a.get_temperature != nullptr &&
      a.get_temperature(device.handle, NVML_TEMPERATURE_GPU, &celsius) == NVML_SUCCESS) {
    reading.temperature_celsius = static_cast<double>(celsius);
  }
  if (device.gpm_supported) {
    absl::MutexLock lock(&mu_);
    reading.sm_activity = ReadSmActivity(device);
  }
  return reading;
}

std::optional<double> Nvml::ReadSmActivity(Device& device) {
  const Api& a = *api_;
  const absl::Time now = absl::Now();
  if (device.previous_time.has_value() && now - *device.previous_time < gpm_min_interval_) {
    return device.last_sm_activity;
  }
  if (!device.previous_time.has_value()) {
    if (a.gpm_sample_get(device.handle, device.previous) == NVML_SUCCESS) {
      device.previous_time = now;
    }
    return std::nullopt;
  }
  if (a.gpm_sample_get(device.handle, device.current) != NVML_SUCCESS) {
    return device.last_sm_activity;
  }
  // Heap-allocated: with NVML_GPM_METRIC_MAX entries the struct is about 19 KiB.
  auto get = std::make_unique<nvmlGpmMetricsGet_t>();
  std::memset(get.get(), 0, sizeof(*get));
  get->version = NVML_GPM_METRICS_GET_VERSION;
  get->numMetrics = 1;
  get->sample1 = device.previous;
  get->sample2 = device.current;
  get->metrics[0].metricId = NVML_GPM_METRIC_SM_UTIL;
  if (a.gpm_metrics_get(get.get()) == NVML_SUCCESS && get->metrics[0].nvmlReturn == NVML_SUCCESS) {
    device.last_sm_activity = Clamp01(get->metrics[0].value / 100.0);
  } else {
    device.last_sm_activity.reset();
  }
  // The sample just taken starts the next interval.
  std::swap(device.previous, device.current);
  device.previous_time = now;
  return device.last_sm_activity;
}

std::vector<int> CudaToNvmlIndices(const std::vector<std::string>& nvml_uuids,
                                   const char* cuda_visible_devices) {
  const int count = static_cast<int>(nvml_uuids.size());
  std::vector<int> result;
  if (cuda_visible_devices == nullptr) {
    for (int i = 0; i < count; ++i) result.push_back(i);
    return result;
  }
  for (absl::string_view entry : absl::StrSplit(cuda_visible_devices, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int index = -1;
    if (absl::StartsWith(entry, "GPU-")) {
      for (int i = 0; i < count; ++i) {
        if (absl::StartsWith(nvml_uuids[i], entry)) {
          if (index != -1) return result;  // ambiguous prefix
          index = i;
        }
      }
    } else if (!absl::SimpleAtoi(entry, &index) || index >= count) {
      index = -1;
    }
    if (index < 0 || std::find(result.begin(), result.end(), index) != result.end()) break;
    result.push_back(index);
  }
  return result;
}

std::vector<int> CudaToNvmlIndices(const Nvml& nvml, const char* cuda_visible_devices) {
  return CudaToNvmlIndices(nvml.uuids(), cuda_visible_devices);
}

}  // namespace trainerd::monitor
