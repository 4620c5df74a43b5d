// trainctl's job commands: submit (and --watch), job list, get, watch, wait, cancel, rm, model
// and checkpoint (the downloads of a trained model and of a checkpoint).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/command_support.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/output.h"
#include "client/requests.h"
#include "common/job_limits.h"
#include "common/memory_size.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {
namespace {

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

// The --format word of a model format.
const char* FormatName(v1::ModelFormat format) {
  if (format == v1::MODEL_FORMAT_PT2) return "pt2";
  return format == v1::MODEL_FORMAT_SAFETENSORS ? "safetensors" : "torchscript";
}

}  // namespace

int Submit(const CommandContext& context) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromFlags(context.invocation);
  if (!spec.ok()) return UsageFailure(spec.status());
  absl::StatusOr<std::string> torchscript = ReadTorchScriptFlag(context.invocation);
  if (!torchscript.ok()) return UsageFailure(torchscript.status());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  if (IsExportedProgramFile(*torchscript)) {
    request.mutable_spec()->clear_model();
    request.set_exported_program(*std::move(torchscript));
  } else {
    request.set_torchscript_module(*std::move(torchscript));
  }
  if (context.invocation.Has("request-id")) {
    request.set_request_id(context.invocation.Get("request-id"));
  }
  v1::Job job;
  if (int failed = CallOrFail(context, context.connection.jobs(), &v1::JobService::Stub::SubmitJob,
                              request, &job)) {
    return failed;
  }

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

// AwaitJobEnd: what it does is said in client/command_support.h (sweep --watch waits with it too).
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

// The newest --limit jobs (shown oldest first, so that the newest is at the bottom), or with
// --all every page in creation order; filtered by --state and --dataset on the daemon.
grpc::Status ListJobPages(const CommandContext& context, v1::ListJobsRequest request,
                          bool every_page, v1::ListJobsResponse* response) {
  while (true) {
    v1::ListJobsResponse page;
    grpc::Status status = context.connection.Call(context.connection.jobs(),
                                                  &v1::JobService::Stub::ListJobs, request, &page);
    if (!status.ok()) return status;
    for (v1::Job& job : *page.mutable_jobs()) *response->add_jobs() = std::move(job);
    if (!every_page || page.next_page_token().empty()) {
      response->set_next_page_token(page.next_page_token());
      return grpc::Status::OK;
    }
    request.set_page_token(page.next_page_token());
  }
}

int JobList(const CommandContext& context) {
  if (context.invocation.Has("sweep")) return SweepList(context);
  if (context.invocation.Has("watch")) {
    return UsageFailure(absl::InvalidArgumentError(
        "--watch follows the members of a sweep (give --sweep ID); 'trainctl job watch ID' "
        "follows one job"));
  }
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
  if (grpc::Status status = ListJobPages(context, request, all, &response); !status.ok()) {
    return UnaryRpcFailure(context, status);
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
  v1::DeleteJobResponse response;
  if (int failed = CallOrFail(context, context.connection.jobs(), &v1::JobService::Stub::DeleteJob,
                              request, &response)) {
    return failed;
  }
  if (context.names) return PrintNames({request.id()});
  return context.structured ? PrintMessage(context, response)
                            : PrintText(absl::StrCat("deleted job '", request.id(),
                                                     "' with its model and checkpoints\n"));
}

int JobGet(const CommandContext& context) {
  v1::GetJobRequest request;
  request.set_id(context.invocation.args.at(0));
  v1::Job job;
  if (int failed = CallOrFail(context, context.connection.jobs(), &v1::JobService::Stub::GetJob,
                              request, &job)) {
    return failed;
  }
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
  v1::Job job;
  if (int failed = CallOrFail(context, context.connection.jobs(), &v1::JobService::Stub::CancelJob,
                              request, &job)) {
    return failed;
  }
  if (context.names) return PrintNames({job.id()});
  if (context.structured) return PrintMessage(context, job);
  if (job.state() == v1::JOB_STATE_CANCELLED) {
    return PrintText(absl::StrCat("cancelled job '", job.id(), "'\n"));
  }
  return PrintText(absl::StrCat("cancelling job '", job.id(), "' (", JobStateName(job.state()),
                                "; it stops before its next step)\n"));
}

namespace {

// A checkpoint holds the model, the optimizer's state (up to three tensors per parameter: amsgrad)
// and, for a job that hands back its best epoch, a second copy of the model: the default bound on
// its download.
constexpr int64_t kMaxCheckpointDownloadBytes =
    kMaxModelParameters * 4 * 5 + (int64_t{64} << 20);

// Downloads a file the daemon streams in ModelChunks (`start` opens the stream on `call`): job ID's
// model or one of its checkpoints, `what` naming it in messages ("model", "checkpoint"). The
// chunks go to --file (-f) by way of a temporary file next to it, which is renamed over FILE only
// when the whole file arrived, so FILE is never half-written. Without --file the bytes go to
// standard output (refused when that is a terminal), as curl and kubectl cp - do; a download that
// breaks then leaves what came and exits 1. The download takes at most the size the daemon
// declares on its first chunk, and refuses a declared size above --max-size (`default_max` unless
// given): a daemon that declares too much, or sends more than it declared, is cancelled at once
// and nothing is kept.
int DownloadJobFile(
    const CommandContext& context, const std::string& what, const std::string& format,
    int64_t default_max,
    const std::function<std::unique_ptr<grpc::ClientReader<v1::ModelChunk>>(grpc::ClientContext*)>&
        start) {
  const std::string& id = context.invocation.args.at(0);
  const std::string path = context.invocation.Get("file");
  const bool to_stdout = !context.invocation.Has("file");
  if (!to_stdout && path.empty()) {
    return UsageFailure(absl::InvalidArgumentError("--file needs a FILE"));
  }
  int64_t max_bytes = default_max;
  if (context.invocation.Has("max-size")) {
    absl::StatusOr<MemorySize> size = ParseMemorySize(context.invocation.Get("max-size"));
    if (!size.ok() || size->bytes <= 0) {
      return UsageFailure(absl::InvalidArgumentError(
          absl::StrCat("--max-size takes a size in bytes above 0 (e.g. 512MiB or 2GB), not '",
                       context.invocation.Get("max-size"), "'")));
    }
    max_bytes = size->bytes;
  }
  if (to_stdout && (context.structured || context.names)) {
    return UsageFailure(absl::InvalidArgumentError(
        absl::StrCat("'job ", what, "' without --file writes the ", what,
                     " to standard output; -o describes a file written with --file FILE")));
  }
  if (to_stdout && isatty(STDOUT_FILENO) == 1) {
    return UsageFailure(absl::InvalidArgumentError(
        absl::StrCat("refusing to write a binary ", what,
                     " to the terminal: give --file FILE, or redirect standard output (> ", what,
                     ".pt)")));
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
  grpc::ClientContext call;
  // The deadline covers the whole download: a model is far smaller than a dataset, but give it
  // the upload's allowance so that a large model on a slow link is not cut off.
  const absl::Duration timeout = std::max(kUploadTimeout, context.invocation.global.timeout);
  Connection::SetDeadline(&call, timeout);
  std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader = start(&call);
  v1::ModelChunk chunk;
  int64_t total = -1;
  int64_t written = 0;
  bool had_replies = false;
  std::string refused;  // why the download was stopped (the daemon's fault); empty: it was not
  while (reader->Read(&chunk)) {
    if (!had_replies) {
      total = chunk.total_bytes();
      if (total < 0 || total > max_bytes) {
        refused = total < 0 ? absl::StrCat("the daemon declared job '", id, "''s ", what, " as ",
                                           total, " bytes, which is no size")
                            : absl::StrCat("the daemon declared job '", id, "''s ", what, " as ",
                                           total, " bytes, more than --max-size allows (",
                                           max_bytes,
                                           " bytes); give a larger --max-size to "
                                           "download it");
        break;
      }
    }
    had_replies = true;
    const int64_t size = static_cast<int64_t>(chunk.data().size());
    if (size > total - written) {
      refused = absl::StrCat("the daemon sent more than the ", total,
                             " bytes it declared for job '", id, "''s ", what, " (",
                             written + size, " so far); stopped reading",
                             to_stdout ? "" : " and kept nothing");
      break;
    }
    out.write(chunk.data().data(), static_cast<std::streamsize>(size));
    written += size;
  }
  if (!refused.empty()) call.TryCancel();  // the daemon sends nothing more
  const grpc::Status status = reader->Finish();
  out.flush();
  if (!to_stdout) file.close();
  const bool write_failed = to_stdout ? !std::cout : file.fail();
  auto fail = [&](const std::string& message) {
    if (!to_stdout) std::remove(tmp.c_str());
    PrintError(message);
    return kExitFailure;
  };
  if (!refused.empty()) return fail(refused);
  if (!status.ok()) {
    if (!to_stdout) std::remove(tmp.c_str());
    return RpcFailure(context, status, timeout, had_replies);
  }
  if (write_failed) return fail(absl::StrCat("cannot write '", to_stdout ? "<stdout>" : tmp, "'"));
  if (written != total) {
    return fail(absl::StrCat("the ", what, " of job '", id, "' arrived incomplete (", written,
                             " of ", total, " bytes)"));
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
                                        JsonString(path),
                                        format.empty()
                                            ? std::string()
                                            : absl::StrCat(",\n \"format\": ", JsonString(format)),
                                        ",\n \"bytes\": \"", written, "\"\n}"),
                           /*stream=*/false);
  }
  return PrintText(absl::StrCat("wrote ", what, " of ", id, " to ", path, " (",
                                format.empty() ? "" : absl::StrCat(format, ", "), written,
                                " bytes)\n"));
}

}  // namespace

// Downloads job ID's model (DownloadJobFile) in --format's form: TorchScript (the default), a
// safetensors state_dict, or an exported program's .pt2.
int JobModel(const CommandContext& context) {
  v1::DownloadModelRequest request;
  request.set_id(context.invocation.args.at(0));
  request.set_format(v1::MODEL_FORMAT_TORCHSCRIPT);
  if (context.invocation.Has("format")) {
    const std::string name = absl::AsciiStrToLower(context.invocation.Get("format"));
    if (name == "safetensors") {
      request.set_format(v1::MODEL_FORMAT_SAFETENSORS);
    } else if (name == "pt2") {
      request.set_format(v1::MODEL_FORMAT_PT2);
    } else if (name != "torchscript") {
      return UsageFailure(absl::InvalidArgumentError(
          absl::StrCat("--format takes torchscript, safetensors or pt2, not '",
                       context.invocation.Get("format"), "'")));
    }
  }
  return DownloadJobFile(context, "model", FormatName(request.format()), kMaxModelDownloadBytes,
                         [&](grpc::ClientContext* call) {
                           return context.connection.jobs().DownloadModel(call, request);
                         });
}

// Downloads one of job ID's checkpoints (DownloadJobFile): --epoch N's, or the newest.
int JobCheckpoint(const CommandContext& context) {
  v1::DownloadCheckpointRequest request;
  request.set_id(context.invocation.args.at(0));
  if (context.invocation.Has("epoch")) {
    absl::StatusOr<int64_t> epoch =
        context.invocation.GetInt("epoch", 0, 1, std::numeric_limits<int32_t>::max());
    if (!epoch.ok()) return UsageFailure(epoch.status());
    request.set_epoch(static_cast<int32_t>(*epoch));
  }
  return DownloadJobFile(context, "checkpoint", "", kMaxCheckpointDownloadBytes,
                         [&](grpc::ClientContext* call) {
                           return context.connection.jobs().DownloadCheckpoint(call, request);
                         });
}

}  // namespace trainerd::client
