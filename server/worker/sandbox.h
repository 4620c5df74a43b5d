// The confinement of a trainerd-worker process, which runs a submitted TorchScript module: code
// from a caller, treated as hostile. Applied in two steps, because LibTorch must start (load its
// libraries, start its threads, on a GPU make its CUDA context) before the module's first byte is
// parsed, and some confinements forbid what that start needs:
//   EnterNamespaces, first thing in main while the process has one thread: death with the daemon
//     and a network namespace of its own (no interface but a loopback that is down).
//   LockDown, after LibTorch's warm-up and before the module is loaded: another user (nobody)
//     when started as root, no new privileges, resource limits, a Landlock ruleset (the files the
//     process may read: its libraries and a few of /proc and /sys; it may write none), and a
//     seccomp filter (no sockets, no processes or programs, no signals to other processes, no
//     tracing, mounting, namespaces, keyrings, BPF or kernel modules).
// Each returns what it applied, one phrase each, for the job's log and docs/SECURITY.md's claims,
// and fills a SandboxReport (common/sandbox_report.h): what is in force as measured at the end of
// LockDown (a read outside Landlock's rules is tried, every thread's status is read), which the
// process sends to the daemon before it reads any submitted code. A part that depends on the
// kernel or on a filter above the process (Landlock, seccomp, the network namespace) is reported
// missing with the kernel's reason rather than failing the process: the daemon decides whether
// what is in force is enough (server/engine/torchscript/sandbox_policy.h).
// tests/worker/sandbox_test.cc checks each claim in a process of its own. Not thread-safe: call
// from main. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sandbox_report.h"

namespace trainerd::worker {

struct SandboxOptions {
  // RLIMIT_AS beyond what the process has mapped when LockDown runs; 0: none.
  int64_t address_space_bytes = 0;
  // RLIMIT_DATA (its heap: private writable mappings) beyond what it has when the limit is set;
  // 0: none. For a GPU job, whose address space cannot be capped.
  int64_t data_bytes = 0;
  // RLIMIT_CPU, in seconds of CPU time (all threads); 0: none. SIGXCPU at the limit, SIGKILL a few
  // seconds after.
  int64_t cpu_seconds = 0;
  // RLIMIT_NOFILE.
  int64_t max_open_files = 64;
  // RLIMIT_NPROC: the tasks its user has when LockDown runs plus this many (threads: the seccomp
  // filter refuses new processes); 0: none.
  int64_t max_threads = 0;
  // The job runs on a GPU: the driver's device files stay readable and writable.
  bool gpu = false;
};

// What applied, e.g. {"network namespace"}; a part the kernel refused is named with "no ". Also
// makes the process the out-of-memory killer's first choice (oom_score_adj 1000), so that a module
// that exhausts the node's memory costs its own process and not the daemon's. `report` (optional)
// gets the network namespace's outcome.
std::vector<std::string> EnterNamespaces(SandboxReport* report = nullptr);

// The rest. INTERNAL when a part that does not depend on the kernel or a filter above the process
// failed (the user, no_new_privs, the limits); Landlock and seccomp are applied where they can be,
// and `report` (optional) gets what is in force, measured (MeasureConfinement).
absl::StatusOr<std::vector<std::string>> LockDown(const SandboxOptions& options,
                                                  SandboxReport* report = nullptr);

// What is in force now, measured into `report` (its Landlock ABI and errors as LockDown left them):
// a read of "/" refused with EACCES (Landlock's rules), Seccomp: 2 and NoNewPrivs: 1 in the status
// of every thread, not dumpable, and the user ids.
void MeasureConfinement(SandboxReport* report);

// A job's own limits once it is known (a pooled worker locks down before it has one): RLIMIT_CPU,
// RLIMIT_AS and RLIMIT_DATA, where set. Limits can only be lowered after LockDown.
absl::Status ApplyJobLimits(const SandboxOptions& options);

}  // namespace trainerd::worker
