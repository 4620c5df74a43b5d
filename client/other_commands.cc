// trainctl's commands outside the dataset, job, sweep and device groups: version, health,
// __complete (names for the completion scripts) and the config commands, which edit the contexts
// of trainctl's config file without a connection. (`completion` and `version --client` need
// nothing from a daemon: RunCommand in commands.cc answers them.)
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/command_support.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/contexts.h"
#include "client/health_check.h"
#include "client/output.h"
#include "common/version.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::client {
namespace {

std::string OrDashText(const std::string& text) { return text.empty() ? "-" : text; }

}  // namespace

// `version`: trainctl's version, then the daemon's (GetVersion). --client is answered in
// RunCommand, before any connection.
int Version(const CommandContext& context) {
  v1::VersionInfo server;
  const grpc::Status status = context.connection.Call(
      context.connection.system(), &v1::SystemService::Stub::GetVersion, v1::GetVersionRequest(),
      &server);
  if (!status.ok()) {
    if (!context.structured && !context.names) {
      std::cout << "trainctl  " << TrainerdVersion() << std::endl;
    }
    return UnaryRpcFailure(context, status);
  }
  if (context.names) return PrintNames({server.trainerd_version()});
  if (context.structured) {
    absl::StatusOr<std::string> json = ToJson(server, /*pretty=*/true);
    if (!json.ok()) return UsageFailure(json.status());
    return PrintStructured(context.format,
                           absl::StrCat("{\n \"client_version\": ", JsonString(TrainerdVersion()),
                                        ",\n \"server\": ", *json, "\n}"),
                           /*stream=*/false);
  }
  return PrintText(KeyValueLines({
      {"trainctl", TrainerdVersion()},
      {"trainerd", OrDashText(server.trainerd_version())},
      {"libtorch", OrDashText(server.libtorch_version())},
      {"cuda", server.cuda_version().empty() ? "- (CPU-only LibTorch)" : server.cuda_version()},
      {"driver", OrDashText(server.driver_version())},
  }));
}

// `__complete datasets|jobs`, for the completion scripts: names or ids, one per line, from one
// quick call; nothing (and exit 0) when the daemon does not answer within a second, so that a
// Tab press never hangs or prints errors.
int Complete(const CommandContext& context) {
  constexpr absl::Duration kCompletionDeadline = absl::Seconds(1);
  const std::string& what = context.invocation.args.at(0);
  grpc::ClientContext call;
  Connection::SetDeadline(&call, kCompletionDeadline);
  std::vector<std::string> names;
  if (what == "datasets") {
    v1::ListDatasetsResponse response;
    if (context.connection.datasets()
            .ListDatasets(&call, v1::ListDatasetsRequest(), &response)
            .ok()) {
      for (const v1::Dataset& dataset : response.datasets()) names.push_back(dataset.name());
    }
  } else if (what == "jobs") {
    v1::ListJobsRequest request;
    request.set_page_size(200);
    request.set_newest_first(true);
    v1::ListJobsResponse response;
    if (context.connection.jobs().ListJobs(&call, request, &response).ok()) {
      for (const v1::Job& job : response.jobs()) names.push_back(job.id());
    }
  }
  return PrintNames(names);
}

int Health(const CommandContext& context) {
  const std::string service = context.invocation.args.empty() ? "" : context.invocation.args[0];
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  int64_t serving_status = 0;
  grpc::Status status = CheckHealth(context.connection.channel(), &call, service, &serving_status);
  // The health protocol answers NOT_FOUND for a service it has no status for.
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    serving_status = kHealthServiceUnknown;
  } else if (!status.ok()) {
    return UnaryRpcFailure(context, status);
  }
  const std::string name = ServingStatusName(serving_status);
  if (context.structured) {
    PrintStructured(context.format, absl::StrCat("{\n \"status\": \"", name, "\"\n}"),
                    /*stream=*/false);
  } else {
    std::cout << name << std::endl;
  }
  return serving_status == kHealthServing ? kExitOk : kExitFailure;
}

// --- Contexts (client/contexts.h): local commands, no connection --------------------------------

// A path as given, made absolute so that the context works from any folder.
std::string Absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return ec ? path : absolute.lexically_normal().string();
}

int ConfigCommand(const Invocation& invocation, ClientConfig config, const std::string& path) {
  const std::string& command = std::string(invocation.command->path);
  const std::string name = invocation.args.empty() ? "" : invocation.args[0];
  const OutputFormat format = invocation.global.output;
  const bool structured = format == OutputFormat::kJson || format == OutputFormat::kYaml;
  if (command == "config get-contexts") {
    if (format == OutputFormat::kName) {
      std::vector<std::string> names;
      for (const ClientContext& c : config.contexts) names.push_back(c.name);
      return PrintNames(names);
    }
    if (structured) {
      std::string out = "[";
      for (size_t i = 0; i < config.contexts.size(); ++i) {
        const ClientContext& c = config.contexts[i];
        absl::StrAppend(&out, i == 0 ? "" : ",", "{\"name\":", JsonString(c.name),
                        ",\"address\":", JsonString(c.address),
                        ",\"token_file\":", JsonString(c.token_file),
                        ",\"tls_ca\":", JsonString(c.tls_ca),
                        ",\"current\":", c.name == config.current_context ? "true" : "false", "}");
      }
      return PrintStructured(format, absl::StrCat(out, "]"), /*stream=*/false);
    }
    if (config.contexts.empty()) {
      return PrintText(absl::StrCat("no contexts in ", path,
                                    "; add one with trainctl config set-context NAME --addr "
                                    "HOST:PORT\n"));
    }
    TextTable table({"CURRENT", "NAME", "ADDRESS", "TOKEN-FILE", "TLS"});
    for (const ClientContext& c : config.contexts) {
      const bool tls = !c.tls_ca.empty() || !c.tls_cert.empty() || !c.tls_server_name.empty();
      table.AddRow({c.name == config.current_context ? "*" : "", c.name,
                    c.address.empty() ? "-" : c.address, c.token_file.empty() ? "-" : c.token_file,
                    tls ? (c.tls_cert.empty() ? "yes" : "mutual") : "no"});
    }
    return PrintText(table.Render(!invocation.global.no_headers));
  }
  if (command == "config current-context") {
    if (config.current_context.empty()) {
      PrintError(absl::StrCat("no current context in ", path));
      return kExitFailure;
    }
    return PrintText(config.current_context + "\n");
  }
  if (command == "config use-context") {
    if (config.Find(name) == nullptr) {
      PrintError(
          absl::StrCat("no context '", name, "' in ", path, " (see trainctl config get-contexts)"));
      return kExitFailure;
    }
    config.current_context = name;
  } else if (command == "config set-context") {
    ClientContext* context = config.Find(name);
    if (context == nullptr) {
      ClientContext added;
      added.name = name;
      config.contexts.push_back(std::move(added));
      context = &config.contexts.back();
      if (config.current_context.empty()) config.current_context = name;
    }
    const GlobalOptions& g = invocation.global;
    if (g.address_given) context->address = g.address;
    if (!g.token_file.empty()) context->token_file = Absolute(g.token_file);
    if (!g.tls_ca.empty()) context->tls_ca = Absolute(g.tls_ca);
    if (!g.tls_cert.empty()) context->tls_cert = Absolute(g.tls_cert);
    if (!g.tls_key.empty()) context->tls_key = Absolute(g.tls_key);
    if (!g.tls_server_name.empty()) context->tls_server_name = g.tls_server_name;
  } else if (command == "config delete-context") {
    auto it = std::find_if(config.contexts.begin(), config.contexts.end(),
                           [&](const ClientContext& c) { return c.name == name; });
    if (it == config.contexts.end()) {
      PrintError(absl::StrCat("no context '", name, "' in ", path));
      return kExitFailure;
    }
    config.contexts.erase(it);
    if (config.current_context == name) config.current_context.clear();
  }
  const absl::Status saved = SaveClientConfig(path, config);
  if (!saved.ok()) {
    PrintError(saved.message());
    return kExitFailure;
  }
  std::cerr << "trainctl: " << path << ": " << command.substr(std::string("config ").size()) << " "
            << name << std::endl;
  return kExitOk;
}

}  // namespace trainerd::client
