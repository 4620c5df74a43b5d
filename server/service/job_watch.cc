// WatchJob's stream: a job's events, its epochs paged from the engine at the watcher's own pace
// (job_streams.h).
#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/convert/convert.h"
#include "server/engine/log.h"
#include "server/service/grpc_status.h"
#include "server/service/job_streams.h"

namespace trainerd::service {

using convert::ToProto;
using convert::ToProtoFor;

namespace {

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

}  // namespace

grpc::ServerWriteReactor<v1::JobEvent>* StartWatch(engine::Engine* engine, const std::string& id,
                                                   const std::string& viewer,
                                                   const absl::Status& access,
                                                   std::optional<CallerSlots::Slot> slot) {
  auto* reactor = new WatchReactor(engine, id, viewer);
  if (slot.has_value()) reactor->HoldSlot(*std::move(slot));
  reactor->Start(access);
  return reactor;
}

}  // namespace trainerd::service
