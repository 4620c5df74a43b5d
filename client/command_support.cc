// What every command of trainctl uses (client/command_support.h): the failures and the printing
// in the -o format asked for.
#include "client/command_support.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/output.h"
#include "common/safe_text.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/status.h"

namespace trainerd::client {

int UsageFailure(const absl::Status& status) {
  PrintError(status.message());
  return kExitUsage;
}

int RpcFailure(const CommandContext& context, const grpc::Status& status, absl::Duration timeout,
               bool had_replies) {
  PrintError(context.connection.DescribeError(status, timeout, had_replies));
  return kExitFailure;
}

int UnaryRpcFailure(const CommandContext& context, const grpc::Status& status) {
  return RpcFailure(context, status, context.invocation.global.timeout);
}

int PrintStructured(OutputFormat format, const std::string& json, bool stream) {
  if (format == OutputFormat::kYaml) {
    absl::StatusOr<std::string> yaml = JsonToYaml(json);
    if (!yaml.ok()) {
      PrintError(yaml.status().message());
      return kExitFailure;
    }
    std::cout << (stream ? "---\n" : "") << *yaml << std::flush;
    return kExitOk;
  }
  std::cout << json << std::endl;
  return kExitOk;
}

int PrintMessage(const CommandContext& context, const google::protobuf::Message& message,
                 bool stream) {
  absl::StatusOr<std::string> json = ToJson(message, /*pretty=*/!stream);
  if (!json.ok()) {
    PrintError(json.status().message());
    return kExitFailure;
  }
  return PrintStructured(context.format, *json, stream);
}

int PrintNames(const std::vector<std::string>& names) {
  for (const std::string& name : names) std::cout << EscapeControls(name) << "\n";
  std::cout << std::flush;
  return kExitOk;
}

int PrintText(const std::string& text) {
  // Views keep their lines; any control character that reached one from the daemon (a name, an
  // error, a spec) is shown escaped rather than obeyed by the terminal.
  std::cout << EscapeControls(text, LineBreaks::kKeep) << std::flush;
  return kExitOk;
}

}  // namespace trainerd::client
