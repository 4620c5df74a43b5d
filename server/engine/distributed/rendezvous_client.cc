// The rank's side of the rendezvous store (rendezvous_store.h: ConnectStore): a c10d::Store over
// one connection to a StoreServer, speaking rendezvous_wire.h.
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
using rendezvous_wire::PutU32;
using rendezvous_wire::PutI64;
using rendezvous_wire::PutBytes;
using rendezvous_wire::GetU32;
using rendezvous_wire::Framed;
using rendezvous_wire::Reader;
using rendezvous_wire::MillisUntil;
using rendezvous_wire::NoDelay;
using rendezvous_wire::WriteAll;
using rendezvous_wire::ReadExactly;
using rendezvous_wire::HelloFrame;
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
