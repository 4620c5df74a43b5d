// Tests for the worker's confinement (server/worker/sandbox.h): a child process applies
// EnterNamespaces and LockDown exactly as trainerd-worker does, then tries each thing
// docs/SECURITY.md says a worker cannot do, and reports what happened over a pipe.
#include "server/worker/sandbox.h"
#include "server/worker/under_asan.h"

#include <fcntl.h>
#include <pthread.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::worker {
namespace {

using ::testing::HasSubstr;

// Writes "name refused|allowed errno\n" for each attempt.
void Report(int fd, const char* name, bool refused) {
  char line[256];
  const int n = std::snprintf(line, sizeof(line), "%s %s %d\n", name,
                              refused ? "refused" : "allowed", errno);
  (void)!::write(fd, line, static_cast<size_t>(n));
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/trainerd-sandbox-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    chmod(dir_.c_str(), 0777);
    secret_ = dir_ + "/token";
    FILE* f = std::fopen(secret_.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("alice s3cret\n", f);
    std::fclose(f);
    chmod(secret_.c_str(), 0644);  // readable by anyone: only the sandbox keeps the worker out
  }
  void TearDown() override {
    unlink(secret_.c_str());
    unlink((dir_ + "/written").c_str());
    unlink((dir_ + "/open-before").c_str());
    rmdir(dir_.c_str());
  }

  // Runs the attempts in a confined child; returns what it reported and what LockDown applied.
  std::map<std::string, bool> RunConfined(std::string* applied) {
    int pipe_fds[2];
    EXPECT_EQ(pipe(pipe_fds), 0);
    // A file open for writing before the lockdown, as the worker's inherited descriptors are.
    const int before = open((dir_ + "/open-before").c_str(), O_WRONLY | O_CREAT, 0666);
    const pid_t parent = getpid();
    const pid_t child = fork();
    if (child == 0) {
      close(pipe_fds[0]);
      const int out = pipe_fds[1];
      std::string phrases;
      SandboxReport report;
      for (const std::string& p : EnterNamespaces(&report)) phrases += p + "; ";
      SandboxOptions options;
      options.cpu_seconds = 30;
      options.address_space_bytes = int64_t{1} << 30;
      options.max_threads = 16;
      absl::StatusOr<std::vector<std::string>> locked = LockDown(options, &report);
      if (!locked.ok()) {
        dprintf(out, "lockdown failed %s\n", std::string(locked.status().message()).c_str());
        _exit(1);
      }
      for (const std::string& p : *locked) phrases += p + "; ";
      dprintf(out, "applied %s\n", phrases.c_str());
      dprintf(out, "report %s\n", EncodeSandboxReport(report).c_str());
      errno = 0;
      Report(out, "inet-socket", socket(AF_INET, SOCK_STREAM, 0) < 0);
      Report(out, "unix-socket", socket(AF_UNIX, SOCK_STREAM, 0) < 0);
      Report(out, "write-new-file",
             open((dir_ + "/written").c_str(), O_WRONLY | O_CREAT, 0666) < 0);
      Report(out, "read-secret", open(secret_.c_str(), O_RDONLY) < 0);
      Report(out, "read-etc", open("/etc/hostname", O_RDONLY) < 0);
      signal(SIGXFSZ, SIG_IGN);
      Report(out, "grow-open-file", before >= 0 && write(before, "x", 1) < 0);
      Report(out, "signal-parent", kill(parent, 0) < 0);
      Report(out, "trace-parent", ptrace(PTRACE_ATTACH, parent, nullptr, nullptr) < 0);
      const pid_t grandchild = fork();
      if (grandchild == 0) _exit(0);
      Report(out, "fork", grandchild < 0);
      char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
      execv("/bin/true", argv);
      Report(out, "exec", true);  // still here
      bool thread_ran = false;
      std::thread t([&] { thread_ran = true; });
      t.join();
      Report(out, "thread", !thread_ran);
      Report(out, "read-own-proc", open("/proc/self/status", O_RDONLY) < 0);
      // RLIMIT_NPROC: a few threads start (LibTorch's), a hundred do not.
      {
        std::vector<pthread_t> started;
        bool refused_one = false;
        for (int i = 0; i < 100 && !refused_one; ++i) {
          pthread_t t;
          if (pthread_create(&t, nullptr, [](void*) -> void* {
                pause();
                return nullptr;
              }, nullptr) != 0) {
            refused_one = true;
          } else {
            started.push_back(t);
          }
        }
        Report(out, "thread-bomb", refused_one);
      }
      // The out-of-memory killer's first choice.
      {
        std::ifstream adj("/proc/self/oom_score_adj");
        int score = 0;
        adj >> score;
        Report(out, "oom-score-not-first", score == 1000);
      }
      close(out);
      _exit(0);
    }
    close(pipe_fds[1]);
    if (before >= 0) close(before);
    std::string text;
    char buffer[4096];
    ssize_t n;
    while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) text.append(buffer, n);
    close(pipe_fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
    std::map<std::string, bool> refused;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("applied ", 0) == 0) {
        *applied = line.substr(8);
        continue;
      }
      if (line.rfind("report ", 0) == 0) {
        report_line_ = line.substr(7);
        continue;
      }
      std::istringstream words(line);
      std::string name, verdict;
      words >> name >> verdict;
      refused[name] = verdict == "refused";
    }
    return refused;
  }

  std::string dir_;
  std::string secret_;
  std::string report_line_;  // the child's SandboxReport, as it measured it
};

TEST_F(SandboxTest, AConfinedProcessCanNeitherReachOutNorTouchOtherProcessesOrFiles) {
  std::string applied;
  std::map<std::string, bool> refused = RunConfined(&applied);
  ASSERT_FALSE(refused.empty()) << "the child reported nothing";
  EXPECT_THAT(applied, HasSubstr("no new privileges"));
  EXPECT_THAT(applied, HasSubstr("seccomp"));
  EXPECT_TRUE(refused["inet-socket"]);
  EXPECT_TRUE(refused["unix-socket"]);
  EXPECT_TRUE(refused["write-new-file"]);
  EXPECT_TRUE(refused["grow-open-file"]);  // RLIMIT_FSIZE 0
  EXPECT_TRUE(refused["signal-parent"]);
  EXPECT_TRUE(refused["trace-parent"]);
  EXPECT_TRUE(refused["fork"]);
  EXPECT_TRUE(refused["exec"]);
  EXPECT_FALSE(refused["thread"]) << "threads must still start (LibTorch's intra-op threads)";
  EXPECT_FALSE(refused["read-own-proc"]);
  // Reading other files needs Landlock (the kernel's) or another user; the claim is made only
  // where one of them applied.
  if (applied.find("Landlock ABI") != std::string::npos) {
    EXPECT_TRUE(refused["read-secret"]);
    EXPECT_TRUE(refused["read-etc"]);
  }
  if (geteuid() == 0) {
    EXPECT_THAT(applied, HasSubstr("user nobody"));
    EXPECT_THAT(applied, HasSubstr("network namespace"));
  }
  EXPECT_TRUE(refused["thread-bomb"]) << "RLIMIT_NPROC";
  EXPECT_TRUE(refused["oom-score-not-first"]) << "oom_score_adj is not 1000";
}

// What the child measured of itself agrees with what it could and could not do.
TEST_F(SandboxTest, TheProcessMeasuresWhatIsInForce) {
  std::string applied;
  std::map<std::string, bool> refused = RunConfined(&applied);
  absl::StatusOr<SandboxReport> report = DecodeSandboxReport(report_line_);
  ASSERT_TRUE(report.ok()) << report.status() << " in '" << report_line_ << "'";
  EXPECT_TRUE(report->seccomp) << report_line_;
  EXPECT_TRUE(report->no_new_privileges);
  EXPECT_TRUE(report->not_dumpable);
  EXPECT_EQ(report->landlock, report->landlock_abi > 0) << report_line_;
  if (report->landlock) {
    EXPECT_TRUE(refused["read-etc"]);
    EXPECT_TRUE(report->landlock_error.empty());
  } else {
    EXPECT_FALSE(report->landlock_error.empty());
  }
  if (geteuid() == 0) {
    EXPECT_EQ(report->uid, 65534);
    EXPECT_TRUE(report->network_namespace);
  }
}

// Without a seccomp filter above it, seccomp(2) loads; a filter above that refuses it (as an
// older systemd unit's did) is reported with its errno, not as a failed lockdown.
TEST(SandboxReportingTest, AFilterAboveThatRefusesSeccompAndLandlockIsReportedNotFatal) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    // The filter an older unit left the daemon with: everything but Landlock and seccomp(2).
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    for (int nr : {SCMP_SYS(landlock_create_ruleset), SCMP_SYS(landlock_add_rule),
                   SCMP_SYS(landlock_restrict_self), SCMP_SYS(seccomp)}) {
      seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    if (seccomp_load(ctx) != 0) _exit(3);
    seccomp_release(ctx);
    SandboxReport report;
    EnterNamespaces(&report);
    absl::StatusOr<std::vector<std::string>> locked = LockDown(SandboxOptions{}, &report);
    dprintf(pipe_fds[1], "%s %s\n", locked.ok() ? "ok" : "failed",
            EncodeSandboxReport(report).c_str());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string text;
  char buffer[1024];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) text.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  ASSERT_EQ(text.rfind("ok ", 0), 0u) << text;
  absl::StatusOr<SandboxReport> report = DecodeSandboxReport(text.substr(3, text.size() - 4));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->landlock);
  EXPECT_EQ(report->landlock_error, "EPERM");
  // The filter above refuses seccomp(2): no filter of the worker's own.
  EXPECT_EQ(report->seccomp_error, "EPERM") << text;
  EXPECT_TRUE(report->no_new_privileges);
  EXPECT_TRUE(report->not_dumpable);
}

// A GPU job's heap (RLIMIT_DATA): an allocation past it fails inside the process.
TEST(SandboxLimitsTest, TheDataLimitRefusesAnAllocationPastIt) {
#ifdef TRAINERD_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer's allocator aborts at the limit rather than fail the malloc";
#endif
  const pid_t child = fork();
  if (child == 0) {
    SandboxOptions limits;
    limits.data_bytes = int64_t{64} << 20;
    if (!ApplyJobLimits(limits).ok()) _exit(2);
    void* small = malloc(size_t{16} << 20);
    void* large = malloc(size_t{256} << 20);
    _exit(small != nullptr && large == nullptr ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "16 MiB under a 64 MiB heap limit and 256 MiB past it";
}

}  // namespace
}  // namespace trainerd::worker
