// WorkerPool: trainerd-worker processes started and kept warm (worker_launcher.h).
#include "server/engine/torchscript/worker_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace trainerd::engine {

WorkerPool::WorkerPool(WorkerOptions options) : options_(std::move(options)) {}

WorkerPool::~WorkerPool() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [device, workers] : idle_) {
    for (WorkerProcess& w : workers) {
      ::kill(w.pid, SIGKILL);
      ::close(w.socket);
      ::close(w.output);
      while (::waitpid(w.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

absl::StatusOr<WorkerProcess> WorkerPool::Take(const std::string& device) {
  std::optional<WorkerProcess> warm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<WorkerProcess>& workers = idle_[device];
    while (!workers.empty() && !warm) {
      WorkerProcess w = workers.back();
      workers.pop_back();
      // One that died while it waited (its warm-up failed, or someone killed it) is reaped.
      if (::waitpid(w.pid, nullptr, WNOHANG) == 0) {
        warm = w;
      } else {
        ::close(w.socket);
        ::close(w.output);
      }
    }
  }
  if (warm) return *warm;
  return Spawn(device);
}

void WorkerPool::Refill(const std::string& device) {
  if (options_.pool <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(idle_[device].size()) >= options_.pool) return;
  }
  absl::StatusOr<WorkerProcess> next = Spawn(device);
  if (!next.ok()) return;  // the next job starts its own, and says why if it cannot
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerProcess>& workers = idle_[device];
  if (static_cast<int>(workers.size()) < options_.pool) {
    workers.push_back(*next);
    return;
  }
  ::kill(next->pid, SIGKILL);  // the pool filled meanwhile
  ::close(next->socket);
  ::close(next->output);
  ::waitpid(next->pid, nullptr, 0);
}

absl::StatusOr<WorkerProcess> WorkerPool::Spawn(const std::string& device) const {
  if (options_.program.empty()) {
    return absl::FailedPreconditionError(
        "this daemon has no worker program (trainerd-worker), so it cannot train TorchScript "
        "modules");
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot make the worker's socket: ", std::strerror(errno)));
  }
  ScopedFd socket(pair[0]);
  ScopedFd child_socket(pair[1]);
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot make the worker's output pipe: ", std::strerror(errno)));
  }
  ScopedFd output(out_pipe[0]);
  ScopedFd child_output(out_pipe[1]);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ScopedFd null_input(devnull);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (null_input.get() >= 0) posix_spawn_file_actions_adddup2(&actions, null_input.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, child_output.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, child_output.get(), 2);
  posix_spawn_file_actions_adddup2(&actions, child_socket.get(), 3);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // A session of its own: no terminal, and the daemon's signals (a Ctrl-C) are not its.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
  std::vector<std::string> arguments = {options_.program, "--socket_fd=3",
                                        absl::StrCat("--device=", device)};
  std::vector<char*> argv;
  for (std::string& a : arguments) argv.push_back(a.data());
  argv.push_back(nullptr);
  // A small, fixed environment: nothing of the daemon's (its token file's path, its settings).
  std::vector<std::string> environment = {"PATH=/usr/bin:/bin", "OMP_NUM_THREADS=1",
                                          "MKL_NUM_THREADS=1"};
  for (const char* name : {"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      environment.push_back(absl::StrCat(name, "=", value));
    }
  }
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, options_.program.c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  child_socket.Close();
  child_output.Close();
  null_input.Close();
  if (spawned != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start the worker '", options_.program, "': ", std::strerror(spawned)));
  }
  WorkerProcess out;
  out.pid = pid;
  out.socket = socket.release();
  out.output = output.release();
  out.device = device;
  return out;
}

}  // namespace trainerd::engine
