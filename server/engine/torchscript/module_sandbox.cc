// RunModuleChecker: a submitted module's first load and trial forward, in a process of its own.
#include "server/engine/torchscript/module_sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "server/engine/torchscript/reaper.h"

namespace trainerd::engine {
namespace {

// What is kept of the checker's output and error streams (the rest is read and dropped).
constexpr size_t kMaxOutputBytes = 64 * 1024;
constexpr size_t kMaxErrorBytes = 8 * 1024;
constexpr size_t kMaxMessageChars = 2000;

std::string OneLine(absl::string_view text) {
  std::string line = absl::StrReplaceAll(text, {{"\r", " "}, {"\n", " "}});
  if (line.size() > kMaxMessageChars) line = line.substr(0, kMaxMessageChars) + "...";
  return line;
}

// The last non-empty line of the checker's error stream, for a message about its death.
std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  return lines.empty() ? std::string() : OneLine(lines.back());
}

absl::Status DeadlineError(absl::Duration allowed) {
  return absl::DeadlineExceededError(absl::StrFormat(
      "the TorchScript module's check (its load and a forward on 2 rows) did not finish within "
      "%.3g s; a module whose load or forward does not end in time is refused",
      absl::ToDoubleSeconds(allowed)));
}

}  // namespace

std::vector<std::string> ModuleCheckerArguments(const ModuleCheckerOptions& options,
                                                const std::vector<int64_t>& feature_shape,
                                                const std::string& dataset_name) {
  const int64_t cpu_seconds =
      static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(options.timeout))) + 1;
  return {options.program, absl::StrCat("--feature_shape=", absl::StrJoin(feature_shape, ",")),
          absl::StrCat("--dataset=", dataset_name),
          absl::StrCat("--memory_limit_bytes=", options.memory_limit_bytes),
          absl::StrCat("--cpu_seconds=", cpu_seconds)};
}

std::string EncodeModuleProbe(const absl::StatusOr<ModuleProbe>& result) {
  if (!result.ok()) {
    return absl::StrCat("error ", static_cast<int>(result.status().code()), "\n",
                        OneLine(result.status().message()), "\n");
  }
  return absl::StrCat("ok\nparameters ", result->parameter_count, "\noutput",
                      result->output_shape.empty() ? "" : " ",
                      absl::StrJoin(result->output_shape, " "), "\n");
}

absl::StatusOr<ModuleProbe> DecodeModuleProbe(std::string_view text) {
  const auto malformed = [&] {
    return absl::InternalError(
        absl::StrCat("the module checker answered something unexpected: '",
                     OneLine(absl::string_view(text.data(), text.size()).substr(0, 200)), "'"));
  };
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(text.data(), text.size()), '\n');
  if (lines.empty()) return malformed();
  if (absl::StartsWith(lines[0], "error ")) {
    int code = 0;
    if (!absl::SimpleAtoi(lines[0].substr(6), &code) || lines.size() < 2) return malformed();
    // Only the verdicts a check can give pass through; anything else is the checker's failure.
    const auto status_code = static_cast<absl::StatusCode>(code);
    if (status_code != absl::StatusCode::kInvalidArgument &&
        status_code != absl::StatusCode::kPermissionDenied &&
        status_code != absl::StatusCode::kResourceExhausted) {
      return absl::InternalError(
          absl::StrCat("the module checker failed: ", OneLine(std::string(lines[1]))));
    }
    return absl::Status(status_code, OneLine(std::string(lines[1])));
  }
  if (lines[0] != "ok" || lines.size() < 3) return malformed();
  ModuleProbe probe;
  if (!absl::StartsWith(lines[1], "parameters ") ||
      !absl::SimpleAtoi(lines[1].substr(11), &probe.parameter_count) || probe.parameter_count < 0) {
    return malformed();
  }
  if (!absl::StartsWith(lines[2], "output")) return malformed();
  for (absl::string_view dim : absl::StrSplit(lines[2].substr(6), ' ', absl::SkipEmpty())) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(dim, &d) || d < 0 || probe.output_shape.size() >= 64) {
      return malformed();
    }
    probe.output_shape.push_back(d);
  }
  return probe;
}

namespace {

// A started checker waiting for its request on standard input (a socket, so that a checker that
// died never raises SIGPIPE in the daemon).
struct StartedChecker {
  pid_t pid = -1;
  int input = -1;
  int out = -1;
  int err = -1;
  // Its sandbox's report, once its first line has been read.
  std::optional<SandboxReport> report;
};

// Reads the checker's first line, "sandbox REPORT", from its standard output by `until`.
absl::StatusOr<SandboxReport> ReadSandboxLine(const StartedChecker& c, absl::Time until) {
  std::string line;
  while (true) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "the module checker did not report its sandbox in time (it starts LibTorch first)");
    }
    pollfd fd{c.out, POLLIN, 0};
    const int ready = ::poll(
        &fd, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 100)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    // Byte by byte: nothing past the line is taken from the pipe (the result follows it).
    char byte = 0;
    const ssize_t n = ::read(c.out, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (byte == '\n') {
      if (line.rfind("sandbox ", 0) != 0) break;
      return DecodeSandboxReport(absl::string_view(line).substr(8));
    }
    if (line.size() >= 1024) break;
    line.push_back(byte);
  }
  // It died before it could say (its error stream has its reason) or said something else.
  char buffer[1024];
  const ssize_t n = ::read(c.err, buffer, sizeof(buffer));
  const std::string said = n > 0 ? LastLine(std::string(buffer, static_cast<size_t>(n))) : "";
  return absl::InternalError(
      absl::StrCat("the module checker did not start", said.empty() ? "" : ": ", said));
}

void Discard(StartedChecker& c) {
  ::kill(c.pid, SIGKILL);
  ::close(c.input);
  ::close(c.out);
  ::close(c.err);
  while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

absl::StatusOr<StartedChecker> SpawnChecker(const std::string& program) {
  int in_pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) != 0) {
    return absl::InternalError(absl::StrCat("cannot create a socket: ", std::strerror(errno)));
  }
  ScopedFd input(in_pair[0]);
  ScopedFd child_input(in_pair[1]);
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("cannot create a pipe: ", std::strerror(errno)));
  }
  ScopedFd out_read(out_pipe[0]);
  ScopedFd out_write(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("cannot create a pipe: ", std::strerror(errno)));
  }
  ScopedFd err_read(err_pipe[0]);
  ScopedFd err_write(err_pipe[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_input.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
  std::vector<char*> argv = {const_cast<char*>(program.c_str()), nullptr};
  // A small, fixed environment: one thread per operator, no GPU, and the library path the
  // daemon itself was started with (LibTorch's libraries may be found through it).
  std::vector<std::string> environment = {"OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1",
                                          "CUDA_VISIBLE_DEVICES=", "PATH=/usr/bin:/bin"};
  if (const char* library_path = std::getenv("LD_LIBRARY_PATH"); library_path != nullptr) {
    environment.push_back(absl::StrCat("LD_LIBRARY_PATH=", library_path));
  }
  std::vector<char*> envp;
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start the module checker '", program, "': ", std::strerror(spawned)));
  }
  StartedChecker c;
  c.pid = pid;
  c.input = ::dup(input.get());
  c.out = ::dup(out_read.get());
  c.err = ::dup(err_read.get());
  ::fcntl(c.input, F_SETFD, FD_CLOEXEC);
  ::fcntl(c.out, F_SETFD, FD_CLOEXEC);
  ::fcntl(c.err, F_SETFD, FD_CLOEXEC);
  return c;
}

// One checker per program kept started (LibTorch loaded, sandbox applied) for the next module.
std::mutex& IdleMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::vector<StartedChecker>>& Idle() {
  static auto* idle = new std::map<std::string, std::vector<StartedChecker>>;
  return *idle;
}

absl::StatusOr<StartedChecker> TakeChecker(const ModuleCheckerOptions& options) {
  std::optional<StartedChecker> warm;
  {
    std::lock_guard<std::mutex> lock(IdleMutex());
    std::vector<StartedChecker>& idle = Idle()[options.program];
    while (!idle.empty() && !warm) {
      StartedChecker c = idle.back();
      idle.pop_back();
      if (::waitpid(c.pid, nullptr, WNOHANG) == 0) {
        warm = c;
      } else {
        ::close(c.input);
        ::close(c.out);
        ::close(c.err);
      }
    }
  }
  if (warm) return *warm;
  return SpawnChecker(options.program);
}

// Starts an idle checker when there are fewer than the options' pool: after a check, so that its
// start never competes with the check.
void RefillCheckers(const ModuleCheckerOptions& options) {
  if (options.pool <= 0) return;
  {
    std::lock_guard<std::mutex> lock(IdleMutex());
    if (static_cast<int>(Idle()[options.program].size()) >= options.pool) return;
  }
  absl::StatusOr<StartedChecker> next = SpawnChecker(options.program);
  if (!next.ok()) return;
  std::lock_guard<std::mutex> lock(IdleMutex());
  std::vector<StartedChecker>& idle = Idle()[options.program];
  if (static_cast<int>(idle.size()) < options.pool) {
    idle.push_back(*next);
  } else {
    Discard(*next);
  }
}

}  // namespace

void DiscardIdleCheckers(const ModuleCheckerOptions& options) {
  std::vector<StartedChecker> idle;
  {
    std::lock_guard<std::mutex> lock(IdleMutex());
    idle.swap(Idle()[options.program]);
  }
  for (StartedChecker& c : idle) Discard(c);
}

absl::StatusOr<SandboxReport> MeasureCheckerSandbox(const ModuleCheckerOptions& options,
                                                    absl::Time deadline) {
  if (options.program.empty()) {
    return absl::FailedPreconditionError("this daemon has no module checker");
  }
  TRAINERD_ASSIGN_OR_RETURN(StartedChecker checker, TakeChecker(options));
  if (!checker.report) {
    absl::StatusOr<SandboxReport> report = ReadSandboxLine(checker, deadline);
    if (!report.ok()) {
      Discard(checker);
      return report.status();
    }
    checker.report = *std::move(report);
  }
  SandboxReport sandbox = *checker.report;
  MeasureFromOutside(checker.pid, options.sandbox_policy, &sandbox);
  if (options.on_sandbox) options.on_sandbox(sandbox);
  // Back to wait for a module (or discarded when the pool filled meanwhile).
  std::lock_guard<std::mutex> lock(IdleMutex());
  std::vector<StartedChecker>& idle = Idle()[options.program];
  if (static_cast<int>(idle.size()) < std::max(1, options.pool)) {
    idle.push_back(checker);
  } else {
    Discard(checker);
  }
  return sandbox;
}

absl::StatusOr<ModuleProbe> RunModuleChecker(const ModuleCheckerOptions& options,
                                             std::string_view archive,
                                             const std::vector<int64_t>& feature_shape,
                                             const std::string& dataset_name, absl::Time deadline,
                                             const CheckStop& stop) {
  if (options.program.empty()) {
    return absl::FailedPreconditionError(
        "this daemon has no module checker (trainerd-module-check), so it cannot accept "
        "TorchScript modules");
  }
  const absl::Time start = absl::Now();
  const absl::Time until = std::min(start + options.timeout, deadline);
  if (until <= start) return DeadlineError(absl::ZeroDuration());

  TRAINERD_ASSIGN_OR_RETURN(StartedChecker checker, TakeChecker(options));
  // Its sandbox first: a checker short of what the policy requires is sent nothing.
  if (!checker.report) {
    absl::StatusOr<SandboxReport> report = ReadSandboxLine(checker, until);
    if (!report.ok()) {
      Discard(checker);
      RefillCheckers(options);
      return report.status();
    }
    checker.report = *std::move(report);
  }
  SandboxReport sandbox = *checker.report;
  MeasureFromOutside(checker.pid, options.sandbox_policy, &sandbox);
  if (options.on_sandbox) options.on_sandbox(sandbox);
  if (absl::Status confined = CheckSandbox(sandbox, options.sandbox_policy); !confined.ok()) {
    Discard(checker);
    return confined;
  }
  // However the check ends, the next one's checker starts once it has.
  struct Refill {
    const ModuleCheckerOptions& options;
    ~Refill() { RefillCheckers(options); }
  } refill{options};
  const pid_t pid = checker.pid;
  ScopedFd input(checker.input);
  ScopedFd out_read(checker.out);
  ScopedFd err_read(checker.err);
  // The request: the flags on the first line, then the archive; the end of input ends it.
  std::vector<std::string> flags = ModuleCheckerArguments(options, feature_shape, dataset_name);
  flags.erase(flags.begin());
  const std::string line = absl::StrCat(absl::StrJoin(flags, " "), "\n");
  for (std::string_view part : {std::string_view(line), archive}) {
    while (!part.empty()) {
      const ssize_t n = ::send(input.get(), part.data(), part.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // it died: its status says why, below
      part.remove_prefix(static_cast<size_t>(n));
    }
  }
  ::shutdown(input.get(), SHUT_WR);

  std::string out;
  std::string err;
  bool out_open = true;
  bool err_open = true;
  bool timed_out = false;
  absl::Status stopped;
  while (out_open || err_open) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    if (stop) {
      stopped = stop();
      if (!stopped.ok()) break;
    }
    pollfd fds[2] = {{out_open ? out_read.get() : -1, POLLIN, 0},
                     {err_open ? err_read.get() : -1, POLLIN, 0}};
    const absl::Duration wait = std::min(left, absl::Milliseconds(100));
    const int ready = ::poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      std::string& sink = i == 0 ? out : err;
      const size_t cap = i == 0 ? kMaxOutputBytes : kMaxErrorBytes;
      sink.append(buffer, std::min(static_cast<size_t>(n), cap - std::min(cap, sink.size())));
    }
  }
  if (timed_out || !stopped.ok()) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    if (!stopped.ok()) return stopped;
    return DeadlineError(until - start);
  }
  // A whole answer (its last line ended) is the verdict, whatever the exit: the checker closes
  // its streams before it exits, and the exit itself is not waited for.
  if (!out.empty() && out.back() == '\n') {
    absl::StatusOr<ModuleProbe> answer = DecodeModuleProbe(out);
    if (answer.ok() || answer.status().code() != absl::StatusCode::kInternal) {
      EndAndReap(pid);
      return answer;
    }
  }
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(wait_status)) {
    const int signal = WTERMSIG(wait_status);
    if (signal == SIGXCPU || signal == SIGKILL) return DeadlineError(until - start);
    const std::string last = LastLine(err);
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module crashed its check (signal ", signal, ", ",
                     strsignal(signal), ")", last.empty() ? "" : ": ", last));
  }
  if (out.empty()) {
    const std::string last = LastLine(err);
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module's check failed (exit status ",
                     WEXITSTATUS(wait_status), ")", last.empty() ? "" : ": ", last));
  }
  return DecodeModuleProbe(out);
}

}  // namespace trainerd::engine
