// What every command of trainctl uses (internal to client/): the CommandContext a handler gets,
// printing in the -o format asked for, and the failures that become one line on stderr and an
// exit code. Also the handlers themselves, by the file that holds them, for RunCommand
// (commands.cc), which picks one by the command's path.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/connection.h"
#include "client/contexts.h"
#include "client/output.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {

// What every command gets: its arguments, the connection and the output format.
struct CommandContext {
  const Invocation& invocation;
  Connection& connection;
  OutputFormat format;
  bool structured;  // -o json or -o yaml: the daemon's messages as they are
  bool names;       // -o name: one name or id per line
  TableOptions table;
};

// Prints the status's message (PrintError) and returns kExitUsage: a bad command line or local
// input, before anything was sent.
int UsageFailure(const absl::Status& status);

// Prints why the call failed (Connection::DescribeError) and returns kExitFailure.
int RpcFailure(const CommandContext& context, const grpc::Status& status, absl::Duration timeout,
               bool had_replies = false);
// RpcFailure of a unary call, made with the global --timeout.
int UnaryRpcFailure(const CommandContext& context, const grpc::Status& status);

// A command's unary call (Connection::Call): 0 when it succeeded and `response` holds the answer,
// else the exit code, the error printed (UnaryRpcFailure).
template <typename Stub, typename Request, typename Response>
int CallOrFail(const CommandContext& context, Stub& stub,
               grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
               const Request& request, Response* response) {
  const grpc::Status status = context.connection.Call(stub, method, request, response);
  return status.ok() ? 0 : UnaryRpcFailure(context, status);
}

// Prints JSON text in the structured format asked for: as it is for json, as YAML for yaml.
// `stream`: one of a series of events (JSON Lines; YAML documents, each opened by "---").
// Flushes, so that watchers see each event.
int PrintStructured(OutputFormat format, const std::string& json, bool stream);

// Prints `message` as -o json or -o yaml asked; `stream` as above (JSON on one line).
int PrintMessage(const CommandContext& context, const google::protobuf::Message& message,
                 bool stream = false);

// -o name: each name or id on a line of its own.
int PrintNames(const std::vector<std::string>& names);

// Prints `text` as it is (a table or view that ends in a newline) and returns kExitOk.
int PrintText(const std::string& text);

// --- The handlers, by file; each returns the exit code -----------------------------------------

// dataset_commands.cc: dataset upload, list, get, rm, share and unshare (`shared` false).
int DatasetUpload(const CommandContext& context);
int DatasetList(const CommandContext& context);
int DatasetGet(const CommandContext& context);
int DatasetRemove(const CommandContext& context);
int DatasetShare(const CommandContext& context, bool shared);

// job_commands.cc: submit and the job commands (list, get, watch, wait, cancel, rm, model).
int Submit(const CommandContext& context);
int JobList(const CommandContext& context);
int JobGet(const CommandContext& context);
int JobWatch(const CommandContext& context);
int JobWait(const CommandContext& context);
int JobCancel(const CommandContext& context);
int JobRemove(const CommandContext& context);
int JobModel(const CommandContext& context);
int JobCheckpoint(const CommandContext& context);

// ListJobs from `request` on: its jobs appended to `response`, page after page while
// `every_page` (else the first page only, its next_page_token kept). The first failed call's
// status. (job_commands.cc; `job list --sweep` lists with it too.)
grpc::Status ListJobPages(const CommandContext& context, v1::ListJobsRequest request,
                          bool every_page, v1::ListJobsResponse* response);

// Blocks until job `id` ended or `timeout` passed (InfiniteDuration: until it ended), on a WatchJob
// stream: the end of a member is seen the moment the daemon publishes it, not at the next poll
// (a packed sweep of small jobs may end within a tenth of a second). Returns the ended job, or
// nullopt when the time ran out first; an RPC error otherwise.
// (job_commands.cc; `sweep --watch` waits on its members with it too.)
absl::StatusOr<std::optional<v1::Job>> AwaitJobEnd(const CommandContext& context,
                                                   const std::string& id, absl::Duration timeout);

// sweep_commands.cc: sweep (with --watch, the live table of its members), and `job list --sweep
// ID` (JobList hands it over): the members of a sweep found again by its id, shown as the table
// `sweep --watch` ends with, or followed as it follows them with --watch.
int Sweep(const CommandContext& context);
int SweepList(const CommandContext& context);

// device_commands.cc: devices, top and diagnose. `devices --all-contexts` asks every context's
// daemon, each with its own connection: RunCommand calls DevicesAllContexts with the config file
// instead of a handler.
int Devices(const CommandContext& context);
int Top(const CommandContext& context);
int Diagnose(const CommandContext& context);
int DevicesAllContexts(const Invocation& invocation, const ClientConfig& config,
                       const std::string& path);

// other_commands.cc: version, health and __complete; and the config commands (contexts), which
// are local: RunCommand calls ConfigCommand with the config file, without a connection.
int Version(const CommandContext& context);
int Health(const CommandContext& context);
int Complete(const CommandContext& context);
int ConfigCommand(const Invocation& invocation, ClientConfig config, const std::string& path);

}  // namespace trainerd::client
