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
// Each returns what it applied, one phrase each, for the job's log and docs/SECURITY.md's claims;
// tests/worker/sandbox_test.cc checks each claim in a process of its own. Not thread-safe: call
// from main. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd::worker {

struct SandboxOptions {
  // RLIMIT_AS beyond what the process has mapped when LockDown runs; 0: none.
  int64_t address_space_bytes = 0;
  // RLIMIT_CPU, in seconds of CPU time (all threads); 0: none. SIGXCPU at the limit, SIGKILL a few
  // seconds after.
  int64_t cpu_seconds = 0;
  // RLIMIT_NOFILE.
  int64_t max_open_files = 64;
  // The job runs on a GPU: the driver's device files stay readable and writable.
  bool gpu = false;
};

// What applied, e.g. {"network namespace"}; a part the kernel refused is named with "no ".
std::vector<std::string> EnterNamespaces();

// The rest. INTERNAL when a part that does not depend on the kernel's features failed (the user,
// no_new_privs, the limits, seccomp); Landlock is applied where the kernel has it.
absl::StatusOr<std::vector<std::string>> LockDown(const SandboxOptions& options);

// A job's own limits once it is known (a pooled worker locks down before it has one): RLIMIT_CPU
// and RLIMIT_AS as in LockDown, where set. Limits can only be lowered after LockDown.
absl::Status ApplyJobLimits(const SandboxOptions& options);

}  // namespace trainerd::worker
