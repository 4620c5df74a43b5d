// Runs a parsed trainctl command in this process as the tests against fake daemons do: its
// standard output and error captured, and the process's own standard output pointed at
// /dev/null meanwhile, so that commands that look at it (live tables, job model) behave as they do
// into a pipe, whoever runs the test.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <iostream>
#include <sstream>
#include <string>

#include "client/cli.h"
#include "client/commands.h"

namespace trainerd::client {

struct CapturedRun {
  int code = -1;
  std::string out;
  std::string err;
};

inline CapturedRun RunCaptured(const Invocation& invocation) {
  std::cout.flush();
  const int saved_stdout = ::dup(STDOUT_FILENO);
  const int null = ::open("/dev/null", O_WRONLY);
  ::dup2(null, STDOUT_FILENO);
  ::close(null);
  std::ostringstream out, err;
  std::streambuf* previous_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* previous_err = std::cerr.rdbuf(err.rdbuf());
  CapturedRun run;
  run.code = RunCommand(invocation);
  std::cout.rdbuf(previous_out);
  std::cerr.rdbuf(previous_err);
  ::dup2(saved_stdout, STDOUT_FILENO);
  ::close(saved_stdout);
  run.out = out.str();
  run.err = err.str();
  return run;
}

}  // namespace trainerd::client
