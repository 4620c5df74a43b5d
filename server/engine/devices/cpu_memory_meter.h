// What a job's own tensors hold in host memory on the CPU, measured rather than guessed: the
// device report's peak memory there (on a GPU the CUDA caching allocator's peak says it).
#pragma once

#include <cstdint>
#include <memory>

namespace trainerd::engine {

// Counts the bytes of CPU tensor storage allocated and freed by the thread that made it, while it
// lives, and the most held at once: a job's parameters, gradients, optimizer state, batches and
// activations, but not its dataset (allocated before, on another thread) nor another job's
// tensors. It installs itself as the thread's LibTorch memory reporter (the hook
// torch.profiler(profile_memory=True) uses: c10::MemoryReportingInfoBase as the thread's
// PROFILER_STATE), restoring what was there when it goes.
//
// Blocks freed on another thread (a tensor the job handed out) are not subtracted, and blocks the
// thread frees that it did not allocate are ignored: the peak may then be a little high, never
// lower than what the job held. LibTorch's reporter (c10::ProfiledCPUMemoryReporter) keeps the
// size of each block allocated while a meter runs until the block is freed on a metered thread:
// the few a job hands out (its outcome's tensors) stay in its table, a few entries per job. Not
// thread-safe: one meter per thread, made and read there.
class CpuMemoryMeter {
 public:
  CpuMemoryMeter();
  ~CpuMemoryMeter();
  CpuMemoryMeter(const CpuMemoryMeter&) = delete;
  CpuMemoryMeter& operator=(const CpuMemoryMeter&) = delete;

  // Bytes held now by blocks the thread allocated since the meter was made.
  int64_t current_bytes() const;
  // The most current_bytes has been.
  int64_t peak_bytes() const;

  struct Counts;

 private:
  std::shared_ptr<Counts> counts_;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace trainerd::engine
