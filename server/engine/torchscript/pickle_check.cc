// The walk over a TorchScript pickle (see pickle_check.h).
//
// The walk keeps a model of the unpickler's stack and memo in which every value is 16 bytes:
// scalars hold their value, strings point into the pickle, tuples into one flat arena, and lists,
// dicts and objects are opaque (a tensor's sizes and strides are tuples, so nothing the checks
// need lives in them). Nothing is freed recursively and nothing recurses, so deep nesting costs
// neither C++ stack nor time. Where LibTorch's unpickler is lax the walk is strict on purpose:
// LibTorch calls REDUCE on whatever integer is below the top of its stack (a GLOBAL leaves an
// index there, a storage type its dtype number), so the walk refuses REDUCE on anything but a
// global; LibTorch indexes its stack without bounds checks after a pop below a MARK (TUPLE) and
// in a SETITEMS of an odd count, so the walk refuses both; LibTorch grows its memo to any index
// BINPUT names, so the walk accepts only the next free one or one already set; LibTorch tags a
// list as List[Tensor] (build_tensorlist, ...) without looking at its items, so the walk does.
//
// The walker is PickleWalker (pickle_walker.h, pickle_walker.cc, pickle_walker_objects.cc); the
// vocabulary it walks with is in pickle_walker.h and pickle_vocabulary.cc.
#include "server/engine/torchscript/pickle_check.h"

#include <string_view>

#include "absl/strings/string_view.h"
#include "server/engine/torchscript/pickle_walker.h"

namespace trainerd::engine {

using pickle_internal::PickleWalker;

absl::Status CheckTorchScriptPickle(std::string_view pickle, std::string_view record_name,
                                    const StorageSizeLookup& storage_bytes) {
  return PickleWalker(absl::string_view(pickle.data(), pickle.size()),
                      absl::string_view(record_name.data(), record_name.size()), storage_bytes)
      .Run();
}

}  // namespace trainerd::engine
