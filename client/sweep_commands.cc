// trainctl's sweep command: submits the members of a sweep and, with --watch, follows them in a
// table redrawn in place on a terminal (once at the end elsewhere), then a summary line.
#include <sys/ioctl.h>
#include <unistd.h>

#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/command_support.h"
#include "client/commands.h"
#include "client/output.h"
#include "client/progress_bar.h"
#include "client/requests.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {
namespace {

// The exit code of a watched sweep whose members all ended: 0 when every one succeeded, 3 when
// any failed, else 4 when any was cancelled (a failure says more than a cancellation, which a
// person asked for).
int SweepExitCode(const google::protobuf::RepeatedPtrField<v1::Job>& members) {
  int code = kExitOk;
  for (const v1::Job& job : members) {
    if (job.state() == v1::JOB_STATE_FAILED) return kExitJobFailed;
    if (job.state() == v1::JOB_STATE_CANCELLED) code = kExitJobCancelled;
  }
  return code;
}

// How often `sweep --watch` redraws its live table (asking GetJob about every member still
// running): often enough to follow the epochs, seldom enough that a 256-member sweep costs the
// daemon little.
constexpr absl::Duration kSweepPollInterval = absl::Milliseconds(400);

// The terminal's size, for the redrawn table; 0 for what ioctl cannot tell.
struct TerminalSize {
  int rows = 0;
  int columns = 0;
};
TerminalSize StdoutTerminalSize() {
  struct winsize size = {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0) return {};
  return {size.ws_row, size.ws_col};
}

// Follows the members of a sweep until every one ended, asking GetJob about each member that has
// not ended whenever the first of them ended (seen on its WatchJob stream) or, on a terminal,
// every kSweepPollInterval (rather than a WatchJob stream per member: a sweep may have
// 256). On a terminal the table of members (SweepWatchTable) is redrawn in place; elsewhere it is
// printed once at the end, so that a log gets one table. Then the summary line. With JSON, each
// member's Job as one line when it ends. Exit code: SweepExitCode. No overall deadline, as for
// `job watch`; Ctrl-C ends trainctl and leaves the members running.
// Asks the daemon for `member` again (GetJob, the full view) and replaces it with the answer.
grpc::Status Refresh(const CommandContext& context, v1::Job& member) {
  v1::GetJobRequest request;
  request.set_id(member.id());
  v1::Job job;
  grpc::Status status =
      context.connection.Call(context.connection.jobs(), &v1::JobService::Stub::GetJob, request, &job);
  if (status.ok()) member = std::move(job);
  return status;
}

int WatchSweep(const CommandContext& context, v1::SubmitSweepResponse sweep) {
  google::protobuf::RepeatedPtrField<v1::Job>& members = *sweep.mutable_members();
  const bool live = !context.structured && !context.names && isatty(STDOUT_FILENO) == 1;
  const TerminalSize terminal = live ? StdoutTerminalSize() : TerminalSize();
  // Rows for members: the terminal less the header, the "... more" line and the cursor's line.
  const int max_rows = terminal.rows > 3 ? terminal.rows - 3 : 0;
  LiveBlock screen(std::cout, terminal.columns);
  std::vector<bool> printed(members.size(), false);  // JSON: the members already printed
  while (true) {
    bool all_ended = true;
    for (v1::Job& member : members) {
      if (IsTerminal(member.state())) continue;
      if (grpc::Status status = Refresh(context, member); !status.ok()) {
        return UnaryRpcFailure(context, status);
      }
      if (!IsTerminal(member.state())) all_ended = false;
    }
    if (context.structured) {
      for (int i = 0; i < members.size(); ++i) {
        if (printed[i] || !IsTerminal(members[i].state())) continue;
        if (int code = PrintMessage(context, members[i], /*stream=*/true); code != kExitOk) {
          return code;
        }
        printed[i] = true;
      }
    }
    if (all_ended) break;
    if (live) screen.Show(SweepWatchTable(members, max_rows));
    // Wait on the first member still running (a pack's members end together): until it ended, or
    // on a terminal until the table is due again; then every member is asked again above.
    for (v1::Job& member : members) {
      if (IsTerminal(member.state())) continue;
      absl::StatusOr<std::optional<v1::Job>> ended =
          AwaitJobEnd(context, member.id(), live ? kSweepPollInterval : absl::InfiniteDuration());
      if (!ended.ok()) {
        return UnaryRpcFailure(context,
                               grpc::Status(static_cast<grpc::StatusCode>(ended.status().code()),
                                            std::string(ended.status().message())));
      }
      if (ended->has_value()) member = **std::move(ended);
      break;
    }
  }
  if (context.structured || context.names) return SweepExitCode(members);
  // A member whose end came on its WatchJob stream has no epochs in that message: asked once
  // more, so that the table and the best member have their validation figures.
  for (v1::Job& member : members) {
    if (member.epochs_size() >= member.epochs_completed()) continue;
    if (grpc::Status status = Refresh(context, member); !status.ok()) {
      return UnaryRpcFailure(context, status);
    }
  }
  // The last table whole, over the live one (which fitted the terminal) or alone.
  const std::string table = SweepWatchTable(members);
  if (live) {
    screen.Show(table);
  } else {
    std::cout << table;
  }
  std::cout << SweepSummaryLine(members) << std::endl;
  return SweepExitCode(members);
}

}  // namespace

int SweepList(const CommandContext& context) {
  const Invocation& invocation = context.invocation;
  if (invocation.Has("limit") || invocation.Has("all")) {
    return UsageFailure(absl::InvalidArgumentError(
        "--sweep lists every member of the sweep (at most 256): --limit and --all do not apply"));
  }
  const std::string sweep_id = invocation.Get("sweep");
  v1::ListJobsRequest request;
  request.set_sweep_id(sweep_id);
  const bool filtered = invocation.Has("state") || invocation.Has("dataset");
  if (invocation.Has("state")) {
    absl::StatusOr<v1::JobState> state = ParseJobState(invocation.Get("state"));
    if (!state.ok()) return UsageFailure(state.status());
    request.set_state(*state);
  }
  request.set_dataset(invocation.Get("dataset"));
  request.set_page_size(1000);
  v1::ListJobsResponse response;
  if (grpc::Status status = ListJobPages(context, request, /*every_page=*/true, &response);
      !status.ok()) {
    return UnaryRpcFailure(context, status);
  }
  if (response.jobs().empty() && !filtered) {
    PrintError(absl::StrCat("sweep '", sweep_id,
                            "' not found (no job of yours is one of its members: deleted, or "
                            "pruned by the daemon's retention)"));
    return kExitFailure;
  }
  const bool watch = invocation.Has("watch");
  if (context.names) {
    std::vector<std::string> ids;
    for (const v1::Job& member : response.jobs()) ids.push_back(member.id());
    PrintNames(ids);
    if (!watch) return kExitOk;
  } else if (context.structured) {
    const int code = PrintMessage(context, response, /*stream=*/watch);
    if (code != kExitOk || !watch) return code;
  }
  v1::SubmitSweepResponse sweep;
  sweep.set_sweep_id(sweep_id);
  *sweep.mutable_members() = std::move(*response.mutable_jobs());
  if (watch) return WatchSweep(context, std::move(sweep));
  // The table `sweep --watch` ends with, as the members stand now: a listing's members have no
  // epochs, so those that finished one are asked for whole (their validation figures).
  for (v1::Job& member : *sweep.mutable_members()) {
    if (member.epochs_completed() == 0) continue;
    if (grpc::Status status = Refresh(context, member); !status.ok()) {
      return UnaryRpcFailure(context, status);
    }
  }
  std::cout << SweepWatchTable(sweep.members());
  bool ended = true;
  for (const v1::Job& member : sweep.members()) ended = ended && IsTerminal(member.state());
  if (ended && !sweep.members().empty()) std::cout << SweepSummaryLine(sweep.members()) << "\n";
  std::cout.flush();
  return kExitOk;
}

int Sweep(const CommandContext& context) {
  absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(context.invocation);
  if (!request.ok()) return UsageFailure(request.status());
  if (context.invocation.Has("request-id")) {
    request->set_request_id(context.invocation.Get("request-id"));
  }
  v1::SubmitSweepResponse response;
  if (int failed = CallOrFail(context, context.connection.jobs(),
                              &v1::JobService::Stub::SubmitSweep, *request, &response)) {
    return failed;
  }

  const bool watch = context.invocation.Has("watch");
  if (context.names) {
    std::vector<std::string> ids;
    for (const v1::Job& member : response.members()) ids.push_back(member.id());
    PrintNames(ids);
    if (!watch) return kExitOk;
  } else if (context.structured) {
    // With --watch the output is JSON Lines throughout, as for submit.
    const int code = PrintMessage(context, response, /*stream=*/watch);
    if (code != kExitOk || !watch) return code;
  } else if (!watch) {
    return PrintText(SweepSubmitTable(response, context.table));
  } else {
    // The id alone first, as without --watch; the watched table shows the members.
    std::cout << response.sweep_id() << std::endl;
  }
  return WatchSweep(context, std::move(response));
}

}  // namespace trainerd::client
