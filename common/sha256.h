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

// One-shot convenience.
std::string Sha256Hex(std::string_view bytes);

}  // namespace trainerd
