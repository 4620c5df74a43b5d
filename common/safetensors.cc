// The safetensors writer and checker. The header is JSON and goes through nlohmann::json (Debian's
// nlohmann-json3-dev) both ways, so names are escaped as JSON requires and nothing is read back
// by hand; the framing around it (the size, the padding, the bytes) is the format's few rules.
#include "common/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safe_text.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "trainerd assumes a little-endian host");

namespace trainerd {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kMetadataKey = "__metadata__";
// The safetensors library's own limit on the header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The byte count of `shape` in `dtype`; -1 when it overflows int64.
int64_t ByteCount(const std::vector<int64_t>& shape, int64_t element_size) {
  int64_t n = element_size;
  for (const int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string Quoted(std::string_view name) {
  return absl::StrCat("'", EscapeControls(std::string(name.substr(0, 200))), "'");
}

}  // namespace

int64_t SafetensorsDtypeSize(std::string_view dtype) {
  static const std::map<std::string_view, int64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8}};
  const auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<SafetensorsTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  int64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("a safetensors tensor cannot be named ", Quoted(t.name)));
    }
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the safetensors tensor name ", Quoted(t.name), " is repeated"));
    }
    const int64_t element_size = SafetensorsDtypeSize(t.dtype);
    if (element_size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(t.name),
                                                     ": unknown safetensors dtype ",
                                                     Quoted(t.dtype)));
    }
    const int64_t bytes = ByteCount(t.shape, element_size);
    if (bytes < 0 || bytes != static_cast<int64_t>(t.data.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(t.name), " has ", t.data.size(), " bytes; ", t.dtype, " of shape [",
          absl::StrJoin(t.shape, ", "), "] needs ", bytes));
    }
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  // Padded with spaces so that the tensors' bytes start 8-byte aligned, as the library writes.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size() + static_cast<size_t>(offset));
  const uint64_t n = json.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += json;
  for (const SafetensorsTensor& t : tensors) out.append(t.data.data(), t.data.size());
  return out;
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view file) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("not a safetensors file: ", why));
  };
  if (file.size() < 8) return bad("it is shorter than its 8-byte header size");
  uint64_t header_size = 0;
  std::memcpy(&header_size, file.data(), sizeof(header_size));
  if (header_size > kMaxHeaderBytes) {
    return bad(absl::StrCat("its header would be ", header_size, " bytes (at most ",
                            kMaxHeaderBytes, ")"));
  }
  if (header_size > file.size() - 8) {
    return bad(absl::StrCat("its header would be ", header_size, " bytes; the file has ",
                            file.size() - 8, " after the size"));
  }
  const std::string_view text = file.substr(8, header_size);
  if (text.empty() || text.front() != '{') return bad("its header is not a JSON object");
  // No exceptions: a malformed header is a discarded value.
  const OrderedJson header = OrderedJson::parse(text.begin(), text.end(), nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("its header is not valid JSON");
  const int64_t data_start = 8 + static_cast<int64_t>(header_size);
  const int64_t data_size = static_cast<int64_t>(file.size()) - data_start;

  SafetensorsFile out;
  struct Span {
    int64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return bad(absl::StrCat("metadata ", Quoted(mkey), " is not a string"));
        }
        out.metadata.emplace_back(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor ", Quoted(key));
    if (key.empty()) return bad("a tensor has an empty name");
    if (!value.is_object() || value.size() != 3 || !value.contains("dtype") ||
        !value.contains("shape") || !value.contains("data_offsets")) {
      return bad(absl::StrCat(where, " is not {dtype, shape, data_offsets}"));
    }
    const OrderedJson& dtype = value["dtype"];
    const OrderedJson& shape = value["shape"];
    const OrderedJson& offsets = value["data_offsets"];
    if (!dtype.is_string() || SafetensorsDtypeSize(dtype.get<std::string>()) == 0) {
      return bad(absl::StrCat(where, " has an unknown dtype"));
    }
    SafetensorsEntry entry;
    entry.name = key;
    entry.dtype = dtype.get<std::string>();
    if (!shape.is_array()) return bad(absl::StrCat(where, "'s shape is not a list"));
    for (const OrderedJson& d : shape) {
      if (!d.is_number_unsigned() ||
          d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat(where, "'s shape holds something other than a size"));
      }
      entry.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return bad(absl::StrCat(where, "'s data_offsets are not two offsets"));
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > static_cast<uint64_t>(data_size)) {
      return bad(absl::StrCat(where, "'s bytes [", begin, ", ", end,
                              ") are not within the file's ", data_size));
    }
    const int64_t bytes = ByteCount(entry.shape, SafetensorsDtypeSize(entry.dtype));
    if (bytes < 0) return bad(absl::StrCat(where, "'s shape holds more bytes than a file can"));
    if (static_cast<uint64_t>(bytes) != end - begin) {
      return bad(absl::StrCat(where, " has ", end - begin, " bytes; its dtype and shape need ",
                              bytes));
    }
    entry.offset = data_start + static_cast<int64_t>(begin);
    entry.size = bytes;
    spans.push_back({static_cast<int64_t>(begin), static_cast<int64_t>(end), out.tensors.size()});
    out.tensors.push_back(std::move(entry));
  }
  // Back to back from the first byte to the last: no gap, no overlap, nothing after.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t expected = 0;
  std::vector<SafetensorsEntry> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) {
    if (s.begin != expected) {
      return bad(absl::StrCat("tensor ", Quoted(out.tensors[s.index].name), "'s bytes start at ",
                              s.begin, "; the one before ends at ", expected));
    }
    expected = s.end;
    ordered.push_back(std::move(out.tensors[s.index]));
  }
  if (expected != data_size) {
    return bad(absl::StrCat("the tensors hold ", expected, " bytes; the file has ", data_size,
                            " after its header"));
  }
  out.tensors = std::move(ordered);
  std::sort(out.metadata.begin(), out.metadata.end());
  return out;
}

absl::StatusOr<std::string> SetSafetensorsMetadata(std::string_view file, const std::string& key,
                                                   const std::string& value) {
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(file);
  if (!parsed.ok()) return parsed.status();
  std::vector<std::pair<std::string, std::string>> metadata = parsed->metadata;
  bool replaced = false;
  for (auto& [k, v] : metadata) {
    if (k == key) {
      v = value;
      replaced = true;
    }
  }
  if (!replaced) metadata.emplace_back(key, value);
  std::sort(metadata.begin(), metadata.end());
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(parsed->tensors.size());
  for (const SafetensorsEntry& e : parsed->tensors) {
    tensors.push_back({e.name, e.dtype, e.shape,
                       file.substr(static_cast<size_t>(e.offset), static_cast<size_t>(e.size))});
  }
  return EncodeSafetensors(tensors, metadata);
}

}  // namespace trainerd
