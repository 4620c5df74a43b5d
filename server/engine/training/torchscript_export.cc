// ExportTorchScript: a trained torch::nn::Sequential as a TorchScript archive.
//
// LibTorch's C++ API cannot script a C++ module (torch.jit.script exists only in Python), so the
// exported module is assembled by hand: a torch::jit::Module whose forward is TorchScript source
// generated from the model spec (module.define), with every trained tensor registered as a
// parameter or buffer of a submodule per layer, named as nn.Sequential names them. The source calls the same ATen operators that the C++
// layers call, so the exported forward computes what the trained model computes in eval mode.
#include "server/engine/training/torchscript_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// torch::nn's defaults, which BuildModel keeps (BatchNormOptions, LayerNormOptions).
constexpr double kBatchNormMomentum = 0.1;
constexpr double kNormEps = 1e-5;

// "[a, b]" for a TorchScript int list.
std::string IntList(const std::vector<int64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

// A Sequential entry's layer and its name within the layer: "3.running_mean" is {"3",
// "running_mean"}.
std::pair<std::string, std::string> SplitName(const std::string& sequential_name) {
  const size_t dot = sequential_name.find('.');
  if (dot == std::string::npos) return {"", sequential_name};
  return {sequential_name.substr(0, dot), sequential_name.substr(dot + 1)};
}

// The class of layer i's submodule, e.g. "__torch__.trainerd.Linear" (mangled by LibTorch when
// two layers share a kind), so that Python shows the layer's kind.
std::string LayerClassName(const LayerSpec& layer) {
  std::string kind = LayerKindName(layer.kind);
  if (!kind.empty()) kind[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(kind[0])));
  return absl::StrCat("__torch__.trainerd.", kind);
}

}  // namespace

absl::StatusOr<std::string> TorchScriptSource(const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape) {
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> shapes,
                            InferLayerShapes(spec, input_shape));
  std::string src = "def forward(self, x):\n";
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    const std::vector<int64_t>& in = shapes[i];
    // This layer's tensors: its submodule's, named as in nn.Sequential ("0.weight").
    const std::string p = absl::StrCat("getattr(self, \"", i, "\").");
    absl::StrAppend(&src, "    # layer ", i + 1, ": ", layer.ToString(), "\n");
    switch (layer.kind) {
      case LayerKind::kLinear:
        absl::StrAppend(&src, "    x = torch.linear(x, ", p, "weight, ", p, "bias)\n");
        break;
      case LayerKind::kConv2d: {
        const int64_t stride = layer.args.size() > 2 ? layer.args[2] : 1;
        const int64_t padding = layer.args.size() > 3 ? layer.args[3] : 0;
        // conv2d(input, weight, bias, stride, padding, dilation, groups)
        absl::StrAppend(&src, "    x = torch.conv2d(x, ", p, "weight, ", p, "bias, ",
                        IntList({stride, stride}), ", ", IntList({padding, padding}),
                        ", [1, 1], 1)\n");
        break;
      }
      case LayerKind::kMaxPool2d: {
        const int64_t k = layer.args[0];
        absl::StrAppend(&src, "    x = torch.max_pool2d(x, ", IntList({k, k}), ", ",
                        IntList({k, k}), ")\n");
        break;
      }
      case LayerKind::kAvgPool2d: {
        // avg_pool2d(input, kernel, stride, padding, ceil_mode, count_include_pad): AvgPool2d's
        // defaults.
        const int64_t k = layer.args[0];
        absl::StrAppend(&src, "    x = torch.avg_pool2d(x, ", IntList({k, k}), ", ",
                        IntList({k, k}), ", [0, 0], False, True)\n");
        break;
      }
      case LayerKind::kFlatten:
        absl::StrAppend(&src, "    x = torch.flatten(x, 1)\n");
        break;
      case LayerKind::kDropout:
        // The export is for inference, where dropout is the identity.
        absl::StrAppend(&src, "    # dropout is the identity in inference\n");
        break;
      case LayerKind::kBatchNorm:
        // batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
        // cudnn_enabled): training=False, i.e. eval semantics with the running statistics.
        absl::StrAppend(&src, "    x = torch.batch_norm(x, ", p, "weight, ", p, "bias, ", p,
                        "running_mean, ", p, "running_var, False, ", kBatchNormMomentum, ", ",
                        kNormEps, ", False)\n");
        break;
      case LayerKind::kLayerNorm:
        // layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)
        absl::StrAppend(&src, "    x = torch.layer_norm(x, ", IntList(in), ", ", p, "weight, ", p,
                        "bias, ", kNormEps, ", False)\n");
        break;
      case LayerKind::kRelu:
        absl::StrAppend(&src, "    x = torch.relu(x)\n");
        break;
      case LayerKind::kGelu:
        absl::StrAppend(&src, "    x = torch.gelu(x)\n");
        break;
      case LayerKind::kTanh:
        absl::StrAppend(&src, "    x = torch.tanh(x)\n");
        break;
      case LayerKind::kSigmoid:
        absl::StrAppend(&src, "    x = torch.sigmoid(x)\n");
        break;
      case LayerKind::kSoftmax:
        absl::StrAppend(&src, "    x = torch.softmax(x, 1)\n");
        break;
      case LayerKind::kLogSoftmax:
        absl::StrAppend(&src, "    x = torch.log_softmax(x, 1)\n");
        break;
    }
  }
  absl::StrAppend(&src, "    return x\n");
  return src;
}

HostModelState CopyModelStateToHost(const torch::nn::Sequential& model) {
  torch::NoGradGuard no_grad;
  HostModelState state;
  std::vector<torch::Tensor*> outputs;  // every tensor of `state`, in order
  std::vector<torch::Tensor> sources;
  for (const auto& p : model->named_parameters()) {
    state.parameters.emplace_back(p.key(), torch::Tensor());
    sources.push_back(p.value().detach());
  }
  for (const auto& b : model->named_buffers()) {
    state.buffers.emplace_back(b.key(), torch::Tensor());
    sources.push_back(b.value().detach());
  }
  for (auto& [name, t] : state.parameters) outputs.push_back(&t);
  for (auto& [name, t] : state.buffers) outputs.push_back(&t);
  if (sources.empty()) return state;

  // Float32, the dtype the model trains in and that the exported forward expects; integer
  // buffers (batchnorm's num_batches_tracked) keep their int64.
  auto host_dtype = [](const torch::Tensor& t) {
    return t.is_floating_point() ? torch::kFloat32 : t.scalar_type();
  };
  if (sources.front().device().is_cpu()) {
    for (size_t i = 0; i < sources.size(); ++i) {
      *outputs[i] = sources[i].to(host_dtype(sources[i])).clone();
    }
    return state;
  }
  // One transfer: every tensor flattened into one float32 buffer, an int64 tensor as its bits
  // (two float32 words per value; copies keep bits as they are).
  std::vector<torch::Tensor> flat;
  flat.reserve(sources.size());
  for (const torch::Tensor& t : sources) {
    const torch::Tensor typed = t.to(host_dtype(t)).contiguous().reshape({-1});
    flat.push_back(typed.scalar_type() == torch::kFloat32 ? typed : typed.view(torch::kFloat32));
  }
  const torch::Tensor all = torch::cat(flat).to(torch::kCPU);  // the one transfer
  int64_t offset = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const torch::ScalarType dtype = host_dtype(sources[i]);
    const int64_t words = flat[i].numel();
    torch::Tensor part = all.narrow(/*dim=*/0, offset, words);
    if (dtype != torch::kFloat32) part = part.view(dtype);
    *outputs[i] = part.view(sources[i].sizes()).clone();
    offset += words;
  }
  return state;
}

absl::StatusOr<std::string> ExportTorchScript(const HostModelState& state, const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape) {
  TRAINERD_ASSIGN_OR_RETURN(const std::string source, TorchScriptSource(spec, input_shape));
  try {
    torch::NoGradGuard no_grad;
    auto unit = std::make_shared<torch::jit::CompilationUnit>();
    torch::jit::Module module(c10::QualifiedName("__torch__.trainerd.TrainerdModel"), unit,
                              /*shouldMangle=*/true);
    // nn.Module's flag: torch.jit.load's Python wrapper and Module::eval() read and write it.
    module.register_attribute("training", c10::BoolType::get(), false);
    // One submodule per layer that holds tensors, named by its place ("0", "2"), so that the
    // archive's state_dict() has nn.Sequential's keys ("0.weight", "2.bias") and loads into an
    // nn.Sequential built from the same spec.
    std::map<std::string, torch::jit::Module> layers;
    auto layer = [&](const std::string& index) -> torch::jit::Module& {
      auto it = layers.find(index);
      if (it == layers.end()) {
        size_t i = 0;
        if (!absl::SimpleAtoi(index, &i) || i >= spec.layers.size()) {
          throw std::runtime_error(absl::StrCat("no layer ", index, " in the spec"));
        }
        torch::jit::Module child(c10::QualifiedName(LayerClassName(spec.layers[i])), unit,
                                 /*shouldMangle=*/true);
        child.register_attribute("training", c10::BoolType::get(), false);
        it = layers.emplace(index, std::move(child)).first;
      }
      return it->second;
    };
    for (const auto& [name, value] : state.parameters) {
      const auto [index, leaf] = SplitName(name);
      // Its own leaf tensor, trainable as in torch.jit.script(model).save.
      layer(index).register_parameter(leaf, value.detach().clone().requires_grad_(true),
                                      /*is_buffer=*/false);
    }
    for (const auto& [name, value] : state.buffers) {
      const auto [index, leaf] = SplitName(name);
      layer(index).register_buffer(leaf, value.detach().clone());
    }
    // In the Sequential's order (numerically: "10" after "9").
    std::vector<std::pair<size_t, std::string>> order;
    for (const auto& [index, child] : layers) order.emplace_back(std::stoul(index), index);
    std::sort(order.begin(), order.end());
    for (const auto& [i, index] : order) module.register_module(index, layers.at(index));
    module.define(source);
    std::ostringstream out;
    module.save(out);
    return out.str();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot export the model as TorchScript: ", FirstLineOf(e)));
  }
}

absl::StatusOr<std::string> ExportTorchScript(const torch::nn::Sequential& model,
                                              const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape) {
  HostModelState state;
  try {
    state = CopyModelStateToHost(model);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot copy the model to the host: ", FirstLineOf(e)));
  }
  return ExportTorchScript(state, spec, input_shape);
}

absl::Status WriteModelArchive(const std::string& path, const std::string& archive) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (absl::Status made = MakeFoldersDurably(dir); !made.ok()) return made;
  return WriteFileAtomically(path, {archive});
}

}  // namespace trainerd::engine
