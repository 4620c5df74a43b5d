// A check of the pickles inside a submitted TorchScript archive (data.pkl, constants.pkl) that
// runs before LibTorch parses them.
//
// LibTorch's unpickler trusts the numbers in a pickle: a tensor declared through
// torch._utils._rebuild_tensor_v2 gets whatever sizes, strides and storage offset the pickle
// names, over a storage of whatever element count it names, so a crafted archive of a few KB
// makes the daemon read and write past its heap buffers. CheckTorchScriptPickle walks the pickle
// opcode by opcode, accepts only what torch.jit.save writes, and checks every tensor against its
// storage record. It needs no LibTorch (Abseil and std only), so it builds quickly and is fuzzed
// on its own (tests/fuzz/pickle_check_fuzz.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "absl/status/status.h"

namespace trainerd::engine {

// What the archive holds besides the pickle: the byte size of each storage record, by the key the
// pickle names it with ("0", "1", ... for the archive's data/<key> or constants/<key> records);
// nullopt when the archive holds no such record.
using StorageSizeLookup = std::function<std::optional<int64_t>(std::string_view key)>;

// Walks a TorchScript pickle (protocol 2, as LibTorch's pickler writes it) without building
// objects beyond what the tensor checks need. Iterative, with bounded nesting, stack and memo, so
// hostile input costs time and memory linear in its size and cannot overflow the C++ stack.
//
// OK when the pickle uses only the opcodes and globals LibTorch's pickler writes for a module's
// state and every tensor lies inside its storage. Otherwise one lower-case sentence that starts
// with `record_name`:
// - INVALID_ARGUMENT: an opcode the pickler does not write, a truncated pickle, a length past the
//   end, a memo index never set, a stack underflow, nesting deeper than the bounds, a storage
//   whose record is missing or of another byte size, a tensor whose sizes, strides and offset
//   reach past its storage ("data.pkl: a tensor of sizes [3, 64] and strides [64, 1] at offset 0
//   reaches element 191 of storage '0', which holds 111").
// - PERMISSION_DENIED: a global other than the module's own __torch__ classes, the dense tensor
//   rebuild, collections.OrderedDict, the torch.<Type>Storage types, torch.device,
//   builtins.complex and the torch.jit._pickle list helpers; in particular custom classes
//   (__torch__.torch.classes.*, native code) and quantized or sparse tensors.
// Thread-safe (no shared state); calls `storage_bytes` once per storage key, with the key as the
// pickle names it (LibTorch reads the record <archive>/data/<key> for data.pkl and
// <archive>/constants/<key> for constants.pkl).
absl::Status CheckTorchScriptPickle(std::string_view pickle, std::string_view record_name,
                                    const StorageSizeLookup& storage_bytes);

}  // namespace trainerd::engine
