// Incremental SHA-256 (OpenSSL's EVP interface), used to checksum dataset payloads on both sides.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace trainerd {

// Not thread-safe; one instance per stream of bytes.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::string_view bytes);
  void Update(const void* data, size_t size);
  // Lower-case hex digest (64 characters). Call once: later calls return the same digest, and
  // Update after it is ignored.
  std::string HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SHA-256 of bytes handed over piece by piece and hashed on a thread of its own, so that the
// caller's thread goes on receiving while the hash catches up (an upload hashes a gigabyte in
// about 0.8 s here: as long as everything else the receiving thread does). The first few MiB
// are hashed on the caller's thread, so small payloads never start a thread. Each piece must stay
// valid and unchanged until HexDigest returns or Stop is called. One caller at a time.
class BackgroundSha256 {
 public:
  BackgroundSha256();
  ~BackgroundSha256();  // Stop()
  BackgroundSha256(const BackgroundSha256&) = delete;
  BackgroundSha256& operator=(const BackgroundSha256&) = delete;

  void Update(const void* data, size_t size);
  // Waits until every piece is hashed; then as Sha256::HexDigest.
  std::string HexDigest();
  // Abandons the pieces not hashed yet and joins the thread: after it no piece is read. Idempotent.
  void Stop();

 private:
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

// One-shot convenience.
std::string Sha256Hex(std::string_view bytes);

}  // namespace trainerd
