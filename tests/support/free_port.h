// A loopback TCP port that is free now, for a test that must name a daemon's address before it
// starts it (daemons that list each other as peers).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <set>

namespace trainerd::testing {

// Chosen at random from 20000-32767, below Linux's ephemeral range (32768-60999): a port the
// kernel hands out for port 0 is one that any outgoing connection of the tests running beside
// this one (ctest -j) may take before the daemon binds it, and two processes asking for port 0
// at once may get the same one. Checked free by binding it, and never handed out twice by one
// process. -1 when 200 tries found none free.
inline int FreePort() {
  static std::mt19937 rng(static_cast<uint32_t>(::getpid()) * 2654435761u ^
                          static_cast<uint32_t>(
                              std::chrono::steady_clock::now().time_since_epoch().count()));
  static std::set<int> given;
  std::uniform_int_distribution<int> pick(20000, 32767);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    if (given.count(port) > 0) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) {
      given.insert(port);
      return port;
    }
  }
  return -1;
}

}  // namespace trainerd::testing
