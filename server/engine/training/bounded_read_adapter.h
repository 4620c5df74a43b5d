// A zip archive in memory for caffe2::serialize::PyTorchStreamReader, read within its bounds.
//
// LibTorch's own MemoryReadAdapter copies whatever range miniz asks for: a submitted archive whose
// central directory names an offset past its end (found by fuzzing) makes it read outside the
// buffer, a crash or another tenant's bytes. This one copies only what the archive holds; a read
// past the end returns fewer bytes, which miniz takes as a broken archive (c10::Error).
#pragma once

#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace trainerd::engine {

class BoundedReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReadAdapter(std::string_view archive) : archive_(archive) {}

  size_t size() const override { return archive_.size(); }

  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/ = "") const override {
    if (pos >= archive_.size()) return 0;
    const size_t count = static_cast<size_t>(std::min<uint64_t>(n, archive_.size() - pos));
    std::memcpy(buf, archive_.data() + pos, count);
    return count;
  }

 private:
  std::string_view archive_;
};

}  // namespace trainerd::engine
