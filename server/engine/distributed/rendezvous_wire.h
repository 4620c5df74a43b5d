// The wire of the rendezvous store (rendezvous_store.h), shared by its server and its client
// (rendezvous_store.cc, rendezvous_client.cc): framing, field encoding, bounded socket reads and
// writes, and the secret's hello. Internal to the distributed room.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainerd::engine::rendezvous_wire {

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


void PutU32(std::string& out, uint32_t v);
void PutI64(std::string& out, int64_t value);
void PutBytes(std::string& out, const std::string& bytes);
uint32_t GetU32(const char* p);
// `body` after its 4-byte length.
std::string Framed(const std::string& body);

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

// Milliseconds from now to `deadline`, between 0 and 1000 (one poll's wait).
int MillisUntil(Clock::time_point deadline);
void NoDelay(int fd);
// Writes all of `data` to the non-blocking `fd` by `deadline`; false when the other end went away
// or did not read in time.
bool WriteAll(int fd, const std::string& data, Clock::time_point deadline);
// Reads exactly `n` bytes from the non-blocking `fd` into `out` by `deadline`, giving up early
// when `stop` turns true. kOk, kTimedOut (deadline or stop), or kRefused (end of stream, error).
Status ReadExactly(int fd, size_t n, std::string* out, Clock::time_point deadline,
                   const std::atomic<bool>* stop);
// The socket's other end and its own address, "host:port" ("[host]:port" for IPv6).
std::string PeerName(int fd);
std::string LocalName(int fd);
// 32 bytes from the kernel's generator, as hex.
std::string FreshSecret();
// Compares in time independent of where they differ.
bool SameSecret(const std::string& a, const std::string& b);
// The first request of a connection: kHello with the store's secret.
std::string HelloFrame(const std::string& secret);

}  // namespace trainerd::engine::rendezvous_wire
