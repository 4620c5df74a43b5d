// SequentialSafetensors and ModuleSafetensors: the trained tensors, contiguous on the host, handed
// to the safetensors encoder with the names PyTorch's state_dict() gives them.
#include "server/engine/training/state_dict.h"

#include <functional>
#include <map>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Encodes `tensors` (CPU) in their order. The contiguous copies live in `keep` while encoding.
absl::StatusOr<std::string> Encode(const NamedTensors& tensors,
                                   std::vector<std::pair<std::string, std::string>> metadata) {
  std::vector<torch::Tensor> keep;
  std::vector<SafetensorsTensor> out;
  keep.reserve(tensors.size());
  out.reserve(tensors.size());
  for (const auto& [name, value] : tensors) {
    const std::string dtype = SafetensorsDtypeOf(value.scalar_type());
    if (dtype.empty()) {
      return absl::InternalError(absl::StrCat("the model's tensor '", name, "' has dtype ",
                                              c10::toString(value.scalar_type()),
                                              ", which safetensors cannot hold"));
    }
    keep.push_back(value.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& t = keep.back();
    out.push_back({name, dtype, t.sizes().vec(),
                   std::string_view(static_cast<const char*>(t.data_ptr()),
                                    static_cast<size_t>(t.numel() * t.element_size()))});
  }
  absl::StatusOr<std::string> file = EncodeSafetensors(out, metadata);
  if (!file.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot write the model as safetensors: ", file.status().message()));
  }
  return file;
}

// nn.Module.state_dict()'s order from a program's parameters and buffers, each listed by its
// module path in the module's own order: the modules in pre-order, each with its own parameters,
// then its own buffers. A module's children come in the order of their first tensor (parameters
// first), which is their registration order except where a child holding only buffers was
// registered before a sibling holding parameters; load_state_dict takes the keys in any order.
void StateDictOrder(const NamedTensors& parameters, const NamedTensors& buffers, NamedTensors& out) {
  struct Node {
    std::vector<std::string> order;  // children, by first appearance
    std::map<std::string, Node> children;
    std::vector<const std::pair<std::string, torch::Tensor>*> own_parameters, own_buffers;
  };
  Node root;
  auto add = [&root](const std::pair<std::string, torch::Tensor>& entry, bool buffer) {
    Node* node = &root;
    std::string_view rest = entry.first;
    for (size_t dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      const std::string child(rest.substr(0, dot));
      auto [it, inserted] = node->children.try_emplace(child);
      if (inserted) node->order.push_back(child);
      node = &it->second;
      rest.remove_prefix(dot + 1);
    }
    (buffer ? node->own_buffers : node->own_parameters).push_back(&entry);
  };
  for (const auto& p : parameters) add(p, false);
  for (const auto& b : buffers) add(b, true);
  std::function<void(const Node&)> walk = [&](const Node& node) {
    for (const auto* p : node.own_parameters) out.push_back(*p);
    for (const auto* b : node.own_buffers) out.push_back(*b);
    for (const std::string& child : node.order) walk(node.children.at(child));
  };
  walk(root);
}

// Python's nn.Module.state_dict() order for a TorchScript module: own parameters, own buffers,
// then each child's under its name.
void CollectState(const torch::jit::Module& module, const std::string& prefix, NamedTensors& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    out.emplace_back(prefix + p.name, p.value);
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    out.emplace_back(prefix + b.name, b.value);
  }
  for (const auto& child : module.named_children()) {
    CollectState(child.value, absl::StrCat(prefix, child.name, "."), out);
  }
}

}  // namespace

std::string SafetensorsDtypeOf(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32: return "F32";
    case torch::kFloat64: return "F64";
    case torch::kFloat16: return "F16";
    case torch::kBFloat16: return "BF16";
    case torch::kInt64: return "I64";
    case torch::kInt32: return "I32";
    case torch::kInt16: return "I16";
    case torch::kInt8: return "I8";
    case torch::kUInt8: return "U8";
    case torch::kBool: return "BOOL";
    default: return "";
  }
}

absl::StatusOr<std::string> SequentialSafetensors(const HostModelState& state,
                                                  const ModelSpec& spec,
                                                  const std::vector<int64_t>& feature_shape) {
  // state.parameters and state.buffers are each in layer order; nn.Sequential's state_dict takes
  // layer by layer, a layer's parameters before its buffers.
  NamedTensors ordered;
  ordered.reserve(state.parameters.size() + state.buffers.size());
  size_t p = 0;
  size_t b = 0;
  auto in_layer = [](const std::string& name, const std::string& prefix) {
    return name.compare(0, prefix.size(), prefix) == 0;
  };
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const std::string prefix = absl::StrCat(i, ".");
    while (p < state.parameters.size() && in_layer(state.parameters[p].first, prefix)) {
      ordered.push_back(state.parameters[p++]);
    }
    while (b < state.buffers.size() && in_layer(state.buffers[b].first, prefix)) {
      ordered.push_back(state.buffers[b++]);
    }
  }
  if (p != state.parameters.size() || b != state.buffers.size()) {
    return absl::InternalError("the model's tensors do not follow its layers");
  }
  return Encode(ordered, {{"format", "pt"},
                          {"trainerd.feature_shape", ShapeText(feature_shape)},
                          {"trainerd.model", spec.ToString()}});
}

absl::StatusOr<std::string> ModuleSafetensors(const torch::jit::Module& module,
                                              const std::vector<int64_t>& feature_shape) {
  try {
    NamedTensors state;
    CollectState(module, "", state);
    return Encode(state, {{"format", "pt"},
                          {"trainerd.feature_shape", ShapeText(feature_shape)},
                          {"trainerd.model", "torchscript"}});
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot write the model as safetensors: ", FirstLineOf(e)));
  }
}

absl::StatusOr<std::string> ExportedSafetensors(const ExportedProgram& program,
                                                const std::vector<int64_t>& feature_shape) {
  try {
    NamedTensors state;
    StateDictOrder(program.named_parameters(), program.named_buffers(), state);
    return Encode(state, {{"format", "pt"},
                          {"trainerd.feature_shape", ShapeText(feature_shape)},
                          {"trainerd.model", "exported"}});
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot write the model as safetensors: ", FirstLineOf(e)));
  }
}

}  // namespace trainerd::engine
