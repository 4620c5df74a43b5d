// The safetensors format (https://huggingface.co/docs/safetensors): a state_dict as one file that
// any framework reads without running code. Layout: an 8-byte little-endian header size N, N
// bytes of JSON (padded with spaces to a multiple of 8), then the tensors' raw little-endian
// bytes, back to back. The JSON maps each tensor's name to {"dtype", "shape", "data_offsets":
// [begin, end)} (offsets into the bytes after the header) and "__metadata__" to string pairs.
// LibTorch-free: the engine writes it, the daemon checks what a worker or a peer sends, and the
// tests read it back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd {

// One tensor to write: its name, its safetensors dtype ("F32", "F64", "F16", "BF16", "I64",
// "I32", "I16", "I8", "U8", "BOOL"), its shape and its row-major little-endian bytes.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string_view data;
};

// One tensor of a parsed file: where its bytes are within the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // of its first byte, from the start of the file
  int64_t size = 0;    // its bytes
};

struct SafetensorsFile {
  std::vector<SafetensorsEntry> tensors;  // in the order of their bytes in the file
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", sorted by key
};

// The bytes of one element of a safetensors dtype; 0 for a name the format does not have.
int64_t SafetensorsDtypeSize(std::string_view dtype);

// The file: the tensors' bytes in the order given, the header's entries in that order too (so
// that a reader that keeps the header's order sees the state_dict's). INVALID_ARGUMENT for an
// empty or repeated name, "__metadata__" as a name, an unknown dtype, a negative dimension, or
// bytes that do not match dtype and shape.
absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<SafetensorsTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);

// Parses and checks a whole file as the safetensors library does before it hands out a tensor:
// the header's size within the file and at most 100 MB, valid JSON whose top level is an object,
// every entry {dtype, shape, data_offsets} with a known dtype, non-negative dimensions and as many
// bytes as dtype and shape say, the tensors' bytes back to back without gaps or overlaps up to the
// file's end, metadata of strings. INVALID_ARGUMENT with a sentence naming what is wrong.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view file);

// `file` (which must parse) with metadata `key` set to `value`: the header is written again, the
// tensors' bytes are kept as they are.
absl::StatusOr<std::string> SetSafetensorsMetadata(std::string_view file, const std::string& key,
                                                   const std::string& value);

}  // namespace trainerd
