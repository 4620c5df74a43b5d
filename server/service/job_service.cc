#include "server/service/job_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
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

namespace trainerd::service {

using convert::FromProto;
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

// OK when `caller` may see and manage job `id` (access.h); NOT_FOUND, worded as for an unknown
// id, when it may not. Owners never change, so the answer holds for the call that follows.
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

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Streams one job's events: the job as it stands (unless it ended), its epochs so far, live
// events until a terminal state, and that state last. A watcher's memory is bounded in bytes,
// not events: epochs are written from a queue of at most kEpochPage events, and a watcher that
// falls behind (or a long history) is caught up page by page from the engine (Engine::JobEpochs)
// as its writes complete, so that it still receives every epoch, at its own pace, and nothing
// piles up for it. State changes carry the job without its epochs (the events carry those).
// Keeps one write in flight, calls Finish once, deletes itself in OnDone.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  // Epochs fetched or queued at a time; a few tens of kilobytes.
  static constexpr int32_t kEpochPage = 256;

  // `viewer`: the caller's name, as whom the job's datasets are named.
  WatchReactor(engine::Engine* engine, std::string id, std::string viewer)
      : engine_(engine), id_(std::move(id)), sink_(std::make_shared<Sink>(std::move(viewer))) {}

  // Called once, from WatchJob, before any reaction can run; `access` is the caller's right to
  // see the job (CheckJobAccess), and ends the stream at once when not OK.
  void Start(const absl::Status& access) {
    if (!access.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FinishLocked(ToGrpcStatus(access));
      return;
    }
    // A local reference: the stream may end (and this reactor be deleted) before Attach runs;
    // Attach then finds the sink detached and does nothing.
    std::shared_ptr<Sink> sink = sink_;
    auto job = engine_->SubscribeJob(id_, sink, /*summary=*/true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!job.ok()) {
        FinishLocked(ToGrpcStatus(job.status()));
        return;
      }
      v1::JobEvent state;
      *state.mutable_job() = ToProtoFor(*job, sink->viewer());
      if (IsTerminalState(state.job().state())) {
        held_state_ = std::move(state);  // after the epochs
      } else {
        pending_.push_back(std::move(state));
      }
      catching_up_ = job->epochs_completed > 0;
      WriteNextLocked(/*may_call_engine=*/true);
    }
    // Events that arrived meanwhile follow, in order.
    sink->Attach(this);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the client went away
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
      return;
    }
    WriteNextLocked(/*may_call_engine=*/true);
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    sink_->Detach();
    engine_->UnsubscribeJob(id_, sink_.get());
    delete this;
  }

  // One of the caller's watch slots, given back when the stream is done.
  void HoldSlot(CallerSlots::Slot slot) { slot_ = std::move(slot); }

 private:
  // The engine pushes into this; it forwards to the reactor once attached and drops events
  // after the reactor is done. Before Attach it keeps at most the latest state and the first
  // epoch it missed (the reactor fetches the epochs).
  class Sink final : public engine::JobEventSink {
   public:
    explicit Sink(std::string viewer) : viewer_(std::move(viewer)) {}
    const std::string& viewer() const { return viewer_; }
    void Push(const engine::JobEvent& event) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (detached_) return;
      if (event.kind == engine::JobEvent::Kind::kInterrupted) {
        interrupted_ = true;
        if (reactor_ != nullptr) reactor_->EndInterrupted();
        return;
      }
      if (event.kind == engine::JobEvent::Kind::kEpoch) {
        if (reactor_ != nullptr) {
          reactor_->OnEpoch(event.epoch);
        } else {
          missed_epochs_ = true;
        }
        return;
      }
      v1::Job job = ToProtoFor(event.job, viewer_);
      job.clear_epochs();  // the epoch events carry them
      if (reactor_ != nullptr) {
        reactor_->OnState(std::move(job));
      } else {
        early_state_ = std::move(job);
      }
    }
    void Attach(WatchReactor* reactor) {
      std::lock_guard<std::mutex> lock(mu_);
      if (detached_) return;
      reactor_ = reactor;
      if (missed_epochs_) reactor->CatchUp();
      if (early_state_.has_value()) reactor->OnState(*std::move(early_state_));
      early_state_.reset();
      if (interrupted_) reactor->EndInterrupted();
    }
    void Detach() {
      std::lock_guard<std::mutex> lock(mu_);
      detached_ = true;
      reactor_ = nullptr;
    }

   private:
    const std::string viewer_;
    std::mutex mu_;
    WatchReactor* reactor_ = nullptr;     // guarded by mu_
    bool detached_ = false;               // guarded by mu_
    bool interrupted_ = false;            // guarded by mu_
    bool missed_epochs_ = false;          // guarded by mu_
    std::optional<v1::Job> early_state_;  // guarded by mu_
  };

  // The daemon stopped before the job ended: once what is queued is written, the stream ends with
  // UNAVAILABLE (the job resumes at the daemon's next start; watch it again then).
  void EndInterrupted() {
    std::lock_guard<std::mutex> lock(mu_);
    end_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the daemon is shutting down; job '" + id_ +
                                   "' resumes when it starts again (watch it again then)");
    WriteNextLocked(/*may_call_engine=*/false);
  }

  // A live epoch: queued when it is the next one and the queue has room; otherwise it (and the
  // ones after it) are fetched once the queue drains.
  void OnEpoch(const engine::EpochResult& epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || epoch.epoch <= queued_through_) return;  // fetched already
    if (!catching_up_ && epoch.epoch == queued_through_ + 1 &&
        static_cast<int32_t>(pending_.size()) < kEpochPage) {
      v1::JobEvent event;
      *event.mutable_epoch() = ToProto(epoch);
      pending_.push_back(std::move(event));
      queued_through_ = epoch.epoch;
    } else {
      catching_up_ = true;
    }
    // Inside the engine's Push, which must not call back into the engine.
    WriteNextLocked(/*may_call_engine=*/false);
  }

  // From Attach (on the handler's thread, not inside the engine's Push): epochs published between
  // the subscription and the attach are fetched, now if the stream is idle.
  void CatchUp() {
    std::lock_guard<std::mutex> lock(mu_);
    catching_up_ = true;
    WriteNextLocked(/*may_call_engine=*/true);
  }

  // A state change: written in order with the epochs queued before it, unless epochs are still
  // to be fetched, in which case the latest state waits until they are.
  void OnState(v1::Job job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    v1::JobEvent event;
    *event.mutable_job() = std::move(job);
    if (catching_up_ || held_state_.has_value()) {
      held_state_ = std::move(event);
    } else {
      pending_.push_back(std::move(event));
    }
    WriteNextLocked(/*may_call_engine=*/false);
  }

  static bool IsTerminalState(v1::JobState state) {
    return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
           state == v1::JOB_STATE_CANCELLED;
  }

  // `may_call_engine`: false inside the engine's Push. Inside Push the reactor only starts
  // catching up when its queue is full, so a write is in flight and the fetch is made at its
  // OnWriteDone; every other fetch is made from a reaction, Start or Attach.
  void WriteNextLocked(bool may_call_engine) {
    if (writing_ || finished_) return;
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    if (pending_.empty() && catching_up_ && may_call_engine) {
      absl::StatusOr<std::vector<engine::EpochResult>> page =
          engine_->JobEpochs(id_, queued_through_, kEpochPage);
      if (!page.ok()) {
        FinishLocked(ToGrpcStatus(page.status()));
        return;
      }
      for (const engine::EpochResult& epoch : *page) {
        v1::JobEvent event;
        *event.mutable_epoch() = ToProto(epoch);
        pending_.push_back(std::move(event));
        queued_through_ = epoch.epoch;
      }
      if (static_cast<int32_t>(page->size()) < kEpochPage) catching_up_ = false;
    }
    if (pending_.empty() && !catching_up_ && held_state_.has_value()) {
      pending_.push_back(*std::move(held_state_));
      held_state_.reset();
    }
    if (pending_.empty()) {
      if (terminal_written_) {
        FinishLocked(grpc::Status::OK);
      } else if (end_status_.has_value() && !catching_up_) {
        FinishLocked(*end_status_);
      }
      return;
    }
    current_ = std::move(pending_.front());
    pending_.pop_front();
    if (current_.has_job() && IsTerminalState(current_.job().state())) {
      terminal_written_ = true;
      pending_.clear();  // nothing follows a terminal state
    }
    writing_ = true;
    StartWrite(&current_);
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    pending_.clear();
    held_state_.reset();
    Finish(status);
  }

  engine::Engine* const engine_;
  const std::string id_;
  const std::shared_ptr<Sink> sink_;
  std::mutex mu_;
  std::deque<v1::JobEvent> pending_;        // guarded by mu_: at most a page, and states
  std::optional<v1::JobEvent> held_state_;  // guarded by mu_: written once caught up
  int32_t queued_through_ = 0;              // guarded by mu_: the last epoch queued
  bool catching_up_ = false;                // guarded by mu_: epochs to fetch from the engine
  v1::JobEvent current_;                    // the write in flight
  bool writing_ = false;                    // guarded by mu_
  bool terminal_written_ = false;           // guarded by mu_
  bool cancelled_ = false;                  // guarded by mu_
  bool finished_ = false;                   // guarded by mu_
  std::optional<grpc::Status> end_status_;  // guarded by mu_: how the stream ends, untimely
  CallerSlots::Slot slot_;
};

// Streams a file the daemon wrote for a job: a succeeded job's TorchScript archive from
// <data_dir>/models/<id>.pt or its state_dict from <id>.safetensors (DownloadModel), or one of its
// checkpoints (DownloadCheckpoint), in
// chunks of at most kModelChunkBytes. One write in flight: the next chunk is read in OnWriteDone,
// so at most one chunk is in memory whatever the file's size. That read is a small local file read
// (1 MiB from a file the engine wrote and fsynced, normally still in the page cache), which the
// service accepts on a reaction instead of adding a hop to the engine's I/O thread per chunk.
// Finish is called once (after the last chunk, on an error, or when the client goes away — a
// write is in flight until then, so a cancelled client always surfaces as OnWriteDone(false));
// the reactor deletes itself in OnDone.
class ModelDownloadReactor final : public grpc::ServerWriteReactor<v1::ModelChunk> {
 public:
  static constexpr int64_t kModelChunkBytes = int64_t{1} << 20;

  // Called once, from DownloadModel, before any reaction can run: the TorchScript archive, or
  // with MODEL_FORMAT_SAFETENSORS the state_dict kept beside it (<id>.safetensors).
  void Start(engine::Engine* engine, const std::string& id, v1::ModelFormat format,
             const absl::Status& access) {
    if (!access.ok()) {
      Finish(ToGrpcStatus(access));
      return;
    }
    if (format == v1::MODEL_FORMAT_SAFETENSORS) {
      const absl::StatusOr<engine::Engine::StateDictFile> file = engine->StateDictPath(id);
      if (!file.ok()) {
        Finish(ToGrpcStatus(file.status()));
        return;
      }
      Open(id, file->path, file->sha256, "state_dict", "", "train the job again");
      return;
    }
    if (format != v1::MODEL_FORMAT_UNSPECIFIED && format != v1::MODEL_FORMAT_TORCHSCRIPT &&
        format != v1::MODEL_FORMAT_PT2) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("format must be MODEL_FORMAT_TORCHSCRIPT (1), "
                                       "MODEL_FORMAT_SAFETENSORS (2) or MODEL_FORMAT_PT2 (3); got ",
                                       static_cast<int>(format))));
      return;
    }
    const absl::StatusOr<std::string> path = engine->ModelArchivePath(id);
    if (!path.ok()) {
      Finish(ToGrpcStatus(path.status()));
      return;
    }
    std::string expected_sha256;
    if (absl::StatusOr<engine::JobSnapshot> job = engine->GetJob(id); job.ok()) {
      expected_sha256 = job->model_sha256;  // empty for models of older builds: not checked
      // An exported program's job keeps its model as a .pt2; its spec names it
      // "exported (N bytes)" (engine_admission.cc). A spec-built job's .pt2 is made from its
      // state_dict; a TorchScript job's needs the user's Python module.
      if (format == v1::MODEL_FORMAT_PT2 && !absl::StartsWith(job->spec.model, "exported (")) {
        if (absl::StartsWith(job->spec.model, "torchscript (")) {
          Finish(grpc::Status(
              grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("job '", id,
                           "' trained a TorchScript module, whose .pt2 is made where its Python "
                           "class is: job.module(MyNet()) then torch.export.export, or the "
                           "Python client's job.export(path, module=MyNet()); the weights come "
                           "as safetensors (--format safetensors)")));
          return;
        }
        const absl::StatusOr<engine::Engine::StateDictFile> pt2 = engine->Pt2Path(id);
        if (!pt2.ok()) {
          Finish(ToGrpcStatus(pt2.status()));
          return;
        }
        Open(id, pt2->path, pt2->sha256, ".pt2", "", "train the job again");
        return;
      }
    }
    Open(id, *path, expected_sha256, "model", "", "train the job again");
  }

  // Called once, from DownloadCheckpoint: `epoch`'s checkpoint, or the newest with 0.
  void StartCheckpoint(engine::Engine* engine, const std::string& id, int32_t epoch,
                       const absl::Status& access) {
    if (!access.ok()) {
      Finish(ToGrpcStatus(access));
      return;
    }
    if (epoch < 0) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("checkpoint epoch must be >= 1, or 0 for the newest; got ",
                                       epoch)));
      return;
    }
    engine::CheckpointInfo info;
    const absl::StatusOr<std::string> path = engine->CheckpointFilePath(id, epoch, &info);
    if (!path.ok()) {
      Finish(ToGrpcStatus(path.status()));
      return;
    }
    // The SHA-256 recorded when it was written (empty for checkpoints of older builds: not
    // checked).
    Open(id, *path, info.sha256, "checkpoint", absl::StrCat(" (epoch ", info.epoch, ")"),
         "download another epoch's checkpoint");
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    if (remaining_ == 0) {
      // Every byte went through the hash: a file damaged on disk (a flipped byte, a cut) ends
      // the stream DATA_LOSS instead of OK, and trainctl keeps nothing.
      const std::string digest = hash_.HexDigest();
      if (!expected_sha256_.empty() && digest != expected_sha256_) {
        engine::LogWarning(absl::StrCat("the ", what_, " file '", path_, "' of job '", id_, "'",
                                        detail_,
                                        " does not match the checksum recorded when it was "
                                        "written (",
                                        expected_sha256_, "; the file has ", digest,
                                        "): it is damaged"));
        Finish(grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("the ", what_, " file of job '", id_, "'", detail_,
                                         " is damaged (it no longer matches the checksum "
                                         "recorded when it was written); ", remedy_)));
        return;
      }
      Finish(grpc::Status::OK);
      return;
    }
    chunk_.set_total_bytes(0);  // only on the first chunk
    WriteNextChunk();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNextChunk() {
    const int64_t n = std::min(remaining_, kModelChunkBytes);
    std::string* data = chunk_.mutable_data();
    data->resize(static_cast<size_t>(n));
    if (n > 0 && !file_.read(data->data(), n)) {
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "the " + what_ + " file ended early"));
      return;
    }
    hash_.Update(*data);
    remaining_ -= n;
    StartWrite(&chunk_);
  }

  void Open(const std::string& id, const std::string& path, const std::string& expected_sha256,
            std::string what, std::string detail, std::string remedy) {
    id_ = id;
    path_ = path;
    expected_sha256_ = expected_sha256;
    what_ = std::move(what);
    detail_ = std::move(detail);
    remedy_ = std::move(remedy);
    errno = 0;
    file_.open(path, std::ios::binary | std::ios::ate);
    if (!file_) {
      // Only a file that is there and cannot be read is lost data: a job deleted since the
      // lookup is NOT_FOUND, and a daemon out of descriptors is RESOURCE_EXHAUSTED (try again).
      const int error_number = errno;
      if (error_number == ENOENT) {
        Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                            "job '" + id + "' was deleted; its " + what_ + " is gone"));
      } else if (IsOutOfDescriptors(error_number)) {
        Finish(ToGrpcStatus(TooManyOpenFiles(error_number, "opening the " + what_ + " file")));
      } else {
        Finish(grpc::Status(grpc::StatusCode::DATA_LOSS,
                            "the " + what_ + " file of job '" + id + "'" + detail_ +
                                " cannot be read"));
      }
      return;
    }
    remaining_ = static_cast<int64_t>(file_.tellg());
    file_.seekg(0);
    chunk_.set_total_bytes(remaining_);
    WriteNextChunk();  // the first chunk goes even for an empty file, carrying total_bytes
  }

  std::ifstream file_;
  std::string id_;
  std::string path_;
  std::string what_;    // "model" or "checkpoint": what the messages name
  std::string detail_;  // after the job in the messages: "" or " (epoch 3)"
  std::string remedy_;  // what to do about a damaged file
  std::string expected_sha256_;  // recorded with the job; empty: not checked
  Sha256 hash_;                  // of the bytes sent so far
  int64_t remaining_ = 0;        // bytes of the file not yet written
  v1::ModelChunk chunk_;         // the write in flight
};

}  // namespace

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
  for (const v1::SweepPoint& given : request->points()) {
    engine::SweepPoint& point = axes.points.emplace_back();
    if (given.has_learning_rate()) point.learning_rate = given.learning_rate();
    if (given.has_momentum()) point.momentum = given.momentum();
    if (given.has_weight_decay()) point.weight_decay = given.weight_decay();
    if (given.has_seed()) point.seed = given.seed();
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
  auto* reactor = new WatchReactor(engine_, request->id(), caller.owner);
  absl::Status access = CheckJobAccess(engine_, caller, request->id());
  if (access.ok()) {
    absl::StatusOr<CallerSlots::Slot> slot = watch_slots_.Take(caller.owner);
    if (slot.ok()) {
      reactor->HoldSlot(*std::move(slot));
    } else {
      access = slot.status();
    }
  }
  reactor->Start(access);
  return reactor;
}

grpc::ServerWriteReactor<v1::ModelChunk>* JobServiceImpl::DownloadCheckpoint(
    grpc::CallbackServerContext* context, const v1::DownloadCheckpointRequest* request) {
  auto* reactor = new ModelDownloadReactor();
  reactor->StartCheckpoint(
      engine_, request->id(), request->epoch(),
      CheckJobAccess(engine_, CallContextOf(context, authenticator_), request->id()));
  return reactor;
}

grpc::ServerWriteReactor<v1::ModelChunk>* JobServiceImpl::DownloadModel(
    grpc::CallbackServerContext* context, const v1::DownloadModelRequest* request) {
  auto* reactor = new ModelDownloadReactor();
  reactor->Start(engine_, request->id(), request->format(),
                 CheckJobAccess(engine_, CallContextOf(context, authenticator_), request->id()));
  return reactor;
}

}  // namespace trainerd::service
