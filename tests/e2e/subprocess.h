// Runs programs as child processes for the end-to-end tests: capture output, or keep a daemon
// running and read its stdout line by line. Every child dies with the test: it gets SIGKILL when
// the test process ends (PR_SET_PDEATHSIG), however the test ends (a crash, ctest's timeout), and
// every wait has a timeout, so that no daemon is left training in the background.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace trainerd::e2e {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;
  std::string err;
  bool timed_out = false;  // killed after the timeout
};

// How long Run lets a program run, and ReadLine waits for a line, unless told otherwise.
inline constexpr int kDefaultTimeoutSeconds = 120;

// Runs `argv` to completion (stdin is /dev/null) with `env` added to the environment; killed
// (SIGKILL) after `timeout_seconds`.
RunResult Run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
              int timeout_seconds = kDefaultTimeoutSeconds);

// The address in trainerd's "listening on HOST:PORT ..." line; "" when the line has none.
std::string ListeningAddress(const std::string& line);

// A long-running child whose stdout can be read line by line. Killed (SIGKILL) on destruction if
// still running. Not thread-safe.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& argv);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Blocks until a whole line arrives on the child's stdout; false at end of file or after
  // `timeout_seconds`.
  bool ReadLine(std::string* line, int timeout_seconds = kDefaultTimeoutSeconds);
  // Sends `signal` and waits for the child to exit; returns its exit code (-1 if signalled). A
  // child still running after `timeout_seconds` gets SIGKILL (and -1 is returned).
  int Stop(int signal, int timeout_seconds = kDefaultTimeoutSeconds);
  // The child's stderr so far (it goes to a file).
  std::string Stderr() const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  std::string err_path_;
};

}  // namespace trainerd::e2e
