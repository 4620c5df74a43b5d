// trainctl: the command-line client of trainerd. Parses the command line, then runs one command;
// see client/cli.cc for the commands and `trainctl --help` for their use.
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli.h"
#include "client/commands.h"

int main(int argc, char** argv) {
  using trainerd::client::Invocation;
  const char* env_address = std::getenv("TRAINERD_ADDR");
  absl::StatusOr<Invocation> invocation = trainerd::client::ParseCommandLine(
      std::vector<std::string>(argv, argv + argc),
      env_address == nullptr ? std::nullopt : std::optional<std::string>(env_address));
  if (!invocation.ok()) {
    trainerd::client::PrintError(invocation.status().message());
    return trainerd::client::kExitUsage;
  }
  if (invocation->show_help) {
    std::cout << invocation->help_text << std::flush;
    return trainerd::client::kExitOk;
  }
  return trainerd::client::RunCommand(*invocation);
}
