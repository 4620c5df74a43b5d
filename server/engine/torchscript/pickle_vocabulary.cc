// The out-of-line functions of the pickle walk's vocabulary (pickle_walker.h): the names of
// opcodes and of kinds of values for messages, and the storage locations the walk accepts.
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/engine/torchscript/pickle_walker.h"

namespace trainerd::engine::pickle_internal {

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

bool IsKnownLocation(absl::string_view location) {
  if (location == "cpu" || location == "cuda") return true;
  if (!absl::ConsumePrefix(&location, "cuda:")) return false;
  if (location.empty() || location.size() > 4) return false;
  for (char c : location) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace trainerd::engine::pickle_internal
