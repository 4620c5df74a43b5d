#include "server/engine/torchscript/reaper.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <thread>

namespace trainerd::engine {

void EndAndReap(pid_t pid) {
  if (pid <= 0) return;
  if (::waitpid(pid, nullptr, WNOHANG) != 0) return;  // gone already (or not a child)
  ::kill(pid, SIGKILL);  // it has answered: nothing of it is waited for
  std::thread([pid] {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }).detach();
}

}  // namespace trainerd::engine
