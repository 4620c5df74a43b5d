// Shared host memory for datasets (shared_memory.h).
#include "server/engine/datasets/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

// Linux 5.1's seal (its value is the kernel's ABI); Debian 12's glibc headers may predate it.
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace trainerd::engine {
namespace {

// What a region's memory file is sealed with before its first read-only descriptor goes out: no
// size change (a shrink would turn the daemon's own reads of the pages past it into SIGBUS), no
// write and no new writable mapping by anyone (the daemon's mapping, made before, stays writable),
// and no further change to the seals.
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

struct Live {
  int fd = -1;
  int64_t size = 0;
};

// Live regions by base address; a region leaves when its tensor's storage is freed.
std::mutex& RegionsMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<const char*, Live>& Regions() {
  static auto* regions = new std::map<const char*, Live>;
  return *regions;
}

struct Mapping {
  void* base = nullptr;
  size_t length = 0;
  int fd = -1;
  bool registered = false;
};

void Unmap(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  if (mapping->registered) {
    std::lock_guard<std::mutex> lock(RegionsMutex());
    Regions().erase(static_cast<const char*>(mapping->base));
  }
  if (mapping->base != nullptr && mapping->length > 0) ::munmap(mapping->base, mapping->length);
  if (mapping->fd >= 0) ::close(mapping->fd);
  delete mapping;
}

}  // namespace

absl::StatusOr<torch::Tensor> AllocateSharedHostBytes(int64_t bytes, const std::string& name) {
  if (bytes < 0) return absl::InvalidArgumentError("a negative size of shared memory");
  const int fd =
      ::memfd_create(absl::StrCat("trainerd-", name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    const int err = errno;
    if (IsOutOfDescriptors(err)) {
      return TooManyOpenFiles(err, absl::StrCat("creating shared memory for '", name, "'"));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create shared memory for '", name, "': ", std::strerror(err)));
  }
  // Readable by the daemon's user only (a memory file starts 0777): a process of another user
  // cannot open it through /proc/<pid>/fd, and one of the daemon's user can open it read-only.
  if (::fchmod(fd, 0400) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot restrict the mode of shared memory for '", name,
                                            "': ", std::strerror(err)));
  }
  // One page at least, so that an empty dataset still has a mapping (and a base) of its own.
  const size_t length = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot size shared memory for '", name, "' (",
                                                     bytes, " bytes): ", std::strerror(err)));
  }
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot map shared memory for '", name, "' (",
                                                     bytes, " bytes): ", std::strerror(err)));
  }
  auto* mapping = new Mapping{base, length, fd, true};
  {
    std::lock_guard<std::mutex> lock(RegionsMutex());
    Regions()[static_cast<const char*>(base)] = Live{fd, bytes};
  }
  try {
    return torch::from_blob(
        base, {bytes}, [mapping](void*) { Unmap(mapping); }, torch::kUInt8);
  } catch (...) {
    Unmap(mapping);
    return absl::ResourceExhaustedError(absl::StrCat("cannot wrap shared memory for '", name, "'"));
  }
}

std::optional<SharedRegion> FindSharedRegion(const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(RegionsMutex());
  auto& regions = Regions();
  auto it = regions.upper_bound(p);
  if (it == regions.begin()) return std::nullopt;
  --it;
  const int64_t offset = p - it->first;
  if (offset < 0 || bytes < 0 || offset > it->second.size || bytes > it->second.size - offset) {
    return std::nullopt;
  }
  return SharedRegion{it->second.fd, it->first, it->second.size, offset};
}

int ReadOnlyDescriptor(const SharedRegion& region) {
  // Sealed first (once: the seals include F_SEAL_SEAL), so that no descriptor of the file, however
  // it is reopened, can write it, map it for writing or change its size.
  const int seals = ::fcntl(region.fd, F_GET_SEALS);
  if (seals < 0) return -1;
  if ((seals & kSeals) != kSeals) {
    if ((seals & F_SEAL_SEAL) != 0) {
      errno = EPERM;  // sealed by someone else without these: never handed out
      return -1;
    }
    if (::fcntl(region.fd, F_ADD_SEALS, kSeals) != 0) return -1;
  }
  // A new open file description, read-only: mmap(PROT_WRITE) and mprotect to writable fail on it.
  return ::open(absl::StrCat("/proc/self/fd/", region.fd).c_str(), O_RDONLY | O_CLOEXEC);
}

absl::StatusOr<torch::Tensor> MapReadOnly(int fd, int64_t size) {
  struct stat st {};
  if (size < 0 || ::fstat(fd, &st) != 0 || st.st_size < size) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("the shared dataset memory is smaller than ", size, " bytes"));
  }
  const size_t length = static_cast<size_t>(std::max<int64_t>(size, 1));
  void* base = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map the shared dataset memory: ", std::strerror(err)));
  }
  auto* mapping = new Mapping{base, length, fd, false};
  return torch::from_blob(
      base, {size}, [mapping](void*) { Unmap(mapping); }, torch::kUInt8);
}

}  // namespace trainerd::engine
