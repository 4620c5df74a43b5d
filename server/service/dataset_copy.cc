#include "server/service/dataset_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"

namespace trainerd::service {
namespace {

// The API's largest chunk (UploadDatasetRequest.chunk).
constexpr int64_t kChunkBytes = int64_t{1} << 20;

}  // namespace

absl::Status SendDataset(v1::DatasetService::Stub* stub, const std::string& name_there,
                         const engine::DatasetMeta& meta, const std::string& path,
                         int64_t payload_offset,
                         const std::function<void(grpc::ClientContext*)>& prepare,
                         const std::function<absl::Status(const grpc::Status&)>& describe) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot read dataset '", meta.name, "' to send it: ", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  grpc::ClientContext context;
  prepare(&context);
  v1::Dataset answer;
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
      stub->UploadDataset(&context, &answer);
  const v1::Dataset described = convert::ToProto(meta);
  v1::UploadDatasetRequest first;
  v1::DatasetHeader* header = first.mutable_header();
  header->set_name(name_there);
  header->set_for_peer_jobs(true);  // the peer removes it once no job has used it for a while
  *header->mutable_feature_shape() = described.feature_shape();
  *header->mutable_target_shape() = described.target_shape();
  header->set_target_dtype(described.target_dtype());
  header->set_row_count(meta.rows);
  header->set_sha256(meta.sha256);  // the peer checks the bytes against it (DATA_LOSS)
  bool open = writer->Write(first);
  absl::Status read_error;
  std::string buffer;
  for (int64_t sent = 0; open && sent < meta.size_bytes;) {
    const int64_t want = std::min(kChunkBytes, meta.size_bytes - sent);
    buffer.resize(static_cast<size_t>(want));
    const ssize_t got = ::pread(fd, buffer.data(), static_cast<size_t>(want),
                                static_cast<off_t>(payload_offset + sent));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      read_error = absl::InternalError(
          absl::StrCat("cannot read dataset '", meta.name, "' to send it: ",
                       got == 0 ? std::string("its file is shorter than its header says")
                                : std::strerror(errno)));
      context.TryCancel();
      break;
    }
    buffer.resize(static_cast<size_t>(got));
    v1::UploadDatasetRequest chunk;
    chunk.set_chunk(buffer);
    open = writer->Write(chunk);
    sent += got;
  }
  if (open && read_error.ok()) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!read_error.ok()) return read_error;
  if (!status.ok()) return describe(status);
  if (answer.sha256() != meta.sha256) {
    return absl::DataLossError(absl::StrCat("the peer stored dataset '", meta.name,
                                            "' with sha256 ", answer.sha256().substr(0, 64),
                                            ", not this daemon's ", meta.sha256));
  }
  return absl::OkStatus();
}

}  // namespace trainerd::service
