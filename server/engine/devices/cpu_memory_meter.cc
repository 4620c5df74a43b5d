#include "server/engine/devices/cpu_memory_meter.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>

namespace trainerd::engine {

struct CpuMemoryMeter::Counts : c10::MemoryReportingInfoBase {
  // LibTorch's CPU allocator reports each block with its size when it is allocated and with the
  // negated size when it is freed, on the thread doing either (ProfiledCPUMemoryReporter).
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device device) override {
    if (!device.is_cpu() || alloc_size == 0) return;
    if (alloc_size > 0) {
      blocks[ptr] = alloc_size;
      current += alloc_size;
      peak = std::max(peak, current);
      return;
    }
    auto it = blocks.find(ptr);
    if (it == blocks.end()) return;  // allocated before the meter, or by another thread
    current -= it->second;
    blocks.erase(it);
  }
  bool memoryProfilingEnabled() const override { return true; }

  std::unordered_map<void*, int64_t> blocks;
  int64_t current = 0;
  int64_t peak = 0;
};

struct CpuMemoryMeter::Guard {
  explicit Guard(std::shared_ptr<c10::DebugInfoBase> info)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(info)) {}
  c10::DebugInfoGuard guard;
};

CpuMemoryMeter::CpuMemoryMeter()
    : counts_(std::make_shared<Counts>()), guard_(std::make_unique<Guard>(counts_)) {}

CpuMemoryMeter::~CpuMemoryMeter() = default;

int64_t CpuMemoryMeter::current_bytes() const { return counts_->current; }
int64_t CpuMemoryMeter::peak_bytes() const { return counts_->peak; }

}  // namespace trainerd::engine
