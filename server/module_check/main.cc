// trainerd-module-check: the first load and trial forward of a TorchScript module submitted with a
// job, in a process of its own (see server/engine/module_sandbox.h). trainerd starts it with the
// module's archive on standard input and the dataset's row shape as an argument, kills it at the
// check's deadline, and reads one result from standard output (EncodeModuleProbe). Before it reads
// a byte of the module it limits itself: CPU time, data memory, no file writes, no core dumps, no
// new privileges, and death with its parent.
//
// Usage: trainerd-module-check --feature_shape=1,28,28 --dataset=NAME
//            [--memory_limit_bytes=N] [--cpu_seconds=N] < module.pt
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_limits.h"
#include "server/engine/module_sandbox.h"
#include "server/engine/torchscript_module.h"

// Under AddressSanitizer (make test-asan) the checker cannot cap its data segment: ASan maps its
// shadow and allocator regions lazily and fails once RLIMIT_DATA is reached. ASan's own cap on a
// single allocation stands in for it there (an allocation over it returns null, which LibTorch
// reports as out of memory).
#if defined(__SANITIZE_ADDRESS__)
#define TRAINERD_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINERD_UNDER_ASAN 1
#endif
#endif
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

void Limit(int resource, rlim_t soft, rlim_t hard) {
  const rlimit limit{soft, hard};
  setrlimit(resource, &limit);
}

// The result, on standard output; the exit status says only whether one was written.
int Answer(const absl::StatusOr<trainerd::engine::ModuleProbe>& result) {
  std::cout << trainerd::engine::EncodeModuleProbe(result) << std::flush;
  return std::cout ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  if (!ParseArguments(argc, argv, &arguments)) {
    std::cerr << "usage: trainerd-module-check --feature_shape=D1,D2,... --dataset=NAME "
                 "[--memory_limit_bytes=N] [--cpu_seconds=N] < module.pt"
              << std::endl;
    return 2;
  }
  // Limits first, before the module is read.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (getppid() == 1) return 1;  // the daemon is already gone
  Limit(RLIMIT_CPU, static_cast<rlim_t>(arguments.cpu_seconds),
        static_cast<rlim_t>(arguments.cpu_seconds + 1));
#ifndef TRAINERD_UNDER_ASAN
  Limit(RLIMIT_DATA, static_cast<rlim_t>(arguments.memory_limit_bytes),
        static_cast<rlim_t>(arguments.memory_limit_bytes));
#endif
  Limit(RLIMIT_FSIZE, 0, 0);
  Limit(RLIMIT_CORE, 0, 0);
  at::set_num_threads(1);

  std::string archive;
  char buffer[1 << 16];
  while (true) {
    const size_t n = std::fread(buffer, 1, sizeof(buffer), stdin);
    if (n == 0) break;
    archive.append(buffer, n);
    if (static_cast<int64_t>(archive.size()) > trainerd::kMaxTorchScriptBytes) {
      return Answer(absl::ResourceExhaustedError(
          absl::StrCat("the TorchScript module is larger than ", trainerd::kMaxTorchScriptBytes,
                       " bytes")));
    }
  }
  return Answer(trainerd::engine::ProbeTorchScriptModule(archive, arguments.feature_shape,
                                                         arguments.dataset));
}
