#include "server/engine/distributed/rendezvous_wire.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <stdexcept>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace trainerd::engine::rendezvous_wire {
namespace {

constexpr size_t kSecretBytes = 32;

}  // namespace

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string& out, int64_t value) {
  const auto v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutBytes(std::string& out, const std::string& bytes) {
  PutU32(out, static_cast<uint32_t>(bytes.size()));
  out += bytes;
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
std::string Framed(const std::string& body) {
  std::string out;
  PutU32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}


int MillisUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
}

void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Writes all of `data` to the non-blocking `fd` by `deadline`; false when the other end went away
// or did not read in time.
bool WriteAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (Clock::now() >= deadline) return false;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, MillisUntil(deadline));
  }
  return true;
}

// Reads exactly `n` bytes from the non-blocking `fd` into `out` by `deadline`, giving up early
// when `stop` turns true. kOk, kTimedOut (deadline or stop), or kRefused (end of stream, error).
Status ReadExactly(int fd, size_t n, std::string* out, Clock::time_point deadline,
                   const std::atomic<bool>* stop) {
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out->data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return kRefused;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return kRefused;
    if (Clock::now() >= deadline || (stop != nullptr && stop->load())) return kTimedOut;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, std::min(MillisUntil(deadline), 200));
  }
  return kOk;
}

std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown peer";
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown peer";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                    : absl::StrCat(host, ":", port);
}

std::string LocalName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                    : absl::StrCat(host, ":", port);
}

// 32 bytes from the kernel's generator, as hex.
std::string FreshSecret() {
  std::string bytes(kSecretBytes, '\0');
  std::ifstream random("/dev/urandom", std::ios::binary);
  random.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!random) throw std::runtime_error("cannot read /dev/urandom for the store's secret");
  return absl::BytesToHexString(bytes);
}

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return differ == 0;
}

std::string HelloFrame(const std::string& secret) {
  std::string body(1, static_cast<char>(kHello));
  PutBytes(body, secret);
  return Framed(body);
}

}  // namespace trainerd::engine::rendezvous_wire
