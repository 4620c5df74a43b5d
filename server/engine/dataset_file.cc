#include "server/engine/dataset_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace trainerd::engine {
namespace {

constexpr char kMagic[] = "TRAINERD-DATASET 1";

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  if (text.empty()) return shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d) || d < 1) return absl::DataLossError("bad shape");
    shape.push_back(d);
  }
  return shape;
}

}  // namespace

absl::Status WriteDatasetFile(const std::string& path, const DatasetMeta& meta,
                              const void* payload, size_t size) {
  std::string header = absl::StrCat(
      kMagic, "\n", "name=", meta.name, "\n", "feature_shape=",
      absl::StrJoin(meta.feature_shape, ","), "\n", "target_shape=",
      absl::StrJoin(meta.target_shape, ","), "\n", "target_dtype=",
      TargetDTypeName(meta.target_dtype), "\n", "rows=", meta.rows, "\n",
      "size_bytes=", meta.size_bytes, "\n", "sha256=", meta.sha256, "\n",
      "create_time_unix_nanos=", absl::ToUnixNanos(meta.create_time), "\n",
      "target_min=", meta.target_min, "\n", "target_max=", meta.target_max, "\n\n");
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status status = WriteAll(fd, header.data(), header.size(), tmp);
  if (status.ok()) status = WriteAll(fd, static_cast<const char*>(payload), size, tmp);
  if (status.ok() && ::fsync(fd) != 0) status = Errno("cannot fsync", tmp);
  if (::close(fd) != 0 && status.ok()) status = Errno("cannot close", tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) status = Errno("cannot rename", tmp);
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Make the rename itself durable.
  const std::string dir = path.substr(0, path.find_last_of('/') + 1);
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<DatasetFileHeader> ReadDatasetFileHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("dataset file '", path, "' is damaged: ", why));
  };
  std::string line;
  if (!std::getline(in, line) || line != kMagic) return damaged("bad magic line");
  std::map<std::string, std::string> fields;
  while (std::getline(in, line) && !line.empty()) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) return damaged(absl::StrCat("bad header line '", line, "'"));
    fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  if (!in) return damaged("truncated header");
  DatasetFileHeader header;
  header.payload_offset = static_cast<int64_t>(in.tellg());
  DatasetMeta& m = header.meta;
  int64_t nanos = 0;
  m.name = fields["name"];
  auto fshape = ParseShape(fields["feature_shape"]);
  auto tshape = ParseShape(fields["target_shape"]);
  if (!fshape.ok() || !tshape.ok() || fshape->empty()) return damaged("bad shape");
  m.feature_shape = *fshape;
  m.target_shape = *tshape;
  if (fields["target_dtype"] == "float32") {
    m.target_dtype = TargetDType::kFloat32;
  } else if (fields["target_dtype"] == "int64") {
    m.target_dtype = TargetDType::kInt64;
  } else {
    return damaged("bad target_dtype");
  }
  if (!absl::SimpleAtoi(fields["rows"], &m.rows) || m.rows < 1 ||
      !absl::SimpleAtoi(fields["size_bytes"], &m.size_bytes) ||
      !absl::SimpleAtoi(fields["create_time_unix_nanos"], &nanos) ||
      !absl::SimpleAtoi(fields["target_min"], &m.target_min) ||
      !absl::SimpleAtoi(fields["target_max"], &m.target_max)) {
    return damaged("bad numeric field");
  }
  m.sha256 = fields["sha256"];
  m.create_time = absl::FromUnixNanos(nanos);
  const int64_t target_item = m.target_dtype == TargetDType::kInt64 ? 8 : 4;
  if (m.size_bytes != m.rows * (ShapeElements(m.feature_shape) * 4 +
                                ShapeElements(m.target_shape) * target_item)) {
    return damaged("size_bytes does not match the shapes");
  }
  in.seekg(0, std::ios::end);
  if (static_cast<int64_t>(in.tellg()) != header.payload_offset + m.size_bytes) {
    return damaged("payload size does not match the header");
  }
  return header;
}

absl::Status ReadDatasetPayload(const std::string& path, const DatasetFileHeader& header,
                                void* dest, size_t size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  in.seekg(header.payload_offset);
  in.read(static_cast<char*>(dest), static_cast<std::streamsize>(size));
  if (static_cast<size_t>(in.gcount()) != size) {
    return absl::DataLossError(absl::StrCat("dataset file '", path, "' is truncated"));
  }
  if (Sha256Hex(std::string_view(static_cast<const char*>(dest), size)) != header.meta.sha256) {
    return absl::DataLossError(
        absl::StrCat("dataset file '", path, "' does not match its checksum"));
  }
  return absl::OkStatus();
}

}  // namespace trainerd::engine
