#include "server/engine/distributed/rendezvous_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

using Clock = std::chrono::steady_clock;

// The wire: every message is a 4-byte little-endian length, then that many bytes. A request's
// first byte is its operation, a response's its status; strings are a 4-byte length and the
// bytes, numbers 8 bytes, little-endian. The first request of a connection is kHello with the
// store's secret.
enum Op : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kDelete = 7,
  kNumKeys = 8,
  kCompareSet = 9,
};
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kRefused = 2 };

constexpr size_t kSecretBytes = 32;
// How long a connection keeps its place among those waiting to say the secret, however many come.
constexpr auto kMinimumWait = std::chrono::milliseconds(200);
// A wait that asks for longer is held to this (the group's timeout bounds it on the rank's side).
constexpr int64_t kMostWaitMillis = int64_t{3600} * 1000;

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

// Reads a message body field by field; every read is bounded by what is left.
class Reader {
 public:
  explicit Reader(const std::string& body) : body_(body) {}
  bool U8(uint8_t* v) {
    if (at_ + 1 > body_.size()) return false;
    *v = static_cast<uint8_t>(body_[at_++]);
    return true;
  }
  bool U32(uint32_t* v) {
    if (at_ + 4 > body_.size()) return false;
    *v = GetU32(body_.data() + at_);
    at_ += 4;
    return true;
  }
  bool I64(int64_t* v) {
    if (at_ + 8 > body_.size()) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) {
      u |= static_cast<uint64_t>(static_cast<uint8_t>(body_[at_ + i])) << (8 * i);
    }
    at_ += 8;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Bytes(std::string* v) {
    uint32_t n = 0;
    if (!U32(&n) || n > body_.size() - at_) return false;
    v->assign(body_, at_, n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == body_.size(); }

 private:
  const std::string& body_;
  size_t at_ = 0;
};

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

}  // namespace

struct StoreServer::State {
  StoreLimits limits;
  std::string secret;
  std::string hello;  // the exact first message a connection must send
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::string address;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> refused{0};

  mutable std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::string> data;  // guarded by mu
  int64_t stored = 0;                       // guarded by mu: keys' and values' bytes

  std::mutex log_mu;
  int logged = 0;  // guarded by log_mu

  // Connections that said the secret, each served by a thread of its own (the acceptor's).
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::list<Connection> connections;  // the acceptor's; stopped and joined by the destructor
  std::thread acceptor;

  size_t most_body() const {
    // A compare-and-set carries a key and two values; a wait, many keys within the same bytes.
    return static_cast<size_t>(limits.max_key_bytes + 2 * limits.max_value_bytes + 64);
  }

  // One line per refusal, at most limits.max_logged_refusals per store, then one to say so.
  void Refuse(int fd, const std::string& why) {
    refused.fetch_add(1);
    std::string line;
    {
      std::lock_guard<std::mutex> lock(log_mu);
      if (logged < limits.max_logged_refusals) {
        line = absl::StrCat("rendezvous store on ", address, ": closed the connection from ",
                            PeerName(fd), ": ", why);
      } else if (logged == limits.max_logged_refusals) {
        line = absl::StrCat("rendezvous store on ", address,
                            ": further refused connections are not logged");
      }
      ++logged;
    }
    if (!line.empty()) LogWarning(line);
    // Told why, in a message it may or may not read; then closed.
    std::string body(1, static_cast<char>(kRefused));
    PutBytes(body, why);
    WriteAll(fd, Framed(body), Clock::now());
    ::shutdown(fd, SHUT_RDWR);
  }

  void Accept();
  void Serve(int fd);
  // Handles one request; false when the connection is to be closed (after Refuse).
  bool Handle(int fd, const std::string& request, int64_t* bytes_set, int64_t* writes);
  bool Reply(int fd, uint8_t status, const std::string& payload) {
    std::string body(1, static_cast<char>(status));
    body += payload;
    // A rank reads its answer at once; one that does not within a few seconds is gone.
    return WriteAll(fd, Framed(body), Clock::now() + std::chrono::seconds(10));
  }
  // Waits under `lock` until every key of `keys` is set, the deadline passes or the store stops.
  bool WaitForKeys(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Clock::time_point deadline) {
    auto all = [&] {
      return std::all_of(keys.begin(), keys.end(),
                         [&](const std::string& key) { return data.count(key) > 0; });
    };
    while (!all()) {
      if (stop.load() || changed.wait_until(lock, deadline) == std::cv_status::timeout) {
        return all();
      }
    }
    return true;
  }
  void Put(const std::string& key, std::string value) {
    auto it = data.find(key);
    if (it != data.end()) {
      stored -= static_cast<int64_t>(it->first.size() + it->second.size());
      it->second = std::move(value);
    } else {
      it = data.emplace(key, std::move(value)).first;
    }
    stored += static_cast<int64_t>(it->first.size() + it->second.size());
    changed.notify_all();
  }
};

void StoreServer::State::Accept() {
  struct Pending {
    int fd;
    Clock::time_point since;
    std::string got;
  };
  std::list<Pending> pending;
  auto drop = [&](std::list<Pending>::iterator it, const std::string& why) {
    Refuse(it->fd, why);
    ::close(it->fd);
    return pending.erase(it);
  };
  while (!stop.load()) {
    std::vector<pollfd> fds = {{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), pending.empty() ? 1000 : 100);
    if (stop.load()) break;
    // Connections that ended give their place back.
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->done.load()) {
        it->thread.join();
        ::close(it->fd);
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
    // Each pending connection: its hello read as it comes, checked, and handed a thread.
    size_t index = 2;
    for (auto it = pending.begin(); it != pending.end(); ++index) {
      if (index < fds.size() && (fds[index].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        char buffer[128];
        const size_t want = hello.size() - it->got.size();
        const ssize_t n = ::recv(it->fd, buffer, std::min(want, sizeof(buffer)), 0);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
          it = drop(it, "it closed without saying the job's secret");
          continue;
        }
        if (n > 0) it->got.append(buffer, static_cast<size_t>(n));
        // The frame's length and operation first (9 bytes): anything else is no hello.
        const size_t head = std::min<size_t>(it->got.size(), 9);
        if (it->got.compare(0, head, hello, 0, head) != 0) {
          it = drop(it, "its first message is not the store's hello");
          continue;
        }
        if (it->got.size() == hello.size()) {
          const int fd = it->fd;
          if (!SameSecret(it->got, hello)) {
            it = drop(it, "it did not say the job's secret");
            continue;
          }
          it = pending.erase(it);
          const int most = limits.max_connections > 0 ? limits.max_connections : 0;
          if (static_cast<int>(connections.size()) >= most) {
            Refuse(fd, absl::StrCat("the store already serves ", most, " connections"));
            ::close(fd);
            continue;
          }
          Reply(fd, kOk, "");
          Connection& c = connections.emplace_back();
          c.fd = fd;
          c.thread = std::thread([this, &c] {
            Serve(c.fd);
            c.done.store(true);
          });
          continue;
        }
      }
      if (Clock::now() - it->since > absl::ToChronoMilliseconds(limits.hello_timeout)) {
        it = drop(it, absl::StrCat("it did not say the job's secret within ",
                                   absl::FormatDuration(limits.hello_timeout)));
        continue;
      }
      ++it;
    }
    if ((fds[1].revents & POLLIN) != 0) {
      while (true) {
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        NoDelay(fd);
        if (static_cast<int>(pending.size()) >= limits.max_pending) {
          // The oldest waiting connection gives way once it had time to say the secret (a rank
          // says it the moment it connects); before that the newcomer is the one closed, so that
          // a flood of connections cannot close a rank's before it was read.
          const std::string why =
              absl::StrCat(limits.max_pending, " connections are waiting to say the secret");
          if (Clock::now() - pending.front().since < kMinimumWait) {
            Refuse(fd, why);
            ::close(fd);
            continue;
          }
          drop(pending.begin(), why);
        }
        pending.push_back(Pending{fd, Clock::now(), ""});
      }
    }
  }
  for (Pending& p : pending) ::close(p.fd);
}

void StoreServer::State::Serve(int fd) {
  int64_t bytes_set = 0;
  int64_t writes = 0;
  std::string header;
  std::string body;
  while (!stop.load()) {
    const Status got = ReadExactly(fd, 4, &header, Clock::time_point::max(), &stop);
    if (got != kOk) return;  // the rank closed (or the store stops)
    const uint32_t length = GetU32(header.data());
    if (length == 0 || length > most_body()) {
      Refuse(fd, absl::StrCat("a message of ", length, " bytes (at most ", most_body(), ")"));
      return;
    }
    // A rank sends a whole message at once; one that stalls inside it is cut off.
    if (ReadExactly(fd, length, &body, Clock::now() + std::chrono::seconds(10), &stop) != kOk) {
      return;
    }
    if (!Handle(fd, body, &bytes_set, &writes)) return;
  }
}

bool StoreServer::State::Handle(int fd, const std::string& request, int64_t* bytes_set,
                                int64_t* writes) {
  Reader in(request);
  uint8_t op = 0;
  in.U8(&op);
  auto malformed = [&] {
    Refuse(fd, absl::StrCat("a malformed request (operation ", op, ")"));
    return false;
  };
  // What a write costs this connection: refused, and the connection cut off, past its limits.
  auto charge = [&](const std::string& key, int64_t value_bytes) {
    if (static_cast<int64_t>(key.size()) > limits.max_key_bytes) {
      Refuse(fd,
             absl::StrCat("a key of ", key.size(), " bytes (at most ", limits.max_key_bytes, ")"));
      return false;
    }
    if (value_bytes > limits.max_value_bytes) {
      Refuse(fd, absl::StrCat("a value of ", value_bytes, " bytes (at most ",
                              limits.max_value_bytes, ")"));
      return false;
    }
    *bytes_set += static_cast<int64_t>(key.size()) + value_bytes;
    *writes += 1;
    if (*bytes_set > limits.max_bytes_per_connection || *writes > limits.max_keys_per_connection) {
      Refuse(fd, absl::StrCat("it set more than ", limits.max_keys_per_connection, " keys or ",
                              limits.max_bytes_per_connection, " bytes"));
      return false;
    }
    return true;
  };
  auto deadline_of = [](int64_t millis) {
    return Clock::now() +
           std::chrono::milliseconds(std::clamp<int64_t>(millis, 0, kMostWaitMillis));
  };
  auto keys_of = [&](std::vector<std::string>* keys) {
    uint32_t n = 0;
    if (!in.U32(&n) || n > static_cast<uint32_t>(limits.max_keys_per_connection)) return false;
    keys->resize(n);
    for (std::string& key : *keys) {
      if (!in.Bytes(&key) || static_cast<int64_t>(key.size()) > limits.max_key_bytes) return false;
    }
    return true;
  };
  std::string key;
  std::string value;
  std::string payload;
  switch (op) {
    case kSet: {
      if (!in.Bytes(&key) || !in.Bytes(&value) || !in.done()) return malformed();
      if (!charge(key, static_cast<int64_t>(value.size()))) return false;
      std::lock_guard<std::mutex> lock(mu);
      Put(key, std::move(value));
      break;
    }
    case kGet: {
      int64_t millis = 0;
      if (!in.Bytes(&key) || !in.I64(&millis) || !in.done()) return malformed();
      std::unique_lock<std::mutex> lock(mu);
      if (!WaitForKeys(lock, {key}, deadline_of(millis))) {
        lock.unlock();
        return Reply(fd, kTimedOut, "");
      }
      PutBytes(payload, data[key]);
      break;
    }
    case kAdd: {
      int64_t delta = 0;
      if (!in.Bytes(&key) || !in.I64(&delta) || !in.done()) return malformed();
      if (!charge(key, 20)) return false;
      std::lock_guard<std::mutex> lock(mu);
      int64_t now = 0;
      auto it = data.find(key);
      if (it != data.end() && !absl::SimpleAtoi(it->second, &now)) {
        Refuse(fd, "an add to a key that holds no number");
        return false;
      }
      now += delta;
      Put(key, std::to_string(now));
      PutI64(payload, now);
      break;
    }
    case kCompareSet: {
      std::string desired;
      if (!in.Bytes(&key) || !in.Bytes(&value) || !in.Bytes(&desired) || !in.done()) {
        return malformed();
      }
      if (!charge(key, static_cast<int64_t>(desired.size()))) return false;
      std::lock_guard<std::mutex> lock(mu);
      // As c10d's stores: set when the key holds `value` (or is missing and `value` is empty);
      // the answer is what the key holds afterwards, or `value` when it is missing.
      auto it = data.find(key);
      if (it == data.end()) {
        if (value.empty()) {
          Put(key, desired);
          PutBytes(payload, desired);
        } else {
          PutBytes(payload, value);
        }
      } else if (it->second == value) {
        Put(key, desired);
        PutBytes(payload, desired);
      } else {
        PutBytes(payload, it->second);
      }
      break;
    }
    case kCheck: {
      std::vector<std::string> keys;
      if (!keys_of(&keys) || !in.done()) return malformed();
      std::lock_guard<std::mutex> lock(mu);
      const bool all = std::all_of(keys.begin(), keys.end(),
                                   [&](const std::string& k) { return data.count(k) > 0; });
      payload.push_back(all ? 1 : 0);
      break;
    }
    case kWait: {
      std::vector<std::string> keys;
      int64_t millis = 0;
      if (!keys_of(&keys) || !in.I64(&millis) || !in.done()) return malformed();
      std::unique_lock<std::mutex> lock(mu);
      if (!WaitForKeys(lock, keys, deadline_of(millis))) {
        lock.unlock();
        return Reply(fd, kTimedOut, "");
      }
      break;
    }
    case kDelete: {
      if (!in.Bytes(&key) || !in.done()) return malformed();
      std::lock_guard<std::mutex> lock(mu);
      auto it = data.find(key);
      payload.push_back(it != data.end() ? 1 : 0);
      if (it != data.end()) {
        stored -= static_cast<int64_t>(it->first.size() + it->second.size());
        data.erase(it);
      }
      break;
    }
    case kNumKeys: {
      if (!in.done()) return malformed();
      std::lock_guard<std::mutex> lock(mu);
      PutI64(payload, static_cast<int64_t>(data.size()));
      break;
    }
    default:
      return malformed();
  }
  return Reply(fd, kOk, payload);
}

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host,
                                                                int port_min, int port_max,
                                                                int world_size,
                                                                StoreLimits limits) {
  if (port_min < 0 || port_max > 65535 || port_min > port_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("the store's port range ", port_min, "-", port_max, " is not a range"));
  }
  if (world_size < 1) return absl::InvalidArgumentError("a group needs at least one rank");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), "0", &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the rendezvous store's host '", host, "' is no address of this machine"));
  }
  sockaddr_storage address{};
  const socklen_t address_length = found->ai_addrlen;
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  const int family = found->ai_family;
  ::freeaddrinfo(found);

  auto server = std::unique_ptr<StoreServer>(new StoreServer());
  auto state = std::make_shared<State>();
  state->limits = limits;
  if (state->limits.max_connections <= 0) state->limits.max_connections = 2 * world_size + 4;
  try {
    state->secret = FreshSecret();
  } catch (const std::exception& error) {
    return absl::InternalError(error.what());
  }
  state->hello = HelloFrame(state->secret);
  std::string last_error = "no port tried";
  for (int port = port_min; port <= port_max && state->listen_fd < 0; ++port) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&address)->sin_port = htons(static_cast<uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in6*>(&address)->sin6_port = htons(static_cast<uint16_t>(port));
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), address_length) != 0 ||
        ::listen(fd, 64) != 0) {
      last_error = std::strerror(errno);  // in use: the next one
      ::close(fd);
      continue;
    }
    state->listen_fd = fd;
  }
  if (state->listen_fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot host a rendezvous store on ", host,
                                               " ports ", port_min, "-", port_max, ": ",
                                               last_error));
  }
  state->address = LocalName(state->listen_fd);
  state->port = std::stoi(state->address.substr(state->address.rfind(':') + 1));
  if (::pipe2(state->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(state->listen_fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  State* raw = state.get();
  state->acceptor = std::thread([raw] { raw->Accept(); });
  server->state_ = std::move(state);
  return server;
}

StoreServer::~StoreServer() {
  if (state_ == nullptr) return;
  state_->stop.store(true);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->changed.notify_all();
  }
  const char byte = 1;
  (void)!::write(state_->wake[1], &byte, 1);
  state_->acceptor.join();
  for (State::Connection& c : state_->connections) ::shutdown(c.fd, SHUT_RDWR);
  for (State::Connection& c : state_->connections) {
    c.thread.join();
    ::close(c.fd);
  }
  ::close(state_->listen_fd);
  ::close(state_->wake[0]);
  ::close(state_->wake[1]);
}

int StoreServer::port() const { return state_->port; }
std::string StoreServer::address() const { return state_->address; }
const std::string& StoreServer::secret() const { return state_->secret; }

void StoreServer::Set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->Put(key, value);
}

int64_t StoreServer::stored_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stored;
}

int64_t StoreServer::refused_connections() const { return state_->refused.load(); }

namespace {

// The rank's side: one connection, one request at a time (under mu_), each bounded in time.
class StoreClient final : public c10d::Store {
 public:
  StoreClient(std::string host, int port, std::string secret, std::chrono::milliseconds timeout)
      : c10d::Store(timeout),
        host_(std::move(host)),
        port_(port),
        secret_(std::move(secret)),
        limit_(timeout) {}
  ~StoreClient() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Connect() {
    const auto deadline = Clock::now() + limit_;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    std::string last = "no address";
    while (true) {
      addrinfo* found = nullptr;
      const int resolved =
          ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
      if (resolved != 0) {
        last = ::gai_strerror(resolved);
      } else {
        for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
          const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          if (fd < 0) continue;
          int error = 0;
          if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            error = errno;
            if (error == EINPROGRESS) {
              pollfd p{fd, POLLOUT, 0};
              ::poll(&p, 1, MillisUntil(deadline));
              socklen_t len = sizeof(error);
              if ((p.revents & (POLLOUT | POLLERR | POLLHUP)) == 0) {
                error = ETIMEDOUT;
              } else {
                ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
              }
            }
          }
          if (error == 0) {
            fd_ = fd;
          } else {
            last = std::strerror(error);
            ::close(fd);
          }
        }
        ::freeaddrinfo(found);
      }
      if (fd_ >= 0) break;
      if (Clock::now() + std::chrono::milliseconds(100) >= deadline) {
        return absl::UnavailableError(absl::StrCat(last, " (within ", limit_.count(), "ms)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    NoDelay(fd_);
    std::string answer;
    if (!WriteAll(fd_, HelloFrame(secret_), deadline) ||
        ReadAnswer(&answer, Clock::now() + limit_) != kOk) {
      return absl::PermissionDeniedError("the store refused this rank's secret");
    }
    return absl::OkStatus();
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    auto copy = c10::make_intrusive<StoreClient>(host_, port_, secret_, limit_);
    if (absl::Status connected = copy->Connect(); !connected.ok()) {
      throw std::runtime_error(Where(std::string(connected.message())));
    }
    return copy;
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::string body(1, static_cast<char>(kSet));
    PutBytes(body, key);
    PutBytes(body, std::string(value.begin(), value.end()));
    Call(body, limit_, key);
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    std::string body(1, static_cast<char>(kCompareSet));
    PutBytes(body, key);
    PutBytes(body, std::string(expected.begin(), expected.end()));
    PutBytes(body, std::string(desired.begin(), desired.end()));
    return BytesOf(Call(body, limit_, key));
  }

  std::vector<uint8_t> get(const std::string& key) override {
    const std::chrono::milliseconds wait = Bounded(timeout_);
    std::string body(1, static_cast<char>(kGet));
    PutBytes(body, key);
    PutI64(body, wait.count());
    return BytesOf(Call(body, wait, key));
  }

  int64_t add(const std::string& key, int64_t value) override {
    std::string body(1, static_cast<char>(kAdd));
    PutBytes(body, key);
    PutI64(body, value);
    const std::string answer = Call(body, limit_, key);
    Reader in(answer);
    int64_t now = 0;
    if (!in.I64(&now)) throw std::runtime_error(Where("a malformed answer to add"));
    return now;
  }

  bool deleteKey(const std::string& key) override {
    std::string body(1, static_cast<char>(kDelete));
    PutBytes(body, key);
    const std::string answer = Call(body, limit_, key);
    return !answer.empty() && answer[0] != 0;
  }

  bool check(const std::vector<std::string>& keys) override {
    std::string body(1, static_cast<char>(kCheck));
    PutKeys(body, keys);
    const std::string answer = Call(body, limit_, Joined(keys));
    return !answer.empty() && answer[0] != 0;
  }

  int64_t getNumKeys() override {
    const std::string answer = Call(std::string(1, static_cast<char>(kNumKeys)), limit_, "");
    Reader in(answer);
    int64_t n = 0;
    if (!in.I64(&n)) throw std::runtime_error(Where("a malformed answer to a key count"));
    return n;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const std::chrono::milliseconds wait = Bounded(timeout);
    std::string body(1, static_cast<char>(kWait));
    PutKeys(body, keys);
    PutI64(body, wait.count());
    Call(body, wait, Joined(keys));
  }

 private:
  std::chrono::milliseconds Bounded(std::chrono::milliseconds asked) const {
    return asked.count() <= 0 ? limit_ : std::min(asked, limit_);
  }
  static void PutKeys(std::string& body, const std::vector<std::string>& keys) {
    PutU32(body, static_cast<uint32_t>(keys.size()));
    for (const std::string& key : keys) PutBytes(body, key);
  }
  static std::string Joined(const std::vector<std::string>& keys) {
    std::string out;
    for (const std::string& key : keys) out += (out.empty() ? "" : ", ") + key;
    return out;
  }
  static std::vector<uint8_t> BytesOf(const std::string& answer) {
    Reader in(answer);
    std::string value;
    if (!in.Bytes(&value)) throw std::runtime_error("the rendezvous store answered malformed");
    return std::vector<uint8_t>(value.begin(), value.end());
  }
  std::string Where(const std::string& what) const {
    return absl::StrCat("rendezvous store at ", host_, ":", port_, ": ", what);
  }

  // An answer's status and payload, read by `deadline`.
  Status ReadAnswer(std::string* payload, Clock::time_point deadline) {
    std::string header;
    if (ReadExactly(fd_, 4, &header, deadline, nullptr) != kOk) return kRefused;
    const uint32_t length = GetU32(header.data());
    if (length == 0 || length > (uint32_t{64} << 20)) return kRefused;
    std::string body;
    if (ReadExactly(fd_, length, &body, deadline, nullptr) != kOk) return kRefused;
    *payload = body.substr(1);
    return static_cast<Status>(body[0]);
  }

  // Sends a request and returns its answer's payload; throws with a sentence otherwise. `wait`:
  // how long the store may take to answer (a wait for keys), on top of the round trip.
  std::string Call(const std::string& body, std::chrono::milliseconds wait,
                   const std::string& keys) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) throw std::runtime_error(Where("the connection is closed"));
    if (!WriteAll(fd_, Framed(body), Clock::now() + limit_)) {
      throw std::runtime_error(Where("the store closed the connection"));
    }
    std::string payload;
    const Status status = ReadAnswer(&payload, Clock::now() + wait + limit_);
    switch (status) {
      case kOk:
        return payload;
      case kTimedOut:
        throw std::runtime_error(
            Where(absl::StrCat("wait timeout after ", wait.count(), "ms for ", keys)));
      default: {
        Reader in(payload);
        std::string why;
        ::close(fd_);
        fd_ = -1;
        if (status == kRefused && in.Bytes(&why)) {
          throw std::runtime_error(Where(absl::StrCat("the store refused: ", why)));
        }
        throw std::runtime_error(Where("the store closed the connection"));
      }
    }
  }

  const std::string host_;
  const int port_;
  const std::string secret_;
  const std::chrono::milliseconds limit_;
  std::mutex mu_;
  int fd_ = -1;  // guarded by mu_ after Connect
};

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const std::string& host, int port,
                                                             const std::string& secret,
                                                             absl::Duration timeout) {
  auto client =
      c10::make_intrusive<StoreClient>(host, port, secret, absl::ToChronoMilliseconds(timeout));
  if (absl::Status connected = client->Connect(); !connected.ok()) return connected;
  return c10::intrusive_ptr<c10d::Store>(std::move(client));
}

}  // namespace trainerd::engine
