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
#include "server/engine/torchscript/pickle_check.h"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/checked_size.h"
#include "common/status_macros.h"

namespace trainerd::engine {
namespace {

// Open MARKs at once, and the nesting of tuples, lists, dicts and objects. A module's state nests
// about two levels per submodule; LibTorch destroys nested values recursively, so the bound also
// keeps LibTorch's own stack safe when it later loads an accepted pickle.
constexpr int kMaxDepth = 512;
// Values on the stack, in the memo and inside tuples (16 bytes each: 64 MiB). Tuples are kept
// to the end of the walk, so this bounds every value ever placed in one: a few hundred thousand
// tensors, where real modules have thousands.
constexpr size_t kMaxValues = size_t{1} << 22;
// Dimensions of one tensor: far more than any real module's.
constexpr size_t kMaxDims = 64;
// A GLOBAL's module or name, a storage key, a type tag and a device string.
constexpr size_t kMaxNameBytes = 1024;
constexpr size_t kMaxKeyBytes = 128;
constexpr size_t kMaxTypeTagBytes = 4096;
constexpr size_t kMaxDeviceBytes = 64;

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

const char* OpName(unsigned char op) {
  switch (op) {
    case kProto:
      return "PROTO";
    case kStop:
      return "STOP";
    case kMark:
      return "MARK";
    case kTuple:
      return "TUPLE";
    case kTuple1:
      return "TUPLE1";
    case kTuple2:
      return "TUPLE2";
    case kTuple3:
      return "TUPLE3";
    case kEmptyTuple:
      return "EMPTY_TUPLE";
    case kEmptyList:
      return "EMPTY_LIST";
    case kEmptyDict:
      return "EMPTY_DICT";
    case kAppends:
      return "APPENDS";
    case kSetItems:
      return "SETITEMS";
    case kBinFloat:
      return "BINFLOAT";
    case kBinInt1:
      return "BININT1";
    case kBinInt2:
      return "BININT2";
    case kBinInt:
      return "BININT";
    case kLong1:
      return "LONG1";
    case kNewTrue:
      return "NEWTRUE";
    case kNewFalse:
      return "NEWFALSE";
    case kNone:
      return "NONE";
    case kBinUnicode:
      return "BINUNICODE";
    case kBinPut:
      return "BINPUT";
    case kLongBinPut:
      return "LONG_BINPUT";
    case kBinGet:
      return "BINGET";
    case kLongBinGet:
      return "LONG_BINGET";
    case kGlobal:
      return "GLOBAL";
    case kNewObj:
      return "NEWOBJ";
    case kBuild:
      return "BUILD";
    case kReduce:
      return "REDUCE";
    case kBinPersId:
      return "BINPERSID";
    default:
      return "?";
  }
}

// The storage types the pickler writes (`torch.<ScalarType>Storage`) that LibTorch loads as dense
// tensors, with their element sizes (checked against torch 2.11's records). The quantized ones
// (QInt8Storage, ...) belong to quantized tensors, which are refused.
struct StorageType {
  absl::string_view name;
  int64_t element_bytes;
};
constexpr StorageType kStorageTypes[] = {
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

uint32_t KindBit(Kind kind) { return uint32_t{1} << static_cast<int>(kind); }

// "an int", "a tuple".
std::string WithArticle(Kind kind) {
  const std::string name = KindName(kind);
  const bool vowel = name[0] == 'i' || name[0] == 'o' || name[0] == 'O';
  return absl::StrCat(vowel ? "an " : "a ", name);
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kGlobal:
      return "global";
    case Kind::kStorage:
      return "storage";
    case Kind::kTensor:
      return "tensor";
    case Kind::kObject:
      return "object";
    case Kind::kHooks:
      return "OrderedDict";
    case Kind::kDevice:
      return "device";
    case Kind::kComplex:
      return "complex";
  }
  return "value";
}

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

Value Scalar(Kind kind, int64_t payload = 0) {
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

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

bool IsKeyChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/';
}

// "cpu", "cuda" or "cuda:<index>": the locations LibTorch's pickler writes for the daemon's
// devices (LibTorch moves a storage there while loading).
bool IsKnownLocation(absl::string_view location) {
  if (location == "cpu" || location == "cuda") return true;
  if (!absl::ConsumePrefix(&location, "cuda:")) return false;
  if (location.empty() || location.size() > 4) return false;
  for (char c : location) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

class PickleWalker {
 public:
  PickleWalker(absl::string_view pickle, absl::string_view record, const StorageSizeLookup& lookup)
      : pickle_(pickle), record_(record), lookup_(lookup) {}

  absl::Status Run() {
    if (pickle_.size() < 2 || static_cast<unsigned char>(pickle_[0]) != kProto) {
      return Invalid("does not start with the PROTO opcode of a TorchScript pickle");
    }
    if (pickle_[1] != 2) {
      return Invalid(absl::StrCat("uses pickle protocol ", static_cast<unsigned char>(pickle_[1]),
                                  "; TorchScript writes protocol 2"));
    }
    pos_ = 2;
    while (true) {
      if (pos_ >= pickle_.size()) {
        return Invalid(absl::StrCat("ends at byte ", pickle_.size(), " without STOP"));
      }
      at_ = pos_;
      op_ = static_cast<unsigned char>(pickle_[pos_++]);
      if (op_ == kStop) return Stop();
      TRAINERD_RETURN_IF_ERROR(Step());
    }
  }

 private:
  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(record_, ": ", what));
  }
  absl::Status Denied(absl::string_view what) const {
    return absl::PermissionDeniedError(absl::StrCat(record_, ": ", what));
  }
  // "the TUPLE2 at byte 17": the opcode being run.
  std::string Here() const { return absl::StrCat("the ", OpName(op_), " at byte ", at_); }

  absl::Status Stop() {
    if (!marks_.empty()) {
      return Invalid(
          absl::StrCat("reaches STOP at byte ", at_, " with ", marks_.size(), " MARKs still open"));
    }
    if (stack_.size() != 1) {
      return Invalid(absl::StrCat("reaches STOP at byte ", at_, " with ", stack_.size(),
                                  " values on the stack instead of 1"));
    }
    if (pos_ != pickle_.size()) {
      return Invalid(
          absl::StrCat("has ", pickle_.size() - pos_, " more bytes after STOP at byte ", at_));
    }
    return absl::OkStatus();
  }

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
  absl::StatusOr<absl::string_view> ReadLine() {
    const size_t limit = std::min(pickle_.size(), pos_ + kMaxNameBytes + 1);
    for (size_t i = pos_; i < limit; ++i) {
      if (pickle_[i] == '\n') {
        absl::string_view line = pickle_.substr(pos_, i - pos_);
        pos_ = i + 1;
        return line;
      }
    }
    if (limit == pickle_.size()) {
      return Invalid(absl::StrCat("is truncated: ", Here(), " has no end of line before byte ",
                                  pickle_.size()));
    }
    return Invalid(
        absl::StrCat(Here(), " names a module or global longer than ", kMaxNameBytes, " bytes"));
  }

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
  absl::StatusOr<Value> MakeTuple(size_t start) {
    int depth = 0;
    for (size_t i = start; i < stack_.size(); ++i) depth = std::max<int>(depth, stack_[i].depth);
    TRAINERD_RETURN_IF_ERROR(CheckDepth(depth + 1));
    Value tuple;
    tuple.kind = Kind::kTuple;
    tuple.depth = static_cast<uint16_t>(depth + 1);
    tuple.payload = static_cast<int64_t>(arena_.size());
    tuple.aux = static_cast<uint32_t>(stack_.size() - start);
    arena_.insert(arena_.end(), stack_.begin() + static_cast<ptrdiff_t>(start), stack_.end());
    stack_.resize(start);
    return tuple;
  }

  const Value& Item(const Value& tuple, size_t i) const {
    return arena_[static_cast<size_t>(tuple.payload) + i];
  }

  absl::string_view String(const Value& value) const {
    return pickle_.substr(static_cast<size_t>(value.payload), value.aux);
  }

  // Opcodes --------------------------------------------------------------------------------------

  absl::Status Step() {
    switch (op_) {
      case kMark:
        if (marks_.size() >= static_cast<size_t>(kMaxDepth)) {
          return Invalid(absl::StrCat(Here(), " nests deeper than ", kMaxDepth, " open MARKs"));
        }
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case kTuple: {
        TRAINERD_ASSIGN_OR_RETURN(const size_t start, PopMark());
        TRAINERD_ASSIGN_OR_RETURN(Value tuple, MakeTuple(start));
        return Push(tuple);
      }
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const size_t count = op_ - kTuple1 + 1;
        TRAINERD_RETURN_IF_ERROR(NeedAboveMark(count));
        TRAINERD_ASSIGN_OR_RETURN(Value tuple, MakeTuple(stack_.size() - count));
        return Push(tuple);
      }
      case kEmptyTuple: {
        Value tuple = Scalar(Kind::kTuple, static_cast<int64_t>(arena_.size()));
        tuple.depth = 1;
        return Push(tuple);
      }
      case kEmptyList:
      case kEmptyDict: {
        Value container = Scalar(op_ == kEmptyList ? Kind::kList : Kind::kDict);
        container.depth = 1;
        return Push(container);
      }
      case kAppends:
      case kSetItems:
        return Fill();
      case kBinFloat:
        TRAINERD_RETURN_IF_ERROR(Need(8));
        pos_ += 8;  // the value is never needed
        return Push(Scalar(Kind::kFloat));
      case kBinInt1:
        TRAINERD_RETURN_IF_ERROR(Need(1));
        return Push(Scalar(Kind::kInt, static_cast<int64_t>(ReadLittleEndian(1))));
      case kBinInt2:
        TRAINERD_RETURN_IF_ERROR(Need(2));
        return Push(Scalar(Kind::kInt, static_cast<int64_t>(ReadLittleEndian(2))));
      case kBinInt:
        TRAINERD_RETURN_IF_ERROR(Need(4));
        return Push(
            Scalar(Kind::kInt, static_cast<int64_t>(static_cast<int32_t>(ReadLittleEndian(4)))));
      case kLong1: {
        TRAINERD_RETURN_IF_ERROR(Need(1));
        const uint64_t length = ReadLittleEndian(1);
        // LibTorch writes and reads 8-byte LONG1s only.
        if (length != 8) {
          return Invalid(absl::StrCat(Here(), " holds ", length, " bytes; LibTorch writes 8"));
        }
        TRAINERD_RETURN_IF_ERROR(Need(8));
        return Push(Scalar(Kind::kInt, static_cast<int64_t>(ReadLittleEndian(8))));
      }
      case kNewTrue:
      case kNewFalse:
        return Push(Scalar(Kind::kBool, op_ == kNewTrue ? 1 : 0));
      case kNone:
        return Push(Scalar(Kind::kNone));
      case kBinUnicode: {
        TRAINERD_RETURN_IF_ERROR(Need(4));
        const uint64_t length = ReadLittleEndian(4);
        if (pickle_.size() - pos_ < length) {
          return Invalid(absl::StrCat(Here(), " declares ", length,
                                      " bytes, past the end of the pickle at byte ",
                                      pickle_.size()));
        }
        Value string = Scalar(Kind::kString, static_cast<int64_t>(pos_));
        string.aux = static_cast<uint32_t>(length);
        pos_ += length;
        return Push(string);
      }
      case kBinPut:
      case kLongBinPut: {
        const size_t bytes = op_ == kBinPut ? 1 : 4;
        TRAINERD_RETURN_IF_ERROR(Need(bytes));
        return Memoize(ReadLittleEndian(bytes));
      }
      case kBinGet:
      case kLongBinGet: {
        const size_t bytes = op_ == kBinGet ? 1 : 4;
        TRAINERD_RETURN_IF_ERROR(Need(bytes));
        const uint64_t index = ReadLittleEndian(bytes);
        if (index >= memo_.size()) {
          return Invalid(
              absl::StrCat(Here(), " reads memo index ", index, ", which was never set"));
        }
        return Push(memo_[index]);
      }
      case kGlobal:
        return ReadGlobal();
      case kNewObj:
        return NewObj();
      case kBuild:
      case kReduce:
        return Call();
      case kBinPersId:
        return PersistentId();
      default:
        return Invalid(absl::StrCat("opcode 0x", absl::Hex(op_, absl::kZeroPad2), " at byte ", at_,
                                    " is not one that LibTorch's pickler writes"));
    }
  }

  absl::Status Memoize(uint64_t index) {
    if (stack_.size() <= Floor()) {
      return Invalid(absl::StrCat(Here(), " has no value above the last MARK to memoize"));
    }
    if (index > memo_.size()) {
      return Invalid(absl::StrCat(Here(), " sets memo index ", index, "; the next free one is ",
                                  memo_.size()));
    }
    Value& top = stack_.back();
    top.sealed = true;
    if (index == memo_.size()) {
      if (stack_.size() + memo_.size() + arena_.size() >= kMaxValues) {
        return Invalid(
            absl::StrCat("holds more than ", kMaxValues, " values at once (at byte ", at_, ")"));
      }
      memo_.push_back(top);
    } else {
      memo_[index] = top;
    }
    return absl::OkStatus();
  }

  // APPENDS and SETITEMS: the items above the last MARK go into the list or dict below it. Their
  // contents are never needed, so the items are dropped; only the nesting is kept.
  absl::Status Fill() {
    TRAINERD_ASSIGN_OR_RETURN(const size_t start, PopMark());
    const Kind want = op_ == kAppends ? Kind::kList : Kind::kDict;
    if (start == 0 || stack_[start - 1].kind != want) {
      return Invalid(absl::StrCat(Here(), " finds no ", KindName(want), " below its MARK"));
    }
    Value& container = stack_[start - 1];
    if (container.sealed) {
      return Invalid(absl::StrCat(Here(), " adds to a ", KindName(want),
                                  " that was already memoized or returned"));
    }
    const size_t count = stack_.size() - start;
    if (want == Kind::kDict && count % 2 != 0) {
      return Invalid(absl::StrCat(Here(), " has ", count, " values, not key-value pairs"));
    }
    int depth = container.depth;
    for (size_t i = start; i < stack_.size(); ++i) {
      depth = std::max(depth, stack_[i].depth + 1);
      if (want == Kind::kList) container.aux |= KindBit(stack_[i].kind);
    }
    TRAINERD_RETURN_IF_ERROR(CheckDepth(depth));
    container.depth = static_cast<uint16_t>(depth);
    stack_.resize(start);
    return absl::OkStatus();
  }

  absl::Status ReadGlobal() {
    TRAINERD_ASSIGN_OR_RETURN(const absl::string_view module, ReadLine());
    TRAINERD_ASSIGN_OR_RETURN(const absl::string_view name, ReadLine());
    const std::string qualified = absl::StrCat(module, ".", name);
    const std::string where =
        absl::StrCat("the global '", absl::CHexEscape(qualified), "' at byte ", at_);
    bool plain = !module.empty() && !name.empty();
    for (char c : qualified) plain = plain && IsNameChar(c);
    if (!plain) return Denied(absl::StrCat(where, " is not a Python name"));

    Value global = Scalar(Kind::kGlobal);
    if (module == "__torch__" || absl::StartsWith(module, "__torch__.")) {
      if (qualified == "__torch__.torch.classes" ||
          absl::StartsWith(qualified, "__torch__.torch.classes.")) {
        return Denied(absl::StrCat(where,
                                   " is a custom class, which is native code; submitted "
                                   "modules may not use custom classes"));
      }
      global.payload = static_cast<int64_t>(Global::kClass);
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      global.payload = static_cast<int64_t>(Global::kRebuildTensor);
    } else if (module == "torch._utils" && absl::StrContains(name, "_rebuild_")) {
      return Denied(absl::StrCat(where,
                                 " rebuilds a quantized, sparse or other special tensor; "
                                 "only dense tensors are accepted"));
    } else if (module == "collections" && name == "OrderedDict") {
      global.payload = static_cast<int64_t>(Global::kOrderedDict);
    } else if (module == "torch" && name == "device") {
      global.payload = static_cast<int64_t>(Global::kDevice);
    } else if (module == "builtins" && name == "complex") {
      global.payload = static_cast<int64_t>(Global::kComplex);
    } else if (module == "torch.jit._pickle" && name == "build_intlist") {
      global.payload = static_cast<int64_t>(Global::kIntList);
    } else if (module == "torch.jit._pickle" && name == "build_tensorlist") {
      global.payload = static_cast<int64_t>(Global::kTensorList);
    } else if (module == "torch.jit._pickle" && name == "build_doublelist") {
      global.payload = static_cast<int64_t>(Global::kDoubleList);
    } else if (module == "torch.jit._pickle" && name == "build_boollist") {
      global.payload = static_cast<int64_t>(Global::kBoolList);
    } else if (module == "torch.jit._pickle" && name == "restore_type_tag") {
      global.payload = static_cast<int64_t>(Global::kTypeTag);
    } else if (module == "torch" && absl::EndsWith(name, "Storage")) {
      size_t type = 0;
      while (type < std::size(kStorageTypes) && kStorageTypes[type].name != name) ++type;
      if (type == std::size(kStorageTypes)) {
        return Denied(absl::StrCat(where, " is not a storage type of dense tensors"));
      }
      global.payload = static_cast<int64_t>(Global::kStorageType);
      global.aux = static_cast<uint32_t>(type);
    } else {
      return Denied(absl::StrCat(where, " is not one that torch.jit.save writes for a module"));
    }
    return Push(global);
  }

  static bool IsGlobal(const Value& value, Global which) {
    return value.kind == Kind::kGlobal && value.payload == static_cast<int64_t>(which);
  }

  // NEWOBJ: pops the empty argument tuple of a __torch__ class; BUILD then sets the state.
  absl::Status NewObj() {
    TRAINERD_RETURN_IF_ERROR(NeedAboveMark(2));
    const Value& args = stack_.back();
    const Value& cls = stack_[stack_.size() - 2];
    if (args.kind != Kind::kTuple || args.aux != 0 || !IsGlobal(cls, Global::kClass)) {
      return Invalid(absl::StrCat(Here(), " applies to ", WithArticle(cls.kind), " and ",
                                  WithArticle(args.kind),
                                  ", not to a __torch__ class and an empty tuple"));
    }
    stack_.pop_back();
    return absl::OkStatus();
  }

  // REDUCE (a global applied to its argument tuple) and BUILD (a class given its state). LibTorch
  // runs both the same way.
  absl::Status Call() {
    TRAINERD_RETURN_IF_ERROR(NeedAboveMark(2));
    const Value args = Pop();
    const Value callee = Pop();
    if (callee.kind != Kind::kGlobal || IsGlobal(callee, Global::kStorageType)) {
      return Invalid(absl::StrCat(Here(), " calls ", WithArticle(callee.kind),
                                  callee.kind == Kind::kGlobal ? " that is a storage type" : "",
                                  " instead of a function or class global"));
    }
    const auto which = static_cast<Global>(callee.payload);
    if (op_ == kBuild && which != Global::kClass) {
      return Invalid(absl::StrCat(Here(), " sets the state of a global that is not a class"));
    }
    switch (which) {
      case Global::kClass: {
        TRAINERD_RETURN_IF_ERROR(CheckDepth(args.depth + 1));
        Value object = Scalar(Kind::kObject);
        object.depth = static_cast<uint16_t>(args.depth + 1);
        return Push(object);
      }
      case Global::kRebuildTensor: {
        TRAINERD_RETURN_IF_ERROR(CheckTensor(args));
        Value tensor = Scalar(Kind::kTensor);
        tensor.depth = 1;
        return Push(tensor);
      }
      case Global::kOrderedDict:
        TRAINERD_RETURN_IF_ERROR(CheckArgs(args, "collections.OrderedDict", {}));
        return Push(Scalar(Kind::kHooks));
      case Global::kDevice: {
        TRAINERD_RETURN_IF_ERROR(CheckArgs(args, "torch.device", {Kind::kString}));
        if (Item(args, 0).aux > kMaxDeviceBytes) {
          return Invalid(
              absl::StrCat(Here(), " names a device longer than ", kMaxDeviceBytes, " bytes"));
        }
        return Push(Scalar(Kind::kDevice));
      }
      case Global::kComplex:
        TRAINERD_RETURN_IF_ERROR(CheckArgs(args, "builtins.complex", {Kind::kFloat, Kind::kFloat}));
        return Push(Scalar(Kind::kComplex));
      case Global::kIntList:
      case Global::kTensorList:
      case Global::kDoubleList:
      case Global::kBoolList: {
        TRAINERD_RETURN_IF_ERROR(CheckArgs(args, "a torch.jit._pickle list", {Kind::kList}));
        // LibTorch tags the list with the element type without looking at the items.
        const Kind item = which == Global::kIntList      ? Kind::kInt
                          : which == Global::kTensorList ? Kind::kTensor
                          : which == Global::kDoubleList ? Kind::kFloat
                                                         : Kind::kBool;
        Value list = Item(args, 0);
        if ((list.aux & ~KindBit(item)) != 0) {
          return Invalid(absl::StrCat(Here(), " builds a list of ", KindName(item),
                                      " from items of other kinds"));
        }
        list.sealed = true;
        return Push(list);
      }
      case Global::kTypeTag: {
        if (args.kind != Kind::kTuple || args.aux != 2 ||
            (Item(args, 0).kind != Kind::kList && Item(args, 0).kind != Kind::kDict) ||
            Item(args, 1).kind != Kind::kString) {
          return Invalid(absl::StrCat(Here(),
                                      " calls torch.jit._pickle.restore_type_tag without "
                                      "a (list or dict, type) tuple"));
        }
        const absl::string_view type = String(Item(args, 1));
        if (type.size() > kMaxTypeTagBytes) {
          return Invalid(absl::StrCat(Here(), " tags a container with a type longer than ",
                                      kMaxTypeTagBytes, " bytes"));
        }
        if (absl::StrContains(type, "torch.classes")) {
          return Denied(absl::StrCat(Here(), " tags a container with the custom class type '",
                                     absl::CHexEscape(type),
                                     "'; submitted modules may not use custom classes"));
        }
        Value container = Item(args, 0);
        container.sealed = true;
        return Push(container);
      }
      case Global::kStorageType:
        break;  // refused above
    }
    return Invalid(absl::StrCat(Here(), " calls an unknown global"));
  }

  absl::Status CheckArgs(const Value& args, absl::string_view callee,
                         std::initializer_list<Kind> kinds) const {
    bool ok = args.kind == Kind::kTuple && args.aux == kinds.size();
    size_t i = 0;
    for (Kind kind : kinds) {
      if (!ok) break;
      ok = Item(args, i++).kind == kind;
    }
    if (ok) return absl::OkStatus();
    std::vector<std::string> names;
    for (Kind kind : kinds) names.push_back(KindName(kind));
    return Invalid(absl::StrCat(Here(), " calls ", callee, " with ", WithArticle(args.kind),
                                " instead of a tuple of (", absl::StrJoin(names, ", "), ")"));
  }

  // BINPERSID: ('storage', torch.<Type>Storage, key, location, numel), the storage of one or more
  // tensors, read by LibTorch from the record <key> as numel * element size bytes.
  absl::Status PersistentId() {
    TRAINERD_RETURN_IF_ERROR(NeedAboveMark(1));
    const Value id = Pop();
    const bool shaped = id.kind == Kind::kTuple && id.aux == 5 &&
                        Item(id, 0).kind == Kind::kString && String(Item(id, 0)) == "storage" &&
                        IsGlobal(Item(id, 1), Global::kStorageType) &&
                        Item(id, 2).kind == Kind::kString && Item(id, 3).kind == Kind::kString &&
                        Item(id, 4).kind == Kind::kInt;
    if (!shaped) {
      return Invalid(absl::StrCat(Here(),
                                  " is not given a ('storage', type, key, location, "
                                  "size) tuple"));
    }
    StorageDecl decl;
    decl.type = Item(id, 1).aux;
    decl.key = String(Item(id, 2));
    decl.numel = Item(id, 4).payload;
    decl.at = at_;
    const absl::string_view type_name = kStorageTypes[decl.type].name;
    bool key_ok =
        !decl.key.empty() && decl.key.size() <= kMaxKeyBytes && !absl::StrContains(decl.key, "..");
    for (char c : decl.key) key_ok = key_ok && IsKeyChar(c);
    if (!key_ok) {
      return Invalid(absl::StrCat(Here(), " names the storage key '", absl::CHexEscape(decl.key),
                                  "', which is not a record name"));
    }
    const absl::string_view location = String(Item(id, 3));
    if (!IsKnownLocation(location)) {
      return Invalid(absl::StrCat("storage '", decl.key, "' at byte ", at_, " is on the device '",
                                  absl::CHexEscape(location.substr(0, kMaxDeviceBytes)),
                                  "'; only cpu and cuda are accepted"));
    }
    if (decl.numel < 0) {
      return Invalid(absl::StrCat("storage '", decl.key, "' at byte ", at_,
                                  " declares a negative element count (", decl.numel, ")"));
    }
    auto [it, inserted] = storage_index_.emplace(std::string_view(decl.key.data(), decl.key.size()),
                                                 storages_.size());
    if (!inserted) {
      const StorageDecl& first = storages_[it->second];
      if (first.type != decl.type || first.numel != decl.numel) {
        return Invalid(absl::StrCat("storage '", decl.key, "' is declared as ", first.numel, " ",
                                    kStorageTypes[first.type].name, " elements at byte ", first.at,
                                    " and as ", decl.numel, " ", type_name, " elements at byte ",
                                    at_));
      }
    } else {
      const std::string what = absl::StrCat(record_, ": storage '", decl.key, "' at byte ", at_);
      TRAINERD_ASSIGN_OR_RETURN(
          const int64_t bytes,
          CheckedMul(decl.numel, kStorageTypes[decl.type].element_bytes, what));
      const std::optional<int64_t> record_bytes =
          lookup_(std::string_view(decl.key.data(), decl.key.size()));
      if (!record_bytes.has_value()) {
        return Invalid(absl::StrCat("storage '", decl.key, "' at byte ", at_,
                                    " has no record in the archive"));
      }
      if (*record_bytes != bytes) {
        return Invalid(absl::StrCat("storage '", decl.key, "' at byte ", at_, " declares ",
                                    decl.numel, " ", type_name, " elements (", bytes,
                                    " bytes), but its record holds ", *record_bytes, " bytes"));
      }
      storages_.push_back(decl);
    }
    Value storage = Scalar(Kind::kStorage, static_cast<int64_t>(it->second));
    storage.depth = 1;
    return Push(storage);
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks
  // [, math_bits]): the tensor must lie inside its storage.
  absl::Status CheckTensor(const Value& args) const {
    if (args.kind != Kind::kTuple || (args.aux != 6 && args.aux != 7)) {
      return Invalid(absl::StrCat(Here(), " rebuilds a tensor from ", WithArticle(args.kind),
                                  args.kind == Kind::kTuple ? absl::StrCat(" of ", args.aux) : "",
                                  " instead of 6 or 7 arguments"));
    }
    const Value& storage = Item(args, 0);
    const Value& offset = Item(args, 1);
    const Value& sizes = Item(args, 2);
    const Value& strides = Item(args, 3);
    const bool shaped = storage.kind == Kind::kStorage && offset.kind == Kind::kInt &&
                        sizes.kind == Kind::kTuple && strides.kind == Kind::kTuple &&
                        Item(args, 4).kind == Kind::kBool && Item(args, 5).kind == Kind::kHooks &&
                        (args.aux == 6 || Item(args, 6).kind == Kind::kDict);
    if (!shaped) {
      return Invalid(absl::StrCat(Here(),
                                  " rebuilds a tensor from arguments that are not "
                                  "(storage, offset, sizes, strides, requires_grad, "
                                  "hooks[, math bits])"));
    }
    if (sizes.aux != strides.aux || sizes.aux > kMaxDims) {
      return Invalid(absl::StrCat(Here(), " rebuilds a tensor with ", sizes.aux, " sizes and ",
                                  strides.aux, " strides; both must be equal and at most ",
                                  kMaxDims));
    }
    std::vector<int64_t> size(sizes.aux);
    std::vector<int64_t> stride(strides.aux);
    for (size_t i = 0; i < size.size(); ++i) {
      if (Item(sizes, i).kind != Kind::kInt || Item(strides, i).kind != Kind::kInt) {
        return Invalid(absl::StrCat(Here(),
                                    " rebuilds a tensor whose sizes or strides are not "
                                    "all integers"));
      }
      size[i] = Item(sizes, i).payload;
      stride[i] = Item(strides, i).payload;
    }
    const StorageDecl& decl = storages_[static_cast<size_t>(storage.payload)];
    // Messages are built only on refusal: a pickle may rebuild many tensors.
    const auto tensor = [&] {
      return absl::StrCat("a tensor of sizes [", absl::StrJoin(size, ", "), "] and strides [",
                          absl::StrJoin(stride, ", "), "] at offset ", offset.payload);
    };
    const auto storage_holds = [&] {
      return absl::StrCat(" of storage '", decl.key, "', which holds ", decl.numel);
    };
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] < 0 || stride[i] < 0) {
        return Invalid(
            absl::StrCat(tensor(), " (at byte ", at_, ") has a negative size or stride"));
      }
    }
    if (offset.payload < 0) {
      return Invalid(absl::StrCat(tensor(), " (at byte ", at_, ") has a negative offset"));
    }
    const absl::StatusOr<int64_t> elements = CheckedShapeElements(size, "the shape");
    if (!elements.ok()) {
      return Invalid(absl::StrCat(tensor(), " (at byte ", at_,
                                  ") has more elements than a 64-bit count holds"));
    }
    if (*elements == 0) {
      // An empty tensor reads nothing; its offset still stays inside (or at the end of) storage.
      if (offset.payload > decl.numel) {
        return Invalid(absl::StrCat("an empty tensor at offset ", offset.payload,
                                    " starts past the end", storage_holds()));
      }
      return absl::OkStatus();
    }
    // The last element reached: offset + sum((size_i - 1) * stride_i), all terms non-negative.
    int64_t last = offset.payload;
    for (size_t i = 0; i < size.size(); ++i) {
      absl::StatusOr<int64_t> step = CheckedMul(size[i] - 1, stride[i], "the last element");
      if (step.ok()) step = CheckedAdd(last, *step, "the last element");
      if (!step.ok()) {
        return Invalid(absl::StrCat(tensor(), " (at byte ", at_,
                                    ") reaches past any 64-bit element index", storage_holds()));
      }
      last = *step;
    }
    if (last >= decl.numel) {
      return Invalid(absl::StrCat(tensor(), " reaches element ", last, storage_holds()));
    }
    return absl::OkStatus();
  }

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

}  // namespace

absl::Status CheckTorchScriptPickle(std::string_view pickle, std::string_view record_name,
                                    const StorageSizeLookup& storage_bytes) {
  return PickleWalker(absl::string_view(pickle.data(), pickle.size()),
                      absl::string_view(record_name.data(), record_name.size()), storage_bytes)
      .Run();
}

}  // namespace trainerd::engine
