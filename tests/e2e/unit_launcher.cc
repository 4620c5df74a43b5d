// Starts a program as systemd would start it under a unit's sandboxing properties, for the
// end-to-end test of the shipped unit (unit_sandbox_e2e_test.cc) on machines where systemd does
// not run as PID 1 (containers, CI). It applies what decides whether a trainerd-worker can
// confine itself under the unit:
//
//   SystemCallFilter=   an allow-list seccomp filter of the unit's system calls, its @groups
//                       expanded by this machine's own `systemd-analyze syscall-filter` (the
//                       systemd the unit would run under), every other call failing with
//   SystemCallErrorNumber= (EPERM by default);
//   RestrictNamespaces= unshare(2) and clone(2) refused for namespace types not listed, clone3(2)
//                       ENOSYS (so that the C library falls back to clone), as systemd does;
//   NoNewPrivileges=    PR_SET_NO_NEW_PRIVS;
//   DynamicUser=        another user (--uid/--gid), with no capabilities and no supplementary
//                       groups, as a dynamic user has.
//
// Run as root:
//   unit_launcher --unit=FILE [--filter=SYSCALLS] --uid=N --gid=N [--expose=DIR]... -- PROGRAM ARGS
// --filter replaces the unit's SystemCallFilter= (a unit as an older release shipped it).
// --expose makes DIR reachable for the user where an ancestor is not (a 0700 home holding the
// LibTorch wheel, a 0700 temporary folder holding a fresh clone): in a mount namespace of the
// launcher's own, the blocking ancestor is covered by an empty tmpfs and DIR bound back into it
// at its own path, so the program's library paths stay as built. Nothing outside the namespace
// changes.
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

int Fail(const std::string& why) {
  std::cerr << "unit_launcher: " << why << std::endl;
  return 125;
}

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> Words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// The unit's [Service] settings that matter here, joined over continuation lines.
std::map<std::string, std::vector<std::string>> ReadUnit(const std::string& path) {
  std::map<std::string, std::vector<std::string>> settings;
  std::ifstream in(path);
  std::string line, logical;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\\') {
      logical += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    logical += line;
    const std::string text = Trim(logical);
    logical.clear();
    if (text.empty() || text[0] == '#' || text[0] == ';' || text[0] == '[') continue;
    const size_t eq = text.find('=');
    if (eq == std::string::npos) continue;
    settings[Trim(text.substr(0, eq))].push_back(Trim(text.substr(eq + 1)));
  }
  return settings;
}

// Every group systemd-analyze knows, with its members (calls and groups).
std::map<std::string, std::vector<std::string>> SyscallGroups() {
  std::map<std::string, std::vector<std::string>> groups;
  FILE* pipe = ::popen("systemd-analyze syscall-filter --no-pager 2>/dev/null", "r");
  if (pipe == nullptr) return groups;
  char buffer[512];
  std::string current;
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    const std::string line = Trim(buffer);
    if (line.empty() || line[0] == '#') continue;
    if (buffer[0] == '@') {
      current = line;
      groups[current];
    } else if (!current.empty()) {
      groups[current].push_back(line);
    }
  }
  ::pclose(pipe);
  return groups;
}

void Expand(const std::string& name, const std::map<std::string, std::vector<std::string>>& groups,
            std::set<std::string>* calls, std::set<std::string>* seen) {
  if (name.empty()) return;
  if (name[0] != '@') {
    calls->insert(name);
    return;
  }
  if (!seen->insert(name).second) return;
  auto it = groups.find(name);
  if (it == groups.end()) return;
  for (const std::string& member : it->second) Expand(member, groups, calls, seen);
}

int ErrnoNamed(const std::string& name) {
  if (name.empty() || name == "EPERM") return EPERM;
  if (name == "EACCES") return EACCES;
  if (name == "ENOSYS") return ENOSYS;
  return EPERM;
}

// The CLONE_NEW* flag of a RestrictNamespaces= name.
uint64_t NamespaceFlag(const std::string& name) {
  if (name == "cgroup") return CLONE_NEWCGROUP;
  if (name == "ipc") return CLONE_NEWIPC;
  if (name == "net") return CLONE_NEWNET;
  if (name == "mnt") return CLONE_NEWNS;
  if (name == "pid") return CLONE_NEWPID;
  if (name == "user") return CLONE_NEWUSER;
  if (name == "uts") return CLONE_NEWUTS;
  return 0;
}

// The first ancestor of `dir` (from the root down) that others cannot search.
std::string BlockingAncestor(const std::filesystem::path& dir) {
  std::filesystem::path at = "/";
  for (const auto& part : dir.relative_path()) {
    at /= part;
    struct stat st {};
    if (::stat(at.c_str(), &st) != 0) return "";
    if (S_ISDIR(st.st_mode) && (st.st_mode & S_IXOTH) == 0) return at.string();
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string unit_path, filter_override;
  bool have_filter_override = false;
  long uid = -1, gid = -1;
  std::vector<std::string> exposed;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--unit=", 0) == 0) {
      unit_path = arg.substr(7);
    } else if (arg.rfind("--filter=", 0) == 0) {
      filter_override = arg.substr(9);
      have_filter_override = true;
    } else if (arg.rfind("--uid=", 0) == 0) {
      uid = std::strtol(arg.c_str() + 6, nullptr, 10);
    } else if (arg.rfind("--gid=", 0) == 0) {
      gid = std::strtol(arg.c_str() + 6, nullptr, 10);
    } else if (arg.rfind("--expose=", 0) == 0) {
      exposed.push_back(arg.substr(9));
    } else {
      return Fail("unknown argument " + arg);
    }
  }
  if (i >= argc || unit_path.empty() || uid <= 0 || gid <= 0) {
    return Fail(
        "usage: unit_launcher --unit=FILE [--filter=CALLS] --uid=N --gid=N "
        "[--expose=DIR]... -- PROGRAM ARGS");
  }
  if (::geteuid() != 0) return Fail("must run as root");
  const auto unit = ReadUnit(unit_path);
  auto setting = [&](const std::string& key) {
    auto it = unit.find(key);
    return it == unit.end() ? std::vector<std::string>{} : it->second;
  };

  // --- The files: the program's folders reachable for the user --------------------------------
  if (!exposed.empty()) {
    if (::unshare(CLONE_NEWNS) != 0) return Fail(std::string("unshare: ") + std::strerror(errno));
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return Fail(std::string("make / private: ") + std::strerror(errno));
    }
    char held_template[] = "/tmp/unit-launcher-XXXXXX";
    if (::mkdtemp(held_template) == nullptr) return Fail("mkdtemp");
    const std::string held = held_template;
    std::vector<std::pair<std::string, std::string>> binds;  // saved copy, original path
    for (size_t k = 0; k < exposed.size(); ++k) {
      const std::string copy = held + "/" + std::to_string(k);
      ::mkdir(copy.c_str(), 0755);
      if (::mount(exposed[k].c_str(), copy.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        return Fail("bind " + exposed[k] + ": " + std::strerror(errno));
      }
      binds.push_back({copy, exposed[k]});
    }
    std::set<std::string> covered;
    for (const auto& [copy, path] : binds) {
      const std::string blocking = BlockingAncestor(path);
      if (blocking.empty() || covered.count(blocking) > 0) continue;
      if (::mount("tmpfs", blocking.c_str(), "tmpfs", 0, "mode=0755") != 0) {
        return Fail("tmpfs over " + blocking + ": " + std::strerror(errno));
      }
      covered.insert(blocking);
    }
    for (const auto& [copy, path] : binds) {
      std::error_code ignored;
      std::filesystem::create_directories(path, ignored);
      if (::mount(copy.c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        return Fail("bind back " + path + ": " + std::strerror(errno));
      }
    }
  }

  // --- The system call filter, built before the user changes (it reads systemd-analyze) --------
  std::vector<std::string> filter_words;
  if (have_filter_override) {
    filter_words = Words(filter_override);
  } else {
    for (const std::string& value : setting("SystemCallFilter")) {
      for (const std::string& w : Words(value)) filter_words.push_back(w);
    }
  }
  std::set<std::string> allowed;
  if (!filter_words.empty()) {
    if (filter_words.front()[0] == '~') return Fail("deny-list filters are not supported");
    const auto groups = SyscallGroups();
    if (groups.empty()) return Fail("systemd-analyze syscall-filter gave nothing");
    std::set<std::string> seen;
    for (const std::string& w : filter_words) Expand(w, groups, &allowed, &seen);
  }
  const std::vector<std::string> error_number = setting("SystemCallErrorNumber");
  const int denied_errno = ErrnoNamed(error_number.empty() ? "" : error_number.back());
  // RestrictNamespaces=: yes (none), no (all), or the types allowed.
  const uint64_t all_namespaces = CLONE_NEWCGROUP | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWNS |
                                  CLONE_NEWPID | CLONE_NEWUSER | CLONE_NEWUTS;
  uint64_t forbidden_namespaces = 0;
  for (const std::string& value : setting("RestrictNamespaces")) {
    if (value == "yes" || value == "true") {
      forbidden_namespaces = all_namespaces;
    } else if (value == "no" || value == "false") {
      forbidden_namespaces = 0;
    } else {
      uint64_t allowed_namespaces = 0;
      for (const std::string& w : Words(value)) allowed_namespaces |= NamespaceFlag(w);
      forbidden_namespaces = all_namespaces & ~allowed_namespaces;
    }
  }

  // --- The user: a dynamic user's, with nothing of root's -------------------------------------
  if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
      ::setresuid(uid, uid, uid) != 0) {
    return Fail(std::string("cannot become the unit's user: ") + std::strerror(errno));
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the change of user cleared it
  for (const std::string& value : setting("NoNewPrivileges")) {
    if (value == "yes" || value == "true") ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  }

  if (!allowed.empty()) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(static_cast<uint32_t>(denied_errno)));
    if (ctx == nullptr) return Fail("seccomp_init");
    for (const std::string& name : allowed) {
      const int nr = seccomp_syscall_resolve_name(name.c_str());
      if (nr == __NR_SCMP_ERROR) continue;  // not a call of this architecture
      int rc = 0;
      if (forbidden_namespaces != 0 && (name == "unshare" || name == "clone")) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, forbidden_namespaces, 0));
      } else if (forbidden_namespaces != 0 && name == "setns") {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, forbidden_namespaces, 0));
      } else if (forbidden_namespaces != 0 && name == "clone3") {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
      } else {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
      }
      if (rc != 0) return Fail("cannot add " + name + " to the filter: " + std::strerror(-rc));
    }
    const int loaded = seccomp_load(ctx);
    seccomp_release(ctx);
    if (loaded != 0) return Fail(std::string("seccomp_load: ") + std::strerror(-loaded));
  }
  ::execv(argv[i], argv + i);
  return Fail(std::string("exec ") + argv[i] + ": " + std::strerror(errno));
}
