// The commands of trainctl. Each one checks what it can locally (exit 2 on bad input, before any
// connection), makes its calls with a deadline (uploads: a long one; watching: none), and prints
// a table or JSON. Errors from trainerd become one line on stderr and exit 1.
#include "client/commands.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/completion.h"
#include "client/connection.h"
#include "client/contexts.h"
#include "client/health_check.h"
#include "client/output.h"
#include "client/progress_bar.h"
#include "client/requests.h"
#include "client/upload_stream.h"
#include "common/dataset_header.h"
#include "common/sha256.h"
#include "common/table.h"
#include "common/version.h"

namespace trainerd::client {
namespace {

// What every command gets: its arguments, the connection and the output format.
struct CommandContext {
  const Invocation& invocation;
  Connection& connection;
  OutputFormat format;
  bool structured;  // -o json or -o yaml: the daemon's messages as they are
  bool names;       // -o name: one name or id per line
  TableOptions table;
};

int UsageFailure(const absl::Status& status) {
  PrintError(status.message());
  return kExitUsage;
}

int RpcFailure(const CommandContext& context, const grpc::Status& status, absl::Duration timeout,
               bool had_replies = false) {
  PrintError(context.connection.DescribeError(status, timeout, had_replies));
  return kExitFailure;
}

int UnaryRpcFailure(const CommandContext& context, const grpc::Status& status) {
  return RpcFailure(context, status, context.invocation.global.timeout);
}

// Prints JSON text in the structured format asked for: as it is for json, as YAML for yaml.
// `stream`: one of a series of events (JSON Lines; YAML documents, each opened by "---").
// Flushes, so that watchers see each event.
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

// Prints `message` as -o json or -o yaml asked; `stream` as above (JSON on one line).
int PrintMessage(const CommandContext& context, const google::protobuf::Message& message,
                 bool stream = false) {
  absl::StatusOr<std::string> json = ToJson(message, /*pretty=*/!stream);
  if (!json.ok()) {
    PrintError(json.status().message());
    return kExitFailure;
  }
  return PrintStructured(context.format, *json, stream);
}

// -o name: each name or id on a line of its own.
int PrintNames(const std::vector<std::string>& names) {
  for (const std::string& name : names) std::cout << name << "\n";
  std::cout << std::flush;
  return kExitOk;
}

// The exit code of a job that ended: 0 succeeded, 3 failed, 4 cancelled.
int JobEndExitCode(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

// Commands whose output -o name can give.
bool SupportsNameOutput(absl::string_view path) {
  static constexpr absl::string_view kPaths[] = {
      "dataset upload", "dataset list", "dataset get", "dataset rm", "submit",
      "sweep",          "job list",     "job get",     "job wait",   "job cancel",
      "job rm",         "job model",    "devices",     "version",    "config get-contexts",
      "__complete"};
  return std::find(std::begin(kPaths), std::end(kPaths), path) != std::end(kPaths);
}

std::string OrDashText(const std::string& text) { return text.empty() ? "-" : text; }

int PrintText(const std::string& text) {
  std::cout << text << std::flush;
  return kExitOk;
}

// Gives the next bytes of an upload's payload: fills `out` with `size` bytes (fewer only at its
// end) and says how many.
using PayloadReader = std::function<absl::StatusOr<size_t>(char* out, size_t size)>;

// Sends an upload: `header`, the `total_bytes` of payload that `read` gives in chunks of at most
// kUploadChunkBytes, and with `sha256_trailer` a last message with the SHA-256 of the bytes sent
// (for a payload checksummed as it is read; the header's sha256 is then empty). The first chunk is
// read before the call starts, so that a bad value in it is refused as before any other call; a
// read error after that cancels the call (the daemon registers nothing) and is still a local
// error (exit 2).
int SendUpload(const CommandContext& context, const v1::DatasetHeader& header, int64_t total_bytes,
               const PayloadReader& read, bool sha256_trailer) {
  v1::UploadDatasetRequest chunk_request;
  std::string& chunk = *chunk_request.mutable_chunk();
  Sha256 sha256;
  int64_t read_bytes = 0;
  // Reads the next chunk into `chunk` (and the checksum).
  const auto read_chunk = [&]() -> absl::Status {
    const size_t size = static_cast<size_t>(
        std::min(static_cast<int64_t>(kUploadChunkBytes), total_bytes - read_bytes));
    chunk.resize(size);
    absl::StatusOr<size_t> got = read(chunk.data(), size);
    if (!got.ok()) return got.status();
    if (*got != size) {
      return absl::DataLossError(absl::StrCat("the payload ended after ", read_bytes + *got, " of ",
                                              total_bytes, " bytes"));
    }
    if (sha256_trailer) sha256.Update(chunk);
    read_bytes += static_cast<int64_t>(size);
    return absl::OkStatus();
  };
  if (absl::Status first = read_chunk(); !first.ok()) return UsageFailure(first);

  const absl::Duration timeout = std::max(kUploadTimeout, context.invocation.global.timeout);
  grpc::ClientContext call;
  Connection::SetDeadline(&call, timeout);
  v1::Dataset dataset;
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
      context.connection.datasets().UploadDataset(&call, &dataset);

  ProgressBar progress(total_bytes, isatty(STDERR_FILENO) == 1, stderr);
  // A failed Write means the stream is over (the daemon rejected it or the connection broke);
  // Finish then says why.
  progress.Update(0);
  v1::UploadDatasetRequest request;
  *request.mutable_header() = header;
  bool open = writer->Write(request);
  int64_t sent = 0;
  while (open) {
    open = writer->Write(chunk_request);
    if (!open) break;
    sent += static_cast<int64_t>(chunk.size());
    progress.Update(sent);
    if (sent == total_bytes) break;
    if (absl::Status next = read_chunk(); !next.ok()) {
      call.TryCancel();
      writer->Finish();
      progress.Finish();
      return UsageFailure(next);
    }
  }
  if (open && sha256_trailer) {
    request.set_sha256(sha256.HexDigest());
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  progress.Finish();
  if (!status.ok()) return RpcFailure(context, status, timeout);
  if (context.names) return PrintNames({dataset.name()});
  return context.structured ? PrintMessage(context, dataset) : PrintText(DatasetDetails(dataset));
}

int DatasetUpload(const CommandContext& context) {
  const std::string& name = context.invocation.args.at(0);
  if (absl::Status status = ValidateDatasetName(name); !status.ok()) return UsageFailure(status);
  absl::StatusOr<UploadInput> input = UploadInputFromFlags(context.invocation);
  if (!input.ok()) return UsageFailure(input.status());

  if (CanStreamUpload(*input)) {
    // .npy files: read, converted and checksummed a block at a time as they are sent, so that
    // trainctl holds a few MiB rather than the files; the checksum goes last.
    absl::StatusOr<std::unique_ptr<NpyUploadStream>> stream = NpyUploadStream::Open(*input);
    if (!stream.ok()) return UsageFailure(stream.status());
    DatasetHeader header = (*stream)->header();
    header.name = name;
    if (absl::Status limits = CheckUploadAgainstLimits(header); !limits.ok()) {
      return UsageFailure(limits);
    }
    NpyUploadStream& source = **stream;
    return SendUpload(
        context, MakeDatasetHeader(header), source.total_bytes(),
        [&source](char* out, size_t size) { return source.Read(out, size); },
        /*sha256_trailer=*/true);
  }

  // CSV (and .npy from a pipe or a device): the whole table is read, checked and encoded first, so
  // its checksum goes in the header.
  absl::StatusOr<Table> table = ReadUploadInput(*input);
  if (!table.ok()) return UsageFailure(table.status());
  if (absl::Status limits = CheckUploadAgainstLimits(name, *table); !limits.ok()) {
    return UsageFailure(limits);
  }
  const std::string payload = EncodePayload(*table);
  size_t offset = 0;
  return SendUpload(
      context, MakeDatasetHeader(name, *table, Sha256Hex(payload)),
      static_cast<int64_t>(payload.size()),
      [&](char* out, size_t size) -> absl::StatusOr<size_t> {
        const size_t n = std::min(size, payload.size() - offset);
        std::memcpy(out, payload.data() + offset, n);
        offset += n;
        return n;
      },
      /*sha256_trailer=*/false);
}

int DatasetList(const CommandContext& context) {
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::ListDatasetsResponse response;
  grpc::Status status =
      context.connection.datasets().ListDatasets(&call, v1::ListDatasetsRequest(), &response);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) {
    std::vector<std::string> names;
    for (const v1::Dataset& dataset : response.datasets()) names.push_back(dataset.name());
    return PrintNames(names);
  }
  return context.structured ? PrintMessage(context, response)
                            : PrintText(DatasetListTable(response, context.table));
}

int DatasetGet(const CommandContext& context) {
  v1::GetDatasetRequest request;
  request.set_name(context.invocation.args.at(0));
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::Dataset dataset;
  grpc::Status status = context.connection.datasets().GetDataset(&call, request, &dataset);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) return PrintNames({dataset.name()});
  return context.structured ? PrintMessage(context, dataset) : PrintText(DatasetDetails(dataset));
}

int DatasetRemove(const CommandContext& context) {
  v1::DeleteDatasetRequest request;
  request.set_name(context.invocation.args.at(0));
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::DeleteDatasetResponse response;
  grpc::Status status = context.connection.datasets().DeleteDataset(&call, request, &response);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) return PrintNames({request.name()});
  return context.structured ? PrintMessage(context, response)
                            : PrintText(absl::StrCat("deleted dataset '", request.name(), "'\n"));
}

// dataset share / dataset unshare.
int DatasetShare(const CommandContext& context, bool shared) {
  v1::ShareDatasetRequest request;
  request.set_name(context.invocation.args.at(0));
  request.set_shared(shared);
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::Dataset dataset;
  grpc::Status status = context.connection.datasets().ShareDataset(&call, request, &dataset);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) return PrintNames({dataset.name()});
  return context.structured
             ? PrintMessage(context, dataset)
             : PrintText(absl::StrCat(shared ? "shared" : "unshared", " dataset '", dataset.name(),
                                      "'\n"));
}

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

// Follows job `id` until it ends: epoch lines (history first, each epoch once), then the outcome
// line; with JSON, every event as one line (YAML: a document each); with -o name, nothing. Exit
// JobEndExitCode (1 when the daemon could not be asked). No deadline: a job may train for hours;
// Ctrl-C ends trainctl and leaves the job running.
int WatchJob(const CommandContext& context, const std::string& id) {
  v1::WatchJobRequest request;
  request.set_id(id);
  grpc::ClientContext call;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      context.connection.jobs().WatchJob(&call, request);

  v1::JobEvent event;
  const bool quiet = context.structured || context.names;  // no epoch lines
  int32_t planned_epochs = 0;
  int32_t last_printed = 0;  // epochs arrive both as events and inside Job; print each once
  bool had_replies = false;
  // A late watcher gets the job's history as epoch events before the Job that says how many
  // epochs are planned: they are printed once it came, so that every line reads "epoch N/M".
  bool job_seen = false;
  std::vector<v1::EpochResult> early;
  std::optional<v1::Job> final_job;
  auto print_epoch = [&](const v1::EpochResult& epoch) {
    if (epoch.epoch() <= last_printed) return;
    std::cout << EpochLine(epoch, planned_epochs) << std::endl;
    last_printed = epoch.epoch();
  };
  while (reader->Read(&event)) {
    had_replies = true;
    if (context.structured) {
      if (int code = PrintMessage(context, event, /*stream=*/true); code != kExitOk) {
        call.TryCancel();
        reader->Finish();
        return code;
      }
    }
    if (event.has_epoch()) {
      if (!quiet && job_seen) print_epoch(event.epoch());
      if (!quiet && !job_seen) early.push_back(event.epoch());
    } else if (event.has_skipped()) {
      // A long history, or epochs this reader fell behind on: the job follows with every epoch,
      // so the lines printed from it still miss none. Said only when it happens mid-stream.
      if (!quiet && last_printed > 0) {
        PrintError(absl::StrCat("the watch fell behind the job; ", event.skipped().epochs(),
                                " epochs arrive together"));
      }
    } else if (event.has_job()) {
      const v1::Job& job = event.job();
      planned_epochs = job.spec().epochs();
      job_seen = true;
      if (!quiet) {
        for (const v1::EpochResult& epoch : early) print_epoch(epoch);
        early.clear();
        for (const v1::EpochResult& epoch : job.epochs()) print_epoch(epoch);
      }
      if (IsTerminal(job.state())) {
        final_job = job;
        break;
      }
    }
  }
  if (final_job.has_value()) {
    // The daemon ends the stream after the terminal job; do not wait on it to do so.
    call.TryCancel();
    reader->Finish();
    if (!context.structured && !context.names) {
      std::cout << JobOutcomeLine(*final_job) << std::endl;
    }
    return JobEndExitCode(*final_job);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcFailure(context, status, absl::InfiniteDuration(), had_replies);
  PrintError(absl::StrCat("the watch of job '", id, "' ended before the job did"));
  return kExitFailure;
}

int Submit(const CommandContext& context) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(context.invocation);
  if (!spec.ok()) return UsageFailure(spec.status());
  absl::StatusOr<std::string> torchscript = ReadTorchScriptFlag(context.invocation);
  if (!torchscript.ok()) return UsageFailure(torchscript.status());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.set_torchscript_module(*std::move(torchscript));
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::Job job;
  grpc::Status status = context.connection.jobs().SubmitJob(&call, request, &job);
  if (!status.ok()) return UnaryRpcFailure(context, status);

  const bool watch = context.invocation.Has("watch");
  int code = kExitOk;
  if (context.structured) {
    // With --watch the output is JSON Lines throughout, so the job goes on one line too.
    code = PrintMessage(context, job, /*stream=*/watch);
  } else {
    // Only the id, so that scripts can capture it: JOB=$(trainctl submit ...).
    std::cout << job.id() << std::endl;
  }
  if (code != kExitOk || !watch) return code;
  return WatchJob(context, job.id());
}

// How often `sweep --watch` redraws its live table (asking GetJob about every member still
// running): often enough to follow the epochs, seldom enough that a 256-member sweep costs the
// daemon little.
constexpr absl::Duration kSweepPollInterval = absl::Milliseconds(400);

// Blocks until job `id` ended or `timeout` passed (InfiniteDuration: until it ended), on a WatchJob
// stream: the end of a member is seen the moment the daemon publishes it, not at the next poll
// (a packed sweep of small jobs may end within a tenth of a second). Returns the ended job, or
// nullopt when the time ran out first; an RPC error otherwise.
absl::StatusOr<std::optional<v1::Job>> AwaitJobEnd(const CommandContext& context,
                                                   const std::string& id, absl::Duration timeout) {
  v1::WatchJobRequest request;
  request.set_id(id);
  grpc::ClientContext call;
  if (timeout != absl::InfiniteDuration()) Connection::SetDeadline(&call, timeout);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      context.connection.jobs().WatchJob(&call, request);
  v1::JobEvent event;
  std::optional<v1::Job> ended;
  while (reader->Read(&event)) {
    if (event.has_job() && IsTerminal(event.job().state())) ended = event.job();
  }
  const grpc::Status status = reader->Finish();
  if (ended.has_value()) return ended;
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return std::nullopt;
  if (!status.ok())
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  return std::nullopt;
}

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
      v1::GetJobRequest request;
      request.set_id(member.id());
      grpc::ClientContext call;
      context.connection.SetUnaryDeadline(&call);
      v1::Job job;
      grpc::Status status = context.connection.jobs().GetJob(&call, request, &job);
      if (!status.ok()) return UnaryRpcFailure(context, status);
      member = std::move(job);
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

int Sweep(const CommandContext& context) {
  absl::StatusOr<v1::SubmitSweepRequest> request = SweepRequestFromFlags(context.invocation);
  if (!request.ok()) return UsageFailure(request.status());
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::SubmitSweepResponse response;
  grpc::Status status = context.connection.jobs().SubmitSweep(&call, *request, &response);
  if (!status.ok()) return UnaryRpcFailure(context, status);

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

// The newest --limit jobs (shown oldest first, so that the newest is at the bottom), or with
// --all every page in creation order; filtered by --state and --dataset on the daemon.
int JobList(const CommandContext& context) {
  constexpr int64_t kDefaultLimit = 50;
  constexpr int32_t kMaxPage = 1000;  // the daemon's largest page
  absl::StatusOr<int64_t> limit = context.invocation.GetInt("limit", kDefaultLimit, 1, kMaxPage);
  if (!limit.ok()) return UsageFailure(limit.status());
  const bool all = context.invocation.Has("all");
  if (all && context.invocation.Has("limit")) {
    return UsageFailure(absl::InvalidArgumentError("give --limit or --all, not both"));
  }
  v1::ListJobsRequest request;
  if (context.invocation.Has("state")) {
    absl::StatusOr<v1::JobState> state = ParseJobState(context.invocation.Get("state"));
    if (!state.ok()) return UsageFailure(state.status());
    request.set_state(*state);
  }
  request.set_dataset(context.invocation.Get("dataset"));
  request.set_page_size(all ? kMaxPage : static_cast<int32_t>(*limit));
  request.set_newest_first(!all);
  v1::ListJobsResponse response;
  while (true) {
    grpc::ClientContext call;
    context.connection.SetUnaryDeadline(&call);
    v1::ListJobsResponse page;
    grpc::Status status = context.connection.jobs().ListJobs(&call, request, &page);
    if (!status.ok()) return UnaryRpcFailure(context, status);
    for (v1::Job& job : *page.mutable_jobs()) *response.add_jobs() = std::move(job);
    if (!all || page.next_page_token().empty()) {
      response.set_next_page_token(page.next_page_token());
      break;
    }
    request.set_page_token(page.next_page_token());
  }
  if (!all) {
    // Asked newest first; shown (and printed as JSON) oldest first like --all.
    std::reverse(response.mutable_jobs()->begin(), response.mutable_jobs()->end());
  }
  const bool more = !response.next_page_token().empty();
  response.clear_next_page_token();
  std::vector<std::string> ids;
  for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
  const int code = context.names        ? PrintNames(ids)
                   : context.structured ? PrintMessage(context, response)
                                        : PrintText(JobListTable(response, context.table));
  if (more) {
    std::cout.flush();
    std::cerr << "trainctl: showing the newest " << response.jobs_size()
              << " jobs; older ones exist (--limit N, or --all)" << std::endl;
  }
  return code;
}

int JobRemove(const CommandContext& context) {
  v1::DeleteJobRequest request;
  request.set_id(context.invocation.args.at(0));
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::DeleteJobResponse response;
  grpc::Status status = context.connection.jobs().DeleteJob(&call, request, &response);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) return PrintNames({request.id()});
  return context.structured ? PrintMessage(context, response)
                            : PrintText(absl::StrCat("deleted job '", request.id(),
                                                     "' with its model and checkpoints\n"));
}

int JobGet(const CommandContext& context) {
  v1::GetJobRequest request;
  request.set_id(context.invocation.args.at(0));
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::Job job;
  grpc::Status status = context.connection.jobs().GetJob(&call, request, &job);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) return PrintNames({job.id()});
  return context.structured ? PrintMessage(context, job) : PrintText(JobDetails(job));
}

int JobWatch(const CommandContext& context) {
  return WatchJob(context, context.invocation.args.at(0));
}

// Waits for job ID's end, as kubectl wait: 0 when it ended as --for asks, else its end's code.
int JobWait(const CommandContext& context) {
  const std::string& id = context.invocation.args.at(0);
  const std::string want = context.invocation.Get("for", "succeeded");
  if (want != "succeeded" && want != "failed" && want != "cancelled" && want != "ended") {
    return UsageFailure(absl::InvalidArgumentError(absl::StrCat(
        "--for: '", want, "' is not a job end (expected succeeded, failed, cancelled or ended)")));
  }
  // The global --timeout bounds the wait when given; otherwise there is no limit, as for watch.
  const absl::Duration timeout = context.invocation.global.timeout_given
                                     ? context.invocation.global.timeout
                                     : absl::InfiniteDuration();
  absl::StatusOr<std::optional<v1::Job>> ended = AwaitJobEnd(context, id, timeout);
  if (!ended.ok()) {
    return RpcFailure(context,
                      grpc::Status(static_cast<grpc::StatusCode>(ended.status().code()),
                                   std::string(ended.status().message())),
                      timeout);
  }
  if (!ended->has_value()) {
    PrintError(absl::StrCat("timed out after ", absl::FormatDuration(timeout), " waiting for job '",
                            id, "' to end"));
    return kExitFailure;
  }
  const v1::Job& job = **ended;
  const std::string state = absl::AsciiStrToLower(JobStateName(job.state()));
  const bool met = want == "ended" || want == state;
  int code = kExitOk;
  if (context.names) {
    if (met) code = PrintNames({job.id()});
  } else if (context.structured) {
    code = PrintMessage(context, job);
  } else {
    std::cout << JobOutcomeLine(job) << std::endl;
  }
  if (code != kExitOk || met) return code;
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    PrintError(absl::StrCat("job '", id, "' succeeded; waited for it to be ", want));
    return kExitFailure;
  }
  return JobEndExitCode(job);
}

int JobCancel(const CommandContext& context) {
  v1::CancelJobRequest request;
  request.set_id(context.invocation.args.at(0));
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::Job job;
  grpc::Status status = context.connection.jobs().CancelJob(&call, request, &job);
  if (!status.ok()) return UnaryRpcFailure(context, status);
  if (context.names) return PrintNames({job.id()});
  if (context.structured) return PrintMessage(context, job);
  if (job.state() == v1::JOB_STATE_CANCELLED) {
    return PrintText(absl::StrCat("cancelled job '", job.id(), "'\n"));
  }
  return PrintText(absl::StrCat("cancelling job '", job.id(), "' (", JobStateName(job.state()),
                                "; it stops before its next step)\n"));
}

// Downloads job ID's model to --file (-f): the chunks go to a temporary file next to it, which is
// renamed over FILE only when the whole archive arrived, so FILE is never half-written. Without
// --file the archive goes to standard output (refused when that is a terminal), as curl and
// kubectl cp - do; a download that breaks then leaves what came and exits 1.
int JobModel(const CommandContext& context) {
  const std::string& id = context.invocation.args.at(0);
  const std::string path = context.invocation.Get("file");
  const bool to_stdout = !context.invocation.Has("file");
  if (!to_stdout && path.empty()) {
    return UsageFailure(absl::InvalidArgumentError("--file needs a FILE"));
  }
  if (to_stdout && (context.structured || context.names)) {
    return UsageFailure(absl::InvalidArgumentError(
        "'job model' without --file writes the model to standard output; -o describes a file "
        "written with --file FILE"));
  }
  if (to_stdout && isatty(STDOUT_FILENO) == 1) {
    return UsageFailure(absl::InvalidArgumentError(
        "refusing to write a binary model to the terminal: give --file FILE, or redirect "
        "standard output (> model.pt)"));
  }
  const std::string tmp = to_stdout ? "" : absl::StrCat(path, ".tmp-", ::getpid());
  std::ofstream file;
  if (!to_stdout) {
    file.open(tmp, std::ios::binary | std::ios::trunc);
    if (!file) {
      return UsageFailure(absl::InvalidArgumentError(
          absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno))));
    }
  }
  std::ostream& out = to_stdout ? std::cout : file;
  v1::DownloadModelRequest request;
  request.set_id(id);
  grpc::ClientContext call;
  // The deadline covers the whole download: a model is far smaller than a dataset, but give it
  // the upload's allowance so that a large model on a slow link is not cut off.
  const absl::Duration timeout = std::max(kUploadTimeout, context.invocation.global.timeout);
  Connection::SetDeadline(&call, timeout);
  std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader =
      context.connection.jobs().DownloadModel(&call, request);
  v1::ModelChunk chunk;
  int64_t total = -1;
  int64_t written = 0;
  bool had_replies = false;
  while (reader->Read(&chunk)) {
    if (!had_replies) total = chunk.total_bytes();
    had_replies = true;
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    written += static_cast<int64_t>(chunk.data().size());
  }
  const grpc::Status status = reader->Finish();
  out.flush();
  if (!to_stdout) file.close();
  const bool write_failed = to_stdout ? !std::cout : file.fail();
  auto fail = [&](const std::string& message) {
    if (!to_stdout) std::remove(tmp.c_str());
    PrintError(message);
    return kExitFailure;
  };
  if (!status.ok()) {
    if (!to_stdout) std::remove(tmp.c_str());
    return RpcFailure(context, status, timeout, had_replies);
  }
  if (write_failed) return fail(absl::StrCat("cannot write '", to_stdout ? "<stdout>" : tmp, "'"));
  if (written != total) {
    return fail(absl::StrCat("the model of job '", id, "' arrived incomplete (", written, " of ",
                             total, " bytes)"));
  }
  if (to_stdout) return kExitOk;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::StrCat("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno)));
  }
  if (context.names) return PrintNames({path});
  if (context.structured) {
    // No message of its own to print: the fields as JSON, int64 as a string like the others.
    return PrintStructured(context.format,
                           absl::StrCat("{\n \"job\": ", JsonString(id), ",\n \"path\": ",
                                        JsonString(path), ",\n \"bytes\": \"", written, "\"\n}"),
                           /*stream=*/false);
  }
  return PrintText(absl::StrCat("wrote model of ", id, " to ", path, " (", written, " bytes)\n"));
}

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
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  return context.connection.system().ListDevices(&call, v1::ListDevicesRequest(), response);
}

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
    grpc::ClientContext call;
    context.connection.SetUnaryDeadline(&call);
    v1::ListJobsRequest running;  // a device runs one job at a time: one page holds them all
    running.set_state(v1::JOB_STATE_RUNNING);
    running.set_page_size(1000);
    status = context.connection.jobs().ListJobs(&call, running, &jobs);
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

// `version`: trainctl's version, then the daemon's (GetVersion). --client is answered in
// RunCommand, before any connection.
int Version(const CommandContext& context) {
  grpc::ClientContext call;
  context.connection.SetUnaryDeadline(&call);
  v1::VersionInfo server;
  const grpc::Status status =
      context.connection.system().GetVersion(&call, v1::GetVersionRequest(), &server);
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

}  // namespace

void PrintError(absl::string_view message) {
  std::cout.flush();
  std::cerr << "trainctl: " << message << std::endl;
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
      grpc::ClientContext call;
      connection.SetUnaryDeadline(&call);
      const grpc::Status status =
          connection.system().ListDevices(&call, v1::ListDevicesRequest(), &response);
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
