// The seed's checks for one device (SystemService.Diagnose): a large float32 matrix product's
// FLOP/s (the peak a job's achieved FLOP/s is compared with), host-to-device bandwidth, the cost
// of one kernel launch (or op dispatch) and of one synchronisation.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>

#include "server/engine/devices/diagnosis_types.h"

namespace trainerd::engine {

inline constexpr int64_t kCudaMatmulSize = 8192;  // 1.1 TFLOP a product: ~20 ms on an H200
inline constexpr int64_t kCpuMatmulSize = 1024;  // 2.1 GFLOP a product: tens of ms on a core or two
inline constexpr double kCudaMatmulSeconds = 0.5;  // long enough for NVML's utilization sample
inline constexpr double kCpuMatmulSeconds = 0.25;
inline constexpr int64_t kCudaCopyBytes = int64_t{256} << 20;
inline constexpr int64_t kCpuCopyBytes = int64_t{64} << 20;

struct DiagnoseOptions {
  // Side of the square float32 matrices; 0: kCudaMatmulSize on a GPU, kCpuMatmulSize on the CPU.
  int64_t matmul_size = 0;
  // How long the timed products should last; their count comes from one timed product after the
  // warm-up. 0: kCudaMatmulSeconds / kCpuMatmulSeconds. Ignored when matmul_repeats > 0.
  double matmul_seconds = 0.0;
  int matmul_repeats = 0;
  // Bytes per host-to-device copy (0: kCudaCopyBytes / kCpuCopyBytes) and copies timed.
  int64_t copy_bytes = 0;
  int copy_repeats = 4;
  // Tiny ops timed for the launch cost, and empty synchronisations for the sync cost.
  int launch_repeats = 2000;
  int sync_repeats = 200;
  // Called once while the timed products are still running: on a GPU right after they are all
  // queued (before the synchronisation; they then last about matmul_seconds), on the CPU from the
  // calling thread while a worker thread is halfway through them. The caller fills in
  // utilization_during_matmul / sm_activity_during_matmul from its sampler. The GPU's figure is
  // timed with CUDA events, so the callback's own time does not lower it; on the CPU the callback
  // shares the cores with the products, so keep it short.
  std::function<void(DeviceDiagnosis&)> sample_during_matmul;
};

// Measures `device` ("cpu" or a CUDA device; "cuda" without an index means cuda:0). Takes about a
// second on a GPU with the defaults (a few seconds the first time, for the CUDA context and
// cuBLAS), less on the CPU. The checks share the device with running jobs, so figures taken on a
// busy device are low. Not for concurrent use: the caller runs one measurement at a time.
// LibTorch reports failures (out of memory on a busy GPU) by throwing c10::Error; the caller
// catches it at the engine's edge.
DeviceDiagnosis DiagnoseDevice(const torch::Device& device, const DiagnoseOptions& options);

// LibTorch's version, e.g. "2.11.0" (TORCH_VERSION).
std::string LibTorchVersion();

// The CUDA runtime version LibTorch was built with, e.g. "13.0"; "" for a CPU-only LibTorch.
std::string CudaBuildVersion();

}  // namespace trainerd::engine
