// PickleWalker (pickle_walker.h): what the walk builds beyond plain values. The globals it accepts
// (ReadGlobal), NEWOBJ, REDUCE and BUILD (NewObj, Call, CheckArgs), the storages that BINPERSID
// declares and their records (PersistentId), and the check of every tensor against its storage
// (CheckTensor). The opcode loop, the stack and the memo are in pickle_walker.cc.
#include <iterator>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_size.h"
#include "common/status_macros.h"
#include "server/engine/torchscript/pickle_walker.h"

namespace trainerd::engine::pickle_internal {

absl::Status PickleWalker::ReadGlobal() {
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

absl::Status PickleWalker::NewObj() {
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

absl::Status PickleWalker::Call() {
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

absl::Status PickleWalker::CheckArgs(const Value& args, absl::string_view callee,
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

absl::Status PickleWalker::PersistentId() {
  TRAINERD_RETURN_IF_ERROR(NeedAboveMark(1));
  const Value id = Pop();
  const bool shaped = id.kind == Kind::kTuple && id.aux == 5 && Item(id, 0).kind == Kind::kString &&
                      String(Item(id, 0)) == "storage" &&
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
  auto [it, inserted] =
      storage_index_.emplace(std::string_view(decl.key.data(), decl.key.size()), storages_.size());
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
    TRAINERD_ASSIGN_OR_RETURN(const int64_t bytes,
                              CheckedMul(decl.numel, kStorageTypes[decl.type].element_bytes, what));
    const std::optional<int64_t> record_bytes =
        lookup_(std::string_view(decl.key.data(), decl.key.size()));
    if (!record_bytes.has_value()) {
      return Invalid(
          absl::StrCat("storage '", decl.key, "' at byte ", at_, " has no record in the archive"));
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

absl::Status PickleWalker::CheckTensor(const Value& args) const {
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
      return Invalid(absl::StrCat(tensor(), " (at byte ", at_, ") has a negative size or stride"));
    }
  }
  if (offset.payload < 0) {
    return Invalid(absl::StrCat(tensor(), " (at byte ", at_, ") has a negative offset"));
  }
  const absl::StatusOr<int64_t> elements = CheckedShapeElements(size, "the shape");
  if (!elements.ok()) {
    return Invalid(
        absl::StrCat(tensor(), " (at byte ", at_, ") has more elements than a 64-bit count holds"));
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

}  // namespace trainerd::engine::pickle_internal
