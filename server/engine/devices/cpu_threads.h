// How many intra-op threads a CPU job runs its operators on, and the daemon-wide account that keeps
// the running CPU jobs' threads within the cores the process may use.
//
// Why: LibTorch parallelises an operator over its OpenMP team whenever the operator is larger than
// its grain, and a tiny model's operators (a 32x64 product, a softmax over 32 rows) pay a fork and
// a join each, after which libgomp's idle workers spin for a while on cores that the training
// thread, the other jobs and gRPC's threads need. A job whose step is a few MFLOPs runs fastest on
// one thread; a job of large products gains from more. So each job gets threads from its size, and
// the jobs running together never hold more threads than there are cores. docs/PERFORMANCE.md has
// the measurements behind the constants.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainerd::engine {

// Model FLOPs per training step below which a job runs on one intra-op thread; each further
// multiple of it earns one more thread (up to the cores). Measured on a 2-core x86 machine with
// LibTorch 2.11 (docs/PERFORMANCE.md, "Threads"): one thread ran every MLP up to 40 MFLOPs per
// step 1.3x to 2.3x faster than two, and the 130 MFLOPs mlp workload about as fast.
inline constexpr double kFlopsPerIntraOpThread = 100e6;

// The cores this process may run on: the affinity mask (a container's cpuset), further bounded by
// a cgroup v2 CPU quota (`docker run --cpus`, a Kubernetes CPU limit), rounded up; at least 1.
int UsableCores();

// The intra-op threads a CPU job would like: 1 for a step below kFlopsPerIntraOpThread FLOPs (or
// of unknown cost), else one per kFlopsPerIntraOpThread FLOPs, at most `cores`.
int IntraOpThreadsFor(double flops_per_step, int cores);

// Sets the calling thread's intra-op threads (LibTorch's OpenMP team for this thread, and MKL's).
// Each job's worker thread calls it before the job's first operator.
void SetIntraOpThreads(int threads);

// The calling thread's intra-op threads as LibTorch sees them.
int IntraOpThreads();

// Whether the calling thread's float arithmetic flushes subnormal numbers to zero (x86's FTZ and
// DAZ; a no-op elsewhere). A job whose values decay towards zero (Adam's moments on a separable
// problem, a saturated softmax's gradients) otherwise meets subnormals, which x86 computes with
// micro-code assists, up to 100 times slower: measured 5x on a whole epoch of the mlp workload in
// PyTorch itself. Flushing changes only values below 1.2e-38, far inside float32 tolerance, as GPUs
// do. Per thread: a job's worker sets it before its first operator, so it covers a one-thread job
// wholly and a many-thread job's own thread.
void SetFlushDenormal(bool on);

// Lowers the calling thread's scheduling priority to at least `nice` (Linux keeps a nice value per
// thread; the threads it starts afterwards, such as its OpenMP team, inherit it). Never raises a
// priority, which would need privileges; 0 or less does nothing. A CPU job's training thread
// calls it before its first operator, so that when training and the threads that answer RPCs both
// want the cores, the RPCs come first: on a 2-core node with 32 busy clients the daemon's p99
// halved (docs/PERFORMANCE.md), while a node that only trains gives training every idle cycle as
// before (a nice value matters only under contention).
void LowerThreadPriority(int nice);

// The running CPU jobs' intra-op threads, kept within the cores. A job's threads depend on the job
// alone (its size and the cores), never on what else runs, so that a seed gives the same losses
// whether the job runs alone or beside others; a job whose threads are not free waits for them,
// as it waits for memory. Thread-safe.
class CpuThreadBudget {
 public:
  explicit CpuThreadBudget(int cores) : cores_(cores < 1 ? 1 : cores) {}
  CpuThreadBudget(const CpuThreadBudget&) = delete;
  CpuThreadBudget& operator=(const CpuThreadBudget&) = delete;

  // Takes `threads` (at least 1) when they fit beside those taken, or when none are taken (so
  // that a job asking for more than the cores still runs, alone); false otherwise. Hand them
  // back with Release. A `claimant` (non-zero: who asks, the same value each time it asks again)
  // whose threads do not fit holds the next turn: until it takes them (or Withdraws), no other
  // claimant's ask succeeds, so that a job wanting every core is not starved by small jobs that
  // keep fitting beside each other.
  bool TryAcquire(int threads, uintptr_t claimant = 0);
  // `claimant` no longer waits (its job was cancelled before it started): the turn it held is free.
  void Withdraw(uintptr_t claimant);
  // Takes `threads` (at least 1) whether or not they fit: work that must not wait for this
  // daemon's jobs (a rank run for another daemon's job, whose other ranks are already waiting in
  // a collective) is counted, so that jobs queued here wait for it, but is never held back by them.
  void Take(int threads);
  void Release(int threads);

  int cores() const { return cores_; }
  int in_use() const;

 private:
  const int cores_;
  mutable absl::Mutex mu_;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uintptr_t next_turn_ ABSL_GUARDED_BY(mu_) = 0;  // the claimant that waits first; 0: none
};

}  // namespace trainerd::engine
