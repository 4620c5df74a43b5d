// The on-disk form of a dataset under <data_dir>/datasets/<name>.trds, so that datasets survive a
// restart. A text header ("TRAINERD-DATASET 1", key=value lines, a blank line) followed by the raw
// payload exactly as uploaded (features then targets, little-endian).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/engine/types.h"

namespace trainerd::engine {

inline constexpr char kDatasetFileExtension[] = ".trds";

// Writes atomically: a temporary file in the same folder, fsync, rename, fsync of the folder.
absl::Status WriteDatasetFile(const std::string& path, const DatasetMeta& meta,
                              const void* payload, size_t size);

// The header of a dataset file and where its payload starts.
struct DatasetFileHeader {
  DatasetMeta meta;
  int64_t payload_offset = 0;
};

// Reads and checks the header (not the payload). DATA_LOSS for a damaged or truncated file.
absl::StatusOr<DatasetFileHeader> ReadDatasetFileHeader(const std::string& path);

// Reads `size` payload bytes into `dest` and checks them against the header's SHA-256.
absl::Status ReadDatasetPayload(const std::string& path, const DatasetFileHeader& header,
                                void* dest, size_t size);

}  // namespace trainerd::engine
