// Whole-file reads through POSIX calls, so that errors carry errno's reason.
#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainerd {
namespace {

absl::Status CannotOpen(const std::string& path, int error_number) {
  return absl::NotFoundError(
      absl::StrCat("cannot open '", path, "': ", std::strerror(error_number)));
}

// Closes the descriptor on every return path.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return CannotOpen(path, errno);
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) return CannotOpen(path, errno);
  if (S_ISDIR(info.st_mode)) return CannotOpen(path, EISDIR);

  std::string bytes;
  if (S_ISREG(info.st_mode) && info.st_size > 0) bytes.reserve(static_cast<size_t>(info.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      return absl::ErrnoToStatus(error_number, absl::StrCat(path, ": cannot read"));
    }
    bytes.append(buffer, static_cast<size_t>(n));
  }
  return bytes;
}

}  // namespace trainerd
