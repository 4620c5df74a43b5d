// The commands of trainctl. Each one checks what it can locally (exit 2 on bad input, before any
// connection), makes its calls with a deadline (uploads: a long one; watching: none), and prints
// a table or JSON. Errors from trainerd become one line on stderr and exit 1.
//
// This file holds RunCommand, which reads the config file when a context is wanted, connects and
// hands the command to its handler; the handlers are in dataset_commands.cc, job_commands.cc,
// sweep_commands.cc, device_commands.cc and other_commands.cc, and what they share in
// command_support.h.
#include "client/commands.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/cli.h"
#include "client/command_support.h"
#include "client/completion.h"
#include "client/connection.h"
#include "client/contexts.h"
#include "client/output.h"
#include "common/safe_text.h"
#include "common/version.h"

namespace trainerd::client {
namespace {

// Commands whose output -o name can give.
bool SupportsNameOutput(absl::string_view path) {
  static constexpr absl::string_view kPaths[] = {
      "dataset upload", "dataset list", "dataset get", "dataset rm", "submit",
      "sweep",          "job list",     "job get",     "job wait",   "job cancel",
      "job rm",         "job model",    "job checkpoint", "devices",     "version",    "config get-contexts",
      "__complete"};
  return std::find(std::begin(kPaths), std::end(kPaths), path) != std::end(kPaths);
}

}  // namespace

void PrintError(absl::string_view message) {
  std::cout.flush();
  // Messages quote the daemon: its control characters are shown, not obeyed.
  std::cerr << "trainctl: " << EscapeControls(message, LineBreaks::kKeep) << std::endl;
}

int RunCommand(const Invocation& invocation) {
  using Handler = int (*)(const CommandContext&);
  static const std::pair<absl::string_view, Handler> kHandlers[] = {
      {"dataset upload", DatasetUpload},
      {"dataset list", DatasetList},
      {"dataset get", DatasetGet},
      {"dataset rm", DatasetRemove},
      {"dataset share", [](const CommandContext& c) { return DatasetShare(c, true); }},
      {"dataset unshare", [](const CommandContext& c) { return DatasetShare(c, false); }},
      {"submit", Submit},
      {"sweep", Sweep},
      {"job list", JobList},
      {"job get", JobGet},
      {"job watch", JobWatch},
      {"job wait", JobWait},
      {"job cancel", JobCancel},
      {"job rm", JobRemove},
      {"job model", JobModel},
      {"job checkpoint", JobCheckpoint},
      {"devices", Devices},
      {"top", Top},
      {"diagnose", Diagnose},
      {"health", Health},
      {"version", Version},
      {"__complete", Complete},
  };
  // The config file, read only when a context may be wanted: a command with --addr works
  // whatever state the file is in.
  const std::string config_path = ConfigPath(std::getenv("TRAINCTL_CONFIG"),
                                             std::getenv("XDG_CONFIG_HOME"), std::getenv("HOME"));
  const std::string path =
      invocation.command == nullptr ? "" : std::string(invocation.command->path);
  // Offline commands: nothing to connect to, no config to read.
  if (path == "version" && invocation.Has("client")) {
    if (invocation.global.output == OutputFormat::kJson ||
        invocation.global.output == OutputFormat::kYaml) {
      return PrintStructured(
          invocation.global.output,
          absl::StrCat("{\n \"client_version\": ", JsonString(TrainerdVersion()), "\n}"),
          /*stream=*/false);
    }
    if (invocation.global.output == OutputFormat::kName) return PrintNames({TrainerdVersion()});
    return PrintText(absl::StrCat("trainctl  ", TrainerdVersion(), "\n"));
  }
  if (path == "completion") {
    absl::StatusOr<std::string> script = CompletionScript(invocation.args.at(0));
    if (!script.ok()) return UsageFailure(script.status());
    return PrintText(*script);
  }
  if (invocation.global.output == OutputFormat::kName && !SupportsNameOutput(path)) {
    return UsageFailure(absl::InvalidArgumentError(
        absl::StrCat("'", path,
                     "' has no names to print: -o name works with dataset and job commands, sweep, "
                     "submit, devices, version and config get-contexts")));
  }
  const bool config_command = absl::StartsWith(path, "config ");
  const bool all_contexts = path == "devices" && invocation.Has("all-contexts");
  Invocation resolved = invocation;
  if (config_command || all_contexts || !invocation.global.context.empty() ||
      (!invocation.global.address_given && !invocation.global.address_from_env)) {
    absl::StatusOr<ClientConfig> config = LoadClientConfig(config_path);
    if (!config.ok()) return UsageFailure(config.status());
    if (config_command) return ConfigCommand(invocation, *std::move(config), config_path);
    if (all_contexts) return DevicesAllContexts(invocation, *config, config_path);
    if (absl::Status applied = ApplyContext(*config, config_path, resolved.global); !applied.ok()) {
      return UsageFailure(applied);
    }
  }
  absl::StatusOr<ClientSecurity> security =
      LoadClientSecurity(resolved.global, std::getenv("TRAINERD_TOKEN"));
  if (!security.ok()) {
    PrintError(security.status().message());
    return kExitUsage;
  }
  Connection connection({resolved.global.address, resolved.global.timeout, *security});
  const OutputFormat format = resolved.global.output;
  const CommandContext context{
      resolved,
      connection,
      format,
      format == OutputFormat::kJson || format == OutputFormat::kYaml,
      format == OutputFormat::kName,
      TableOptions{format == OutputFormat::kWide, !resolved.global.no_headers}};
  for (const auto& [path, handler] : kHandlers) {
    if (invocation.command != nullptr && invocation.command->path == path) return handler(context);
  }
  PrintError(absl::StrCat("no handler for command '",
                          invocation.command == nullptr ? "" : invocation.command->path, "'"));
  return kExitUsage;
}

}  // namespace trainerd::client
