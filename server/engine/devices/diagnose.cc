#include "server/engine/devices/diagnose.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "server/engine/devices/cpu_threads.h"

namespace trainerd::engine {
namespace {

using Clock = std::chrono::steady_clock;

// Bounds on the product count sized from matmul_seconds: at least two, so that one slow product
// (a clock tick, a preemption) does not make the figure; at most enough to keep a tiny test
// matrix from queueing millions of launches.
constexpr int kMinMatmulRepeats = 2;
constexpr int kMaxMatmulRepeats = 100000;
// Ops before timing the launch cost, so that the allocator, the dispatcher's caches and the
// kernel's first-launch costs are out of the figure.
constexpr int kLaunchWarmups = 100;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int MatmulRepeats(const DiagnoseOptions& options, double target_seconds, double one_seconds) {
  if (options.matmul_repeats > 0) return options.matmul_repeats;
  const double target = options.matmul_seconds > 0.0 ? options.matmul_seconds : target_seconds;
  const double wanted = one_seconds > 0.0 ? std::ceil(target / one_seconds) : kMaxMatmulRepeats;
  return static_cast<int>(std::clamp(wanted, static_cast<double>(kMinMatmulRepeats),
                                     static_cast<double>(kMaxMatmulRepeats)));
}

double MatmulFlops(int64_t n, int repeats) {
  const double side = static_cast<double>(n);
  return 2.0 * side * side * side * static_cast<double>(repeats);
}

// The first "model name" of /proc/cpuinfo, e.g. "AMD EPYC 9654 96-Core Processor"; "cpu" when
// there is none (some ARM kernels leave it out).
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "model name")) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
    if (!name.empty()) return name;
  }
  return "cpu";
}

// MemTotal of /proc/meminfo in bytes; 0 when unreadable.
int64_t HostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "MemTotal:")) continue;
    // "MemTotal:       131891388 kB"
    const std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int64_t kib = 0;
    if (words.size() >= 2 && absl::SimpleAtoi(words[1], &kib)) return kib * 1024;
  }
  return 0;
}

void DiagnoseCpu(const DiagnoseOptions& options, DeviceDiagnosis& d) {
  d.device = "cpu";
  d.name = CpuModelName();
  d.memory_total_bytes = HostMemoryBytes();

  // Matrix products on every usable core (the peak; a job's own threads are chosen per job, and a
  // thread LibTorch has not seen takes the last count any thread set). The warm-up also grows the
  // intra-op thread pool and the allocator.
  const int cores = UsableCores();
  SetIntraOpThreads(cores);
  const int64_t n = options.matmul_size > 0 ? options.matmul_size : kCpuMatmulSize;
  d.matmul_size = n;
  // A generator of its own: LibTorch's global one is where jobs' initial weights come from, and
  // a measurement beside a job must not change that job's numbers.
  at::Generator gen = at::detail::createCPUGenerator(/*seed_val=*/20261202);
  const torch::Tensor a = torch::randn({n, n}, gen, torch::kFloat);
  const torch::Tensor b = torch::randn({n, n}, gen, torch::kFloat);
  torch::Tensor c = torch::empty({n, n}, torch::kFloat);
  torch::mm_out(c, a, b);
  Clock::time_point start = Clock::now();
  torch::mm_out(c, a, b);
  const int repeats = MatmulRepeats(options, kCpuMatmulSeconds, SecondsSince(start));
  // The CPU has no queue to leave the products in: they run on a worker thread so that the
  // sampler is called while they run. LibTorch's intra-op pool serves any thread.
  absl::Notification halfway;
  std::exception_ptr failure;
  double matmul_seconds = 0.0;
  std::thread worker([&] {
    try {
      SetIntraOpThreads(cores);
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < repeats; ++i) {
        if (i == repeats / 2) halfway.Notify();
        torch::mm_out(c, a, b);
      }
      matmul_seconds = SecondsSince(t0);
    } catch (...) {
      failure = std::current_exception();
    }
    if (!halfway.HasBeenNotified()) halfway.Notify();
  });
  halfway.WaitForNotification();
  if (options.sample_during_matmul) options.sample_during_matmul(d);
  worker.join();
  if (failure) std::rethrow_exception(failure);
  if (matmul_seconds > 0.0) d.matmul_flops_per_second = MatmulFlops(n, repeats) / matmul_seconds;

  // "Host to device" on the CPU: a copy between two buffers, i.e. memory bandwidth as LibTorch's
  // copy_ (parallel for large tensors) sees it.
  const int64_t bytes = options.copy_bytes > 0 ? options.copy_bytes : kCpuCopyBytes;
  const int copies = std::max(1, options.copy_repeats);
  const torch::Tensor src = torch::ones({bytes}, torch::kUInt8);
  torch::Tensor dst = torch::empty({bytes}, torch::kUInt8);
  dst.copy_(src);  // faults the destination's pages in
  start = Clock::now();
  for (int i = 0; i < copies; ++i) dst.copy_(src);
  const double copy_seconds = SecondsSince(start);
  if (copy_seconds > 0.0) {
    d.host_to_device_bytes_per_second =
        static_cast<double>(bytes) * static_cast<double>(copies) / copy_seconds;
  }

  // Dispatch cost of the smallest op, the CPU's counterpart of a kernel launch.
  torch::Tensor x = torch::zeros({1}, torch::kFloat);
  for (int i = 0; i < kLaunchWarmups; ++i) x.add_(1.0);
  const int launches = std::max(1, options.launch_repeats);
  start = Clock::now();
  for (int i = 0; i < launches; ++i) x.add_(1.0);
  d.launch_seconds = SecondsSince(start) / launches;
  d.sync_seconds = 0.0;  // nothing is ever queued
}

void DiagnoseCuda(const torch::Device& device, const DiagnoseOptions& options, DeviceDiagnosis& d) {
  const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
  const torch::Device cuda(torch::kCUDA, index);
  c10::cuda::CUDAGuard guard(index);  // the events and the current stream are this device's
  d.device = absl::StrCat("cuda:", index);
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(index);
  d.name = properties->name;
  d.memory_total_bytes = static_cast<int64_t>(properties->totalGlobalMem);
  const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream(index);

  // Matrix products in float32. LibTorch's default leaves TF32 off for float32 products
  // (allowTF32CuBLAS() is false unless someone turns it on; the daemon does not), so this is
  // plain float32 FLOP/s: the arithmetic a float32 job's products get, not the tensor cores'
  // TF32 rate. Events time them on the device, so host-side time (the sampler) is not counted.
  const int64_t n = options.matmul_size > 0 ? options.matmul_size : kCudaMatmulSize;
  d.matmul_size = n;
  const torch::TensorOptions floats = torch::TensorOptions().dtype(torch::kFloat).device(cuda);
  // Drawn on the host from a generator of its own (see the CPU's), then copied once.
  at::Generator gen = at::detail::createCPUGenerator(/*seed_val=*/20261202);
  const torch::Tensor a = torch::randn({n, n}, gen, torch::kFloat).to(floats);
  const torch::Tensor b = torch::randn({n, n}, gen, torch::kFloat).to(floats);
  torch::Tensor c = torch::empty({n, n}, floats);
  torch::mm_out(c, a, b);  // cuBLAS handle, workspace and kernel choice
  torch::cuda::synchronize(index);
  at::cuda::CUDAEvent start_event(cudaEventDefault);
  at::cuda::CUDAEvent end_event(cudaEventDefault);
  start_event.record(stream);
  torch::mm_out(c, a, b);
  end_event.record(stream);
  end_event.synchronize();
  const double one_seconds = start_event.elapsed_time(end_event) / 1000.0;
  const int repeats = MatmulRepeats(options, kCudaMatmulSeconds, one_seconds);
  start_event.record(stream);
  for (int i = 0; i < repeats; ++i) torch::mm_out(c, a, b);
  end_event.record(stream);
  // The products are queued and run for about matmul_seconds: sample now.
  if (options.sample_during_matmul) options.sample_during_matmul(d);
  end_event.synchronize();
  const double matmul_seconds = start_event.elapsed_time(end_event) / 1000.0;
  if (matmul_seconds > 0.0) d.matmul_flops_per_second = MatmulFlops(n, repeats) / matmul_seconds;
  // Free the matrices before the copy's buffers are allocated (3 x 256 MiB at the default size).
  c = torch::Tensor();

  // Host to device from pinned memory, asynchronous as the daemon's uploads are.
  const int64_t bytes = options.copy_bytes > 0 ? options.copy_bytes : kCudaCopyBytes;
  const int copies = std::max(1, options.copy_repeats);
  const torch::Tensor pinned =
      torch::ones({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  torch::Tensor on_device =
      torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(cuda));
  on_device.copy_(pinned, /*non_blocking=*/true);
  torch::cuda::synchronize(index);
  Clock::time_point start = Clock::now();
  for (int i = 0; i < copies; ++i) on_device.copy_(pinned, /*non_blocking=*/true);
  torch::cuda::synchronize(index);
  const double copy_seconds = SecondsSince(start);
  if (copy_seconds > 0.0) {
    d.host_to_device_bytes_per_second =
        static_cast<double>(bytes) * static_cast<double>(copies) / copy_seconds;
  }

  // Launch cost: many tiny kernels, one synchronisation at the end (its cost, a few
  // microseconds, spread over the launches). The kernels take less time than their launches, so
  // the host's launch rate is what is measured, as it is for a small model's training step.
  torch::Tensor x = torch::zeros({1}, floats);
  for (int i = 0; i < kLaunchWarmups; ++i) x.add_(1.0);
  torch::cuda::synchronize(index);
  const int launches = std::max(1, options.launch_repeats);
  start = Clock::now();
  for (int i = 0; i < launches; ++i) x.add_(1.0);
  torch::cuda::synchronize(index);
  d.launch_seconds = SecondsSince(start) / launches;

  // Synchronisation with nothing queued: the floor of every host read-back.
  const int syncs = std::max(1, options.sync_repeats);
  torch::cuda::synchronize(index);
  start = Clock::now();
  for (int i = 0; i < syncs; ++i) torch::cuda::synchronize(index);
  d.sync_seconds = SecondsSince(start) / syncs;
}

}  // namespace

DeviceDiagnosis DiagnoseDevice(const torch::Device& device, const DiagnoseOptions& options) {
  torch::NoGradGuard no_grad;  // measurements, not training: no autograd records
  DeviceDiagnosis d;
  if (device.is_cuda()) {
    DiagnoseCuda(device, options, d);
  } else {
    DiagnoseCpu(options, d);
  }
  return d;
}

std::string LibTorchVersion() { return TORCH_VERSION; }

std::string CudaBuildVersion() {
  // The CUDA hooks are registered by libtorch_cuda (linked into the engine with the CUDA wheel)
  // and answer with the CUDART_VERSION LibTorch was compiled with, GPU or not; a CPU-only
  // LibTorch's default hooks throw. (hasCUDART() is not asked: it may depend on a device.)
  try {
    const long version = at::detail::getCUDAHooks().versionCUDART();  // 13000 for 13.0
    if (version <= 0) return "";
    return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
  } catch (const c10::Error&) {
    return "";
  }
}

}  // namespace trainerd::engine
