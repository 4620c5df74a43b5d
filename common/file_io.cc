// Whole-file reads and atomic writes through POSIX calls, so that errors carry errno's reason.
#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainerd {

void ScopedFd::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int64_t BytesOnDisk(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    return ec ? 0 : static_cast<int64_t>(size);
  }
  int64_t total = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uintmax_t size = it->file_size(size_ec);
      if (!size_ec) total += static_cast<int64_t>(size);
    }
  }
  return total;
}

bool IsOutOfDescriptors(int error_number) {
  return error_number == EMFILE || error_number == ENFILE;
}

absl::Status TooManyOpenFiles(int error_number, absl::string_view what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the daemon has no file descriptor left (", std::strerror(error_number), "): ", what,
      " failed; try again later (operators: raise its open-file limit, LimitNOFILE= or ulimit -n, "
      "or lower --max_datasets)"));
}

absl::Status CannotOpen(const std::string& path, int error_number) {
  if (IsOutOfDescriptors(error_number)) {
    return TooManyOpenFiles(error_number, absl::StrCat("opening '", path, "'"));
  }
  return absl::NotFoundError(
      absl::StrCat("cannot open '", path, "': ", std::strerror(error_number)));
}

absl::Status FileError(int error_number, absl::string_view what, const std::string& path) {
  if (error_number == ENOSPC || error_number == EDQUOT) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the disk holding '", path, "' is full (", std::strerror(error_number), "): ", what,
        " failed; free space there or delete datasets, models or old jobs"));
  }
  if (IsOutOfDescriptors(error_number)) {
    return TooManyOpenFiles(error_number, absl::StrCat(what, " '", path, "'"));
  }
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(error_number)));
}

absl::Status SyncParentFolder(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  ScopedFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) return FileError(errno, "cannot open the folder of", path);
  if (::fsync(dir_fd.get()) != 0) return FileError(errno, "cannot fsync the folder of", path);
  return absl::OkStatus();
}

absl::Status MakeFoldersDurably(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  // Every prefix that ends at a '/', then the whole path.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = end == std::string::npos ? dir : dir.substr(0, end);
    if (!prefix.empty() && prefix != "." && prefix != "..") {
      if (::mkdir(prefix.c_str(), 0755) == 0) {
        if (absl::Status synced = SyncParentFolder(prefix); !synced.ok()) return synced;
      } else if (errno != EEXIST) {
        return FileError(errno, "cannot create the folder", prefix);
      }
    }
    if (end == std::string::npos) break;
  }
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return FileError(ENOTDIR, "cannot use the folder", dir);
  }
  return absl::OkStatus();
}

namespace {

absl::Status Errno(const char* what, const std::string& path) {
  return FileError(errno, what, path);
}

}  // namespace

absl::Status WriteAt(int fd, const std::string& path, std::string_view bytes, int64_t offset) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status SyncAndRename(int fd, const std::string& tmp, const std::string& path) {
  absl::Status status;
  if (::fsync(fd) != 0) status = Errno("cannot fsync", tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) status = Errno("cannot rename", tmp);
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Make the rename itself durable.
  return SyncParentFolder(path);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> parts) {
  const std::string tmp = path + ".tmp";
  ScopedFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Errno("cannot create", tmp);
  int64_t offset = 0;
  for (std::string_view part : parts) {
    const absl::Status written = WriteAt(fd.get(), tmp, part, offset);
    if (!written.ok()) {
      ::unlink(tmp.c_str());
      return written;
    }
    offset += static_cast<int64_t>(part.size());
  }
  return SyncAndRename(fd.get(), tmp, path);
}

std::vector<absl::Status> WriteFilesAtomically(const std::vector<FileToWrite>& files) {
  std::vector<absl::Status> status(files.size());
  std::vector<std::string> tmps(files.size());
  std::vector<int> fds(files.size(), -1);
  // Written and synced a slice at a time, so that a large batch holds a bounded number of
  // descriptors open.
  for (size_t begin = 0; begin < files.size(); begin += kFilesOpenAtOnce) {
    const size_t end = std::min(files.size(), begin + kFilesOpenAtOnce);
    for (size_t i = begin; i < end; ++i) {
      tmps[i] = files[i].path + ".tmp";
      fds[i] = ::open(tmps[i].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      status[i] = fds[i] < 0 ? Errno("cannot create", tmps[i])
                             : WriteAt(fds[i], tmps[i], files[i].bytes, 0);
    }
    // The fsyncs at once: each waits for its own data, and a journaling filesystem commits the
    // ones that arrive together in one transaction.
    std::atomic<size_t> next{begin};
    auto sync_some = [&] {
      for (size_t i = next++; i < end; i = next++) {
        if (status[i].ok() && ::fsync(fds[i]) != 0) status[i] = Errno("cannot fsync", tmps[i]);
      }
    };
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < std::min<size_t>(kParallelFileSyncs, end - begin); ++t) {
      try {
        helpers.emplace_back(sync_some);
      } catch (const std::system_error&) {
        break;  // no thread to be had: fewer at once
      }
    }
    sync_some();
    for (std::thread& helper : helpers) helper.join();
    for (size_t i = begin; i < end; ++i) {
      if (fds[i] >= 0) ::close(fds[i]);
      if (status[i].ok() && ::rename(tmps[i].c_str(), files[i].path.c_str()) != 0) {
        status[i] = Errno("cannot rename", tmps[i]);
      }
      if (!status[i].ok() && fds[i] >= 0) ::unlink(tmps[i].c_str());
    }
  }
  // Makes the renames durable, each folder once.
  std::map<std::string, std::vector<size_t>> folders;  // folder -> its files renamed into it
  for (size_t i = 0; i < files.size(); ++i) {
    if (!status[i].ok()) continue;
    const size_t slash = files[i].path.find_last_of('/');
    folders[slash == std::string::npos ? "." : files[i].path.substr(0, slash + 1)].push_back(i);
  }
  for (const auto& [folder, in_it] : folders) {
    const absl::Status synced = SyncParentFolder(files[in_it.front()].path);
    if (synced.ok()) continue;
    for (size_t i : in_it) status[i] = synced;
  }
  return status;
}

std::string FileSignature(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return "";
  return absl::StrCat(info.st_ino, ":", info.st_size, ":", info.st_mtim.tv_sec, ".",
                      info.st_mtim.tv_nsec);
}

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
