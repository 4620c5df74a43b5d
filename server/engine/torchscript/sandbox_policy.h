// What the daemon requires of the confinement of a process that runs submitted code (a
// trainerd-worker, a trainerd-module-check), held against what that process measured of itself
// (common/sandbox_report.h) and what the daemon reads of it from outside.
//
// Required, as docs/SECURITY.md promises: Landlock's rules in force (files: reads only beneath the
// process's libraries, writes nowhere), the seccomp filter on every thread (no sockets, processes,
// programs, foreign signals, tracing), no new privileges, and not dumpable. Each is something every
// shipped deployment gives (the systemd unit, the image under Docker's or containerd's default
// seccomp profile, the Kubernetes manifests). Measured and shown, not required: a network namespace
// of its own (systemd's RestrictNamespaces= and containers' default seccomp profiles refuse one;
// the seccomp filter refuses sockets either way) and a user other than the daemon's (only a daemon
// that runs as root can switch; Landlock, seccomp and the daemon being non-dumpable keep a worker
// of the daemon's own user out of its files and its process).
//
// A process short of the requirement never gets the code: its check or job is refused with
// FAILED_PRECONDITION naming what is missing, why, and the fix; an operator may accept less only
// with --worker_sandbox_may_lack naming the parts. LibTorch-free.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/sandbox_report.h"

namespace trainerd::engine {

struct SandboxPolicy {
  // Required parts the operator accepts missing (--worker_sandbox_may_lack): "landlock",
  // "seccomp", "no_new_privileges", "not_dumpable".
  std::set<std::string> may_lack;
  // The daemon's own user, against which a report's uid is compared.
  uid_t daemon_uid = 0;
};

// The parts --worker_sandbox_may_lack may name, i.e. the required ones.
const std::vector<std::string>& RequiredSandboxParts();

// One required part a report lacks: its name, and a sentence that says why and how to fix it.
struct SandboxShortfall {
  std::string part;
  std::string explanation;
};

// The required parts `report` lacks that the policy does not excuse, in a fixed order.
std::vector<SandboxShortfall> SandboxShortfalls(const SandboxReport& report,
                                                const SandboxPolicy& policy);

// OK, or FAILED_PRECONDITION naming every shortfall, e.g. "the sandbox of trainerd-worker lacks
// landlock: ...; submitted code is not run without it (--worker_sandbox_may_lack=landlock accepts
// that)".
absl::Status CheckSandbox(const SandboxReport& report, const SandboxPolicy& policy);

// Completes `report` from outside the process `pid`: every thread's Seccomp and NoNewPrivs from
// /proc/PID/task/*/status (world-readable even for a process that is not dumpable; a part the
// process claimed but a thread lacks is set false), its user ids, and `other_user` against the
// policy's daemon_uid. Where /proc does not show the process (hidepid, as systemd's
// ProtectProc=invisible mounts it, hides a process that is not dumpable even from its parent), the
// process's own measurement stands.
void MeasureFromOutside(pid_t pid, const SandboxPolicy& policy, SandboxReport* report);

// One line for logs and listings: "Landlock ABI 7, seccomp, no new privileges, not dumpable,
// network namespace, user 65534 (not the daemon's)", with "no X (why)" for what is missing.
std::string DescribeSandbox(const SandboxReport& report);

}  // namespace trainerd::engine
