// Streaming the payload of `dataset upload` from .npy files a block at a time.
#include "client/upload_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/checked_size.h"
#include "common/status_macros.h"

namespace trainerd::client {
namespace {

NpyArrayInfo InfoOf(const NpyHeaderInfo& header) {
  return {header.shape, header.dtype, header.data_bytes};
}

// Opens `path` for reading, sequentially. The file was opened moments ago by ReadNpyHeader.
absl::StatusOr<int> OpenForStreaming(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error_number = errno;
    return absl::NotFoundError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(error_number)));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return fd;
}

}  // namespace

bool CanStreamUpload(const UploadInput& input) {
  if (!input.npy) return false;
  std::vector<std::string> paths = {input.features_path};
  if (input.targets_path.has_value()) paths.push_back(*input.targets_path);
  for (const std::string& path : paths) {
    struct stat info;
    if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode) && !S_ISDIR(info.st_mode)) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<NpyUploadStream>> NpyUploadStream::Open(const UploadInput& input) {
  TRAINERD_ASSIGN_OR_RETURN(const NpyHeaderInfo features, ReadNpyHeader(input.features_path));
  std::optional<NpyHeaderInfo> targets;
  std::optional<NpyArrayInfo> target_info;
  if (input.targets_path.has_value()) {
    TRAINERD_ASSIGN_OR_RETURN(targets, ReadNpyHeader(*input.targets_path));
    target_info = InfoOf(*targets);
  }
  std::unique_ptr<NpyUploadStream> stream(new NpyUploadStream());
  stream->files_ = input.features_path;
  if (input.targets_path.has_value())
    absl::StrAppend(&stream->files_, " and ", *input.targets_path);

  NpyTableOptions options;
  options.target_columns = input.target_columns;
  options.target_dtype = EffectiveTargetDType(
      input, targets.has_value() ? std::optional<NpyDType>(targets->dtype) : std::nullopt);
  absl::StatusOr<NpyTableLayout> layout = LayOutNpyTable(InfoOf(features), target_info, options);
  if (!layout.ok()) {
    // As ReadUploadInput: the layout's checks do not know the file names.
    return absl::Status(layout.status().code(),
                        absl::StrCat(stream->files_, ": ", layout.status().message()));
  }

  stream->notes_ = NpyConversionNotes(
      features.dtype, targets.has_value() ? std::optional<NpyDType>(targets->dtype) : std::nullopt,
      layout->target_dtype);

  DatasetHeader& header = stream->header_;
  header.feature_shape = layout->feature_shape;
  header.target_shape = layout->target_shape;
  header.target_dtype = layout->target_dtype;
  header.rows = layout->rows;
  // The files' sizes bound these; checked all the same.
  TRAINERD_ASSIGN_OR_RETURN(
      const int64_t feature_bytes,
      CheckedByteSize(header.rows, header.feature_shape, 4, "the feature shape"));
  TRAINERD_ASSIGN_OR_RETURN(
      const int64_t target_bytes,
      CheckedByteSize(header.rows, header.target_shape, TargetItemBytes(header.target_dtype),
                      "the target shape"));
  TRAINERD_ASSIGN_OR_RETURN(stream->total_bytes_,
                            CheckedAdd(feature_bytes, target_bytes, "the payload"));

  // One pass for the features and one for the targets: over the targets file, or a second one
  // over the features file for its last columns.
  TRAINERD_ASSIGN_OR_RETURN(const int features_fd, OpenForStreaming(input.features_path));
  stream->fds_.push_back(features_fd);
  int targets_fd = features_fd;
  if (input.targets_path.has_value()) {
    TRAINERD_ASSIGN_OR_RETURN(targets_fd, OpenForStreaming(*input.targets_path));
    stream->fds_.push_back(targets_fd);
  }
  auto add_pass = [&](int fd, const std::string& path, const char* name, const NpyHeaderInfo& file,
                      const NpyColumns& columns, bool to_int64) {
    Pass pass;
    pass.fd = fd;
    pass.path = path;
    pass.name = name;
    pass.shape = file.shape;
    pass.dtype = file.dtype;
    pass.data_offset = file.data_offset;
    pass.columns = columns;
    pass.to_int64 = to_int64;
    // From the first value wanted to the last: rows >= 1 and the columns are not empty.
    pass.next = columns.begin;
    pass.end = (layout->rows - 1) * columns.stride + columns.end;
    stream->passes_.push_back(std::move(pass));
  };
  add_pass(features_fd, input.features_path, "features", features, layout->feature_columns,
           /*to_int64=*/false);
  const bool int64_targets = layout->target_dtype == TargetDType::kInt64;
  if (targets.has_value()) {
    add_pass(targets_fd, *input.targets_path, "targets", *targets, layout->target_columns,
             int64_targets);
  } else {
    add_pass(features_fd, input.features_path, "features", features, layout->target_columns,
             int64_targets);
  }
  stream->raw_.resize(kReadBytes);
  // At most kReadBytes / item values a block, converted to at most 8 bytes each (int64): 8 times
  // the block for one-byte values (uint8 images, bool).
  size_t smallest_item = 8;
  for (const Pass& pass : stream->passes_) {
    smallest_item = std::min(smallest_item, NpyItemSize(pass.dtype));
  }
  stream->converted_.resize(kReadBytes / smallest_item * 8);
  return stream;
}

NpyUploadStream::~NpyUploadStream() {
  for (int fd : fds_) ::close(fd);
}

absl::Status NpyUploadStream::Refill() {
  Pass& pass = passes_[current_];
  const int64_t item = static_cast<int64_t>(NpyItemSize(pass.dtype));
  const int64_t first = pass.next;
  const int64_t count = std::min(static_cast<int64_t>(kReadBytes) / item, pass.end - first);
  const size_t bytes = static_cast<size_t>(count * item);
  size_t have = 0;
  while (have < bytes) {
    const ssize_t n =
        ::pread(pass.fd, raw_.data() + have, bytes - have,
                static_cast<off_t>(pass.data_offset + first * item) + static_cast<off_t>(have));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      return absl::ErrnoToStatus(error_number, absl::StrCat(pass.path, ": cannot read"));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(pass.path,
                       ": the file ended before its data did (did it change while "
                       "it was being uploaded?)"));
    }
    have += static_cast<size_t>(n);
  }

  const auto convert = [&](int64_t from, int64_t values, char* out) {
    const char* in = raw_.data() + (from - first) * item;
    return pass.to_int64
               ? NpyValuesToInt64(pass.dtype, in, values, out, pass.name, pass.shape, from)
               : NpyValuesToFloat32(pass.dtype, in, values, out, pass.name, pass.shape, from);
  };
  const int64_t out_item = pass.to_int64 ? 8 : 4;
  const NpyColumns& columns = pass.columns;
  absl::Status status;
  size_t converted = 0;
  if (columns.begin == 0 && columns.end == columns.stride) {
    // Whole rows: every value read is wanted.
    status = convert(first, count, converted_.data());
    converted = static_cast<size_t>(count * out_item);
  } else {
    // The wanted columns of each row the block touches.
    const int64_t stop = first + count;
    for (int64_t row = first / columns.stride; row * columns.stride < stop && status.ok(); ++row) {
      const int64_t from = std::max(first, row * columns.stride + columns.begin);
      const int64_t to = std::min(stop, row * columns.stride + columns.end);
      if (from >= to) continue;
      status = convert(from, to - from, converted_.data() + converted);
      converted += static_cast<size_t>((to - from) * out_item);
    }
  }
  if (!status.ok()) {
    // As ReadUploadInput says it: after the names of the files.
    return absl::Status(status.code(), absl::StrCat(files_, ": ", status.message()));
  }
  pass.next = first + count;
  converted_size_ = converted;
  converted_pos_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<size_t> NpyUploadStream::Read(char* out, size_t size) {
  if (!error_.ok()) return error_;
  size_t done = 0;
  while (done < size) {
    if (converted_pos_ < converted_size_) {
      const size_t n = std::min(size - done, converted_size_ - converted_pos_);
      std::memcpy(out + done, converted_.data() + converted_pos_, n);
      converted_pos_ += n;
      done += n;
      continue;
    }
    if (current_ == passes_.size()) break;
    if (passes_[current_].next >= passes_[current_].end) {
      ++current_;
      continue;
    }
    if (absl::Status status = Refill(); !status.ok()) {
      error_ = status;
      return error_;
    }
  }
  return done;
}

}  // namespace trainerd::client
