// trainctl's commands: each takes a parsed command line, talks to trainerd and prints the result
// (stdout) or one error line (stderr).
#pragma once

#include "absl/strings/string_view.h"
#include "client/cli.h"

namespace trainerd::client {

// Runs `invocation.command` and returns the process exit code (kExitOk, kExitFailure,
// kExitUsage). The invocation must not be a help request.
int RunCommand(const Invocation& invocation);

// Prints "trainctl: <message>" as one line on stderr.
void PrintError(absl::string_view message);

}  // namespace trainerd::client
