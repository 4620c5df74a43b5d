#include "server/engine/datasets/dataset_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dataset_header.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace trainerd::engine {
namespace {

constexpr char kMagic[] = "TRAINERD-DATASET 1";

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  if (text.empty()) return shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d)) return absl::DataLossError("bad shape");
    shape.push_back(d);
  }
  return shape;
}

}  // namespace

namespace {

// The header's lines up to (not including) the blank line that ends it, with the values that are
// known only at the end of an upload given as text.
std::string HeaderLines(const DatasetMeta& meta, absl::string_view sha256, absl::string_view nanos,
                        absl::string_view target_min, absl::string_view target_max) {
  return absl::StrCat(kMagic, "\n", "name=", meta.name, "\n",
                      "feature_shape=", absl::StrJoin(meta.feature_shape, ","), "\n",
                      "target_shape=", absl::StrJoin(meta.target_shape, ","), "\n",
                      "target_dtype=", TargetDTypeName(meta.target_dtype), "\n", "rows=", meta.rows,
                      "\n", "size_bytes=", meta.size_bytes, "\n", "sha256=", sha256, "\n",
                      "create_time_unix_nanos=", nanos, "\n", "target_min=", target_min, "\n",
                      "target_max=", target_max, "\n", "owner=", absl::CEscape(meta.owner), "\n",
                      "shared=", meta.shared ? 1 : 0, "\n", "peer_copy=", meta.peer_copy ? 1 : 0,
                      "\n");
}

constexpr size_t kMinPadLine = 5;     // "pad=\n"
constexpr size_t kMaxPadLine = 1024;  // well under the reader's line limit

}  // namespace

int64_t DatasetFileHeaderBytes(const DatasetMeta& meta) {
  // The widest each late value can be: 64 hex digits, and an int64 with its sign.
  const std::string widest_int(20, '9');
  const size_t widest =
      HeaderLines(meta, std::string(std::max<size_t>(64, meta.sha256.size()), 'f'), widest_int,
                  widest_int, widest_int)
          .size();
  // At least one pad line, then the blank line.
  const size_t bytes = widest + kMinPadLine + 1;
  return static_cast<int64_t>((bytes + 4095) / 4096 * 4096);
}

std::string DatasetFileHeaderText(const DatasetMeta& meta) {
  return DatasetFileHeaderText(meta, DatasetFileHeaderBytes(meta)).value();
}

absl::StatusOr<std::string> DatasetFileHeaderText(const DatasetMeta& meta, int64_t header_bytes) {
  std::string text =
      HeaderLines(meta, meta.sha256, absl::StrCat(absl::ToUnixNanos(meta.create_time)),
                  absl::StrCat(meta.target_min), absl::StrCat(meta.target_max));
  const size_t total = static_cast<size_t>(header_bytes);
  if (header_bytes < 0 || text.size() + kMinPadLine + 1 > total) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the header of dataset '", meta.name, "' does not fit its ", header_bytes, " bytes"));
  }
  // What the pad lines fill: at least kMinPadLine, by the reservation.
  size_t need = total - text.size() - 1;
  while (need > 0) {
    size_t line = std::min(need, kMaxPadLine);
    if (need - line > 0 && need - line < kMinPadLine) line = need - kMinPadLine;
    text += "pad=";
    text.append(line - kMinPadLine, '.');
    text += "\n";
    need -= line;
  }
  text += "\n";
  return text;
}

absl::Status WriteDatasetFile(const std::string& path, const DatasetMeta& meta, const void* payload,
                              size_t size) {
  return WriteFileAtomically(path, {DatasetFileHeaderText(meta),
                                    std::string_view(static_cast<const char*>(payload), size)});
}

absl::Status RewriteDatasetFileHeader(const std::string& path, const DatasetFileHeader& header) {
  TRAINERD_ASSIGN_OR_RETURN(const std::string text,
                            DatasetFileHeaderText(header.meta, header.payload_offset));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "cannot open", path);
  ScopedFd closer(fd);
  TRAINERD_RETURN_IF_ERROR(WriteAt(fd, path, text, 0));
  if (::fdatasync(fd) != 0) return FileError(errno, "cannot fdatasync", path);
  return absl::OkStatus();
}

absl::StatusOr<DatasetFileHeader> ReadDatasetFileHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("dataset file '", path, "' is damaged: ", why));
  };
  // The header is a few hundred bytes; a file whose header runs past this is not ours. A line
  // may still be long: the owner is the caller's name (a token's name, a certificate's subject),
  // which nothing bounds below this, and a file the daemon wrote must read back.
  constexpr size_t kMaxHeaderLine = 64 << 10;
  constexpr int kMaxHeaderLines = 64;
  std::string line;
  auto read_line = [&]() -> bool {
    line.clear();
    char c = 0;
    while (in.get(c) && c != '\n') {
      if (line.size() == kMaxHeaderLine) return false;
      line.push_back(c);
    }
    return static_cast<bool>(in);
  };
  if (!read_line() || line != kMagic) return damaged("bad magic line");
  std::map<std::string, std::string> fields;
  int lines = 0;
  bool ended = false;  // by the blank line
  while (read_line()) {
    if (line.empty()) {
      ended = true;
      break;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos || ++lines > kMaxHeaderLines) {
      return damaged(absl::StrCat("bad header line '", absl::CHexEscape(line.substr(0, 80)), "'"));
    }
    fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  if (!ended) return damaged("truncated header");
  DatasetFileHeader header;
  header.payload_offset = static_cast<int64_t>(in.tellg());
  DatasetMeta& m = header.meta;
  int64_t nanos = 0;
  auto fshape = ParseShape(fields["feature_shape"]);
  auto tshape = ParseShape(fields["target_shape"]);
  if (!fshape.ok() || !tshape.ok()) return damaged("bad shape");
  DatasetHeader declared;
  declared.name = fields["name"];
  declared.feature_shape = *fshape;
  declared.target_shape = *tshape;
  if (fields["target_dtype"] == "float32") {
    declared.target_dtype = TargetDType::kFloat32;
  } else if (fields["target_dtype"] == "int64") {
    declared.target_dtype = TargetDType::kInt64;
  } else {
    return damaged("bad target_dtype");
  }
  if (!absl::SimpleAtoi(fields["rows"], &declared.rows) ||
      !absl::SimpleAtoi(fields["size_bytes"], &m.size_bytes) ||
      !absl::SimpleAtoi(fields["create_time_unix_nanos"], &nanos) ||
      !absl::SimpleAtoi(fields["target_min"], &m.target_min) ||
      !absl::SimpleAtoi(fields["target_max"], &m.target_max)) {
    return damaged("bad numeric field");
  }
  declared.sha256 = fields["sha256"];
  // The same checks as an upload's header (no size limit: the daemon accepted it once).
  const absl::StatusOr<DatasetLayout> layout =
      CheckDatasetHeader(declared, /*max_dataset_bytes=*/0);
  if (!layout.ok()) return damaged(std::string(layout.status().message()));
  if (declared.sha256.empty()) return damaged("no sha256");
  if (m.size_bytes != layout->total_bytes) return damaged("size_bytes does not match the shapes");
  std::string owner;
  if (!absl::CUnescape(fields["owner"], &owner)) return damaged("bad owner");
  m.name = declared.name;
  m.feature_shape = declared.feature_shape;
  m.target_shape = declared.target_shape;
  m.target_dtype = declared.target_dtype;
  m.rows = declared.rows;
  m.sha256 = declared.sha256;
  m.feature_bytes = layout->feature_bytes;
  m.owner = std::move(owner);
  m.shared = fields["shared"] == "1";  // files from before sharing have no such line
  m.peer_copy = fields["peer_copy"] == "1";  // nor of copies for peers
  m.create_time = absl::FromUnixNanos(nanos);
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
