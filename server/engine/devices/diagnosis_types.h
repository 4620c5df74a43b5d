// The figures of SystemService.Diagnose (proto DiagnoseResponse / DeviceDiagnosis), as plain
// LibTorch-free values: the service layer converts them, the engine measures them (diagnose.h)
// and JudgeSpeed (speed_report.h) compares jobs with them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace trainerd::engine {

// One device's measurements. See proto/trainerd/v1/system.proto, DeviceDiagnosis.
struct DeviceDiagnosis {
  std::string device;  // "cpu" or "cuda:N"
  std::string name;    // "NVIDIA H200", the CPU's model name
  int64_t memory_total_bytes = 0;
  // A square float32 matrix product of this size: its achieved FLOP/s (2 n^3 per product).
  int64_t matmul_size = 0;
  double matmul_flops_per_second = 0.0;
  // From pinned host memory to the device (GPU); a copy between two host buffers (CPU).
  double host_to_device_bytes_per_second = 0.0;
  // One launch of a tiny kernel (GPU) or dispatch of the smallest op (CPU); one synchronisation
  // with nothing queued (0 on the CPU).
  double launch_seconds = 0.0;
  double sync_seconds = 0.0;
  // Filled in by the caller's sampler while the products run (DiagnoseOptions), 0..1.
  std::optional<double> utilization_during_matmul;
  std::optional<double> sm_activity_during_matmul;
};

struct Diagnosis {
  std::string libtorch_version;  // "2.11.0"
  std::string cuda_version;      // LibTorch's CUDA build, "13.0"; empty without CUDA
  std::string driver_version;    // the driver's CUDA version, when a driver is present
  std::vector<DeviceDiagnosis> devices;
  absl::Time measure_time = absl::InfinitePast();
  bool cached = false;
};

}  // namespace trainerd::engine
