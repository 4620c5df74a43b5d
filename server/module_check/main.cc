// trainerd-module-check: the first load and trial forward of a TorchScript module submitted with a
// job, in a process of its own (see server/engine/torchscript/module_sandbox.h). trainerd starts it with the
// module's archive on standard input and the dataset's row shape as an argument, kills it at the
// check's deadline, and reads one result from standard output (EncodeModuleProbe), after a first
// line "sandbox REPORT" (common/sandbox_report.h) that it writes once confined. Before it reads
// a byte of the module it confines itself as the worker does (server/worker/sandbox.h: its own
// network, user nobody when root, no files, no processes, seccomp, limits on CPU time and address
// space, death with its parent).
//
// Usage: trainerd-module-check --feature_shape=1,28,28 --dataset=NAME
//            [--memory_limit_bytes=N] [--cpu_seconds=N] < module.pt
//    or: trainerd-module-check < REQUEST, whose first line holds those flags: the daemon keeps one
//        such checker started (LibTorch loaded, sandbox applied) so that a submission does not
//        wait for a process to start.
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_limits.h"
#include "common/sandbox_report.h"
#include "server/engine/torchscript/module_sandbox.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "server/worker/sandbox.h"
#include "server/worker/under_asan.h"

// Under AddressSanitizer (make test-asan) the checker cannot cap its data segment: ASan maps its
// shadow and allocator regions lazily and fails once RLIMIT_DATA is reached. ASan's own cap on a
// single allocation stands in for it there (an allocation over it returns null, which LibTorch
// reports as out of memory).
#ifdef TRAINERD_UNDER_ASAN
extern "C" const char* __asan_default_options() {
  return "max_allocation_size_mb=4096:allocator_may_return_null=1:detect_leaks=0";
}
#endif

namespace {

struct Arguments {
  std::vector<int64_t> feature_shape;
  std::string dataset;
  int64_t memory_limit_bytes = int64_t{4} << 30;
  int64_t cpu_seconds = 31;
};

bool ParseArguments(int argc, char** argv, Arguments* out) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    absl::string_view value = arg;
    if (absl::StartsWith(arg, "--feature_shape=")) {
      value.remove_prefix(16);
      for (absl::string_view d : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int64_t dim = 0;
        if (!absl::SimpleAtoi(d, &dim) || dim < 1) return false;
        out->feature_shape.push_back(dim);
      }
    } else if (absl::StartsWith(arg, "--dataset=")) {
      out->dataset = std::string(value.substr(10));
    } else if (absl::StartsWith(arg, "--memory_limit_bytes=")) {
      if (!absl::SimpleAtoi(value.substr(21), &out->memory_limit_bytes)) return false;
    } else if (absl::StartsWith(arg, "--cpu_seconds=")) {
      if (!absl::SimpleAtoi(value.substr(14), &out->cpu_seconds)) return false;
    } else {
      return false;
    }
  }
  return !out->feature_shape.empty();
}

// The result, on standard output; the exit status says only whether one was written. The
// process ends at once: its standard streams closed first, so that the daemon has the whole
// answer as soon as it is written, and by _exit, without LibTorch's teardown (static destructors
// that deregister every operator, a tenth of a second the daemon would wait for at each
// submission).
[[noreturn]] void Answer(const absl::StatusOr<trainerd::engine::ModuleProbe>& result) {
  std::cout << trainerd::engine::EncodeModuleProbe(result) << std::flush;
  const int status = std::cout ? 0 : 1;
  std::cerr << std::flush;
  ::close(STDOUT_FILENO);
  ::close(STDERR_FILENO);
  ::_exit(status);
}

}  // namespace

int main(int argc, char** argv) {
  // Confined before it reads a byte of anything: the worker's sandbox (server/worker/sandbox.h),
  // so that a checker kept warm by the daemon waits for its module already locked down.
  trainerd::SandboxReport report;
  report.program = "trainerd-module-check";
  const std::vector<std::string> namespaces = trainerd::worker::EnterNamespaces(&report);
  if (getppid() == 1) return 1;  // the daemon is already gone
  Arguments arguments;
  if (argc > 1) {
    if (!ParseArguments(argc, argv, &arguments)) {
      std::cerr << "usage: trainerd-module-check --feature_shape=D1,D2,... --dataset=NAME "
                   "[--memory_limit_bytes=N] [--cpu_seconds=N] < module.pt\n"
                   "   or: trainerd-module-check < REQUEST (its first line: the same flags)"
                << std::endl;
      return 2;
    }
  }
  at::set_num_threads(1);
  trainerd::worker::SandboxOptions sandbox;
  sandbox.max_threads = 64;
  absl::StatusOr<std::vector<std::string>> locked = trainerd::worker::LockDown(sandbox, &report);
  if (!locked.ok()) {
    std::cerr << "trainerd-module-check: " << locked.status().message() << std::endl;
    return 1;
  }
  // What is in force, as measured, before a byte of the request is read: the daemon sends the
  // module only to a checker whose sandbox holds what it requires.
  std::cout << "sandbox " << trainerd::EncodeSandboxReport(report) << std::endl;
  if (argc == 1) {
    // A warm checker: its arguments are the request's first line.
    std::string line;
    if (!std::getline(std::cin, line)) return 1;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    std::vector<char*> fake = {argv[0]};
    for (std::string& w : words) fake.push_back(w.data());
    if (!ParseArguments(static_cast<int>(fake.size()), fake.data(), &arguments)) {
      std::cerr << "trainerd-module-check: a malformed request line" << std::endl;
      return 2;
    }
  }
  trainerd::worker::SandboxOptions limits;
  limits.cpu_seconds = arguments.cpu_seconds;
#ifndef TRAINERD_UNDER_ASAN
  limits.address_space_bytes = arguments.memory_limit_bytes;
#endif
  if (absl::Status limited = trainerd::worker::ApplyJobLimits(limits); !limited.ok()) {
    std::cerr << "trainerd-module-check: " << limited.message() << std::endl;
    return 1;
  }

  std::string archive;
  char buffer[1 << 16];
  while (true) {
    std::cin.read(buffer, sizeof(buffer));
    const std::streamsize n = std::cin.gcount();
    if (n <= 0) break;
    archive.append(buffer, static_cast<size_t>(n));
    if (static_cast<int64_t>(archive.size()) > trainerd::kMaxTorchScriptBytes) {
      Answer(absl::ResourceExhaustedError(absl::StrCat(
          "the TorchScript module is larger than ", trainerd::kMaxTorchScriptBytes, " bytes")));
    }
  }
  Answer(trainerd::engine::ProbeTorchScriptModule(archive, arguments.feature_shape,
                                                         arguments.dataset));
}
