// Internal to the pickle check (pickle_check.h): included only by the pickle_*.cc files of this
// folder. It holds the vocabulary of the walk (its bounds, the opcodes it accepts, the storage
// types, the kinds of values in its model of the unpickler's stack and memo, the globals it knows)
// and the class PickleWalker. The vocabulary's functions are defined in pickle_vocabulary.cc; the
// walker's methods in pickle_walker.cc (the opcode loop, the input, the stack, the memo and
// tuples) and pickle_walker_objects.cc (globals, NEWOBJ, REDUCE and BUILD, persistent ids and the
// tensor checks). The design of the walk is described at the top of pickle_check.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/engine/torchscript/pickle_check.h"

namespace trainerd::engine::pickle_internal {

// Open MARKs at once, and the nesting of tuples, lists, dicts and objects. A module's state nests
// about two levels per submodule; LibTorch destroys nested values recursively, so the bound also
// keeps LibTorch's own stack safe when it later loads an accepted pickle.
inline constexpr int kMaxDepth = 512;
// Values on the stack, in the memo and inside tuples (16 bytes each: 64 MiB). Tuples are kept
// to the end of the walk, so this bounds every value ever placed in one: a few hundred thousand
// tensors, where real modules have thousands.
inline constexpr size_t kMaxValues = size_t{1} << 22;
// Dimensions of one tensor: far more than any real module's.
inline constexpr size_t kMaxDims = 64;
// A GLOBAL's module or name, a storage key, a type tag and a device string.
inline constexpr size_t kMaxNameBytes = 1024;
inline constexpr size_t kMaxKeyBytes = 128;
inline constexpr size_t kMaxTypeTagBytes = 4096;
inline constexpr size_t kMaxDeviceBytes = 64;

// The opcodes LibTorch's pickler writes (torch/csrc/jit/serialization/pickler.cpp), named as in
// Python's pickletools. Every other opcode is refused.
enum Op : unsigned char {
  kProto = 0x80,
  kStop = '.',
  kMark = '(',
  kTuple = 't',
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kEmptyTuple = ')',
  kEmptyList = ']',
  kEmptyDict = '}',
  kAppends = 'e',
  kSetItems = 'u',
  kBinFloat = 'G',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kBinInt = 'J',
  kLong1 = 0x8a,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kNone = 'N',
  kBinUnicode = 'X',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kGlobal = 'c',
  kNewObj = 0x81,
  kBuild = 'b',
  kReduce = 'R',
  kBinPersId = 'Q',
};

const char* OpName(unsigned char op);

// The storage types the pickler writes (`torch.<ScalarType>Storage`) that LibTorch loads as dense
// tensors, with their element sizes (checked against torch 2.11's records). The quantized ones
// (QInt8Storage, ...) belong to quantized tensors, which are refused.
struct StorageType {
  absl::string_view name;
  int64_t element_bytes;
};
inline constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", 4},
    {"DoubleStorage", 8},
    {"HalfStorage", 2},
    {"BFloat16Storage", 2},
    {"LongStorage", 8},
    {"IntStorage", 4},
    {"ShortStorage", 2},
    {"CharStorage", 1},
    {"ByteStorage", 1},
    {"BoolStorage", 1},
    {"ComplexFloatStorage", 8},
    {"ComplexDoubleStorage", 16},
    {"ComplexHalfStorage", 4},
    {"UInt16Storage", 2},
    {"UInt32Storage", 4},
    {"UInt64Storage", 8},
    {"Float8_e4m3fnStorage", 1},
    {"Float8_e5m2Storage", 1},
    {"Float8_e4m3fnuzStorage", 1},
    {"Float8_e5m2fnuzStorage", 1},
};

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,  // payload: offset in the pickle; aux: length
  kTuple,   // payload: first element in the arena; aux: element count
  kList,    // aux: a bit per Kind among its items
  kDict,
  kGlobal,   // payload: a Global; aux: the StorageType index for kStorageType
  kStorage,  // payload: index of its StorageDecl
  kTensor,
  kObject,
  kHooks,  // collections.OrderedDict(): a tensor's (always empty) backward hooks
  kDevice,
  kComplex,
};

const char* KindName(Kind kind);

inline uint32_t KindBit(Kind kind) { return uint32_t{1} << static_cast<int>(kind); }

// "an int", "a tuple".
std::string WithArticle(Kind kind);

enum class Global : int64_t {
  kClass,  // a __torch__ class (or enum) of the module
  kRebuildTensor,
  kOrderedDict,
  kDevice,
  kComplex,
  kIntList,
  kTensorList,
  kDoubleList,
  kBoolList,
  kTypeTag,
  kStorageType,
};

struct Value {
  Kind kind = Kind::kNone;
  // A list or dict that may not grow any more: it was memoized or returned by a global, so it may
  // be referenced from elsewhere (growing it could make it contain itself).
  bool sealed = false;
  uint16_t depth = 0;
  uint32_t aux = 0;
  int64_t payload = 0;
};
static_assert(sizeof(Value) == 16, "values are kept small: the walk bounds their count");

inline Value Scalar(Kind kind, int64_t payload = 0) {
  Value value;
  value.kind = kind;
  value.payload = payload;
  return value;
}

// One storage the pickle declares through BINPERSID.
struct StorageDecl {
  absl::string_view key;
  size_t type = 0;  // index into kStorageTypes
  int64_t numel = 0;
  size_t at = 0;  // the BINPERSID's byte offset
};

inline bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

inline bool IsKeyChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/';
}

// "cpu", "cuda" or "cuda:<index>": the locations LibTorch's pickler writes for the daemon's
// devices (LibTorch moves a storage there while loading).
bool IsKnownLocation(absl::string_view location);

class PickleWalker {
 public:
  PickleWalker(absl::string_view pickle, absl::string_view record, const StorageSizeLookup& lookup)
      : pickle_(pickle), record_(record), lookup_(lookup) {}

  absl::Status Run();

 private:
  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(record_, ": ", what));
  }
  absl::Status Denied(absl::string_view what) const {
    return absl::PermissionDeniedError(absl::StrCat(record_, ": ", what));
  }
  // "the TUPLE2 at byte 17": the opcode being run.
  std::string Here() const { return absl::StrCat("the ", OpName(op_), " at byte ", at_); }

  absl::Status Stop();

  // Input ----------------------------------------------------------------------------------------

  absl::Status Need(size_t bytes) const {
    if (pickle_.size() - pos_ < bytes) {
      return Invalid(absl::StrCat("is truncated: ", Here(), " needs ", bytes,
                                  " more bytes, but the pickle ends at byte ", pickle_.size()));
    }
    return absl::OkStatus();
  }
  // Little-endian, as LibTorch reads and writes them. Callers have checked Need().
  uint64_t ReadLittleEndian(size_t bytes) {
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) {
      value |= uint64_t{static_cast<unsigned char>(pickle_[pos_ + i])} << (8 * i);
    }
    pos_ += bytes;
    return value;
  }
  // A GLOBAL's module or name: up to the next newline.
  absl::StatusOr<absl::string_view> ReadLine();

  // The stack ------------------------------------------------------------------------------------

  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }

  absl::Status Push(Value value) {
    if (stack_.size() + memo_.size() + arena_.size() >= kMaxValues) {
      return Invalid(
          absl::StrCat("holds more than ", kMaxValues, " values at once (at byte ", at_, ")"));
    }
    stack_.push_back(value);
    return absl::OkStatus();
  }

  absl::Status NeedAboveMark(size_t count) const {
    if (stack_.size() - Floor() < count) {
      return Invalid(absl::StrCat(Here(), " needs ", count, " value", count == 1 ? "" : "s",
                                  " on the stack", marks_.empty() ? "" : " above the last MARK",
                                  " and finds ", stack_.size() - Floor()));
    }
    return absl::OkStatus();
  }

  Value Pop() {
    Value value = stack_.back();
    stack_.pop_back();
    return value;
  }

  absl::StatusOr<size_t> PopMark() {
    if (marks_.empty()) return Invalid(absl::StrCat(Here(), " has no MARK to close"));
    const size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }

  absl::Status CheckDepth(int depth) const {
    if (depth > kMaxDepth) {
      return Invalid(absl::StrCat(Here(), " nests values deeper than ", kMaxDepth, " levels"));
    }
    return absl::OkStatus();
  }

  // A tuple of stack_[start, end): moved into the arena.
  absl::StatusOr<Value> MakeTuple(size_t start);

  const Value& Item(const Value& tuple, size_t i) const {
    return arena_[static_cast<size_t>(tuple.payload) + i];
  }

  absl::string_view String(const Value& value) const {
    return pickle_.substr(static_cast<size_t>(value.payload), value.aux);
  }

  // Opcodes --------------------------------------------------------------------------------------

  absl::Status Step();

  absl::Status Memoize(uint64_t index);

  // APPENDS and SETITEMS: the items above the last MARK go into the list or dict below it. Their
  // contents are never needed, so the items are dropped; only the nesting is kept.
  absl::Status Fill();

  absl::Status ReadGlobal();

  static bool IsGlobal(const Value& value, Global which) {
    return value.kind == Kind::kGlobal && value.payload == static_cast<int64_t>(which);
  }

  // NEWOBJ: pops the empty argument tuple of a __torch__ class; BUILD then sets the state.
  absl::Status NewObj();

  // REDUCE (a global applied to its argument tuple) and BUILD (a class given its state). LibTorch
  // runs both the same way.
  absl::Status Call();

  absl::Status CheckArgs(const Value& args, absl::string_view callee,
                         std::initializer_list<Kind> kinds) const;

  // BINPERSID: ('storage', torch.<Type>Storage, key, location, numel), the storage of one or more
  // tensors, read by LibTorch from the record <key> as numel * element size bytes.
  absl::Status PersistentId();

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks
  // [, math_bits]): the tensor must lie inside its storage.
  absl::Status CheckTensor(const Value& args) const;

  const absl::string_view pickle_;
  const absl::string_view record_;
  const StorageSizeLookup& lookup_;
  size_t pos_ = 0;
  size_t at_ = 0;         // the current opcode's offset
  unsigned char op_ = 0;  // the current opcode
  std::vector<Value> stack_;
  std::vector<size_t> marks_;  // stack sizes at each open MARK
  std::vector<Value> memo_;
  std::vector<Value> arena_;  // the elements of every tuple, flat, kept to the end
  std::vector<StorageDecl> storages_;
  std::unordered_map<std::string_view, size_t> storage_index_;  // by key
};

}  // namespace trainerd::engine::pickle_internal
