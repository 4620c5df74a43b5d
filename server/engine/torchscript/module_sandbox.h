// Runs the first load and the trial forward of a submitted TorchScript module in a separate
// process, trainerd-module-check (server/module_check/), under a time limit and resource limits,
// so that a module that hangs, allocates without bound or crashes LibTorch costs that process
// and not the daemon: the daemon kills it at the deadline (DEADLINE_EXCEEDED). What the process
// reports is used only for the job's shapes; the security checks are repeated by the daemon on
// its own copy (module_check.h), so a process that lies gains nothing.
//
// The request travels on the process's standard input (its flags on a first line, then the
// archive) and the result on its standard output as a few lines of text (EncodeModuleProbe /
// DecodeModuleProbe). One checker is kept started and waiting (ModuleCheckerOptions::pool) so
// that a submission does not pay LibTorch's start; each checks one module and exits.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sandbox_report.h"
#include "server/engine/torchscript/sandbox_policy.h"

namespace trainerd::engine {

// Asked every 100 ms while a check runs: a status that is not OK ends the check at once (its
// checker killed) with that status; e.g. UNAVAILABLE when the daemon stops, CANCELLED when the
// call that asked for the check went away.
using CheckStop = std::function<absl::Status()>;

// What the checker learned from the module.
struct ModuleProbe {
  int64_t parameter_count = 0;        // values in all parameters
  std::vector<int64_t> output_shape;  // per row, from a forward on a batch of 2 rows
};

struct ModuleCheckerOptions {
  // The checker program (absolute path). Empty: submitted modules are refused with
  // FAILED_PRECONDITION.
  std::string program;
  // How long the load and the trial forward may take together.
  absl::Duration timeout = absl::Seconds(30);
  // The checker's address space beyond what it has mapped at its start (RLIMIT_AS), in bytes.
  int64_t memory_limit_bytes = int64_t{4} << 30;
  // Checkers kept started and waiting (LibTorch loaded, sandbox applied), so that a submission
  // does not wait for a process to start; each checks one module. 0: one started per module.
  int pool = 1;
  // What a checker's sandbox must hold before it is sent a module (sandbox_policy.h), and where
  // each checker's measured sandbox is published (optional; called on the checking thread).
  SandboxPolicy sandbox_policy;
  std::function<void(const SandboxReport&)> on_sandbox;
};

// Runs the checker on `archive` for dataset `dataset_name` (a valid dataset name), whose rows are
// shaped `feature_shape`, and waits
// for it until the options' timeout or `deadline`, whichever comes first. The checker's first line
// is its sandbox's report, completed from outside and held against the options' policy before the
// module is sent: a checker short of it gets nothing and the call is FAILED_PRECONDITION naming
// what it lacks and the fix. Returns the checker's
// verdict: its INVALID_ARGUMENT / PERMISSION_DENIED sentences as they are; DEADLINE_EXCEEDED
// when it ran out of time (it is then killed); INVALID_ARGUMENT when it died on the module
// (a crash or a resource limit); INTERNAL when it could not be started; `stop`'s status when it
// (optional) said to stop meanwhile. Blocks: call it off the gRPC threads.
absl::StatusOr<ModuleProbe> RunModuleChecker(const ModuleCheckerOptions& options,
                                             std::string_view archive,
                                             const std::vector<int64_t>& feature_shape,
                                             const std::string& dataset_name, absl::Time deadline,
                                             const CheckStop& stop = nullptr);

// Starts (or takes) a checker and reads its sandbox's report, completed from outside and published
// through the options' on_sandbox, without sending it a module: the checker stays waiting for the
// next one. For the daemon's start, so that its listing and metrics show the sandbox before the
// first submission. DEADLINE_EXCEEDED when it did not report by `deadline`.
absl::StatusOr<SandboxReport> MeasureCheckerSandbox(const ModuleCheckerOptions& options,
                                                    absl::Time deadline);

// Kills and reaps the checkers left waiting for `options.program`: at an engine's shutdown, since
// each dies with the thread that started it (PR_SET_PDEATHSIG) and must not be taken meanwhile.
void DiscardIdleCheckers(const ModuleCheckerOptions& options);

// The checker's output for a result, and back. Decoding never trusts the text: malformed output
// is INTERNAL.
std::string EncodeModuleProbe(const absl::StatusOr<ModuleProbe>& result);
absl::StatusOr<ModuleProbe> DecodeModuleProbe(std::string_view text);

// The checker's command-line arguments for these limits, and the limits it applies to itself.
std::vector<std::string> ModuleCheckerArguments(const ModuleCheckerOptions& options,
                                                const std::vector<int64_t>& feature_shape,
                                                const std::string& dataset_name);

}  // namespace trainerd::engine
