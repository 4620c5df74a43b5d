// Whole-file reads, with the error wording the CSV and NPY readers share, and the one atomic file
// writer (datasets, models and checkpoints are written through it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainerd {

// A file descriptor closed on every return path.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd() { Close(); }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  // Gives the descriptor up without closing it (-1 after).
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes it now (a child's end of a pipe once the child has it); -1 after.
  void Close();

 private:
  int fd_;
};

// NOT_FOUND "cannot open 'path': <strerror(error_number)>": the wording every reader of a local
// file uses when it cannot be opened (missing, unreadable, a directory); FileError's
// RESOURCE_EXHAUSTED for EMFILE and ENFILE.
absl::Status CannotOpen(const std::string& path, int error_number);

// The error of a file operation that failed with `error_number`: RESOURCE_EXHAUSTED naming the
// disk for a full disk or quota (ENOSPC, EDQUOT), so that a caller hears to free space rather
// than an internal error; RESOURCE_EXHAUSTED naming the open-file limit when the process or the
// system has no descriptor left (EMFILE, ENFILE: the call may succeed later, nothing is damaged);
// otherwise INTERNAL "<what> '<path>': <reason>".
absl::Status FileError(int error_number, absl::string_view what, const std::string& path);

// The bytes `path` takes: a regular file's size, or the sum of the regular files under a folder
// (recursively); 0 when it does not exist or cannot be read.
int64_t BytesOnDisk(const std::string& path);

// True for EMFILE and ENFILE; TooManyOpenFiles is their RESOURCE_EXHAUSTED sentence.
bool IsOutOfDescriptors(int error_number);
absl::Status TooManyOpenFiles(int error_number, absl::string_view what);

// fsync of the folder that holds `path`, which makes a rename, a new file or a new folder in it
// durable. FileError's errors.
absl::Status SyncParentFolder(const std::string& path);

// Creates `dir` and any missing parents (mode 0755), each new folder made durable by an fsync of
// the folder that holds it, so that a file written into it and synced survives a power loss with
// its path. An existing folder is fine. FileError's errors.
absl::Status MakeFoldersDurably(const std::string& dir);

// The file's inode, size and modification time as one string ("" when it cannot be stat'ed):
// enough to notice a file replaced or rewritten (Kubernetes swaps a Secret's files by renaming a
// symlinked folder; the stat follows the link), so that a file re-read when it changes (tokens,
// certificates) is read only then.
std::string FileSignature(const std::string& path);

// The file's bytes. NOT_FOUND "cannot open 'path': <reason>" when it cannot be opened (missing,
// unreadable, a directory); other errors start with "path: ".
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `parts`, one after the other, as the whole of `path`, so that a reader (or a restart
// after a crash) finds the old file or the new one and never a part: a temporary name in the
// same folder, fsync, rename, then an fsync of the folder. INTERNAL naming the step and the file.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> parts);

// One file of a batch for WriteFilesAtomically.
struct FileToWrite {
  std::string path;
  std::string_view bytes;
};

// Writes each of `files` as WriteFileAtomically would, but made durable together: every file
// written under its temporary name first, their fsyncs then run at once (on up to
// kParallelFileSyncs threads, so that the filesystem commits them together), then the renames in
// the order given, then one fsync of each folder they are in (kFilesOpenAtOnce files at a time
// up to the renames, so that a large batch holds few descriptors). A hundred small files cost about
// one fsync's wait instead of two hundred. A status per file, in order: a file whose write,
// fsync or rename failed is not in place (nor its temporary); the others are. A folder's failed
// fsync fails every file in it.
inline constexpr size_t kParallelFileSyncs = 4;
inline constexpr size_t kFilesOpenAtOnce = 64;
std::vector<absl::Status> WriteFilesAtomically(const std::vector<FileToWrite>& files);

// Writes all of `bytes` at `offset` of the open file `fd` (named `path` in errors), retrying
// short writes and EINTR. FileError's errors ("cannot write").
absl::Status WriteAt(int fd, const std::string& path, std::string_view bytes, int64_t offset);

// The end of an atomic write whose bytes went to `tmp` (open as `fd`, in the same folder as
// `path`) piece by piece: fsync, rename to `path`, fsync of the folder. `tmp` is removed when a
// step fails. The caller closes `fd`. INTERNAL naming the step and the file.
absl::Status SyncAndRename(int fd, const std::string& tmp, const std::string& path);

}  // namespace trainerd
