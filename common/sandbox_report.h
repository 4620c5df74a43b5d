// What a process that runs submitted code (trainerd-worker, trainerd-module-check) got of its
// confinement, as measured rather than as asked for: the process measures itself once it has
// locked itself down and before it reads a byte of the submitted code (server/worker/sandbox.h),
// sends the report to the daemon, and the daemon completes it from outside
// (/proc/PID/task/*/status) and holds it against what docs/SECURITY.md promises
// (server/engine/torchscript/sandbox_policy.h).
//
// The report crosses a pipe or a socket as one line of `key=value` words (values without spaces or
// control characters: reasons are short tokens such as "EPERM"), so that the module checker's text
// protocol and the worker's framed one carry the same thing. Decoding never trusts the line: an
// unknown key is skipped, a malformed value is INVALID_ARGUMENT. No LibTorch, no gRPC.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainerd {

struct SandboxReport {
  // The program that measured itself ("trainerd-worker", "trainerd-module-check").
  std::string program;
  // Landlock: the kernel's ABI version (0: none usable), and whether the ruleset is in force, which
  // the process checks by trying to read a folder its rules leave out. `landlock_error` is why not:
  // the errno's name from the kernel ("ENOSYS": no Landlock in this kernel; "EOPNOTSUPP": built in
  // but not enabled; "EPERM": a seccomp filter above the process refuses the call), or "probe" when
  // the ruleset was accepted but a read outside it succeeded.
  int landlock_abi = 0;
  bool landlock = false;
  std::string landlock_error;
  // Every thread of the process runs under its seccomp filter (Seccomp: 2 in its status), and the
  // filter's load error when there is none ("EPERM": refused by a filter above the process).
  bool seccomp = false;
  std::string seccomp_error;
  // PR_SET_NO_NEW_PRIVS is set on every thread.
  bool no_new_privileges = false;
  // The process is not dumpable: processes of its user cannot open its /proc files or trace it.
  bool not_dumpable = false;
  // A network namespace of its own, and why not ("EPERM": namespaces refused, e.g. by systemd's
  // RestrictNamespaces= or a container's seccomp profile).
  bool network_namespace = false;
  std::string network_error;
  // Its user id (real, effective, saved and file-system ids all this one; -1 when they differ), and
  // whether that is another user than the daemon's (filled in by the daemon).
  int64_t uid = -1;
  bool other_user = false;
};

std::string EncodeSandboxReport(const SandboxReport& report);
absl::StatusOr<SandboxReport> DecodeSandboxReport(absl::string_view line);

// The value of `key` ("Seccomp:") in a /proc status file (a process's or a thread's), blanks
// trimmed; "" when the file or the key is missing. What both sides of a report read: the process
// of itself, the daemon of the process from outside.
std::string ProcStatusField(const std::string& path, absl::string_view key);

// The parts, as named in reports, flags (--worker_sandbox_may_lack) and metrics.
inline constexpr absl::string_view kSandboxLandlock = "landlock";
inline constexpr absl::string_view kSandboxSeccomp = "seccomp";
inline constexpr absl::string_view kSandboxNoNewPrivileges = "no_new_privileges";
inline constexpr absl::string_view kSandboxNotDumpable = "not_dumpable";
inline constexpr absl::string_view kSandboxNetworkNamespace = "network_namespace";
inline constexpr absl::string_view kSandboxOtherUser = "other_user";

}  // namespace trainerd
