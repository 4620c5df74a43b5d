// trainctl's device commands: devices (one daemon, or with --all-contexts every context's),
// top (the devices and running jobs, refreshed until Ctrl-C) and diagnose (measured figures).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/command_support.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/contexts.h"
#include "client/output.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::client {
namespace {

// Diagnose measures every device for seconds on first use (or with --refresh) and may wait for
// a measurement already running, so the usual 30 s would cut it off; --timeout still wins.
constexpr absl::Duration kDiagnoseTimeout = absl::Seconds(120);

// How `top` polls for Ctrl-C while it waits between refreshes.
constexpr absl::Duration kTopPollStep = absl::Milliseconds(50);

// "\x1b[H\x1b[2J": cursor home, clear the screen. Only written to a terminal.
constexpr absl::string_view kClearScreen = "\x1b[H\x1b[2J";

// Set by SIGINT while `top` runs; read between refreshes.
volatile std::sig_atomic_t stop_requested = 0;

extern "C" void OnInterrupt(int /*signal*/) { stop_requested = 1; }

grpc::Status ListDevices(const CommandContext& context, v1::ListDevicesResponse* response) {
  return context.connection.Call(context.connection.system(), &v1::SystemService::Stub::ListDevices,
                                 v1::ListDevicesRequest(), response);
}

}  // namespace

int Devices(const CommandContext& context) {
  v1::ListDevicesResponse response;
  grpc::Status status = ListDevices(context, &response);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) {
    std::vector<std::string> names;
    for (const v1::DeviceStatus& device : response.devices()) names.push_back(device.device());
    return PrintNames(names);
  }
  return context.structured ? PrintMessage(context, response)
                            : PrintText(DeviceListTable(response, context.table));
}

int Diagnose(const CommandContext& context) {
  v1::DiagnoseRequest request;
  request.set_refresh(context.invocation.Has("refresh"));
  const absl::Duration timeout = context.invocation.global.timeout_given
                                     ? context.invocation.global.timeout
                                     : kDiagnoseTimeout;
  grpc::ClientContext call;
  Connection::SetDeadline(&call, timeout);
  v1::DiagnoseResponse response;
  grpc::Status status = context.connection.system().Diagnose(&call, request, &response);
  if (!status.ok()) return RpcFailure(context, status, timeout);
  return context.structured ? PrintMessage(context, response) : PrintText(DiagnoseTable(response));
}

// Refreshes the devices and the running jobs every --interval until Ctrl-C (exit 0) or
// --iterations refreshes; a failed call ends it with exit 1, as any other command.
int Top(const CommandContext& context) {
  absl::StatusOr<double> interval = context.invocation.GetDouble("interval", 2.0);
  if (!interval.ok()) return UsageFailure(interval.status());
  if (*interval < 0.1) {
    return UsageFailure(absl::InvalidArgumentError(
        absl::StrCat("--interval must be at least 0.1 seconds, got ", *interval)));
  }
  absl::StatusOr<int64_t> iterations =
      context.invocation.GetInt("iterations", 0, 1, std::numeric_limits<int64_t>::max());
  if (!iterations.ok()) return UsageFailure(iterations.status());

  // Ctrl-C ends the loop rather than the process, so that the screen is left whole and the exit
  // status is 0: stopping top is its normal end.
  stop_requested = 0;
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  struct sigaction previous = {};
  sigaction(SIGINT, &action, &previous);
  struct RestoreOnExit {
    struct sigaction* previous;
    ~RestoreOnExit() { sigaction(SIGINT, previous, nullptr); }
  } restore{&previous};

  const bool tty = isatty(STDOUT_FILENO) == 1;
  for (int64_t refresh = 0; *iterations == 0 || refresh < *iterations; ++refresh) {
    if (refresh > 0) {
      // Sleep in short steps so that Ctrl-C is answered at once.
      const absl::Time until = absl::Now() + absl::Seconds(*interval);
      while (!stop_requested && absl::Now() < until) {
        absl::SleepFor(std::min(kTopPollStep, until - absl::Now()));
      }
    }
    if (stop_requested) break;
    v1::ListDevicesResponse devices;
    grpc::Status status = ListDevices(context, &devices);
    if (!status.ok()) return stop_requested ? kExitOk : UnaryRpcFailure(context, status);
    v1::ListJobsResponse jobs;
    v1::ListJobsRequest running;  // a device runs a few jobs at once: one page holds them all
    running.set_state(v1::JOB_STATE_RUNNING);
    running.set_page_size(1000);
    status = context.connection.Call(context.connection.jobs(), &v1::JobService::Stub::ListJobs,
                                     running, &jobs);
    if (!status.ok()) return stop_requested ? kExitOk : UnaryRpcFailure(context, status);
    if (stop_requested) break;

    if (context.structured) {
      // No message holds both; one JSON object per line (JSON Lines) as `job watch -o json`.
      absl::StatusOr<std::string> devices_json = ToJson(devices, /*pretty=*/false);
      absl::StatusOr<std::string> jobs_json = ToJson(RunningJobs(jobs), /*pretty=*/false);
      if (!devices_json.ok() || !jobs_json.ok()) {
        PrintError(!devices_json.ok() ? devices_json.status().message()
                                      : jobs_json.status().message());
        return kExitFailure;
      }
      // {"devices":[...]} and {"jobs":[...]} merged into one object.
      const int code =
          PrintStructured(context.format,
                          absl::StrCat(devices_json->substr(0, devices_json->size() - 1), ",",
                                       jobs_json->substr(1)),
                          /*stream=*/true);
      if (code != kExitOk) return code;
      continue;
    }
    std::string screen = TopScreen(devices, jobs);
    if (tty) {
      screen = absl::StrCat(kClearScreen, "trainerd at ", context.connection.address(), "  ",
                            absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()),
                            "  (every ", absl::StrFormat("%g", *interval), " s; Ctrl-C quits)\n\n",
                            screen);
    } else if (refresh > 0) {
      screen = absl::StrCat("\n", screen);
    }
    std::cout << screen << std::flush;
  }
  return kExitOk;
}

// devices --all-contexts: each context's daemon in turn, with its own address and credentials.
int DevicesAllContexts(const Invocation& invocation, const ClientConfig& config,
                       const std::string& path) {
  if (config.contexts.empty()) {
    PrintError(absl::StrCat("no contexts in ", path, " (see trainctl config set-context)"));
    return kExitUsage;
  }
  const OutputFormat format = invocation.global.output;
  const bool json = format == OutputFormat::kJson || format == OutputFormat::kYaml;
  const TableOptions table{format == OutputFormat::kWide, !invocation.global.no_headers};
  int exit_code = kExitOk;
  std::string json_out = "[";
  for (size_t i = 0; i < config.contexts.size(); ++i) {
    const ClientContext& c = config.contexts[i];
    GlobalOptions global;
    global.timeout = invocation.global.timeout;
    global.context = c.name;
    std::string error;
    v1::ListDevicesResponse response;
    if (absl::Status applied = ApplyContext(config, path, global); !applied.ok()) {
      error = std::string(applied.message());
    } else if (absl::StatusOr<ClientSecurity> security =
                   LoadClientSecurity(global, /*env_token=*/nullptr);
               !security.ok()) {
      error = std::string(security.status().message());
    } else {
      Connection connection({global.address, global.timeout, *security});
      const grpc::Status status = connection.Call(
          connection.system(), &v1::SystemService::Stub::ListDevices, v1::ListDevicesRequest(),
          &response);
      if (!status.ok()) error = connection.DescribeError(status, global.timeout, false);
    }
    if (!error.empty()) exit_code = kExitFailure;
    if (json) {
      absl::StatusOr<std::string> devices = ToJson(response, /*pretty=*/false);
      absl::StrAppend(&json_out, i == 0 ? "" : ",", "{\"context\":", JsonString(c.name),
                      ",\"address\":", JsonString(global.address), ",",
                      error.empty() ? absl::StrCat("\"devices\":", devices.ok() ? *devices : "{}")
                                    : absl::StrCat("\"error\":", JsonString(error)),
                      "}");
      continue;
    }
    std::cout << (i == 0 ? "" : "\n") << "context " << c.name << " (" << global.address << ")"
              << (c.name == config.current_context ? " *" : "") << ":\n";
    if (error.empty()) {
      std::cout << DeviceListTable(response, table);
    } else {
      std::cout << "  unreachable: " << error << "\n";
    }
  }
  if (json) PrintStructured(format, absl::StrCat(json_out, "]"), /*stream=*/false);
  std::cout << std::flush;
  return exit_code;
}

}  // namespace trainerd::client
