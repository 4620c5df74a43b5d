// A stand-in for libnvidia-ml.so.1 with two canned devices, built as a shared library that the
// tests dlopen() in place of the real one. The tests steer it through the fake_nvml_* functions,
// which they look up with dlsym() on the same handle (dlopen() of one path yields one instance).
// Built twice: as fake_nvml, and with FAKE_NVML_NO_GPM as fake_nvml_nogpm, a library without
// the GPM entry points, like drivers older than 520.
#include <cstdlib>
#include <cstring>

#include "server/monitor/nvml_api.h"

namespace {

constexpr unsigned int kDevices = 2;

struct FakeDevice {
  unsigned int index;
  unsigned int utilization_percent;
  unsigned long long memory_used;
  unsigned long long memory_total;
  unsigned int power_milliwatts;
  unsigned int temperature;
  bool gpm_supported;
  double sm_util_percent;
};

FakeDevice devices[kDevices];
nvmlReturn_t init_result = NVML_SUCCESS;
int initialized = 0;  // nvmlInit_v2 minus nvmlShutdown calls
int gpm_metrics_calls = 0;

struct FakeGpmSample {
  unsigned int device = kDevices;  // kDevices: not taken yet
  double sm_util_percent = 0;
};

void Reset() {
  for (unsigned int i = 0; i < kDevices; ++i) {
    devices[i] =
        FakeDevice{i, i == 0 ? 37u : 80u, 1ull << 30, 80ull << 30, 123456u, 55u, i == 0, 42.5};
  }
  init_result = NVML_SUCCESS;
  initialized = 0;
  gpm_metrics_calls = 0;
}

struct ResetAtLoad {
  ResetAtLoad() { Reset(); }
} reset_at_load;

FakeDevice* Lookup(nvmlDevice_t device) {
  for (FakeDevice& d : devices) {
    if (reinterpret_cast<nvmlDevice_t>(&d) == device) return &d;
  }
  return nullptr;
}

nvmlReturn_t CopyString(const char* text, char* buffer, unsigned int length) {
  if (buffer == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (std::strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::strcpy(buffer, text);
  return NVML_SUCCESS;
}

}  // namespace

extern "C" {

// Controls.
void fake_nvml_reset() { Reset(); }
void fake_nvml_set_init_result(int result) { init_result = static_cast<nvmlReturn_t>(result); }
void fake_nvml_set_utilization(unsigned int device, unsigned int percent) {
  devices[device].utilization_percent = percent;
}
void fake_nvml_set_sm_util(unsigned int device, double percent) {
  devices[device].sm_util_percent = percent;
}
int fake_nvml_initialized() { return initialized; }
int fake_nvml_gpm_metrics_calls() { return gpm_metrics_calls; }

// NVML.
nvmlReturn_t nvmlInit_v2() {
  if (init_result != NVML_SUCCESS) return init_result;
  ++initialized;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown() {
  if (initialized == 0) return NVML_ERROR_UNINITIALIZED;
  --initialized;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return CopyString("999.99.99", version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (initialized == 0) return NVML_ERROR_UNINITIALIZED;
  *count = kDevices;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (initialized == 0) return NVML_ERROR_UNINITIALIZED;
  if (index >= kDevices) return NVML_ERROR_INVALID_ARGUMENT;
  *device = reinterpret_cast<nvmlDevice_t>(&devices[index]);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return CopyString(d->index == 0 ? "Fake GPU 0" : "Fake GPU 1", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return CopyString(d->index == 0 ? "GPU-fake-0000-0000-0000-000000000000"
                                  : "GPU-fake-1111-1111-1111-111111111111",
                    uuid, length);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr || utilization == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  utilization->gpu = d->utilization_percent;
  utilization->memory = 10;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr || memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = d->memory_total;
  memory->used = d->memory_used;
  memory->free = d->memory_total - d->memory_used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr || power == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *power = d->power_milliwatts;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                      unsigned int* temp) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr || temp == nullptr || sensor != NVML_TEMPERATURE_GPU) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *temp = d->temperature;
  return NVML_SUCCESS;
}

#ifndef FAKE_NVML_NO_GPM
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t* support) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr || support == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (support->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_INVALID_ARGUMENT;
  support->isSupportedDevice = d->gpm_supported ? 1 : 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *sample = reinterpret_cast<nvmlGpmSample_t>(new FakeGpmSample());
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  delete reinterpret_cast<FakeGpmSample*>(sample);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
  const FakeDevice* d = Lookup(device);
  if (d == nullptr || sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!d->gpm_supported) return NVML_ERROR_NOT_SUPPORTED;
  auto* s = reinterpret_cast<FakeGpmSample*>(sample);
  s->device = d->index;
  s->sm_util_percent = d->sm_util_percent;
  return NVML_SUCCESS;
}

// Reports the SM utilization set when the later sample was taken; checks what a real driver
// would reject.
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* get) {
  ++gpm_metrics_calls;
  if (get == nullptr || get->version != NVML_GPM_METRICS_GET_VERSION) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (get->numMetrics == 0 || get->numMetrics > NVML_GPM_METRIC_MAX) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  const auto* first = reinterpret_cast<const FakeGpmSample*>(get->sample1);
  const auto* second = reinterpret_cast<const FakeGpmSample*>(get->sample2);
  if (first == nullptr || second == nullptr || first == second || first->device >= kDevices ||
      first->device != second->device) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  for (unsigned int i = 0; i < get->numMetrics; ++i) {
    nvmlGpmMetric_t& metric = get->metrics[i];
    if (metric.metricId == NVML_GPM_METRIC_SM_UTIL) {
      metric.nvmlReturn = NVML_SUCCESS;
      metric.value = second->sm_util_percent;
    } else {
      metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
  }
  return NVML_SUCCESS;
}
#endif  // FAKE_NVML_NO_GPM

}  // extern "C"
