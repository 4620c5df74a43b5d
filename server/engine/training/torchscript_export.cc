// ExportTorchScript: a trained torch::nn::Sequential as a TorchScript archive.
//
// LibTorch's C++ API cannot script a C++ module (torch.jit.script exists only in Python), so the
// exported module is assembled by hand: a torch::jit::Module whose forward is TorchScript source
// generated from the model spec (module.define), with every trained tensor registered as a
// parameter or buffer of that module. The source calls the same ATen operators that the C++
// layers call, so the exported forward computes what the trained model computes in eval mode.
#include "server/engine/training/torchscript_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/script.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
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

// The TorchScript parameter or buffer name of a Sequential entry: "3.running_mean" becomes
// "l3_running_mean" (TorchScript attribute names cannot hold dots).
std::string ExportName(const std::string& sequential_name) {
  std::string name = absl::StrCat("l", sequential_name);
  for (char& c : name) {
    if (c == '.') c = '_';
  }
  return name;
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
    const std::string p = absl::StrCat("self.l", i, "_");  // this layer's tensors
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
    if (b.key().find("num_batches_tracked") != std::string::npos) continue;
    state.buffers.emplace_back(b.key(), torch::Tensor());
    sources.push_back(b.value().detach());
  }
  for (auto& [name, t] : state.parameters) outputs.push_back(&t);
  for (auto& [name, t] : state.buffers) outputs.push_back(&t);
  if (sources.empty()) return state;

  // Float32: the dtype the model trains in and that the exported forward expects.
  if (sources.front().device().is_cpu()) {
    for (size_t i = 0; i < sources.size(); ++i) {
      *outputs[i] = sources[i].to(torch::kFloat32).clone();
    }
    return state;
  }
  std::vector<torch::Tensor> flat;
  flat.reserve(sources.size());
  for (const torch::Tensor& t : sources) flat.push_back(t.to(torch::kFloat32).reshape({-1}));
  const torch::Tensor all = torch::cat(flat).to(torch::kCPU);  // the one transfer
  int64_t offset = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const int64_t n = sources[i].numel();
    *outputs[i] = all.narrow(/*dim=*/0, offset, n).view(sources[i].sizes()).clone();
    offset += n;
  }
  return state;
}

absl::StatusOr<std::string> ExportTorchScript(const HostModelState& state, const ModelSpec& spec,
                                              const std::vector<int64_t>& input_shape) {
  TRAINERD_ASSIGN_OR_RETURN(const std::string source, TorchScriptSource(spec, input_shape));
  try {
    torch::NoGradGuard no_grad;
    torch::jit::Module module("TrainerdModel");
    // nn.Module's flag: torch.jit.load's Python wrapper and Module::eval() read and write it.
    module.register_attribute("training", c10::BoolType::get(), false);
    for (const auto& [name, value] : state.parameters) {
      // Its own leaf tensor, trainable as in torch.jit.script(model).save.
      module.register_parameter(ExportName(name), value.detach().clone().requires_grad_(true),
                                /*is_buffer=*/false);
    }
    for (const auto& [name, value] : state.buffers) {
      module.register_buffer(ExportName(name), value.detach().clone());
    }
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
