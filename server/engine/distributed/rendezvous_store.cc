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
#include "server/engine/distributed/rendezvous_wire.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// The wire's vocabulary (rendezvous_wire.h).
using rendezvous_wire::Clock;
using rendezvous_wire::Status;
using rendezvous_wire::kSet;
using rendezvous_wire::kGet;
using rendezvous_wire::kAdd;
using rendezvous_wire::kCheck;
using rendezvous_wire::kWait;
using rendezvous_wire::kDelete;
using rendezvous_wire::kNumKeys;
using rendezvous_wire::kCompareSet;
using rendezvous_wire::kOk;
using rendezvous_wire::kTimedOut;
using rendezvous_wire::kRefused;
using rendezvous_wire::PutI64;
using rendezvous_wire::PutBytes;
using rendezvous_wire::GetU32;
using rendezvous_wire::Framed;
using rendezvous_wire::Reader;
using rendezvous_wire::NoDelay;
using rendezvous_wire::WriteAll;
using rendezvous_wire::ReadExactly;
using rendezvous_wire::PeerName;
using rendezvous_wire::LocalName;
using rendezvous_wire::FreshSecret;
using rendezvous_wire::SameSecret;
using rendezvous_wire::HelloFrame;

// How long a connection keeps its place among those waiting to say the secret, however many come.
constexpr auto kMinimumWait = std::chrono::milliseconds(200);
// A wait that asks for longer is held to this (the group's timeout bounds it on the rank's side).
constexpr int64_t kMostWaitMillis = int64_t{3600} * 1000;

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

}  // namespace trainerd::engine
