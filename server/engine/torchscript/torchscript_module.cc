// ProbeTorchScriptModule (the checker process's side) and LoadTorchScriptModule (the daemon's).
#include "server/engine/torchscript/torchscript_module.h"

#include <exception>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_limits.h"
#include "common/status_macros.h"
#include "common/table.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/module_check.h"
#include "server/engine/training/exported_program.h"
#include "server/engine/training/loss.h"

namespace trainerd::engine {
namespace {

// The rows of the shape-check batch: 2 rather than 1, so that a module that squeezes or
// normalises over the batch (batchnorm in training mode needs more than one value) is seen with
// a real batch dimension.
constexpr int64_t kCheckRows = 2;

// "[2, 1, 28, 28]": a batch's shape as PyTorch prints it (ShapeToString's "1x28x28" is per row).
std::string BatchShape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// torch::jit::load from memory onto the CPU, whatever device the module was saved from. Runs no
// code of the module when CheckTorchScriptArchive passed (no __setstate__, no custom classes).
absl::StatusOr<std::shared_ptr<torch::jit::Module>> LoadArchive(std::string_view archive) {
  try {
    std::istringstream in{std::string(archive)};
    return std::make_shared<torch::jit::Module>(torch::jit::load(in, torch::kCPU));
  } catch (const std::exception& e) {  // c10::Error, and anything the archive reader throws
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be loaded: ", FirstLineOf(e)));
  }
}

absl::StatusOr<int64_t> CountModuleParameters(const torch::jit::Module& module) {
  int64_t count = 0;
  try {
    for (const torch::Tensor& p : module.parameters()) count += p.numel();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be checked: ", FirstLineOf(e)));
  }
  if (count == 0) {
    return absl::InvalidArgumentError(
        "the TorchScript module has no parameters to train; register its weights as "
        "parameters (nn.Parameter), not buffers");
  }
  return count;
}

// The checker's work on an exported program: CheckExportedProgram, its input against the
// dataset's rows, the load, and an evaluation-mode forward on zeros (which changes nothing of the
// program: no buffer is mutated in evaluation mode).
absl::StatusOr<ModuleProbe> ProbeExportedProgram(std::string_view archive,
                                                 const std::vector<int64_t>& feature_shape,
                                                 const std::string& dataset_name) {
  TRAINERD_ASSIGN_OR_RETURN(const ExportedProgramInfo info, CheckExportedProgram(archive));
  if (info.input_shape != feature_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the exported program takes rows shaped ", ShapeToString(info.input_shape),
        "; dataset '", dataset_name, "' has ", ShapeToString(feature_shape),
        " features per row (export the module with an example batch of the dataset's rows)"));
  }
  if (info.parameter_count == 0) {
    return absl::InvalidArgumentError(
        "the exported program has no parameters to train; register its weights as parameters "
        "(nn.Parameter), not buffers");
  }
  TRAINERD_ASSIGN_OR_RETURN(std::shared_ptr<ExportedProgram> program,
                            ExportedProgram::Load(archive));
  std::vector<int64_t> batch_shape = {kCheckRows};
  batch_shape.insert(batch_shape.end(), feature_shape.begin(), feature_shape.end());
  ModuleProbe probe;
  probe.parameter_count = info.parameter_count;
  try {
    torch::NoGradGuard no_grad;
    program->Train(false);
    const torch::Tensor y = program->Forward(torch::zeros(batch_shape, torch::kFloat32));
    if (y.dim() < 1 || y.size(0) != kCheckRows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the exported program must return one output row per input row: a batch of shape ",
          BatchShape(batch_shape), " gave an output of shape ", BatchShape(y.sizes().vec())));
    }
    probe.output_shape.assign(y.sizes().begin() + 1, y.sizes().end());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the exported program's forward does not accept a batch of shape ",
                     BatchShape(batch_shape), ": ", FirstLineOf(e)));
  }
  if (probe.output_shape != info.output_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the exported program's output is shaped ", ShapeToString(probe.output_shape),
        " per row where its graph says ", ShapeToString(info.output_shape)));
  }
  return probe;
}

}  // namespace

absl::StatusOr<ModuleProbe> ProbeTorchScriptModule(std::string_view archive,
                                                   const std::vector<int64_t>& feature_shape,
                                                   const std::string& dataset_name) {
  if (IsExportedProgramArchive(archive)) {
    return ProbeExportedProgram(archive, feature_shape, dataset_name);
  }
  absl::Status archive_ok = CheckTorchScriptArchive(archive);
  if (!archive_ok.ok()) return archive_ok;
  absl::StatusOr<std::shared_ptr<torch::jit::Module>> module = LoadArchive(archive);
  if (!module.ok()) return module.status();
  absl::Status operators = CheckModuleOperators(**module);
  if (!operators.ok()) return operators;
  ModuleProbe probe;
  absl::StatusOr<int64_t> parameters = CountModuleParameters(**module);
  if (!parameters.ok()) return parameters.status();
  probe.parameter_count = *parameters;
  std::vector<int64_t> batch_shape = {kCheckRows};
  batch_shape.insert(batch_shape.end(), feature_shape.begin(), feature_shape.end());
  try {
    // A copy in eval mode: the check must not change the module (its training flag, a
    // batchnorm's running statistics). Zeros are enough to check shapes.
    torch::NoGradGuard no_grad;
    torch::jit::Module copy = (*module)->clone();
    copy.eval();
    const torch::Tensor x = torch::zeros(batch_shape, torch::kFloat32);
    torch::jit::IValue out;
    try {
      out = copy.forward({x});
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the TorchScript module's forward does not accept a batch of shape ",
                       BatchShape(batch_shape), " (dataset '", dataset_name, "' has ",
                       ShapeToString(feature_shape), " features per row): ", FirstLineOf(e)));
    }
    if (!out.isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TorchScript module's forward must return one tensor; it returned ", out.tagKind()));
    }
    const torch::Tensor y = out.toTensor();
    if (y.dim() < 1 || y.size(0) != kCheckRows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TorchScript module's forward must return one output row per input row: a batch "
          "of shape ",
          BatchShape(batch_shape), " gave an output of shape ", BatchShape(y.sizes().vec())));
    }
    probe.output_shape.assign(y.sizes().begin() + 1, y.sizes().end());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be checked: ", FirstLineOf(e)));
  }
  return probe;
}

absl::StatusOr<std::shared_ptr<torch::jit::Module>> LoadCheckedModule(std::string_view archive) {
  TRAINERD_RETURN_IF_ERROR(CheckTorchScriptArchive(archive));
  TRAINERD_ASSIGN_OR_RETURN(std::shared_ptr<torch::jit::Module> module, LoadArchive(archive));
  TRAINERD_RETURN_IF_ERROR(CheckModuleOperators(*module));
  TRAINERD_RETURN_IF_ERROR(CountModuleParameters(*module).status());
  return module;
}

absl::StatusOr<LoadedTorchScript> LoadTorchScriptModule(const JobSpec& spec,
                                                        const DatasetMeta& dataset,
                                                        const ModuleCheckerOptions& checker,
                                                        absl::Time deadline,
                                                        const CheckStop& stop) {
  absl::StatusOr<ModuleProbe> probe = RunModuleChecker(
      checker, spec.torchscript, dataset.feature_shape, dataset.name, deadline, stop);
  if (!probe.ok()) return probe.status();
  // The checker's word is not trusted for safety: the archive check again on the daemon's own
  // copy (data only; nothing of the module is loaded here).
  const bool exported = IsExportedProgramArchive(spec.torchscript);
  if (exported) {
    // The reader and checker again; they allocate no tensor and run no operator.
    TRAINERD_ASSIGN_OR_RETURN(const ExportedProgramInfo info,
                              CheckExportedProgram(spec.torchscript));
    if (info.input_shape != dataset.feature_shape) {
      return absl::InvalidArgumentError("the exported program does not take the dataset's rows");
    }
  } else {
    absl::Status archive_ok = CheckTorchScriptArchive(spec.torchscript);
    if (!archive_ok.ok()) return archive_ok;
  }
  LoadedTorchScript loaded;
  loaded.parameter_count = probe->parameter_count;
  if (loaded.parameter_count > kMaxModelParameters) {
    return absl::ResourceExhaustedError(
        absl::StrCat(exported ? "the exported program" : "the TorchScript module", " has ",
                     loaded.parameter_count, " parameters; at most ",
                     kMaxModelParameters, " are allowed"));
  }
  loaded.output_shape = probe->output_shape;
  // The caller has set spec.model to the module's description, which CheckLoss's sentences name.
  absl::Status loss = CheckLoss(spec, loaded.output_shape, dataset);
  if (!loss.ok()) return loss;
  return loaded;
}

}  // namespace trainerd::engine
