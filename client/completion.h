// `trainctl completion bash|zsh`: a shell script, generated from the command table (cli.h), that
// completes commands, flags, the names flags take (losses, optimizers, output formats, ...), file
// names where a flag takes a file, and, through `trainctl __complete`, the daemon's dataset names
// and job ids. No gRPC, no I/O.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace trainerd::client {

// The script for `shell` ("bash" or "zsh"; zsh runs the bash function through bashcompinit).
// INVALID_ARGUMENT for another shell.
absl::StatusOr<std::string> CompletionScript(const std::string& shell);

}  // namespace trainerd::client
