// The on-disk form of a dataset, so that datasets survive a restart (DatasetRegistry::PathFor:
// <data_dir>/datasets/<owner folder>/<name>.trds, or <data_dir>/datasets/<name>.trds for a
// dataset without an owner). A text header ("TRAINERD-DATASET 1", key=value lines, a blank line)
// followed by the raw payload exactly as uploaded (features then targets, little-endian).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/types.h"

namespace trainerd::engine {

inline constexpr char kDatasetFileExtension[] = ".trds";

// The bytes the header of `meta`'s file takes, whatever its sha256, create time and target range
// turn out to be: a multiple of 4096 at which the payload starts. An upload writes its payload
// there as the bytes arrive and the header last (DatasetFileHeaderText).
int64_t DatasetFileHeaderBytes(const DatasetMeta& meta);

// The header of `meta`'s file, padded with "pad=" lines (which readers skip) to exactly
// DatasetFileHeaderBytes(meta) bytes.
std::string DatasetFileHeaderText(const DatasetMeta& meta);
// The same header padded to `header_bytes` (a file's payload offset); FAILED_PRECONDITION when it
// does not fit.
absl::StatusOr<std::string> DatasetFileHeaderText(const DatasetMeta& meta, int64_t header_bytes);

// Writes atomically: a temporary file in the same folder, fsync, rename, fsync of the folder.
absl::Status WriteDatasetFile(const std::string& path, const DatasetMeta& meta, const void* payload,
                              size_t size);

// The header of a dataset file and where its payload starts.
struct DatasetFileHeader {
  DatasetMeta meta;
  int64_t payload_offset = 0;
};

// Reads and checks the header (not the payload). DATA_LOSS for a damaged or truncated file.
absl::StatusOr<DatasetFileHeader> ReadDatasetFileHeader(const std::string& path);
// Writes `header.meta` over the file's header in place, padded to the same payload offset, and
// syncs it: the payload is not touched (sharing a dataset flips one line of its header).
absl::Status RewriteDatasetFileHeader(const std::string& path, const DatasetFileHeader& header);

// Reads `size` payload bytes into `dest` and checks them against the header's SHA-256.
absl::Status ReadDatasetPayload(const std::string& path, const DatasetFileHeader& header,
                                void* dest, size_t size);

}  // namespace trainerd::engine
