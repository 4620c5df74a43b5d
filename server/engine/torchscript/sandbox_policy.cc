// The daemon's requirement of a worker's sandbox (sandbox_policy.h).
#include "server/engine/torchscript/sandbox_policy.h"

#include <dirent.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainerd::engine {
namespace {

// What to change where a filter above the daemon refuses a system call the sandbox needs.
constexpr char kFilterFix[] =
    "with systemd, the unit's SystemCallFilter= must allow landlock_create_ruleset, "
    "landlock_add_rule, landlock_restrict_self and seccomp (deploy/systemd/trainerd.service "
    "does); in a container, the runtime's seccomp profile must allow them (Docker 23 and "
    "containerd 1.6 or later do by default; a custom or older profile may not)";

std::string LandlockExplanation(const SandboxReport& r) {
  const std::string& why = r.landlock_error;
  if (why == "ENOSYS") {
    return "this kernel has no Landlock (it needs Linux 5.13 or later built with "
           "CONFIG_SECURITY_LANDLOCK)";
  }
  if (why == "EOPNOTSUPP") {
    return "this kernel has Landlock but it is not enabled: add landlock to the lsm= kernel "
           "boot parameter";
  }
  if (why == "EPERM" || why == "EACCES") {
    return absl::StrCat("a seccomp filter on the daemon refuses Landlock's system calls: ",
                        kFilterFix);
  }
  if (why == "probe") {
    return "its Landlock rules were accepted but a read outside them succeeded";
  }
  return absl::StrCat("Landlock could not be applied (", why.empty() ? "unknown" : why, ")");
}

std::string SeccompExplanation(const SandboxReport& r) {
  const std::string& why = r.seccomp_error;
  if (why == "EPERM" || why == "EACCES") {
    return absl::StrCat("a seccomp filter on the daemon refuses seccomp(2): ", kFilterFix);
  }
  if (why == "ENOSYS" || why == "EINVAL") {
    return "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)";
  }
  if (why == "probe") return "a thread of the process runs outside its seccomp filter";
  return absl::StrCat("its seccomp filter could not be loaded (", why.empty() ? "unknown" : why,
                      ")");
}

}  // namespace

const std::vector<std::string>& RequiredSandboxParts() {
  static const auto* parts = new std::vector<std::string>{
      std::string(kSandboxLandlock), std::string(kSandboxSeccomp),
      std::string(kSandboxNoNewPrivileges), std::string(kSandboxNotDumpable)};
  return *parts;
}

std::vector<SandboxShortfall> SandboxShortfalls(const SandboxReport& report,
                                                const SandboxPolicy& policy) {
  std::vector<SandboxShortfall> out;
  auto lacks = [&](absl::string_view part, bool has, std::string explanation) {
    if (has || policy.may_lack.count(std::string(part)) > 0) return;
    out.push_back({std::string(part), std::move(explanation)});
  };
  lacks(kSandboxLandlock, report.landlock, LandlockExplanation(report));
  lacks(kSandboxSeccomp, report.seccomp, SeccompExplanation(report));
  lacks(kSandboxNoNewPrivileges, report.no_new_privileges,
        "no_new_privs is not set on every thread of the process");
  lacks(kSandboxNotDumpable, report.not_dumpable, "the process is dumpable");
  return out;
}

absl::Status CheckSandbox(const SandboxReport& report, const SandboxPolicy& policy) {
  const std::vector<SandboxShortfall> shortfalls = SandboxShortfalls(report, policy);
  if (shortfalls.empty()) return absl::OkStatus();
  std::vector<std::string> parts, explained;
  for (const SandboxShortfall& s : shortfalls) {
    parts.push_back(s.part);
    explained.push_back(absl::StrCat(s.part, ": ", s.explanation));
  }
  const std::string program = report.program.empty() ? "the worker" : report.program;
  return absl::FailedPreconditionError(
      absl::StrCat("submitted code is not run here: the sandbox of ", program, " lacks ",
                   absl::StrJoin(explained, "; "), " (docs/SECURITY.md; --worker_sandbox_may_lack=",
                   absl::StrJoin(parts, ","), " runs submitted code without it)"));
}

void MeasureFromOutside(pid_t pid, const SandboxPolicy& policy, SandboxReport* report) {
  bool all_filtered = true;
  bool all_no_new_privs = true;
  int threads = 0;
  // The worker's own filter comes on top of any the daemon runs under (systemd's
  // SystemCallFilter=, a container's profile): each thread has more than the daemon has.
  int64_t own_filters = -1;
  (void)absl::SimpleAtoi(ProcStatusField("/proc/self/status", "Seccomp_filters:"), &own_filters);
  const std::string task_dir = absl::StrCat("/proc/", pid, "/task");
  if (DIR* tasks = ::opendir(task_dir.c_str())) {
    while (dirent* e = ::readdir(tasks)) {
      int tid = 0;
      if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
      const std::string path = absl::StrCat(task_dir, "/", tid, "/status");
      const std::string seccomp = ProcStatusField(path, "Seccomp:");
      if (seccomp.empty()) continue;  // the thread ended meanwhile
      ++threads;
      int64_t filters = -1;
      const bool counted = absl::SimpleAtoi(ProcStatusField(path, "Seccomp_filters:"), &filters);
      all_filtered = all_filtered && seccomp == "2" &&
                     (!counted || own_filters < 0 || filters > own_filters);
      all_no_new_privs = all_no_new_privs && ProcStatusField(path, "NoNewPrivs:") == "1";
    }
    ::closedir(tasks);
  }
  // Unreadable (a /proc mounted with hidepid, e.g. systemd's ProtectProc=invisible, hides a process
  // that is not dumpable even from its parent): the process's own measurement stands.
  if (threads > 0 && !all_filtered) {
    if (report->seccomp && report->seccomp_error.empty()) report->seccomp_error = "probe";
    report->seccomp = false;
  }
  if (threads > 0 && !all_no_new_privs) report->no_new_privileges = false;
  // Uid: real, effective, saved, file system.
  std::istringstream uids(ProcStatusField(absl::StrCat("/proc/", pid, "/status"), "Uid:"));
  int64_t real = -1, effective = -1, saved = -1, fs = -1;
  uids >> real >> effective >> saved >> fs;
  if (real >= 0) {
    report->uid = real == effective && effective == saved && saved == fs ? real : -1;
  }
  const auto daemon = static_cast<int64_t>(policy.daemon_uid);
  report->other_user = report->uid >= 0 && report->uid != daemon;
}

std::string DescribeSandbox(const SandboxReport& r) {
  std::vector<std::string> parts;
  parts.push_back(r.landlock ? absl::StrCat("Landlock ABI ", r.landlock_abi)
                             : absl::StrCat("no Landlock (", r.landlock_error, ")"));
  parts.push_back(r.seccomp ? "seccomp" : absl::StrCat("no seccomp (", r.seccomp_error, ")"));
  parts.push_back(r.no_new_privileges ? "no new privileges" : "new privileges possible");
  parts.push_back(r.not_dumpable ? "not dumpable" : "dumpable");
  parts.push_back(r.network_namespace
                      ? "network namespace"
                      : absl::StrCat("no network namespace (", r.network_error, ")"));
  parts.push_back(
      r.uid < 0
          ? "mixed user ids"
          : absl::StrCat("user ", r.uid, r.other_user ? " (not the daemon's)" : " (the daemon's)"));
  return absl::StrJoin(parts, ", ");
}

}  // namespace trainerd::engine
