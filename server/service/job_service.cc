// JobService's unary calls (submit, sweep, get, list, cancel, delete) over the engine; its two
// streams, a job's events and its files, are job_watch.cc and job_downloads.cc (job_streams.h).
#include "server/service/job_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/file_io.h"
#include "common/job_limits.h"
#include "common/sha256.h"
#include "server/convert/convert.h"
#include "server/engine/access.h"
#include "server/engine/log.h"
#include "server/service/call_context.h"
#include "server/service/grpc_status.h"
#include "server/service/job_streams.h"

namespace trainerd::service {

using convert::FromProto;
using convert::MemberSpecFromProto;
using convert::ToProto;
using convert::ToProtoFor;

namespace {

// SubmitJobRequest.request_id's form: 1 to 128 characters of [A-Za-z0-9._:-] (a UUID fits).
absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > 128 || !std::all_of(id.begin(), id.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
               c == ':' || c == '-';
      })) {
    return absl::InvalidArgumentError(
        "request_id must be 1 to 128 characters of letters, digits, '.', '_', ':' and '-' "
        "(a UUID fits)");
  }
  return absl::OkStatus();
}

// ListJobsRequest.sweep_id's form: at most 64 of [A-Za-z0-9_-] (the daemon's are
// "sweep-" and 12 hex digits).
absl::Status CheckSweepId(const std::string& id) {
  if (id.size() > 64 || !std::all_of(id.begin(), id.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      })) {
    return absl::InvalidArgumentError(
        "sweep_id must be at most 64 letters, digits, '_' and '-' (as SubmitSweep names a "
        "sweep: sweep-0123456789ab)");
  }
  return absl::OkStatus();
}

// The digest a repeated request id is compared by: every field of the request but the id, and
// which call it was. Deterministic serialization: the same request gives the same bytes.
template <typename Request>
std::string RequestDigest(const char* method, Request request) {
  request.clear_request_id();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    request.SerializeToCodedStream(&coded);
  }
  Sha256 hash;
  hash.Update(method);
  hash.Update(std::string_view("\0", 1));
  hash.Update(bytes);
  return hash.HexDigest();
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

absl::Status CheckJobAccess(engine::Engine* engine, const engine::CallContext& caller,
                            const std::string& id) {
  if (static_cast<int64_t>(id.size()) > kMaxJobIdLength) {
    // Refused without echoing it, so that an error is never larger than a sentence.
    return absl::InvalidArgumentError(absl::StrCat("a job id has at most ", kMaxJobIdLength,
                                                   " characters; this one has ", id.size()));
  }
  if (caller.admin) return absl::OkStatus();
  absl::StatusOr<engine::JobSnapshot> job = engine->GetJob(id);
  if (!job.ok()) return job.status();
  if (!engine::Owns(caller, job->owner)) {
    return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::Job* response) {
  auto spec = FromProto(request->spec());
  if (!spec.ok()) return FinishWith(context, spec.status());
  if (!request->request_id().empty()) {
    if (absl::Status id = CheckRequestId(request->request_id()); !id.ok()) {
      return FinishWith(context, id);
    }
  }
  spec->torchscript = request->torchscript_module();  // bring your own model; usually empty
  spec->exported_program = request->exported_program();
  engine::CallContext caller = CallContextOf(context, authenticator_);
  caller.request_id = request->request_id();
  // A module's check stops when its caller goes away (the context lives until Finish, and
  // IsCancelled may be asked from any thread in the callback API).
  caller.cancelled = [context] {
    return context->IsCancelled()
               ? absl::CancelledError(
                     "the submit call was cancelled (its client went away or its deadline "
                     "passed): its module's check was stopped")
               : absl::OkStatus();
  };
  // A spec-built job is answered once its record is committed, from the blocking pool; a
  // TorchScript job from a module-check thread once its module was checked (seconds at most,
  // bounded by the caller's deadline).
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto submit = [engine = engine_, reactor, request, response, spec = *std::move(spec),
                 caller]() mutable {
    // Off the callback thread: a module may be 64 MiB to hash. (The request lives until Finish.)
    if (!caller.request_id.empty()) {
      caller.request_digest = RequestDigest("SubmitJob", *request);
    }
    std::string viewer = caller.owner;
    engine->SubmitJobAsync(
        std::move(spec), std::move(caller),
        [reactor, response, viewer = std::move(viewer)](absl::StatusOr<engine::JobSnapshot> job) {
          if (job.ok()) *response = ToProtoFor(*job, viewer);
          reactor->Finish(ToGrpcStatus(job.status()));
        });
  };
  if (blocking_ == nullptr) {
    submit();
    return reactor;
  }
  const std::string owner = caller.owner;
  if (absl::Status queued = blocking_->Run(owner, std::move(submit)); !queued.ok()) {
    reactor->Finish(ToGrpcStatus(queued));
  }
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitSweep(grpc::CallbackServerContext* context,
                                                      const v1::SubmitSweepRequest* request,
                                                      v1::SubmitSweepResponse* response) {
  auto spec = FromProto(request->spec());
  if (!spec.ok()) return FinishWith(context, spec.status());
  engine::SweepAxes axes;
  axes.learning_rates.assign(request->learning_rates().begin(), request->learning_rates().end());
  axes.momenta.assign(request->momenta().begin(), request->momenta().end());
  axes.weight_decays.assign(request->weight_decays().begin(), request->weight_decays().end());
  axes.seeds.assign(request->seeds().begin(), request->seeds().end());
  if (request->points_size() > engine::kMaxSweepMembers) {
    return FinishWith(context, absl::InvalidArgumentError(
                                   absl::StrCat("the sweep has ", request->points_size(),
                                                " points; at most ", engine::kMaxSweepMembers)));
  }
  // A random search is its drawn points.
  std::vector<v1::SweepPoint> drawn;
  if (request->has_search()) {
    if (request->points_size() > 0 || !axes.learning_rates.empty() || !axes.momenta.empty() ||
        !axes.weight_decays.empty() || !axes.seeds.empty()) {
      return FinishWith(context, absl::InvalidArgumentError(
                                     "a sweep takes lists, points or a search, one of them"));
    }
    absl::StatusOr<std::vector<v1::SweepPoint>> sampled = convert::SamplePoints(request->search());
    if (!sampled.ok()) return FinishWith(context, sampled.status());
    drawn = *std::move(sampled);
  }
  const int point_count =
      request->has_search() ? static_cast<int>(drawn.size()) : request->points_size();
  for (int index = 0; index < point_count; ++index) {
    const v1::SweepPoint& given =
        request->has_search() ? drawn[static_cast<size_t>(index)] : request->points(index);
    engine::SweepPoint& point = axes.points.emplace_back();
    if (given.has_learning_rate()) point.learning_rate = given.learning_rate();
    if (given.has_momentum()) point.momentum = given.momentum();
    if (given.has_weight_decay()) point.weight_decay = given.weight_decay();
    if (given.has_seed()) point.seed = given.seed();
    if (given.fields().paths_size() > 0) {
      absl::StatusOr<engine::JobSpec> own = MemberSpecFromProto(request->spec(), given);
      if (!own.ok()) {
        return FinishWith(
            context, absl::Status(own.status().code(),
                                  absl::StrCat("points[", index, "]: ", own.status().message())));
      }
      point.spec = *std::move(own);
    }
  }
  engine::CallContext caller = CallContextOf(context, authenticator_);
  if (!request->request_id().empty()) {
    if (absl::Status id = CheckRequestId(request->request_id()); !id.ok()) {
      return FinishWith(context, id);
    }
    caller.request_id = request->request_id();
    caller.request_digest = RequestDigest("SubmitSweep", *request);  // small: no module
  }
  // Spec-built members only: checked, committed and queued without waiting on training.
  return FinishFromPool(blocking_, context, caller.owner,
                        [engine = engine_, response, spec = *std::move(spec),
                         axes = std::move(axes), caller]() mutable {
                          absl::StatusOr<engine::SweepSnapshot> sweep =
                              engine->SubmitSweep(std::move(spec), axes, caller);
                          if (!sweep.ok()) return sweep.status();
                          response->set_sweep_id(sweep->id);
                          for (const engine::JobSnapshot& member : sweep->members) {
                            *response->add_members() = ToProtoFor(member, caller.owner);
                          }
                          return absl::OkStatus();
                        });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  if (absl::Status access = CheckJobAccess(engine_, caller, request->id()); !access.ok()) {
    return FinishWith(context, access);
  }
  auto job = engine_->GetJob(request->id());
  if (job.ok() && !engine::Owns(caller, job->owner)) {
    job = absl::NotFoundError(absl::StrCat("job '", request->id(), "' not found"));
  }
  if (job.ok()) *response = ToProtoFor(*job, caller.owner);
  return FinishWith(context, job.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  if (request->page_size() < 0) {
    return FinishWith(context, absl::InvalidArgumentError(absl::StrCat(
                                   "page_size must be 0 (the default, 100) or more, not ",
                                   request->page_size())));
  }
  engine::JobQuery query;
  query.page_size = request->page_size() == 0
                        ? 100
                        : std::min<int32_t>(request->page_size(), engine::kMaxJobPageSize);
  query.page_token = request->page_token();
  if (request->state() != v1::JOB_STATE_UNSPECIFIED) {
    absl::StatusOr<engine::JobState> state = FromProto(request->state());
    if (!state.ok()) {
      return FinishWith(context, absl::InvalidArgumentError(absl::StrCat(
                                     "state ", static_cast<int>(request->state()),
                                     " is not a job state (QUEUED, RUNNING, SUCCEEDED, FAILED "
                                     "or CANCELLED)")));
    }
    query.state = *state;
  }
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  if (!request->dataset().empty()) {
    // By key, as the records keep it: the caller's bare name is its own dataset.
    absl::StatusOr<std::string> key =
        engine::ResolveDatasetReference(request->dataset(), caller.owner);
    if (!key.ok()) return FinishWith(context, key.status());
    query.dataset = *key;
  }
  switch (request->view()) {
    case v1::JOB_VIEW_UNSPECIFIED:
    case v1::JOB_VIEW_BASIC:
      break;
    case v1::JOB_VIEW_FULL:
      query.full = true;
      break;
    default:
      return FinishWith(context,
                        absl::InvalidArgumentError("view must be JOB_VIEW_BASIC or JOB_VIEW_FULL"));
  }
  query.newest_first = request->newest_first();
  if (!caller.admin) query.owner = caller.owner;  // a tenant lists its own jobs
  if (!request->request_id().empty()) {
    if (absl::Status id = CheckRequestId(request->request_id()); !id.ok()) {
      return FinishWith(context, id);
    }
    // A request id is its submitter's own, an admin's too (as at submit).
    query.request_id = request->request_id();
    query.owner = caller.owner;
  }
  if (absl::Status sweep = CheckSweepId(request->sweep_id()); !sweep.ok()) {
    return FinishWith(context, sweep);
  }
  query.sweep_id = request->sweep_id();
  absl::StatusOr<engine::JobPage> page = engine_->ListJobs(query);
  if (page.ok()) {
    // Held to kMaxListReplyBytes (less a margin for the token and framing): a page that would
    // pass it ends at the job before, and its token continues from there.
    constexpr int64_t kBudget = kMaxListReplyBytes - 4096;
    int64_t bytes = 0;
    size_t sent = 0;
    for (; sent < page->jobs.size(); ++sent) {
      v1::Job job = ToProtoFor(page->jobs[sent], caller.owner);
      const int64_t size = static_cast<int64_t>(job.ByteSizeLong()) + 8;
      if (sent > 0 && bytes + size > kBudget) break;
      bytes += size;
      *response->add_jobs() = std::move(job);
    }
    response->set_next_page_token(sent < page->jobs.size() && sent <= page->resume_tokens.size()
                                      ? page->resume_tokens[sent - 1]
                                      : page->next_page_token);
  }
  return FinishWith(context, page.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(grpc::CallbackServerContext* context,
                                                    const v1::DeleteJobRequest* request,
                                                    v1::DeleteJobResponse* /*response*/) {
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  return FinishFromPool(blocking_, context, caller.owner, [engine = engine_, caller, request] {
    absl::Status status = CheckJobAccess(engine, caller, request->id());
    if (status.ok()) status = engine->DeleteJob(request->id());
    return status;
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::Job* response) {
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  if (absl::Status access = CheckJobAccess(engine_, caller, request->id()); !access.ok()) {
    return FinishWith(context, access);
  }
  return FinishFromPool(blocking_, context, caller.owner,
                        [engine = engine_, request, response, viewer = caller.owner] {
                          absl::StatusOr<engine::JobSnapshot> job =
                              engine->CancelJob(request->id());
                          if (job.ok()) *response = ToProtoFor(*job, viewer);
                          return job.status();
                        });
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  absl::Status access = CheckJobAccess(engine_, caller, request->id());
  std::optional<CallerSlots::Slot> held;
  if (access.ok()) {
    absl::StatusOr<CallerSlots::Slot> slot = watch_slots_.Take(caller.owner);
    if (slot.ok()) {
      held = *std::move(slot);
    } else {
      access = slot.status();
    }
  }
  return StartWatch(engine_, request->id(), caller.owner, access, std::move(held));
}

grpc::ServerWriteReactor<v1::ModelChunk>* JobServiceImpl::DownloadCheckpoint(
    grpc::CallbackServerContext* context, const v1::DownloadCheckpointRequest* request) {
  return StartCheckpointDownload(
      engine_, request->id(), request->epoch(),
      CheckJobAccess(engine_, CallContextOf(context, authenticator_), request->id()));
}

grpc::ServerWriteReactor<v1::ModelChunk>* JobServiceImpl::DownloadModel(
    grpc::CallbackServerContext* context, const v1::DownloadModelRequest* request) {
  return StartModelDownload(
      engine_, request->id(), request->format(),
      CheckJobAccess(engine_, CallContextOf(context, authenticator_), request->id()));
}

}  // namespace trainerd::service
