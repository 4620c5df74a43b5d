// Hand-made exported-program archives (the layout torch.export.save writes), for tests that do not
// link LibTorch: a zip writer (stored records, real CRC-32) and a one-layer program y = x W^T + b
// over rows of `features` values, with knobs that spoil it the ways a hostile caller would.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainerd::testing {

// A zip of stored (uncompressed) records. `declared_sizes`, when given for a record, is the
// uncompressed size its headers claim (and deflate as its method): a decompression bomb's lie.
inline std::string ZipArchive(const std::vector<std::pair<std::string, std::string>>& records,
                              const std::vector<std::pair<std::string, uint32_t>>& declared = {}) {
  auto crc32 = [](const std::string& data) {
    uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char c : data) {
      crc ^= c;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
  };
  auto put16 = [](std::string& out, uint16_t v) {
    out.push_back(static_cast<char>(v & 0xFF));
    out.push_back(static_cast<char>(v >> 8));
  };
  auto put32 = [&](std::string& out, uint32_t v) {
    put16(out, static_cast<uint16_t>(v & 0xFFFF));
    put16(out, static_cast<uint16_t>(v >> 16));
  };
  std::string out, central;
  for (const auto& [name, data] : records) {
    uint32_t size = static_cast<uint32_t>(data.size());
    uint16_t method = 0;
    for (const auto& [lie_name, lie_size] : declared) {
      if (lie_name == name) {
        size = lie_size;
        method = 8;
      }
    }
    const uint32_t offset = static_cast<uint32_t>(out.size());
    const uint32_t crc = crc32(data);
    put32(out, 0x04034b50);
    put16(out, 20);
    put16(out, 0);
    put16(out, method);
    put32(out, 0);
    put32(out, crc);
    put32(out, static_cast<uint32_t>(data.size()));
    put32(out, size);
    put16(out, static_cast<uint16_t>(name.size()));
    put16(out, 0);
    out += name;
    out += data;
    put32(central, 0x02014b50);
    put16(central, 20);
    put16(central, 20);
    put16(central, 0);
    put16(central, method);
    put32(central, 0);
    put32(central, crc);
    put32(central, static_cast<uint32_t>(data.size()));
    put32(central, size);
    put16(central, static_cast<uint16_t>(name.size()));
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put32(central, 0);
    put32(central, offset);
    central += name;
  }
  const uint32_t central_offset = static_cast<uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint16_t>(records.size()));
  put16(out, static_cast<uint16_t>(records.size()));
  put32(out, static_cast<uint32_t>(central.size()));
  put32(out, central_offset);
  put16(out, 0);
  return out;
}

// How to spoil the one-layer program.
struct ExportedProgramKnobs {
  int64_t features = 1;
  std::string target = "torch.ops.aten.linear.default";  // the node's operator
  bool forged_graph = false;                             // the node uses a value nothing defines
  int64_t weight_rows = 1;      // the weight's declared rows (its record holds 1 x features)
  bool pickled_weight = false;  // use_pickle: true
  uint32_t bomb_bytes = 0;      // > 0: the graph's record claims to expand to this many bytes
};

// The program's records, in the order they are zipped.
inline std::vector<std::pair<std::string, std::string>> ExportedProgramRecords(
    const ExportedProgramKnobs& k = {}) {
  auto tensor_meta = [](const std::string& sizes, const std::string& strides) {
    return absl::StrCat(R"({"dtype": 7, "sizes": [)", sizes, R"(], "strides": [)", strides,
                        R"(], "storage_offset": {"as_int": 0}, "layout": 7,)",
                        R"( "requires_grad": false, "device": {"type": "cpu", "index": null}})");
  };
  const std::string batch = R"({"as_expr": {"expr_str": "s0", "hint": {"as_int": 2}}})";
  const std::string features = absl::StrCat(R"({"as_int": )", k.features, "}");
  const std::string input_name = k.forged_graph ? "nowhere" : "x";
  const std::string model = absl::StrCat(
      R"({"graph_module": {"graph": {)",
      R"("inputs": [{"as_tensor": {"name": "p_w"}}, {"as_tensor": {"name": "p_b"}},)",
      R"( {"as_tensor": {"name": "x"}}],)", R"( "outputs": [{"as_tensor": {"name": "out"}}],)",
      R"( "nodes": [{"target": ")", k.target, R"(", "name": "out", "inputs": [)",
      R"({"name": "input", "arg": {"as_tensor": {"name": ")", input_name, R"("}}, "kind": 1},)",
      R"( {"name": "weight", "arg": {"as_tensor": {"name": "p_w"}}, "kind": 1},)",
      R"( {"name": "bias", "arg": {"as_tensor": {"name": "p_b"}}, "kind": 1}],)",
      R"( "outputs": [{"as_tensor": {"name": "out"}}]}],)", R"( "tensor_values": {"x": )",
      tensor_meta(absl::StrCat(batch, ", ", features),
                  absl::StrCat(features, R"(, {"as_int": 1})")),
      R"(, "out": )",
      tensor_meta(absl::StrCat(batch, R"(, {"as_int": 1})"), R"({"as_int": 1}, {"as_int": 1})"),
      R"(}, "custom_obj_values": {}},)", R"( "signature": {"input_specs": [)",
      R"({"parameter": {"arg": {"name": "p_w"}, "parameter_name": "fc.weight"}},)",
      R"( {"parameter": {"arg": {"name": "p_b"}, "parameter_name": "fc.bias"}},)",
      R"( {"user_input": {"arg": {"as_tensor": {"name": "x"}}}}],)",
      R"( "output_specs": [{"user_output": {"arg": {"as_tensor": {"name": "out"}}}}]}}})");
  auto weight = [&](const std::string& path, const std::string& sizes, const std::string& strides) {
    return absl::StrCat(R"({"path_name": ")", path, R"(", "is_param": true, "use_pickle": )",
                        k.pickled_weight ? "true" : "false", R"(, "tensor_meta": )",
                        tensor_meta(sizes, strides), "}");
  };
  const std::string weights = absl::StrCat(
      R"({"config": {"fc.weight": )",
      weight("weight_0", absl::StrCat(R"({"as_int": )", k.weight_rows, "}, ", features),
             absl::StrCat(features, R"(, {"as_int": 1})")),
      R"(, "fc.bias": )", weight("weight_1", R"({"as_int": 1})", R"({"as_int": 1})"), "}}");
  std::string w(static_cast<size_t>(4 * k.features), '\0');
  const float half = 0.5f;
  for (int64_t i = 0; i < k.features; ++i) std::memcpy(&w[4 * i], &half, 4);
  std::string b(4, '\0');
  return {{"m/archive_format", "pt2"},
          {"m/models/model.json", model},
          {"m/data/weights/model_weights_config.json", weights},
          {"m/data/weights/weight_0", w},
          {"m/data/weights/weight_1", b},
          {"m/data/constants/model_constants_config.json", R"({"config": {}})"},
          {"m/byteorder", "little"},
          {"m/.data/version", "6\n"}};
}

inline std::string ExportedProgramArchive(const ExportedProgramKnobs& k = {}) {
  std::vector<std::pair<std::string, uint32_t>> declared;
  if (k.bomb_bytes > 0) declared.emplace_back("m/models/model.json", k.bomb_bytes);
  return ZipArchive(ExportedProgramRecords(k), declared);
}

}  // namespace trainerd::testing
