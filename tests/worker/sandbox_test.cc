// Tests for the worker's confinement (server/worker/sandbox.h): a child process applies
// EnterNamespaces and LockDown exactly as trainerd-worker does, then tries each thing
// docs/SECURITY.md says a worker cannot do, and reports what happened over a pipe.
#include "server/worker/sandbox.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>

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
      for (const std::string& p : EnterNamespaces()) phrases += p + "; ";
      SandboxOptions options;
      options.cpu_seconds = 30;
      options.address_space_bytes = int64_t{1} << 30;
      absl::StatusOr<std::vector<std::string>> locked = LockDown(options);
      if (!locked.ok()) {
        dprintf(out, "lockdown failed %s\n", std::string(locked.status().message()).c_str());
        _exit(1);
      }
      for (const std::string& p : *locked) phrases += p + "; ";
      dprintf(out, "applied %s\n", phrases.c_str());
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
      std::istringstream words(line);
      std::string name, verdict;
      words >> name >> verdict;
      refused[name] = verdict == "refused";
    }
    return refused;
  }

  std::string dir_;
  std::string secret_;
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
}

}  // namespace
}  // namespace trainerd::worker
