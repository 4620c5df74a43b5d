// PickleWalker (pickle_walker.h): the opcode loop (Run, Step, Stop), the input (ReadLine), the
// tuples on the stack (MakeTuple), the memo (Memoize), and APPENDS and SETITEMS (Fill). Globals,
// NEWOBJ, REDUCE and BUILD, persistent ids and the tensor checks are in pickle_walker_objects.cc.
#include "server/engine/torchscript/pickle_walker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainerd::engine::pickle_internal {

absl::Status PickleWalker::Run() {
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

absl::Status PickleWalker::Stop() {
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

absl::StatusOr<absl::string_view> PickleWalker::ReadLine() {
  const size_t limit = std::min(pickle_.size(), pos_ + kMaxNameBytes + 1);
  for (size_t i = pos_; i < limit; ++i) {
    if (pickle_[i] == '\n') {
      absl::string_view line = pickle_.substr(pos_, i - pos_);
      pos_ = i + 1;
      return line;
    }
  }
  if (limit == pickle_.size()) {
    return Invalid(
        absl::StrCat("is truncated: ", Here(), " has no end of line before byte ", pickle_.size()));
  }
  return Invalid(
      absl::StrCat(Here(), " names a module or global longer than ", kMaxNameBytes, " bytes"));
}

absl::StatusOr<Value> PickleWalker::MakeTuple(size_t start) {
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

absl::Status PickleWalker::Step() {
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
                                    " bytes, past the end of the pickle at byte ", pickle_.size()));
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
        return Invalid(absl::StrCat(Here(), " reads memo index ", index, ", which was never set"));
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

absl::Status PickleWalker::Memoize(uint64_t index) {
  if (stack_.size() <= Floor()) {
    return Invalid(absl::StrCat(Here(), " has no value above the last MARK to memoize"));
  }
  if (index > memo_.size()) {
    return Invalid(
        absl::StrCat(Here(), " sets memo index ", index, "; the next free one is ", memo_.size()));
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

absl::Status PickleWalker::Fill() {
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

}  // namespace trainerd::engine::pickle_internal
