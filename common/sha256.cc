// SHA-256 through OpenSSL's EVP digest interface.
#include "common/sha256.h"

#include <openssl/evp.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace trainerd {
namespace {

// The EVP calls fail only when memory runs out or OpenSSL is broken; the header's API has no
// status to report that with, so the process stops (as it would on a failed operator new).
void CheckOpenSsl(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "trainerd: OpenSSL %s failed\n", what);
  std::abort();
}

struct EvpMdCtxDeleter {
  void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};

}  // namespace

struct Sha256::Impl {
  std::unique_ptr<EVP_MD_CTX, EvpMdCtxDeleter> context;
  // Set by the first HexDigest; later calls return it again and Update is then ignored.
  std::string digest;
  bool finished = false;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->context.reset(EVP_MD_CTX_new());
  CheckOpenSsl(impl_->context != nullptr, "EVP_MD_CTX_new");
  CheckOpenSsl(EVP_DigestInit_ex(impl_->context.get(), EVP_sha256(), nullptr) == 1,
               "EVP_DigestInit_ex");
}

Sha256::~Sha256() = default;

void Sha256::Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }

void Sha256::Update(const void* data, size_t size) {
  if (impl_->finished || size == 0) return;
  CheckOpenSsl(EVP_DigestUpdate(impl_->context.get(), data, size) == 1, "EVP_DigestUpdate");
}

std::string Sha256::HexDigest() {
  if (impl_->finished) return impl_->digest;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  CheckOpenSsl(EVP_DigestFinal_ex(impl_->context.get(), digest, &length) == 1,
               "EVP_DigestFinal_ex");
  static constexpr char kHex[] = "0123456789abcdef";
  impl_->digest.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    impl_->digest.push_back(kHex[digest[i] >> 4]);
    impl_->digest.push_back(kHex[digest[i] & 0xf]);
  }
  impl_->finished = true;
  return impl_->digest;
}

struct BackgroundSha256::Shared {
  // Hashed on the caller's thread until this many bytes were handed over.
  static constexpr size_t kInlineBytes = size_t{4} << 20;

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !pending.empty(); });
      if (stop) return;
      const auto [data, size] = pending.front();
      lock.unlock();
      sha.Update(data, size);
      lock.lock();
      pending.pop_front();
      if (pending.empty()) cv.notify_all();  // HexDigest may be waiting
    }
  }

  Sha256 sha;  // the caller's until the thread starts, then the thread's
  size_t handed = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<const char*, size_t>> pending;  // guarded by mu; front: being hashed
  bool stop = false;                                   // guarded by mu
  bool closed = false;  // the caller's: Stop was called, Update ignores what comes
  std::thread thread;
};

BackgroundSha256::BackgroundSha256() : shared_(std::make_unique<Shared>()) {}

BackgroundSha256::~BackgroundSha256() { Stop(); }

void BackgroundSha256::Update(const void* data, size_t size) {
  Shared& s = *shared_;
  if (size == 0 || s.closed) return;
  const bool inline_hash = !s.thread.joinable() && s.handed + size <= Shared::kInlineBytes;
  s.handed += size;
  if (inline_hash) {
    s.sha.Update(data, size);
    return;
  }
  if (!s.thread.joinable()) s.thread = std::thread([&s] { s.Run(); });
  const char* bytes = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stop) return;
  // A piece that continues the last waiting one (not the front, which may be being hashed)
  // extends it: an upload's pieces are contiguous in its buffer.
  if (s.pending.size() > 1 && s.pending.back().first + s.pending.back().second == bytes) {
    s.pending.back().second += size;
    return;
  }
  s.pending.emplace_back(bytes, size);
  if (s.pending.size() == 1) s.cv.notify_all();
}

std::string BackgroundSha256::HexDigest() {
  Shared& s = *shared_;
  if (s.thread.joinable()) {
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return s.pending.empty() || s.stop; });
    }
    Stop();
  }
  return s.sha.HexDigest();
}

void BackgroundSha256::Stop() {
  Shared& s = *shared_;
  s.closed = true;
  if (!s.thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stop = true;
    s.cv.notify_all();
  }
  s.thread.join();
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes);
  return sha.HexDigest();
}

}  // namespace trainerd
