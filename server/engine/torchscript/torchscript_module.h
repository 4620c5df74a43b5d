// "Bring your own model": a TorchScript module uploaded with a job (JobSpec::torchscript, the bytes
// torch.jit.save writes) is checked as code and against the dataset at Submit, so that a module
// that may not run here, or cannot train on the dataset, fails there rather than at epoch 1.
//
// The check has two halves. ProbeTorchScriptModule is what the separate checker process
// (trainerd-module-check, run by module_sandbox.h under a time limit) does with the untrusted
// bytes: the archive check, the first load, the operator allow-list (module_check.h), and a trial
// forward. LoadTorchScriptModule is the daemon's side: it runs that process, then repeats the
// security checks on its own load (which runs no code of the module once the archive check
// passed) and checks the loss against the output shape the probe found.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/torchscript/module_sandbox.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// The JobSpec::model text a TorchScript job may give instead of an empty one.
inline constexpr char kTorchScriptModelName[] = "torchscript";

// What the daemon knows of a module that passed LoadTorchScriptModule. The daemon never loads a
// submitted module itself (LibTorch trusts an archive's tensor metadata, and the interpreter
// cannot be interrupted): the job trains it in a worker process (worker_launcher.h), which loads
// it with LoadCheckedModule.
struct LoadedTorchScript {
  std::vector<int64_t> output_shape;  // per row, from the checker's forward on a batch of 2 rows
  int64_t parameter_count = 0;        // values in all parameters, as the checker counted them
};

// The worker's load of an archive that the daemon accepted: CheckTorchScriptArchive,
// torch::jit::load onto the CPU, CheckModuleOperators and at least one parameter, as at the check.
// Never throws.
absl::StatusOr<std::shared_ptr<torch::jit::Module>> LoadCheckedModule(std::string_view archive);

// The checker's work on an untrusted archive, for rows shaped `feature_shape`:
// CheckTorchScriptArchive, torch::jit::load from memory onto the CPU, CheckModuleOperators, at
// least one parameter, and a forward of an eval-mode copy under NoGradGuard on zeros shaped
// [2, *feature_shape] that returns one tensor with the batch dimension first. INVALID_ARGUMENT or
// PERMISSION_DENIED with a sentence otherwise. Never throws.
// `dataset_name` only names the dataset in sentences.
absl::StatusOr<ModuleProbe> ProbeTorchScriptModule(std::string_view archive,
                                                   const std::vector<int64_t>& feature_shape,
                                                   const std::string& dataset_name);

// The daemon's side: runs the checker (RunModuleChecker with `checker`, until `deadline` at the
// latest), then CheckTorchScriptArchive on its own copy of the bytes (which reads the archive's
// records and pickles as data, never loading them), the checker's parameter count against
// kMaxModelParameters (RESOURCE_EXHAUSTED) and the loss against the probe's output shape
// (CheckLoss). Blocks for as long as the checker runs (`stop`, when set, ends it with its status):
// call it off the gRPC threads. Never throws.
absl::StatusOr<LoadedTorchScript> LoadTorchScriptModule(const JobSpec& spec,
                                                        const DatasetMeta& dataset,
                                                        const ModuleCheckerOptions& checker,
                                                        absl::Time deadline,
                                                        const CheckStop& stop = nullptr);

}  // namespace trainerd::engine
