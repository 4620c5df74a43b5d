#include "tests/e2e/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

extern char** environ;

namespace trainerd::e2e {
namespace {

std::vector<char*> CArgs(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

// In the child, before exec: die with the test. `parent` is the test's pid from before fork; if
// it already died between fork and prctl, the child exits at once.
void DieWithParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
}

int64_t NowMillis() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Waits for `pid` until `deadline_ms` (CLOCK_MONOTONIC); SIGKILL then. Returns the wait status,
// and sets *killed when it had to kill.
int WaitOrKill(pid_t pid, int64_t deadline_ms, bool* killed) {
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0 && errno != EINTR) return status;
    if (NowMillis() >= deadline_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      if (killed != nullptr) *killed = true;
      return status;
    }
    usleep(2000);
  }
}

}  // namespace

RunResult Run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
              int timeout_seconds) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) std::abort();
  const pid_t parent = getpid();
  const int64_t deadline = NowMillis() + int64_t{timeout_seconds} * 1000;
  pid_t pid = fork();
  if (pid == 0) {
    DieWithParent(parent);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    auto args = CArgs(argv);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  RunResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    const int64_t left = deadline - NowMillis();
    if (left <= 0) {
      kill(pid, SIGKILL);  // the pipes close with it
      result.timed_out = true;
    }
    const int ready =
        poll(fds, 2, static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1000))));
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (ready == 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  const int status = WaitOrKill(pid, std::max(deadline, NowMillis()) + 5000, &result.timed_out);
  result.exit_code = ExitCode(status);
  return result;
}

Daemon::Daemon(const std::vector<std::string>& argv) {
  char tmpl[] = "/tmp/trainerd-e2e-stderr-XXXXXX";
  int err_fd = mkstemp(tmpl);
  err_path_ = tmpl;
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) std::abort();
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    DieWithParent(parent);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_fd, 2);
    auto args = CArgs(argv);
    execv(args[0], args.data());
    _exit(127);
  }
  close(err_fd);
  close(out_pipe[1]);
  out_fd_ = out_pipe[0];
}

Daemon::~Daemon() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  unlink(err_path_.c_str());
}

bool Daemon::ReadLine(std::string* line, int timeout_seconds) {
  const int64_t deadline = NowMillis() + int64_t{timeout_seconds} * 1000;
  while (true) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      *line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return true;
    }
    pollfd fd = {out_fd_, POLLIN, 0};
    const int64_t left = deadline - NowMillis();
    if (left <= 0) return false;
    const int ready = poll(&fd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    char buf[1024];
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

int Daemon::Stop(int signal, int timeout_seconds) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  bool killed = false;
  const int status = WaitOrKill(pid_, NowMillis() + int64_t{timeout_seconds} * 1000, &killed);
  pid_ = -1;
  return killed ? -1 : ExitCode(status);
}

std::string Daemon::Stderr() const {
  std::ifstream in(err_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ListeningAddress(const std::string& line) {
  const std::string marker = "listening on ";
  const size_t at = line.find(marker);
  if (at == std::string::npos) return "";
  const size_t start = at + marker.size();
  return line.substr(start, line.find(' ', start) - start);
}

}  // namespace trainerd::e2e
