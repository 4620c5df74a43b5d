// Runs programs as child processes for the end-to-end tests: capture output, or keep a daemon
// running and read its stdout line by line.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace trainerd::e2e {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;
  std::string err;
};

// Runs `argv` to completion (stdin is /dev/null) with `env` added to the environment.
RunResult Run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// A long-running child whose stdout can be read line by line. Killed (SIGKILL) on destruction if
// still running. Not thread-safe.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& argv);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Blocks until a whole line arrives on the child's stdout; false at end of file.
  bool ReadLine(std::string* line);
  // Sends `signal` and waits for the child to exit; returns its exit code (-1 if signalled).
  int Stop(int signal);
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
