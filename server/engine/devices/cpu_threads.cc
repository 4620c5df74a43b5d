#include "server/engine/devices/cpu_threads.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace trainerd::engine {
namespace {

// cgroup v2's "cpu.max": "<quota> <period>" in microseconds, or "max <period>" without a quota.
// Returns the quota in cores rounded up, or 0 when there is none (or no cgroup v2).
int CgroupQuotaCores() {
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  const std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
  int64_t quota = 0;
  int64_t period = 0;
  if (words.size() != 2 || !absl::SimpleAtoi(words[0], &quota) ||
      !absl::SimpleAtoi(words[1], &period) || quota <= 0 || period <= 0) {
    return 0;
  }
  return static_cast<int>((quota + period - 1) / period);
}

}  // namespace

int UsableCores() {
  int cores = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  const int quota = CgroupQuotaCores();
  if (quota > 0) cores = std::min(cores, quota);
  return std::max(cores, 1);
}

int IntraOpThreadsFor(double flops_per_step, int cores) {
  cores = std::max(cores, 1);
  if (!(flops_per_step >= kFlopsPerIntraOpThread)) return 1;  // also NaN and unknown (0)
  const double threads = std::floor(flops_per_step / kFlopsPerIntraOpThread);
  return threads >= cores ? cores : std::max(1, static_cast<int>(threads));
}

void SetIntraOpThreads(int threads) {
  // LibTorch initialises a thread's setting lazily, at its first parallel operator, from the last
  // count any thread set; asking for the count first runs that initialisation now, so that it
  // cannot later replace this thread's own count with another job's.
  at::get_num_threads();
  at::set_num_threads(std::max(threads, 1));
}

int IntraOpThreads() { return at::get_num_threads(); }

void SetFlushDenormal(bool on) { at::globalContext().setFlushDenormal(on); }

void LowerThreadPriority(int nice) {
  if (nice <= 0) return;
  nice = std::min(nice, 19);
  // PRIO_PROCESS with a thread id names that thread alone on Linux.
  const id_t self = static_cast<id_t>(::gettid());
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, self);
  if (errno != 0 || now >= nice) return;
  // Lowering one's own priority needs no privilege; a failure leaves the thread as it was.
  (void)::setpriority(PRIO_PROCESS, self, nice);
}

bool CpuThreadBudget::TryAcquire(int threads, uintptr_t claimant) {
  threads = std::max(threads, 1);
  absl::MutexLock lock(&mu_);
  if (next_turn_ != 0 && next_turn_ != claimant) return false;
  if (in_use_ > 0 && in_use_ + threads > cores_) {
    if (claimant != 0) next_turn_ = claimant;
    return false;
  }
  in_use_ += threads;
  next_turn_ = 0;
  return true;
}

void CpuThreadBudget::Withdraw(uintptr_t claimant) {
  absl::MutexLock lock(&mu_);
  if (next_turn_ == claimant) next_turn_ = 0;
}

void CpuThreadBudget::Take(int threads) {
  absl::MutexLock lock(&mu_);
  in_use_ += std::max(threads, 1);
}

void CpuThreadBudget::Release(int threads) {
  absl::MutexLock lock(&mu_);
  in_use_ = std::max(0, in_use_ - std::max(threads, 1));
}

int CpuThreadBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

}  // namespace trainerd::engine
