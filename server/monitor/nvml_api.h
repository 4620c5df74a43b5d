// The slice of NVIDIA's NVML C ABI that trainerd::monitor uses, declared here so that the daemon
// builds without the CUDA toolkit's nvml.h and loads libnvidia-ml.so.1 with dlopen() at run time
// (machines without the NVIDIA driver still run the daemon, CPU-only).
//
// Transcribed from nvml.h of the nvidia-nvml-dev 13.4.92 wheel (NVML 13.x). Everything here is
// part of NVML's stable ABI: the _v2 entry points are what nvml.h maps nvmlInit,
// nvmlDeviceGetCount and nvmlDeviceGetHandleByIndex to, and the GPM structs carry a version field.
// Only the types and function-pointer typedefs appear: no symbol is linked.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st* nvmlDevice_t;

// Percent (0..100) of the last sample period (1/6 s to 1 s, product dependent).
typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

// Bytes (v1 layout, the one nvmlDeviceGetMemoryInfo fills).
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef enum nvmlTemperatureSensors_enum {
  NVML_TEMPERATURE_GPU = 0,
  NVML_TEMPERATURE_GPU_MAX = 1,
  NVML_TEMPERATURE_COUNT
} nvmlTemperatureSensors_t;

#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

// GPM (GPU performance monitoring, Hopper and newer, drivers >= 520).
typedef enum {
  NVML_GPM_METRIC_GRAPHICS_UTIL = 1,  // percent of time any compute/graphics work was active
  NVML_GPM_METRIC_SM_UTIL = 2,        // percent of SMs that were busy
  NVML_GPM_METRIC_SM_OCCUPANCY = 3,   // percent of warps active vs the theoretical maximum
  // nvml.h 13.x says 477; 12.x said 210 and 11.x 98. NVML reads only metrics[0, numMetrics), so
  // any value at least numMetrics works; the newest keeps our struct at least as large as
  // the driver's.
  NVML_GPM_METRIC_MAX = 477
} nvmlGpmMetricId_t;

typedef struct nvmlGpmSample_st* nvmlGpmSample_t;

typedef struct {
  unsigned int metricId;    // IN: an nvmlGpmMetricId_t
  nvmlReturn_t nvmlReturn;  // OUT: value is valid only when NVML_SUCCESS
  double value;             // OUT
  struct {
    char* shortName;
    char* longName;
    char* unit;
  } metricInfo;  // OUT: may be NULL
} nvmlGpmMetric_t;

typedef struct {
  unsigned int version;     // IN: NVML_GPM_METRICS_GET_VERSION
  unsigned int numMetrics;  // IN: entries used in metrics[]
  nvmlGpmSample_t sample1;  // IN: the earlier sample
  nvmlGpmSample_t sample2;  // IN: the later sample
  nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

#define NVML_GPM_METRICS_GET_VERSION 1

typedef struct {
  unsigned int version;            // IN: NVML_GPM_SUPPORT_VERSION
  unsigned int isSupportedDevice;  // OUT: nonzero when the device supports GPM
} nvmlGpmSupport_t;

#define NVML_GPM_SUPPORT_VERSION 1

// The entry points, as pointer types for dlsym().
typedef nvmlReturn_t (*nvmlInit_v2_fn)(void);
typedef nvmlReturn_t (*nvmlShutdown_fn)(void);
typedef const char* (*nvmlErrorString_fn)(nvmlReturn_t result);
typedef nvmlReturn_t (*nvmlSystemGetDriverVersion_fn)(char* version, unsigned int length);
typedef nvmlReturn_t (*nvmlDeviceGetCount_v2_fn)(unsigned int* device_count);
typedef nvmlReturn_t (*nvmlDeviceGetHandleByIndex_v2_fn)(unsigned int index, nvmlDevice_t* device);
typedef nvmlReturn_t (*nvmlDeviceGetName_fn)(nvmlDevice_t device, char* name, unsigned int length);
typedef nvmlReturn_t (*nvmlDeviceGetUUID_fn)(nvmlDevice_t device, char* uuid, unsigned int length);
typedef nvmlReturn_t (*nvmlDeviceGetUtilizationRates_fn)(nvmlDevice_t device,
                                                         nvmlUtilization_t* utilization);
typedef nvmlReturn_t (*nvmlDeviceGetMemoryInfo_fn)(nvmlDevice_t device, nvmlMemory_t* memory);
// Milliwatts.
typedef nvmlReturn_t (*nvmlDeviceGetPowerUsage_fn)(nvmlDevice_t device, unsigned int* power);
// Degrees Celsius. Marked deprecated in NVML 13 (in favour of nvmlDeviceGetTemperatureV) but
// still exported, and the only form older drivers have.
typedef nvmlReturn_t (*nvmlDeviceGetTemperature_fn)(nvmlDevice_t device,
                                                    nvmlTemperatureSensors_t sensor,
                                                    unsigned int* temp);
typedef nvmlReturn_t (*nvmlGpmQueryDeviceSupport_fn)(nvmlDevice_t device,
                                                     nvmlGpmSupport_t* gpm_support);
typedef nvmlReturn_t (*nvmlGpmSampleAlloc_fn)(nvmlGpmSample_t* gpm_sample);
typedef nvmlReturn_t (*nvmlGpmSampleFree_fn)(nvmlGpmSample_t gpm_sample);
typedef nvmlReturn_t (*nvmlGpmSampleGet_fn)(nvmlDevice_t device, nvmlGpmSample_t gpm_sample);
typedef nvmlReturn_t (*nvmlGpmMetricsGet_fn)(nvmlGpmMetricsGet_t* metrics_get);

#ifdef __cplusplus
}  // extern "C"
#endif
