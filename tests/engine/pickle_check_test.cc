// Tests for the check of TorchScript pickles (server/engine/pickle_check.h): hand-built pickles
// for each refusal, and real data.pkl / constants.pkl files that torch.jit.save wrote
// (tests/engine/testdata, from make_pickle_fixtures.py), which must pass.
#include "server/engine/torchscript/pickle_check.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef TRAINERD_PICKLE_TESTDATA
#error "TRAINERD_PICKLE_TESTDATA names tests/engine/testdata (tests/engine/CMakeLists.txt sets it)"
#endif

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Writes pickle opcodes as LibTorch's pickler encodes them (protocol 2, little-endian operands),
// without its memoization unless a test asks for it. Each method appends one opcode or one of the
// pickler's fixed sequences.
class PickleBuilder {
 public:
  PickleBuilder() { Op(0x80).Byte(2); }

  PickleBuilder& Op(unsigned char op) { return Byte(op); }
  PickleBuilder& Byte(unsigned char byte) {
    bytes_.push_back(static_cast<char>(byte));
    return *this;
  }
  PickleBuilder& Raw(std::string_view raw) {
    bytes_.append(raw);
    return *this;
  }
  PickleBuilder& LittleEndian(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) Byte(static_cast<unsigned char>(value >> (8 * i)));
    return *this;
  }
  // BININT1, BININT2, BININT or LONG1, whichever the pickler picks for `value`.
  PickleBuilder& Int(int64_t value) {
    if (value >= 0 && value <= 0xff) return Op('K').LittleEndian(value, 1);
    if (value >= 0 && value <= 0xffff) return Op('M').LittleEndian(value, 2);
    if (value >= INT32_MIN && value <= INT32_MAX) {
      return Op('J').LittleEndian(static_cast<uint32_t>(value), 4);
    }
    return Op(0x8a).Byte(8).LittleEndian(static_cast<uint64_t>(value), 8);
  }
  PickleBuilder& Str(std::string_view text) {
    return Op('X').LittleEndian(text.size(), 4).Raw(text);
  }
  PickleBuilder& Global(std::string_view module, std::string_view name) {
    return Op('c').Raw(module).Raw("\n").Raw(name).Raw("\n");
  }
  PickleBuilder& Put(uint32_t index) { return Op('q').Byte(static_cast<unsigned char>(index)); }
  PickleBuilder& Get(uint32_t index) { return Op('h').Byte(static_cast<unsigned char>(index)); }
  PickleBuilder& Mark() { return Op('('); }
  PickleBuilder& Tuple() { return Op('t'); }
  PickleBuilder& EmptyTuple() { return Op(')'); }
  PickleBuilder& EmptyList() { return Op(']'); }
  PickleBuilder& EmptyDict() { return Op('}'); }
  PickleBuilder& Appends() { return Op('e'); }
  PickleBuilder& SetItems() { return Op('u'); }
  PickleBuilder& True() { return Op(0x88); }
  PickleBuilder& False() { return Op(0x89); }
  PickleBuilder& None() { return Op('N'); }
  PickleBuilder& Reduce() { return Op('R'); }
  PickleBuilder& Build() { return Op('b'); }
  PickleBuilder& NewObj() { return Op(0x81); }
  PickleBuilder& PersId() { return Op('Q'); }
  PickleBuilder& IntTuple(const std::vector<int64_t>& values) {
    Mark();
    for (int64_t value : values) Int(value);
    return Tuple();
  }
  // ('storage', torch.<type>, key, location, numel) BINPERSID.
  PickleBuilder& Storage(std::string_view type, std::string_view key, int64_t numel,
                         std::string_view location = "cpu") {
    return Mark()
        .Str("storage")
        .Global("torch", type)
        .Str(key)
        .Str(location)
        .Int(numel)
        .Tuple()
        .PersId();
  }
  // The arguments after the storage, and the call: offset, sizes, strides, requires_grad,
  // OrderedDict() hooks, TUPLE, REDUCE.
  PickleBuilder& RebuildRest(int64_t offset, const std::vector<int64_t>& sizes,
                             const std::vector<int64_t>& strides) {
    return Int(offset)
        .IntTuple(sizes)
        .IntTuple(strides)
        .False()
        .Global("collections", "OrderedDict")
        .EmptyTuple()
        .Reduce()
        .Tuple()
        .Reduce();
  }
  // A whole _rebuild_tensor_v2 call over a newly declared storage.
  PickleBuilder& Tensor(std::string_view type, std::string_view key, int64_t numel, int64_t offset,
                        const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    Global("torch._utils", "_rebuild_tensor_v2").Mark().Storage(type, key, numel);
    return RebuildRest(offset, sizes, strides);
  }
  // GLOBAL __torch__ Net, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, MARK: the start of a module's state;
  // EndModule closes it.
  PickleBuilder& BeginModule() {
    return Global("__torch__", "Net").EmptyTuple().NewObj().EmptyDict().Mark();
  }
  PickleBuilder& EndModule() { return Str("training").True().SetItems().Build(); }
  std::string Stop() {
    Op('.');
    return bytes_;
  }

 private:
  std::string bytes_;
};

StorageSizeLookup Records(std::map<std::string, int64_t, std::less<>> sizes) {
  return [sizes = std::move(sizes)](std::string_view key) -> std::optional<int64_t> {
    auto it = sizes.find(key);
    if (it == sizes.end()) return std::nullopt;
    return it->second;
  };
}

// A module Net { w: [3, 4] float over storage '0', b: [3] float over storage '1' }.
std::string TwoTensorModule() {
  PickleBuilder b;
  b.BeginModule();
  b.Str("w").Tensor("FloatStorage", "0", 12, 0, {3, 4}, {4, 1});
  b.Str("b").Tensor("FloatStorage", "1", 3, 0, {3}, {1});
  return b.EndModule().Stop();
}
const StorageSizeLookup kTwoTensorRecords = Records({{"0", 48}, {"1", 12}});

// A module with one tensor over storage '0'.
std::string OneTensorModule(std::string_view type, int64_t numel, int64_t offset,
                            const std::vector<int64_t>& sizes,
                            const std::vector<int64_t>& strides) {
  PickleBuilder b;
  b.BeginModule().Str("w").Tensor(type, "0", numel, offset, sizes, strides);
  return b.EndModule().Stop();
}

absl::Status Check(std::string_view pickle, const StorageSizeLookup& records) {
  return CheckTorchScriptPickle(pickle, "data.pkl", records);
}

TEST(PickleCheckTest, ModuleWithTwoTensorsIsAccepted) {
  EXPECT_TRUE(Check(TwoTensorModule(), kTwoTensorRecords).ok())
      << Check(TwoTensorModule(), kTwoTensorRecords);
}

TEST(PickleCheckTest, TensorPastItsStorageIsRefusedNamingTheNumbers) {
  // The attack: a (3, 64) parameter over a (3, 37) storage.
  const absl::Status status =
      Check(OneTensorModule("FloatStorage", 111, 0, {3, 64}, {64, 1}), Records({{"0", 444}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "data.pkl: a tensor of sizes [3, 64] and strides [64, 1] at offset 0 reaches element "
            "191 of storage '0', which holds 111");
}

TEST(PickleCheckTest, TensorEndingAtTheLastElementIsAccepted) {
  EXPECT_TRUE(
      Check(OneTensorModule("FloatStorage", 111, 0, {3, 37}, {37, 1}), Records({{"0", 444}})).ok());
  // A column: offset 3, every fourth element of 12.
  EXPECT_TRUE(Check(OneTensorModule("FloatStorage", 12, 3, {3}, {4}), Records({{"0", 48}})).ok());
}

TEST(PickleCheckTest, OffsetPastTheEndIsRefused) {
  const absl::Status status =
      Check(OneTensorModule("FloatStorage", 12, 10, {3}, {1}), Records({{"0", 48}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "data.pkl: a tensor of sizes [3] and strides [1] at offset 10 reaches element 12 of "
            "storage '0', which holds 12");
  // A scalar at the end of its storage reads one element past it.
  EXPECT_EQ(Check(OneTensorModule("FloatStorage", 12, 12, {}, {}), Records({{"0", 48}})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(OneTensorModule("FloatStorage", 1, 1 << 30, {}, {}), Records({{"0", 4}})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, ScalarAndEmptyTensorsAreAccepted) {
  EXPECT_TRUE(Check(OneTensorModule("FloatStorage", 1, 0, {}, {}), Records({{"0", 4}})).ok());
  EXPECT_TRUE(
      Check(OneTensorModule("FloatStorage", 0, 0, {0, 3}, {3, 1}), Records({{"0", 0}})).ok());
  // An empty slice at the end of a storage, with a huge size in its other dimension.
  EXPECT_TRUE(Check(OneTensorModule("FloatStorage", 12, 12, {0, int64_t{1} << 40}, {1, 1}),
                    Records({{"0", 48}}))
                  .ok());
}

TEST(PickleCheckTest, EmptyTensorStartingPastTheEndIsRefused) {
  const absl::Status status =
      Check(OneTensorModule("FloatStorage", 12, 13, {0}, {1}), Records({{"0", 48}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "data.pkl: an empty tensor at offset 13 starts past the end of storage '0', which "
            "holds 12");
}

TEST(PickleCheckTest, NegativeSizeStrideOrOffsetIsRefused) {
  const StorageSizeLookup records = Records({{"0", 48}});
  const absl::Status size = Check(OneTensorModule("FloatStorage", 12, 0, {-1, 4}, {4, 1}), records);
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(size.message()), HasSubstr("sizes [-1, 4]"));
  EXPECT_THAT(std::string(size.message()), HasSubstr("negative size or stride"));
  // A negative stride would walk backwards from the offset, before the storage.
  const absl::Status stride =
      Check(OneTensorModule("FloatStorage", 12, 11, {3, 4}, {-4, 1}), records);
  EXPECT_EQ(stride.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(stride.message()), HasSubstr("negative size or stride"));
  const absl::Status offset = Check(OneTensorModule("FloatStorage", 12, -4, {2}, {1}), records);
  EXPECT_EQ(offset.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(offset.message()), HasSubstr("negative offset"));
}

TEST(PickleCheckTest, SizesWhoseProductOverflowsAreRefused) {
  const StorageSizeLookup records = Records({{"0", 48}});
  // The last element reached overflows: (2^62 - 1) * 4.
  const absl::Status reach =
      Check(OneTensorModule("FloatStorage", 12, 0, {int64_t{1} << 62, 1}, {4, 1}), records);
  EXPECT_EQ(reach.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reach.message(),
            "data.pkl: a tensor of sizes [4611686018427387904, 1] and strides [4, 1] at offset 0 "
            "(at byte 163) reaches past any 64-bit element index of storage '0', which holds 12");
  // The largest offset and stride: the sum overflows.
  const absl::Status sum =
      Check(OneTensorModule("FloatStorage", 12, INT64_MAX, {2}, {INT64_MAX}), records);
  EXPECT_THAT(std::string(sum.message()), HasSubstr("reaches past any 64-bit element index"));
  // Zero strides reach only element 0, but the element count overflows.
  const absl::Status count =
      Check(OneTensorModule("FloatStorage", 12, 0, {int64_t{1} << 40, int64_t{1} << 40}, {0, 0}),
            records);
  EXPECT_EQ(count.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(count.message()),
              HasSubstr("has more elements than a 64-bit count holds"));
  // The storage's own byte count overflows.
  const absl::Status bytes =
      Check(OneTensorModule("LongStorage", int64_t{1} << 61, 0, {1}, {1}), records);
  EXPECT_EQ(bytes.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.message()), HasSubstr("overflows"));
}

TEST(PickleCheckTest, TooManyDimensionsAreRefused) {
  const std::vector<int64_t> ones(65, 1);
  EXPECT_EQ(Check(OneTensorModule("FloatStorage", 12, 0, ones, ones), Records({{"0", 48}})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(OneTensorModule("FloatStorage", 12, 0, {3, 4}, {4}), Records({{"0", 48}})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, MissingStorageRecordIsRefused) {
  const absl::Status status = Check(TwoTensorModule(), Records({{"0", 48}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("data.pkl: storage '1' at byte "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("has no record in the archive"));
}

TEST(PickleCheckTest, StorageRecordOfAnotherByteSizeIsRefused) {
  const absl::Status status = Check(TwoTensorModule(), Records({{"0", 48}, {"1", 8}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("declares 3 FloatStorage elements (12 bytes), but its record holds 8 "
                        "bytes"));
  // The element size comes from the storage type: 12 doubles are 96 bytes, not 48.
  EXPECT_EQ(Check(OneTensorModule("DoubleStorage", 12, 0, {12}, {1}), Records({{"0", 48}})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Check(OneTensorModule("DoubleStorage", 6, 0, {6}, {1}), Records({{"0", 48}})).ok());
  EXPECT_EQ(Check(OneTensorModule("FloatStorage", -1, 0, {0}, {1}), Records({{"0", 0}})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, StorageSharedByViewsInRangeIsAccepted) {
  PickleBuilder b;
  b.BeginModule();
  b.Str("full").Global("torch._utils", "_rebuild_tensor_v2").Put(0).Mark();
  b.Storage("FloatStorage", "0", 12).Put(1).RebuildRest(0, {3, 4}, {4, 1});
  b.Str("col").Get(0).Mark().Get(1).RebuildRest(1, {3}, {4});
  b.Str("tail").Get(0).Mark().Get(1).RebuildRest(5, {7}, {1});
  EXPECT_TRUE(Check(b.EndModule().Stop(), Records({{"0", 48}})).ok());
}

TEST(PickleCheckTest, ViewOfASharedStoragePastItsEndIsRefused) {
  PickleBuilder b;
  b.BeginModule();
  b.Str("full").Global("torch._utils", "_rebuild_tensor_v2").Put(0).Mark();
  b.Storage("FloatStorage", "0", 12).Put(1).RebuildRest(0, {3, 4}, {4, 1});
  b.Str("col").Get(0).Mark().Get(1).RebuildRest(2, {3}, {5});
  const absl::Status status = Check(b.EndModule().Stop(), Records({{"0", 48}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("reaches element 12 of storage '0', which holds 12"));
}

TEST(PickleCheckTest, StorageKeyDeclaredAgainDifferentlyIsRefused) {
  // The same key declared twice the same way is only redundant.
  PickleBuilder same;
  same.BeginModule();
  same.Str("a").Tensor("FloatStorage", "0", 12, 0, {12}, {1});
  same.Str("b").Tensor("FloatStorage", "0", 12, 0, {12}, {1});
  EXPECT_TRUE(Check(same.EndModule().Stop(), Records({{"0", 48}})).ok());

  PickleBuilder numel;
  numel.BeginModule();
  numel.Str("a").Tensor("FloatStorage", "0", 12, 0, {12}, {1});
  numel.Str("b").Tensor("FloatStorage", "0", 24, 0, {24}, {1});
  const absl::Status status = Check(numel.EndModule().Stop(), Records({{"0", 48}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("storage '0' is declared as 12 FloatStorage elements"));

  PickleBuilder type;
  type.BeginModule();
  type.Str("a").Tensor("FloatStorage", "0", 12, 0, {12}, {1});
  type.Str("b").Tensor("IntStorage", "0", 12, 0, {12}, {1});
  EXPECT_EQ(Check(type.EndModule().Stop(), Records({{"0", 48}})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, StorageOnAnUnknownDeviceOrWithABadKeyIsRefused) {
  for (std::string_view location : {"cuda:0", "cuda"}) {
    PickleBuilder b;
    b.BeginModule().Str("w").Global("torch._utils", "_rebuild_tensor_v2").Mark();
    b.Storage("FloatStorage", "0", 3, location).RebuildRest(0, {3}, {1});
    EXPECT_TRUE(Check(b.EndModule().Stop(), Records({{"0", 12}})).ok()) << location;
  }
  for (std::string_view location : {"evil", "cuda:x", "", "meta"}) {
    PickleBuilder b;
    b.BeginModule().Str("w").Global("torch._utils", "_rebuild_tensor_v2").Mark();
    b.Storage("FloatStorage", "0", 3, location).RebuildRest(0, {3}, {1});
    EXPECT_EQ(Check(b.EndModule().Stop(), Records({{"0", 12}})).code(),
              absl::StatusCode::kInvalidArgument)
        << location;
  }
  for (std::string_view key : {"../0", "", "a b", "0\n"}) {
    PickleBuilder b;
    b.BeginModule().Str("w").Tensor("FloatStorage", key, 3, 0, {3}, {1});
    EXPECT_EQ(Check(b.EndModule().Stop(), Records({{std::string(key), 12}})).code(),
              absl::StatusCode::kInvalidArgument)
        << key;
  }
}

TEST(PickleCheckTest, OpcodesThePicklerDoesNotWriteAreRefusedNamingThem) {
  const absl::Status status = Check(PickleBuilder().Op('i').Stop(), kTwoTensorRecords);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "data.pkl: opcode 0x69 at byte 2 is not one that LibTorch's pickler writes");
  // Among others: LIST, DICT, APPEND, SETITEM, POP, DUP, INT, STRING, SHORT_BINUNICODE, BINBYTES,
  // STACK_GLOBAL, FRAME, MEMOIZE, PERSID, INST, OBJ, EXT1, NEWOBJ_EX, a second PROTO.
  const unsigned char kRefused[] = {'l',  'd',  'a',  's', '0', '2',  'I',  'S',  0x8c, 'B',
                                    0x93, 0x95, 0x94, 'P', 'o', 0x82, 0x92, 0x80, 0xff, 0x00};
  for (unsigned char op : kRefused) {
    PickleBuilder b;
    b.Int(1).Op(op);
    const absl::Status refused = Check(b.Stop(), kTwoTensorRecords);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << int{op};
    EXPECT_THAT(std::string(refused.message()), HasSubstr("at byte 4 is not one")) << int{op};
  }
}

TEST(PickleCheckTest, GlobalsTorchJitSaveDoesNotWriteAreRefused) {
  const std::pair<std::string_view, std::string_view> kForbidden[] = {
      {"os", "system"},
      {"builtins", "eval"},
      {"builtins", "exec"},
      {"__builtin__", "eval"},
      {"posix", "system"},
      {"subprocess", "Popen"},
      {"torch.storage", "_load_from_bytes"},
      {"torch._utils", "_rebuild_qtensor"},
      {"torch._utils", "_rebuild_sparse_tensor"},
      {"torch._utils", "_rebuild_parameter"},
      {"torch._tensor", "_rebuild_from_type_v2"},
      {"torch.jit._pickle", "build_tensor_from_id"},
      {"torch", "Tensor"},
      {"torch", "QInt8Storage"},
      {"torch", "per_tensor_affine"},
      {"__main__", "TensorID"},
      {"collections", "defaultdict"},
      {"numpy.core.multiarray", "_reconstruct"},
  };
  for (const auto& [module, name] : kForbidden) {
    PickleBuilder b;
    b.Global(module, name).EmptyTuple().Reduce();
    const absl::Status status = Check(b.Stop(), kTwoTensorRecords);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << module << "." << name;
    EXPECT_THAT(std::string(status.message()),
                StartsWith(absl::StrCat("data.pkl: the global '", std::string(module), ".",
                                        std::string(name), "' at byte 2")));
  }
}

TEST(PickleCheckTest, CustomClassesAreRefused) {
  for (const auto& [module, name] : std::vector<std::pair<std::string, std::string>>{
           {"__torch__.torch.classes.x", "Y"},
           {"__torch__.torch", "classes"},
           {"__torch__.torch.classes.my_ns.deep", "Thing"}}) {
    PickleBuilder b;
    b.Global(module, name).EmptyTuple().NewObj().EmptyDict().Build();
    const absl::Status status = Check(b.Stop(), kTwoTensorRecords);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << module;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("is a custom class, which is native code"));
  }
  // A type tag naming one.
  PickleBuilder tag;
  tag.Global("torch.jit._pickle", "restore_type_tag")
      .EmptyList()
      .Str("List[__torch__.torch.classes.x.Y]")
      .Op(0x86)
      .Reduce();
  EXPECT_EQ(Check(tag.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kPermissionDenied);
  // A module's own classes whose names merely contain "classes" are fine.
  PickleBuilder own;
  own.Global("__torch__.my.classes", "Net").EmptyTuple().NewObj().EmptyDict().Build();
  EXPECT_TRUE(Check(own.Stop(), kTwoTensorRecords).ok());
}

TEST(PickleCheckTest, GlobalNamesThatAreNotPythonNamesAreRefused) {
  for (std::string_view module : {"__torch__ x", "__torch__.a;b", "", "__torch__\x01"}) {
    PickleBuilder b;
    b.Global(module, "Net").EmptyTuple().NewObj().EmptyDict().Build();
    EXPECT_EQ(Check(b.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kPermissionDenied)
        << module;
  }
  // A line longer than any name, with no end.
  PickleBuilder endless;
  endless.Op('c').Raw(std::string(5000, 'a'));
  EXPECT_EQ(Check(endless.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, EveryTruncationOfAValidPickleIsRefused) {
  const std::string valid = TwoTensorModule();
  for (size_t length = 0; length < valid.size(); ++length) {
    const absl::Status status = Check(std::string_view(valid).substr(0, length), kTwoTensorRecords);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << length;
    EXPECT_THAT(std::string(status.message()), StartsWith("data.pkl: ")) << length;
  }
  EXPECT_TRUE(Check(valid, kTwoTensorRecords).ok());
}

TEST(PickleCheckTest, BytesAfterStopAreRefused) {
  const absl::Status status = Check(TwoTensorModule() + "x", kTwoTensorRecords);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("has 1 more bytes after STOP"));
}

TEST(PickleCheckTest, OtherProtocolsAreRefused) {
  std::string protocol4 = TwoTensorModule();
  protocol4[1] = 4;
  EXPECT_EQ(Check(protocol4, kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check("]\x80\x02.", kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, LengthsPastTheEndAreRefused) {
  PickleBuilder string;
  string.Op('X').LittleEndian(0xffffffff, 4).Raw("abc");
  const absl::Status status = Check(string.Stop(), kTwoTensorRecords);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("declares 4294967295 bytes, past the end"));
  PickleBuilder long1;
  long1.Op(0x8a).Byte(200).Raw(std::string(200, '\x01'));
  EXPECT_EQ(Check(long1.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, MemoIndicesNeverSetAreRefused) {
  PickleBuilder get;
  get.Int(1).Put(0).Get(1);
  const absl::Status status = Check(get.Stop(), kTwoTensorRecords);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("reads memo index 1, which was never set"));
  // LibTorch would grow its memo to four billion entries for this one.
  PickleBuilder put;
  put.Int(1).Op('r').LittleEndian(0xffffffff, 4);
  EXPECT_EQ(Check(put.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
  PickleBuilder long_get;
  long_get.Op('j').LittleEndian(7, 4);
  EXPECT_EQ(Check(long_get.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
  // Setting an index again is what LibTorch does too.
  PickleBuilder again;
  again.Int(1).Put(0).False().Put(0).Op(0x86);
  EXPECT_TRUE(Check(again.Stop(), kTwoTensorRecords).ok());
}

TEST(PickleCheckTest, StackUnderflowIsRefused) {
  EXPECT_EQ(Check(PickleBuilder().Int(1).Op(0x86).Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().Reduce().Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().Tuple().Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().Appends().Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().PersId().Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().Put(0).Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  // A pop below the last MARK (LibTorch would then index its stack out of bounds in TUPLE).
  const absl::Status below =
      Check(PickleBuilder().Int(1).Mark().Op(0x85).Tuple().Stop(), kTwoTensorRecords);
  EXPECT_EQ(below.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(below.message()), HasSubstr("above the last MARK"));
  // STOP with two values, or with a MARK open.
  EXPECT_EQ(Check(PickleBuilder().Int(1).Int(2).Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().Int(1).Mark().Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check(PickleBuilder().Stop(), kTwoTensorRecords).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, DeepNestingIsRefusedWithoutRecursion) {
  PickleBuilder marks;
  for (int i = 0; i < 100000; ++i) marks.Mark();
  const absl::Status status = Check(marks.Stop(), kTwoTensorRecords);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("nests deeper than 512 open MARKs"));

  // Tuples in tuples: each level is complete, so only the nesting bound stops them.
  PickleBuilder tuples;
  tuples.EmptyTuple();
  for (int i = 0; i < 100000; ++i) tuples.Op(0x85);
  const absl::Status nested = Check(tuples.Stop(), kTwoTensorRecords);
  EXPECT_EQ(nested.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nested.message()), HasSubstr("nests values deeper than 512 levels"));

  // 100k empty lists side by side are not deep, only too many for STOP.
  PickleBuilder lists;
  for (int i = 0; i < 100000; ++i) lists.EmptyList();
  EXPECT_THAT(std::string(Check(lists.Stop(), kTwoTensorRecords).message()),
              HasSubstr("with 100000 values on the stack instead of 1"));

  // Lists in lists through APPENDS (each new list gets the previous one from the memo).
  PickleBuilder appends;
  appends.EmptyList().Put(0);
  for (int i = 0; i < 100000; ++i) appends.EmptyList().Mark().Get(0).Appends().Put(0);
  EXPECT_THAT(std::string(Check(appends.Stop(), kTwoTensorRecords).message()),
              HasSubstr("nests values deeper than 512 levels"));
  // Objects in objects: 100k class globals, then the innermost state and 100k REDUCEs.
  PickleBuilder objects;
  objects.Global("__torch__", "Net").Put(0);
  for (int i = 1; i < 100000; ++i) objects.Get(0);
  objects.None();
  for (int i = 0; i < 100000; ++i) objects.Reduce();
  EXPECT_THAT(std::string(Check(objects.Stop(), kTwoTensorRecords).message()),
              HasSubstr("nests values deeper than 512 levels"));
}

TEST(PickleCheckTest, NestingWithinTheBoundsIsAccepted) {
  PickleBuilder tuples;
  tuples.EmptyTuple();
  for (int i = 0; i < 500; ++i) tuples.Op(0x85);
  EXPECT_TRUE(Check(tuples.Stop(), kTwoTensorRecords).ok());
}

TEST(PickleCheckTest, ReduceOnAnythingButAGlobalIsRefused) {
  // LibTorch's REDUCE calls its global number <int>: an integer must not stand in for
  // _rebuild_tensor_v2 (which would then go unchecked).
  PickleBuilder b;
  b.Global("torch._utils", "_rebuild_tensor_v2").Put(0).Int(0).Mark();
  b.Storage("FloatStorage", "0", 3).RebuildRest(0, {3}, {1});  // REDUCE on the int 0
  EXPECT_EQ(Check(b.Stop(), Records({{"0", 12}})).code(), absl::StatusCode::kInvalidArgument);
  // Nor a storage type, which LibTorch pushes as its dtype number.
  PickleBuilder storage;
  storage.Global("torch", "FloatStorage").EmptyTuple().Reduce();
  EXPECT_THAT(std::string(Check(storage.Stop(), kTwoTensorRecords).message()),
              HasSubstr("calls a global that is a storage type"));
  // BUILD sets the state of a class only.
  PickleBuilder build;
  build.Global("collections", "OrderedDict").EmptyTuple().Build();
  EXPECT_EQ(Check(build.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
  // NEWOBJ on a function.
  PickleBuilder newobj;
  newobj.Global("torch._utils", "_rebuild_tensor_v2").EmptyTuple().NewObj();
  EXPECT_EQ(Check(newobj.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, ArgumentsOfTheWrongKindAreRefused) {
  // A storage type (an integer in LibTorch) as a size.
  PickleBuilder size;
  size.Global("torch._utils", "_rebuild_tensor_v2").Mark().Storage("FloatStorage", "0", 3);
  size.Int(0)
      .Mark()
      .Global("torch", "LongStorage")
      .Tuple()
      .IntTuple({1})
      .False()
      .Global("collections", "OrderedDict")
      .EmptyTuple()
      .Reduce()
      .Tuple()
      .Reduce();
  EXPECT_EQ(Check(size.Stop(), Records({{"0", 12}})).code(), absl::StatusCode::kInvalidArgument);
  // An integer instead of a storage type in the persistent id.
  PickleBuilder type;
  type.Mark().Str("storage").Int(6).Str("0").Str("cpu").Int(3).Tuple().PersId();
  EXPECT_EQ(Check(type.Stop(), Records({{"0", 12}})).code(), absl::StatusCode::kInvalidArgument);
  // A tensor from an integer instead of a storage.
  PickleBuilder storage;
  storage.Global("torch._utils", "_rebuild_tensor_v2").Mark().Int(0).RebuildRest(0, {3}, {1});
  EXPECT_EQ(Check(storage.Stop(), Records({{"0", 12}})).code(), absl::StatusCode::kInvalidArgument);
  // Five arguments.
  PickleBuilder few;
  few.Global("torch._utils", "_rebuild_tensor_v2").Mark().Storage("FloatStorage", "0", 3);
  few.Int(0).IntTuple({3}).IntTuple({1}).False().Tuple().Reduce();
  EXPECT_EQ(Check(few.Stop(), Records({{"0", 12}})).code(), absl::StatusCode::kInvalidArgument);
  // A bool is not an int: True as the offset.
  PickleBuilder offset;
  offset.Global("torch._utils", "_rebuild_tensor_v2").Mark().Storage("FloatStorage", "0", 3);
  offset.True()
      .IntTuple({3})
      .IntTuple({1})
      .False()
      .Global("collections", "OrderedDict")
      .EmptyTuple()
      .Reduce()
      .Tuple()
      .Reduce();
  EXPECT_EQ(Check(offset.Stop(), Records({{"0", 12}})).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, TypedListOfOtherItemsIsRefused) {
  // build_tensorlist tags the list as List[Tensor] without looking: an int in it is refused.
  PickleBuilder tensors;
  tensors.Global("torch.jit._pickle", "build_tensorlist")
      .Mark()
      .EmptyList()
      .Mark()
      .Int(7)
      .Appends()
      .Tuple()
      .Reduce();
  EXPECT_THAT(std::string(Check(tensors.Stop(), kTwoTensorRecords).message()),
              HasSubstr("builds a list of tensor from items of other kinds"));
  PickleBuilder ints;
  ints.Global("torch.jit._pickle", "build_intlist")
      .Mark()
      .EmptyList()
      .Mark()
      .Int(7)
      .True()
      .Appends()
      .Tuple()
      .Reduce();
  EXPECT_EQ(Check(ints.Stop(), kTwoTensorRecords).code(), absl::StatusCode::kInvalidArgument);
  PickleBuilder empty;
  empty.Global("torch.jit._pickle", "build_boollist").Mark().EmptyList().Tuple().Reduce();
  EXPECT_TRUE(Check(empty.Stop(), kTwoTensorRecords).ok());
}

TEST(PickleCheckTest, ContainersThatCannotBeBuiltSoAreRefused) {
  // SETITEMS with a key and no value.
  PickleBuilder odd;
  odd.EmptyDict().Mark().Str("a").SetItems();
  EXPECT_THAT(std::string(Check(odd.Stop(), kTwoTensorRecords).message()),
              HasSubstr("not key-value pairs"));
  // APPENDS to a memoized list: it could end up inside itself.
  PickleBuilder memoized;
  memoized.EmptyList().Put(0).Mark().Get(0).Appends();
  EXPECT_THAT(std::string(Check(memoized.Stop(), kTwoTensorRecords).message()),
              HasSubstr("already memoized or returned"));
  // APPENDS onto a dict, SETITEMS onto a list.
  EXPECT_EQ(
      Check(PickleBuilder().EmptyDict().Mark().Int(1).Appends().Stop(), kTwoTensorRecords).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Check(PickleBuilder().EmptyList().Mark().Int(1).Int(2).SetItems().Stop(), kTwoTensorRecords)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(PickleCheckTest, TheOtherValuesThePicklerWritesAreAccepted) {
  PickleBuilder b;
  b.BeginModule();
  b.Str("ints").Global("torch.jit._pickle", "build_intlist").Mark().EmptyList().Mark();
  b.Int(1).Int(300).Int(70000).Int(-5).Int(int64_t{1} << 40).Appends().Tuple().Reduce();
  b.Str("floats").Global("torch.jit._pickle", "build_doublelist").Mark().EmptyList().Mark();
  b.Op('G').LittleEndian(0, 8).Appends().Tuple().Reduce();
  b.Str("tensors").Global("torch.jit._pickle", "build_tensorlist").Mark().EmptyList().Mark();
  b.Tensor("HalfStorage", "0", 2, 0, {2}, {1}).Appends().Tuple().Reduce();
  b.Str("named").Global("torch.jit._pickle", "restore_type_tag").EmptyDict().Mark();
  b.Str("a").Tensor("BoolStorage", "1", 2, 1, {1}, {1}).SetItems().Str("Dict[str, Tensor]");
  b.Op(0x86).Reduce();
  b.Str("number")
      .Global("builtins", "complex")
      .Op('G')
      .LittleEndian(0, 8)
      .Op('G')
      .LittleEndian(0, 8)
      .Op(0x86)
      .Reduce();
  b.Str("place").Global("torch", "device").Str("cpu").Op(0x85).Reduce();
  b.Str("mixed").Mark().Int(1).Str("x").None().Int(3).Tuple();
  // A conjugated tensor: the rebuild's seventh argument is its math bits.
  b.Str("conj").Global("torch._utils", "_rebuild_tensor_v2").Mark();
  b.Storage("ComplexFloatStorage", "2", 1).Int(0).IntTuple({1}).IntTuple({1}).False();
  b.Global("collections", "OrderedDict").EmptyTuple().Reduce();
  b.Global("torch.jit._pickle", "restore_type_tag").EmptyDict().Mark().Str("conj").True();
  b.SetItems().Str("Dict[str, bool]").Op(0x86).Reduce().Tuple().Reduce();
  // An enum value and a submodule.
  b.Str("mode").Global("__torch__", "Mode").Int(1).Reduce();
  b.Str("sub")
      .Global("__torch__.torch.nn.modules.linear.___torch_mangle_0", "Linear")
      .EmptyTuple()
      .NewObj()
      .EmptyDict()
      .Mark()
      .Str("training")
      .False()
      .SetItems()
      .Build();
  const absl::Status status = Check(b.EndModule().Stop(), Records({{"0", 4}, {"1", 2}, {"2", 8}}));
  EXPECT_TRUE(status.ok()) << status;
}

// The real fixtures ---------------------------------------------------------------------------

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(TRAINERD_PICKLE_TESTDATA) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << name;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// records.txt: "<fixture> <data|constants>/<key> <bytes>" per storage record.
StorageSizeLookup FixtureRecords(const std::string& fixture, const std::string& folder) {
  std::map<std::string, int64_t, std::less<>> sizes;
  std::istringstream lines(ReadFixture("records.txt"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, record;
    int64_t bytes = 0;
    fields >> name >> record >> bytes;
    if (name == fixture && record.rfind(folder + "/", 0) == 0) {
      sizes[record.substr(folder.size() + 1)] = bytes;
    }
  }
  return Records(std::move(sizes));
}

constexpr const char* kFixtures[] = {"sequential", "buffer", "constants", "views"};

TEST(PickleCheckTest, PicklesTorchJitSaveWroteAreAccepted) {
  int tensors = 0;
  for (const char* fixture : kFixtures) {
    for (const std::string folder : {"data", "constants"}) {
      const std::string record = folder + ".pkl";
      const std::string pickle = ReadFixture(std::string(fixture) + "." + record);
      ASSERT_FALSE(pickle.empty()) << fixture << " " << record;
      const absl::Status status =
          CheckTorchScriptPickle(pickle, record, FixtureRecords(fixture, folder));
      EXPECT_TRUE(status.ok()) << fixture << " " << record << ": " << status;
      tensors += static_cast<int>(
          std::count_if(pickle.begin(), pickle.end(), [](char c) { return c == 'Q'; }));
    }
  }
  EXPECT_GE(tensors, 15);  // the fixtures really hold storages
}

TEST(PickleCheckTest, RealPickleWithASizePastItsStorageIsRefused) {
  // The first Linear's weight: MARK 3 4 TUPLE MARK 4 1 TUPLE over 12 floats; make it 4 x 4.
  std::string pickle = ReadFixture("sequential.data.pkl");
  const std::string sizes = "(K\x03K\x04t(K\x04K\x01t";
  const size_t at = pickle.find(sizes);
  ASSERT_NE(at, std::string::npos);
  ASSERT_TRUE(
      CheckTorchScriptPickle(pickle, "data.pkl", FixtureRecords("sequential", "data")).ok());
  pickle[at + 2] = 4;
  const absl::Status status =
      CheckTorchScriptPickle(pickle, "data.pkl", FixtureRecords("sequential", "data"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "data.pkl: a tensor of sizes [4, 4] and strides [4, 1] at offset 0 reaches element 15 "
            "of storage '0', which holds 12");
}

TEST(PickleCheckTest, RealPickleWithoutItsRecordsIsRefused) {
  const std::string pickle = ReadFixture("constants.constants.pkl");
  const absl::Status status = CheckTorchScriptPickle(pickle, "constants.pkl", Records({}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("constants.pkl: storage '0'"));
}

}  // namespace
}  // namespace trainerd::engine
