#include "server/service/job_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/convert/convert.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

using convert::FromProto;
using convert::ToProto;

namespace {

// A watcher that reads more slowly than its job produces events keeps at most this many unsent
// events; beyond it the queued epoch events are dropped and the job as it stands is sent instead
// (JobEvent.skipped says so).
constexpr size_t kMaxPendingEvents = 256;

// The call's deadline; InfiniteFuture when the client set none.
absl::Time CallDeadline(const grpc::CallbackServerContext& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Streams one job's events: the history (epochs so far, then the job's state) and then live events
// until a terminal state. Keeps one write in flight, calls Finish once, deletes itself in OnDone.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(engine::Engine* engine, std::string id)
      : engine_(engine), id_(std::move(id)), sink_(std::make_shared<Sink>()) {}

  // Called once, from WatchJob, before any reaction can run.
  void Start() {
    // A local reference: once the history is queued the stream may end (and this reactor be
    // deleted) before Attach runs; Attach then finds the sink detached and does nothing.
    std::shared_ptr<Sink> sink = sink_;
    auto job = engine_->SubscribeJob(id_, sink);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!job.ok()) {
        FinishLocked(ToGrpcStatus(job.status()));
        return;
      }
      // A long history goes as the notice and the job (which carries every epoch), not as one
      // event per epoch, as it would once the stream had fallen behind.
      if (job->epochs.size() > kMaxPendingEvents) {
        v1::JobEvent notice;
        notice.mutable_skipped()->set_epochs(static_cast<int64_t>(job->epochs.size()));
        pending_.push_back(std::move(notice));
      } else {
        for (const auto& epoch : job->epochs) {
          v1::JobEvent event;
          *event.mutable_epoch() = ToProto(epoch);
          pending_.push_back(std::move(event));
        }
      }
      v1::JobEvent state;
      *state.mutable_job() = ToProto(*job);
      pending_.push_back(std::move(state));
      WriteNextLocked(/*may_call_engine=*/true);
    }
    // Events that arrived while the history was queued follow it, in order.
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

 private:
  // The engine pushes into this; it forwards to the reactor once the history is queued and drops
  // events after the reactor is done.
  class Sink final : public engine::JobEventSink {
   public:
    void Push(const engine::JobEvent& event) override {
      if (event.kind == engine::JobEvent::Kind::kInterrupted) {
        std::lock_guard<std::mutex> lock(mu_);
        if (detached_) return;
        // Before Attach: the history is queued but the reactor not yet attached; it ends then.
        interrupted_ = true;
        if (reactor_ != nullptr) reactor_->EndInterrupted();
        return;
      }
      v1::JobEvent proto;
      if (event.kind == engine::JobEvent::Kind::kEpoch) {
        *proto.mutable_epoch() = ToProto(event.epoch);
      } else {
        *proto.mutable_job() = ToProto(event.job);
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (detached_) return;
      if (reactor_ == nullptr) {
        backlog_.push_back(std::move(proto));
        return;
      }
      reactor_->Enqueue(std::move(proto));
    }
    void Attach(WatchReactor* reactor) {
      std::lock_guard<std::mutex> lock(mu_);
      if (detached_) return;
      for (auto& event : backlog_) reactor->Enqueue(std::move(event));
      backlog_.clear();
      reactor_ = reactor;
      if (interrupted_) reactor->EndInterrupted();
    }
    void Detach() {
      std::lock_guard<std::mutex> lock(mu_);
      detached_ = true;
      reactor_ = nullptr;
    }

   private:
    std::mutex mu_;
    WatchReactor* reactor_ = nullptr;   // guarded by mu_
    bool detached_ = false;             // guarded by mu_
    bool interrupted_ = false;          // guarded by mu_
    std::deque<v1::JobEvent> backlog_;  // guarded by mu_
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

  void Enqueue(v1::JobEvent event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    pending_.push_back(std::move(event));
    if (pending_.size() > kMaxPendingEvents) SkipToLatestLocked();
    // Enqueue runs inside the engine's Push, which must not call back into the engine.
    WriteNextLocked(/*may_call_engine=*/false);
  }

  // Drops the queued epoch events, keeping the state changes; unless a terminal state is among
  // them, the job as it stands (every epoch in Job.epochs) follows the notice. The job is fetched
  // only when it is about to be written (an empty placeholder event stands for it until then),
  // from a reaction rather than from the engine's Push. A backlog means a write is in flight, so
  // OnWriteDone is what comes next.
  void SkipToLatestLocked() {
    std::deque<v1::JobEvent> kept;
    int64_t dropped = 0;
    bool terminal = false;
    for (v1::JobEvent& event : pending_) {
      if (event.has_epoch()) {
        ++dropped;
        continue;
      }
      terminal = terminal || (event.has_job() && IsTerminalState(event.job().state()));
      kept.push_back(std::move(event));
    }
    pending_.clear();
    v1::JobEvent notice;
    notice.mutable_skipped()->set_epochs(dropped);
    pending_.push_back(std::move(notice));
    if (!terminal) pending_.push_back(v1::JobEvent());  // the job as it stands, fetched later
    for (v1::JobEvent& event : kept) pending_.push_back(std::move(event));
  }

  static bool IsTerminalState(v1::JobState state) {
    return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
           state == v1::JOB_STATE_CANCELLED;
  }

  // `may_call_engine`: false inside the engine's Push (a placeholder for the latest job is then
  // dropped; by the reasoning above, it never is at the front there).
  void WriteNextLocked(bool may_call_engine) {
    if (writing_ || finished_) return;
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    while (!pending_.empty() && pending_.front().event_case() == v1::JobEvent::EVENT_NOT_SET) {
      absl::StatusOr<engine::JobSnapshot> job =
          may_call_engine ? engine_->GetJob(id_) : absl::UnavailableError("");
      if (job.ok()) {
        *pending_.front().mutable_job() = ToProto(*job);
      } else {
        pending_.pop_front();
      }
    }
    if (pending_.empty()) {
      if (terminal_written_) {
        FinishLocked(grpc::Status::OK);
      } else if (end_status_.has_value()) {
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
    Finish(status);
  }

  engine::Engine* const engine_;
  const std::string id_;
  const std::shared_ptr<Sink> sink_;
  std::mutex mu_;
  std::deque<v1::JobEvent> pending_;        // guarded by mu_
  v1::JobEvent current_;                    // the write in flight
  bool writing_ = false;                    // guarded by mu_
  bool terminal_written_ = false;           // guarded by mu_
  bool cancelled_ = false;                  // guarded by mu_
  bool finished_ = false;                   // guarded by mu_
  std::optional<grpc::Status> end_status_;  // guarded by mu_: how the stream ends, untimely
};

// Streams a succeeded job's TorchScript archive from <data_dir>/models/<id>.pt in chunks of at
// most kModelChunkBytes. One write in flight: the next chunk is read in OnWriteDone, so at most one
// chunk is in memory whatever the model's size. That read is a small local file read (1 MiB from
// a file the engine wrote and fsynced, normally still in the page cache), which the service
// accepts on a reaction instead of adding a hop to the engine's I/O thread per chunk. Finish is
// called once (after the last chunk, on an error, or when the client goes away — a write is in
// flight until then, so a cancelled client always surfaces as OnWriteDone(false)); the reactor
// deletes itself in OnDone.
class ModelDownloadReactor final : public grpc::ServerWriteReactor<v1::ModelChunk> {
 public:
  static constexpr int64_t kModelChunkBytes = int64_t{1} << 20;

  // Called once, from DownloadModel, before any reaction can run.
  void Start(engine::Engine* engine, const std::string& id) {
    const absl::StatusOr<std::string> path = engine->ModelArchivePath(id);
    if (!path.ok()) {
      Finish(ToGrpcStatus(path.status()));
      return;
    }
    file_.open(*path, std::ios::binary | std::ios::ate);
    if (!file_) {
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS,
                          "the model file of job '" + id + "' cannot be read"));
      return;
    }
    remaining_ = static_cast<int64_t>(file_.tellg());
    file_.seekg(0);
    chunk_.set_total_bytes(remaining_);
    WriteNextChunk();  // the first chunk goes even for an empty file, carrying total_bytes
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    if (remaining_ == 0) {
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
      Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "the model file ended early"));
      return;
    }
    remaining_ -= n;
    StartWrite(&chunk_);
  }

  std::ifstream file_;
  int64_t remaining_ = 0;  // bytes of the file not yet written
  v1::ModelChunk chunk_;   // the write in flight
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::Job* response) {
  auto spec = FromProto(request->spec());
  if (!spec.ok()) return FinishWith(context, spec.status());
  spec->torchscript = request->torchscript_module();  // bring your own model; usually empty
  engine::CallContext caller;
  caller.owner = CallerName(context, authenticator_);
  caller.deadline = CallDeadline(*context);
  // A spec-built job is answered here; a TorchScript job from a module-check thread once its
  // module was checked (seconds at most, bounded by the caller's deadline).
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->SubmitJobAsync(*std::move(spec), std::move(caller),
                          [reactor, response](absl::StatusOr<engine::JobSnapshot> job) {
                            if (job.ok()) *response = ToProto(*job);
                            reactor->Finish(ToGrpcStatus(job.status()));
                          });
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
  engine::CallContext caller;
  caller.owner = CallerName(context, authenticator_);
  caller.deadline = CallDeadline(*context);
  // Spec-built members only: checked and queued here without blocking on training.
  absl::StatusOr<engine::SweepSnapshot> sweep =
      engine_->SubmitSweep(*std::move(spec), axes, caller);
  if (sweep.ok()) {
    response->set_sweep_id(sweep->id);
    for (const engine::JobSnapshot& member : sweep->members) {
      *response->add_members() = ToProto(member);
    }
  }
  return FinishWith(context, sweep.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  auto job = engine_->GetJob(request->id());
  if (job.ok()) *response = ToProto(*job);
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
  query.dataset = request->dataset();
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
  absl::StatusOr<engine::JobPage> page = engine_->ListJobs(query);
  if (page.ok()) {
    for (const engine::JobSnapshot& job : page->jobs) *response->add_jobs() = ToProto(job);
    response->set_next_page_token(page->next_page_token);
  }
  return FinishWith(context, page.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(grpc::CallbackServerContext* context,
                                                    const v1::DeleteJobRequest* request,
                                                    v1::DeleteJobResponse* /*response*/) {
  return FinishWith(context, engine_->DeleteJob(request->id()));
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::Job* response) {
  auto job = engine_->CancelJob(request->id());
  if (job.ok()) *response = ToProto(*job);
  return FinishWith(context, job.status());
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  auto* reactor = new WatchReactor(engine_, request->id());
  reactor->Start();
  return reactor;
}

grpc::ServerWriteReactor<v1::ModelChunk>* JobServiceImpl::DownloadModel(
    grpc::CallbackServerContext* context, const v1::DownloadModelRequest* request) {
  auto* reactor = new ModelDownloadReactor();
  reactor->Start(engine_, request->id());
  return reactor;
}

}  // namespace trainerd::service
