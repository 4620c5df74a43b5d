// The worker's confinement (sandbox.h).
#include "server/worker/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <link.h>
#include <linux/landlock.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

// Debian 12's kernel headers (6.1) predate Landlock ABI 3; its bit is fixed by the kernel's ABI.
#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif

#define TRAINERD_SANDBOX_RETURN_IF_ERROR(expr) \
  do {                                         \
    const absl::Status status_ = (expr);       \
    if (!status_.ok()) return status_;         \
  } while (0)

namespace trainerd::worker {
namespace {

constexpr uid_t kNobody = 65534;
// seccomp(2)'s SECCOMP_GET_ACTION_AVAIL and SECCOMP_RET_ALLOW (the kernel's ABI; linux/seccomp.h
// clashes with libseccomp's header).
constexpr unsigned kSeccompGetActionAvail = 2;
constexpr uint32_t kSeccompRetAllow = 0x7fff0000U;

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat("cannot ", what, ": ", std::strerror(errno)));
}

// "EPERM" for EPERM: the token a report carries (sandbox_report.h).
std::string ErrnoName(int err) {
  const char* name = ::strerrorname_np(err);
  return name != nullptr ? name : absl::StrCat("E", err);
}

bool WriteFile(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// The bytes of address space mapped now (/proc/self/statm's first field, in pages).
int64_t MappedBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  statm >> pages;
  return pages * ::sysconf(_SC_PAGESIZE);
}

absl::Status Limit(int resource, int64_t soft, int64_t hard, const char* name) {
  const rlimit limit{static_cast<rlim_t>(soft), static_cast<rlim_t>(hard)};
  if (::setrlimit(resource, &limit) != 0) return Errno(absl::StrCat("set ", name));
  return absl::OkStatus();
}

// --- Landlock (no libc wrappers in Debian 12's glibc) -------------------------------------------

// The kernel's Landlock ABI, or minus the errno of its refusal.
int LandlockAbi() {
  const long abi =
      ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi < 0 ? -errno : static_cast<int>(abi);
}

uint64_t HandledAccess(int abi) {
  uint64_t access =
      LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |
      LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
      LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
      LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
      LANDLOCK_ACCESS_FS_MAKE_SYM;
  if (abi >= 2) access |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) access |= LANDLOCK_ACCESS_FS_TRUNCATE;
  return access;
}

int CollectObject(dl_phdr_info* info, size_t, void* data) {
  auto* dirs = static_cast<std::set<std::string>*>(data);
  const std::string path = info->dlpi_name == nullptr ? "" : info->dlpi_name;
  const size_t slash = path.find_last_of('/');
  if (!path.empty() && path[0] == '/' && slash != std::string::npos && slash > 0) {
    dirs->insert(path.substr(0, slash));
  }
  return 0;
}

void AllowBeneath(int ruleset, const std::string& path, uint64_t access) {
  const int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return;  // not on this machine
  landlock_path_beneath_attr rule{};
  rule.allowed_access = access;
  rule.parent_fd = fd;
  // A file (rather than a folder) takes only the rights that apply to files.
  if (::syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0) {
    rule.allowed_access &=
        LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE;
    ::syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
  }
  ::close(fd);
}

// Reads only of the loaded libraries' folders (and the loader's cache), of the process's own
// /proc entry and of the CPU's description; writes nowhere (a GPU job: its device files).
std::string ApplyLandlock(bool gpu, SandboxReport* report) {
  const int abi = LandlockAbi();
  if (abi <= 0) {
    const int err = abi < 0 ? -abi : ENOSYS;
    report->landlock_error = ErrnoName(err);
    if (err == ENOSYS) return "no Landlock (the kernel has none)";
    if (err == EOPNOTSUPP) return "no Landlock (the kernel has it, not enabled at boot)";
    return absl::StrCat("no Landlock (", std::strerror(err),
                        ": refused by a seccomp filter above "
                        "this process)");
  }
  report->landlock_abi = abi;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = HandledAccess(abi);
  const int ruleset =
      static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0));
  if (ruleset < 0) {
    report->landlock_error = ErrnoName(errno);
    return absl::StrCat("no Landlock (", std::strerror(errno), ")");
  }
  const uint64_t read =
      LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_EXECUTE;
  std::set<std::string> dirs;
  dl_iterate_phdr(CollectObject, &dirs);
  for (const std::string& dir : dirs) AllowBeneath(ruleset, dir, read);
  AllowBeneath(ruleset, "/etc/ld.so.cache", LANDLOCK_ACCESS_FS_READ_FILE);
  AllowBeneath(ruleset, "/proc/self", LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR);
  AllowBeneath(ruleset, "/proc/cpuinfo", LANDLOCK_ACCESS_FS_READ_FILE);
  AllowBeneath(ruleset, "/proc/meminfo", LANDLOCK_ACCESS_FS_READ_FILE);
  AllowBeneath(ruleset, "/sys/devices/system/cpu",
               LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR);
  if (gpu) {
    AllowBeneath(ruleset, "/dev", read | LANDLOCK_ACCESS_FS_WRITE_FILE);
    AllowBeneath(ruleset, "/proc/driver/nvidia", read);
    AllowBeneath(ruleset, "/sys", read);
  }
  const long restricted = ::syscall(SYS_landlock_restrict_self, ruleset, 0);
  const int err = errno;
  ::close(ruleset);
  if (restricted != 0) {
    report->landlock_error = ErrnoName(err);
    return absl::StrCat("no Landlock (", std::strerror(err), ")");
  }
  return absl::StrCat("Landlock ABI ", abi, " (reads: its libraries, /proc/self; writes: ",
                      gpu ? "the GPU's device files" : "none", ")");
}

// --- seccomp (libseccomp) -----------------------------------------------------------------------

// 0, or the errno of the filter's refusal. On every thread of the process (TSYNC): threads that
// LibTorch or a GPU's driver started during the warm-up are filtered too, and get no_new_privs.
int ApplySeccomp() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return ENOMEM;
  const uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  int rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1);
  auto add = [&](int nr) {
    if (rc == 0 && nr >= 0) rc = seccomp_rule_add(ctx, deny, nr, 0);
  };
  // No network: no new sockets at all (the daemon's socket is inherited).
  for (int nr : {SCMP_SYS(socket), SCMP_SYS(connect), SCMP_SYS(bind), SCMP_SYS(listen),
                 SCMP_SYS(accept), SCMP_SYS(accept4)}) {
    add(nr);
  }
  // No programs, no other processes (threads only: clone with CLONE_THREAD; clone3's flags are
  // behind a pointer, so it is refused as unknown and glibc falls back to clone).
  for (int nr : {SCMP_SYS(execve), SCMP_SYS(execveat), SCMP_SYS(fork), SCMP_SYS(vfork)}) add(nr);
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, deny, SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  }
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  // Signals only to itself (glibc's raise and abort use tgkill on their own process).
  const pid_t self = ::getpid();
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, deny, SCMP_SYS(kill), 1,
                          SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(self)));
  }
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, deny, SCMP_SYS(tgkill), 1,
                          SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(self)));
  }
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, deny, SCMP_SYS(rt_sigqueueinfo), 1,
                          SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(self)));
  }
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, deny, SCMP_SYS(rt_tgsigqueueinfo), 1,
                          SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(self)));
  }
  for (int nr : {SCMP_SYS(tkill), SCMP_SYS(pidfd_open), SCMP_SYS(pidfd_send_signal),
                 SCMP_SYS(pidfd_getfd)}) {
    add(nr);
  }
  // No reaching into other processes or the kernel.
  for (int nr : {SCMP_SYS(ptrace),
                 SCMP_SYS(process_vm_readv),
                 SCMP_SYS(process_vm_writev),
                 SCMP_SYS(mount),
                 SCMP_SYS(umount2),
                 SCMP_SYS(pivot_root),
                 SCMP_SYS(chroot),
                 SCMP_SYS(unshare),
                 SCMP_SYS(setns),
                 SCMP_SYS(keyctl),
                 SCMP_SYS(add_key),
                 SCMP_SYS(request_key),
                 SCMP_SYS(bpf),
                 SCMP_SYS(perf_event_open),
                 SCMP_SYS(init_module),
                 SCMP_SYS(finit_module),
                 SCMP_SYS(delete_module),
                 SCMP_SYS(kexec_load),
                 SCMP_SYS(kexec_file_load),
                 SCMP_SYS(reboot),
                 SCMP_SYS(swapon),
                 SCMP_SYS(swapoff),
                 SCMP_SYS(userfaultfd),
                 SCMP_SYS(io_uring_setup),
                 SCMP_SYS(open_by_handle_at),
                 SCMP_SYS(name_to_handle_at),
                 SCMP_SYS(personality),
                 SCMP_SYS(acct),
                 SCMP_SYS(settimeofday),
                 SCMP_SYS(clock_settime),
                 SCMP_SYS(quotactl)}) {
    add(nr);
  }
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc == 0) return 0;
  // Why: seccomp(2) itself refused (EPERM: a filter above this process, such as systemd's
  // SystemCallFilter= without it; ENOSYS: no seccomp in the kernel), else libseccomp's -errno.
  uint32_t action = kSeccompRetAllow;
  if (::syscall(SYS_seccomp, kSeccompGetActionAvail, 0, &action) != 0) return errno;
  return -rc;
}

// The tasks (threads included) that user `uid` has now, as /proc shows them: what RLIMIT_NPROC
// counts outside a user namespace of the process's own.
int64_t TasksOfUser(uid_t uid) {
  int64_t tasks = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    int64_t threads = 0;
    bool mine = false;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "Uid:")) {
        std::istringstream words(line.substr(4));
        int64_t real = -1;
        words >> real;
        mine = real == static_cast<int64_t>(uid);
      } else if (absl::StartsWith(line, "Threads:")) {
        (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &threads);
      }
    }
    if (mine) tasks += threads;
  }
  ::closedir(proc);
  return tasks;
}

}  // namespace

std::vector<std::string> EnterNamespaces(SandboxReport* report) {
  SandboxReport ignored;
  if (report == nullptr) report = &ignored;
  std::vector<std::string> applied;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Raising one's own score needs no privilege.
  if (WriteFile("/proc/self/oom_score_adj", "1000")) {
    applied.push_back("the out-of-memory killer's first choice");
  }
  // Root (or CAP_SYS_ADMIN) makes the namespace directly; anyone else through a user namespace of
  // its own (where the kernel and the container allow one), mapped to its own ids.
  if (::unshare(CLONE_NEWNET) == 0) {
    applied.push_back("network namespace");
    report->network_namespace = true;
    return applied;
  }
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0) {
    WriteFile("/proc/self/setgroups", "deny");
    WriteFile("/proc/self/uid_map", absl::StrCat(uid, " ", uid, " 1\n"));
    WriteFile("/proc/self/gid_map", absl::StrCat(gid, " ", gid, " 1\n"));
    applied.push_back("network namespace (in a user namespace)");
    report->network_namespace = true;
    return applied;
  }
  report->network_error = ErrnoName(errno);
  applied.push_back(absl::StrCat("no network namespace (", std::strerror(errno),
                                 "; the seccomp filter still refuses sockets)"));
  return applied;
}

namespace {

// The bytes of private writable memory now (/proc/self/status VmData, in kB).
int64_t DataBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmData:")) {
      int64_t kb = 0;
      std::istringstream(line.substr(7)) >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace

absl::Status ApplyJobLimits(const SandboxOptions& options) {
  if (options.cpu_seconds > 0) {
    TRAINERD_SANDBOX_RETURN_IF_ERROR(
        Limit(RLIMIT_CPU, options.cpu_seconds, options.cpu_seconds + 5, "RLIMIT_CPU"));
  }
  if (options.address_space_bytes > 0) {
    const int64_t limit = MappedBytes() + options.address_space_bytes;
    TRAINERD_SANDBOX_RETURN_IF_ERROR(Limit(RLIMIT_AS, limit, limit, "RLIMIT_AS"));
  }
  if (options.data_bytes > 0) {
    const int64_t limit = DataBytes() + options.data_bytes;
    TRAINERD_SANDBOX_RETURN_IF_ERROR(Limit(RLIMIT_DATA, limit, limit, "RLIMIT_DATA"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> LockDown(const SandboxOptions& options,
                                                  SandboxReport* report) {
  SandboxReport ignored;
  if (report == nullptr) report = &ignored;
  std::vector<std::string> applied;
  if (::geteuid() == 0) {
    if (::setgroups(0, nullptr) != 0) return Errno("drop supplementary groups");
    if (::setresgid(kNobody, kNobody, kNobody) != 0) return Errno("become group nobody");
    if (::setresuid(kNobody, kNobody, kNobody) != 0) return Errno("become user nobody");
    applied.push_back("user nobody");
    // A change of user clears the parent-death signal: set it again, and go if the daemon went
    // meanwhile, so that a worker never outlives it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() == 1) ::_exit(1);
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Errno("set no_new_privs");
  applied.push_back("no new privileges");
  ::prctl(PR_SET_DUMPABLE, 0);
  absl::Status limited = Limit(RLIMIT_CORE, 0, 0, "RLIMIT_CORE");
  if (limited.ok()) limited = Limit(RLIMIT_FSIZE, 0, 0, "RLIMIT_FSIZE");
  if (limited.ok()) {
    limited = Limit(RLIMIT_NOFILE, options.max_open_files, options.max_open_files, "RLIMIT_NOFILE");
  }
  if (limited.ok() && options.cpu_seconds > 0) {
    limited = Limit(RLIMIT_CPU, options.cpu_seconds, options.cpu_seconds + 5, "RLIMIT_CPU");
  }
  // Threads (fork is refused below): what the user has now, and room for the job's intra-op
  // threads and LibTorch's own; a module cannot start thousands.
  const int64_t max_tasks = TasksOfUser(::getuid()) + options.max_threads;
  if (limited.ok() && options.max_threads > 0) {
    limited = Limit(RLIMIT_NPROC, max_tasks, max_tasks, "RLIMIT_NPROC");
  }
  if (limited.ok() && options.address_space_bytes > 0) {
    const int64_t limit = MappedBytes() + options.address_space_bytes;
    limited = Limit(RLIMIT_AS, limit, limit, "RLIMIT_AS");
  }
  if (!limited.ok()) return limited;
  applied.push_back(absl::StrCat(
      "limits (no core, no file writes, ", options.max_open_files, " files",
      options.max_threads > 0 ? absl::StrCat(", ", max_tasks, " tasks of its user") : "",
      options.cpu_seconds > 0 ? absl::StrCat(", ", options.cpu_seconds, " s of CPU") : "",
      options.address_space_bytes > 0
          ? absl::StrCat(", ", options.address_space_bytes >> 20, " MiB of address space")
          : "",
      ")"));
  applied.push_back(ApplyLandlock(options.gpu, report));
  if (const int err = ApplySeccomp(); err != 0) {
    report->seccomp_error = ErrnoName(err);
    applied.push_back(absl::StrCat("no seccomp filter (", std::strerror(err), ")"));
  } else {
    applied.push_back("seccomp (no sockets, processes, programs, foreign signals or tracing)");
  }
  MeasureConfinement(report);
  return applied;
}

void MeasureConfinement(SandboxReport* report) {
  // Landlock's rules: "/" lies outside every folder they let the process read.
  if (report->landlock_error.empty()) {
    const int fd = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    report->landlock = fd < 0 && errno == EACCES;
    if (fd >= 0) ::close(fd);
    if (!report->landlock) report->landlock_error = "probe";
  } else {
    report->landlock = false;
  }
  // Every thread's filter and no_new_privs (a thread started before the filter without TSYNC
  // would be outside it).
  bool all_filtered = true;
  bool all_no_new_privs = true;
  int threads = 0;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(tasks)) {
      int tid = 0;
      if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
      ++threads;
      const std::string path = absl::StrCat("/proc/self/task/", tid, "/status");
      all_filtered = all_filtered && ProcStatusField(path, "Seccomp:") == "2";
      all_no_new_privs = all_no_new_privs && ProcStatusField(path, "NoNewPrivs:") == "1";
    }
    ::closedir(tasks);
  }
  // Its own filter loaded (a filter above it, such as systemd's, shows as Seccomp: 2 too) and on
  // every thread.
  report->seccomp = report->seccomp_error.empty() && threads > 0 && all_filtered;
  if (!report->seccomp && report->seccomp_error.empty()) report->seccomp_error = "probe";
  report->no_new_privileges = threads > 0 && all_no_new_privs;
  report->not_dumpable = ::prctl(PR_GET_DUMPABLE) == 0;
  uid_t real = 0, effective = 0, saved = 0;
  ::getresuid(&real, &effective, &saved);
  report->uid = real == effective && effective == saved ? static_cast<int64_t>(real) : -1;
}

}  // namespace trainerd::worker
