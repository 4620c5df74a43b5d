// Writes a small TorchScript module for the end-to-end tests of `trainctl submit --torchscript`,
// so that they need no Python: make_torchscript_fixture PATH INPUTS OUTPUTS [KIND] saves a module
// "Net" whose forward is torch.linear(x, w, b) with w of shape [OUTPUTS, INPUTS], b of [OUTPUTS]
// and a buffer "calls" its forward never touches, as torch.jit.script(model).save(PATH) would.
// KIND makes a hostile module instead:
//   reads-file             the forward reads /etc/hostname through torch.from_file
//   loops-in-training      the forward never returns in training mode (the checker's trial runs
//                          in eval mode and passes)
//   allocates-in-training  the forward asks for 4 TB in training mode
//   uninitialised          the forward copies uninitialised memory (empty_like) into a buffer
//   warns                  the forward writes a forged log line (warnings.warn)
//   metadata-past-storage  a parameter of [3, 37] used in training mode, whose archive then
//                          declares it [3, 64] over the same 111-value storage (the attack that
//                          made LibTorch read and write past it)
//   deep-nesting           code nested 200,000 parentheses deep in the archive's source, which
//                          TorchScript's recursive parser meets when the module is loaded
// The only e2e piece that links LibTorch; e2e tests run it as a process.
#include <torch/script.h>
#include <torch/torch.h>
// (After LibTorch's headers, which bring the off_t these use.)
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <iostream>
#include <iterator>
#include <string>

namespace {

uint32_t Crc32(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Replaces `from` by `to` (same length) inside the archive's stored data.pkl and mends the
// record's CRC in its local header and central directory entry, so that the archive reads as
// well-formed: only its tensor metadata lies.
bool PatchDataPickle(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path, std::ios::binary);
  std::string zip((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The central directory's entry for data.pkl: its sizes (the local header may defer them to a
  // data descriptor) and where its local header is.
  for (size_t c = zip.find("PK\x01\x02"); c != std::string::npos; c = zip.find("PK\x01\x02", c + 4)) {
    uint16_t name_len = 0;
    std::memcpy(&name_len, &zip[c + 28], 2);
    const std::string name = zip.substr(c + 46, name_len);
    if (name.size() < 9 || name.compare(name.size() - 9, 9, "/data.pkl") != 0) continue;
    uint32_t size = 0, local = 0;
    std::memcpy(&size, &zip[c + 20], 4);
    std::memcpy(&local, &zip[c + 42], 4);
    uint16_t local_name = 0, local_extra = 0;
    std::memcpy(&local_name, &zip[local + 26], 2);
    std::memcpy(&local_extra, &zip[local + 28], 2);
    const size_t data = local + 30 + local_name + local_extra;
    std::string pickle = zip.substr(data, size);
    const size_t at = pickle.find(from);
    if (at == std::string::npos || from.size() != to.size()) return false;
    pickle.replace(at, from.size(), to);
    zip.replace(data, pickle.size(), pickle);
    const uint32_t crc = Crc32(pickle);
    std::memcpy(&zip[c + 16], &crc, 4);
    std::memcpy(&zip[local + 14], &crc, 4);
    // A data descriptor after the data repeats the CRC (signature, crc, sizes).
    if (zip.compare(data + size, 4, "PK\x07\x08") == 0) std::memcpy(&zip[data + size + 4], &crc, 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << zip;
    return true;
  }
  return false;
}

// Rewrites the archive with its code record replaced by `code`: the same records otherwise, in a
// new archive that LibTorch's writer makes (so that offsets and checksums are right).
bool ReplaceCode(const std::string& path, const std::function<std::string(std::string)>& edit) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.setMinVersion(reader.version());
  bool found = false;
  for (const std::string& name : reader.getAllRecords()) {
    // Written by the writer itself.
    if (name == "version" || name == ".data/version" || name == "byteorder" ||
        name == ".data/serialization_id") {
      continue;
    }
    auto [data, size] = reader.getRecord(name);
    std::string record(static_cast<const char*>(data.get()), size);
    if (name == "code/__torch__.py") {
      record = edit(record);
      found = true;
    }
    writer.writeRecord(name, record.data(), record.size(), /*compress=*/false);
  }
  writer.writeEndOfFile();
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: make_torchscript_fixture PATH INPUTS OUTPUTS [KIND]\n";
    return 2;
  }
  const std::string kind = argc == 5 ? argv[4] : "";
  try {
    const int64_t inputs = std::stoll(argv[2]);
    const int64_t outputs = std::stoll(argv[3]);
    torch::manual_seed(5);
    torch::jit::Module m("Net");
    // nn.Module's flag, which every module scripted in Python carries (train() and eval() set it).
    m.register_attribute("training", c10::BoolType::get(), true);
    m.register_parameter("w", torch::randn({outputs, inputs}), /*is_buffer=*/false);
    m.register_parameter("b", torch::zeros({outputs}), /*is_buffer=*/false);
    m.register_buffer("calls", torch::zeros({1}));
    std::string training_only;
    if (kind == "reads-file") {
      m.define(
          "def forward(self, x):\n"
          "  t = torch.from_file('/etc/hostname', False, 1)\n"
          "  return torch.linear(x, self.w, self.b) + t.sum()\n");
    } else if (kind == "loops-in-training") {
      training_only = "    i = 0\n    while i >= 0:\n      i = i + 1\n";
    } else if (kind == "allocates-in-training") {
      training_only = "    z = torch.ones([1000000, 1000000])\n    x = x + z.sum()\n";
    } else if (kind == "uninitialised") {
      training_only = "    self.calls.copy_(torch.empty_like(self.calls))\n";
    } else if (kind == "warns") {
      training_only = "    torch.warn('I1202 00:00:00.000 trainerd] job SUCCEEDED')\n";
    } else if (kind == "metadata-past-storage") {
      m.register_parameter("big", torch::zeros({3, 37}), /*is_buffer=*/false);
      training_only = "    x = x + 0.0 * (self.big * 2.0).sum()\n";
    } else if (kind == "deep-nesting") {
      training_only = "    x = x + 1.0\n";
    } else if (!kind.empty()) {
      std::cerr << "make_torchscript_fixture: unknown kind '" << kind << "'\n";
      return 2;
    }
    if (kind != "reads-file") {
      m.define("def forward(self, x):\n  if self.training:\n" +
               (training_only.empty() ? std::string("    pass\n") : training_only) +
               "  return torch.linear(x, self.w, self.b)\n");
    }
    m.save(argv[1]);
    if (kind == "deep-nesting" &&
        !ReplaceCode(argv[1], [](std::string code) {
          const size_t at = code.find("torch.add(x, 1.)");
          if (at == std::string::npos) return code;
          const int depth = 200000;
          return code.replace(at, 16, "torch.add(x, " + std::string(depth, '(') + "1." +
                                          std::string(depth, ')') + ")");
        })) {
      std::cerr << "make_torchscript_fixture: cannot find the module's code\n";
      return 1;
    }
    // [3, 37] with strides [37, 1] becomes [3, 64] with strides [64, 1] ('%' is 37, '@' 64).
    if (kind == "metadata-past-storage" &&
        !PatchDataPickle(argv[1], std::string("(K\x03K%t(K%K\x01t", 12),
                         std::string("(K\x03K@t(K@K\x01t", 12))) {
      std::cerr << "make_torchscript_fixture: cannot find the parameter's metadata\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "make_torchscript_fixture: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
