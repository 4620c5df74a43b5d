// LoadTorchScriptModule: a user's TorchScript module, loaded and checked at Submit.
#include "server/engine/torchscript_module.h"

#include <exception>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/table.h"
#include "server/engine/loss.h"

namespace trainerd::engine {
namespace {

// The rows of the shape-check batch: 2 rather than 1, so that a module that squeezes or
// normalises over the batch (batchnorm in training mode needs more than one value) is seen with
// a real batch dimension.
constexpr int64_t kCheckRows = 2;

std::string FirstLine(const std::string& what) { return what.substr(0, what.find('\n')); }

// "[2, 1, 28, 28]": a batch's shape as PyTorch prints it (ShapeToString's "1x28x28" is per row).
std::string BatchShape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<LoadedTorchScript> LoadTorchScriptModule(const JobSpec& spec,
                                                        const DatasetMeta& dataset) {
  LoadedTorchScript loaded;
  try {
    std::istringstream in(spec.torchscript);
    // On the CPU whatever device it was saved from: the worker moves it to the job's device.
    loaded.module = std::make_shared<torch::jit::Module>(torch::jit::load(in, torch::kCPU));
  } catch (const std::exception& e) {  // c10::Error, and anything the archive reader throws
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be loaded: ", FirstLine(e.what())));
  }
  std::vector<int64_t> batch_shape = {kCheckRows};
  batch_shape.insert(batch_shape.end(), dataset.feature_shape.begin(),
                     dataset.feature_shape.end());
  try {
    for (const torch::Tensor& p : loaded.module->parameters()) {
      loaded.parameter_count += p.numel();
    }
    if (loaded.parameter_count == 0) {
      return absl::InvalidArgumentError(
          "the TorchScript module has no parameters to train; register its weights as "
          "parameters (nn.Parameter), not buffers");
    }
    // A copy in eval mode: the check must not change the job's module (its training flag, a
    // batchnorm's running statistics). Zeros are enough to check shapes.
    torch::NoGradGuard no_grad;
    torch::jit::Module copy = loaded.module->clone();
    copy.eval();
    const torch::Tensor x = torch::zeros(batch_shape, torch::kFloat32);
    torch::jit::IValue out;
    try {
      out = copy.forward({x});
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TorchScript module's forward does not accept a batch of shape ",
          BatchShape(batch_shape), " (dataset '", dataset.name, "' has ",
          ShapeToString(dataset.feature_shape), " features per row): ", FirstLine(e.what())));
    }
    if (!out.isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the TorchScript module's forward must return one tensor; it returned ",
                       out.tagKind()));
    }
    const torch::Tensor y = out.toTensor();
    if (y.dim() < 1 || y.size(0) != kCheckRows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TorchScript module's forward must return one output row per input row: a batch "
          "of shape ", BatchShape(batch_shape), " gave an output of shape ",
          BatchShape(y.sizes().vec())));
    }
    loaded.output_shape.assign(y.sizes().begin() + 1, y.sizes().end());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be checked: ", FirstLine(e.what())));
  }
  // The caller has set spec.model to the module's description, which CheckLoss's sentences name.
  absl::Status loss = CheckLoss(spec, loaded.output_shape, dataset);
  if (!loss.ok()) return loss;
  return loaded;
}

}  // namespace trainerd::engine
