// The payload of `dataset upload` streamed from .npy files: trainctl reads each file's header
// (shape and dtype), decides the dataset's layout as TableFromNpy does, and then reads, converts
// and hands out the payload a block at a time, so that it never holds more than a few MiB however
// large the files are. The bytes are those EncodePayload gives for the table ReadUploadInput reads
// from the same files, and a value ReadUploadInput refuses is refused with the same message, when
// the stream reaches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/upload_input.h"
#include "common/dataset_header.h"
#include "common/npy_reader.h"

namespace trainerd::client {

// Whether NpyUploadStream takes `input`: .npy features (and targets), each a regular file, or a
// path that cannot be looked at (then Open says why, as ReadUploadInput would). CSV input, and
// .npy read from a pipe or a device (whose size is not known before the end), go through
// ReadUploadInput: the whole table in memory.
bool CanStreamUpload(const UploadInput& input);

// Reads the payload of an upload from its .npy files. Covers every .npy input: a separate targets
// file, and a 2-D features file whose last --target-columns columns are the targets (read twice:
// the feature columns of every row, then the target columns). Not thread-safe.
class NpyUploadStream {
 public:
  // Reads the files' headers and checks them and the layout: the errors of ReadUploadInput for the
  // same files (a file that cannot be opened, a bad or truncated file named by its path, a layout
  // TableFromNpy refuses after the file names), without reading the data.
  static absl::StatusOr<std::unique_ptr<NpyUploadStream>> Open(const UploadInput& input);

  ~NpyUploadStream();
  NpyUploadStream(const NpyUploadStream&) = delete;
  NpyUploadStream& operator=(const NpyUploadStream&) = delete;

  // The upload's header figures; its name and sha256 are left empty.
  const DatasetHeader& header() const { return header_; }
  // Payload bytes: features then targets.
  int64_t total_bytes() const { return total_bytes_; }
  // What the upload converts (NpyConversionNotes).
  const std::vector<std::string>& notes() const { return notes_; }

  // Writes the next min(size, what is left) bytes of the payload at `out` and returns how many
  // (0 at the end). INVALID_ARGUMENT for a value TableFromNpy refuses, with its message after the
  // file names ("x.npy and y.npy: features[7, 2]: nan is not a finite number"); an error naming
  // the file when it cannot be read or ends early (changed since Open). The stream is unusable
  // after an error (each later call returns it again).
  absl::StatusOr<size_t> Read(char* out, size_t size);

  // Raw bytes read from a file at a time.
  static constexpr size_t kReadBytes = size_t{1} << 20;

 private:
  // One pass over one file: `columns` of each of `rows` rows, converted to float32 or int64.
  struct Pass {
    int fd = -1;
    std::string path;
    const char* name = "";  // "features" or "targets", for errors
    std::vector<int64_t> shape;
    NpyDType dtype = NpyDType::kFloat32;
    int64_t data_offset = 0;
    NpyColumns columns;
    bool to_int64 = false;
    int64_t next = 0;  // the flat index of the next element to read
    int64_t end = 0;   // one past the last element the pass needs
  };

  NpyUploadStream() = default;
  // Reads the current pass's next block and converts what it needs of it into converted_.
  absl::Status Refill();

  std::string files_;  // "x.npy" or "x.npy and y.npy", for value errors
  DatasetHeader header_;
  int64_t total_bytes_ = 0;
  std::vector<std::string> notes_;
  std::vector<int> fds_;
  std::vector<Pass> passes_;
  size_t current_ = 0;  // index into passes_
  std::vector<char> raw_;
  std::vector<char> converted_;
  size_t converted_size_ = 0;
  size_t converted_pos_ = 0;
  absl::Status error_;
};

}  // namespace trainerd::client
