#include "server/service/member_watch.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "server/convert/convert.h"

namespace trainerd::service {
namespace {

// What the reactors hand to the calling thread: epochs in the order they came, and ended
// streams. Thread-safe.
class Inbox {
 public:
  explicit Inbox(size_t members) : ends_(members) {}

  void Epoch(size_t member, engine::EpochResult epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    epochs_.emplace_back(member, std::move(epoch));
    ready_.notify_all();
  }
  void Ended(size_t member, grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    ends_[member] = std::move(status);
    ready_.notify_all();
  }
  void CancelEnded() {
    std::lock_guard<std::mutex> lock(mu_);
    --cancels_;
    ready_.notify_all();
  }
  void CancelStarted() {
    std::lock_guard<std::mutex> lock(mu_);
    ++cancels_;
  }

  // Waits up to `wait` for news; then moves out the epochs that came and the streams' ends
  // (for the members whose end was not taken before, marked in `taken`).
  void Take(std::chrono::milliseconds wait,
            std::deque<std::pair<size_t, engine::EpochResult>>* epochs,
            std::vector<std::pair<size_t, grpc::Status>>* ends, std::vector<bool>* taken) {
    std::unique_lock<std::mutex> lock(mu_);
    auto news = [&] {
      if (!epochs_.empty()) return true;
      for (size_t i = 0; i < ends_.size(); ++i) {
        if (ends_[i].has_value() && !(*taken)[i]) return true;
      }
      return false;
    };
    ready_.wait_for(lock, wait, news);
    epochs->swap(epochs_);
    for (size_t i = 0; i < ends_.size(); ++i) {
      if (ends_[i].has_value() && !(*taken)[i]) {
        (*taken)[i] = true;
        ends->emplace_back(i, *ends_[i]);
      }
    }
  }

  // Waits until every cancel call ended.
  void AwaitCancels() {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return cancels_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::pair<size_t, engine::EpochResult>> epochs_;
  std::vector<std::optional<grpc::Status>> ends_;
  int cancels_ = 0;
};

// One member's WatchJob stream: each epoch and the end go to the inbox. Destroyed by
// WatchMembers once its end was taken (OnDone is the reactor's last callback).
class WatchReader final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  WatchReader(Inbox* inbox, size_t member) : inbox_(inbox), member_(member) {}

  void Start(v1::JobService::Stub* stub, const std::string& id) {
    request_.set_id(id);
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  grpc::ClientContext* context() { return &context_; }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ends: OnDone follows
    if (event_.has_epoch()) inbox_->Epoch(member_, convert::FromProto(event_.epoch()));
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override { inbox_->Ended(member_, status); }

 private:
  Inbox* const inbox_;
  const size_t member_;
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::JobEvent event_;
};

// A CancelJob in flight: deletes itself when it ends.
struct CancelCall {
  grpc::ClientContext context;
  v1::CancelJobRequest request;
  v1::Job response;
};

}  // namespace

void WatchMembers(v1::JobService::Stub* stub, const std::vector<WatchedMember>& members,
                  const WatchOptions& options,
                  const std::function<void(size_t, const WatchEnd&)>& on_end) {
  const size_t n = members.size();
  Inbox inbox(n);
  std::vector<std::unique_ptr<WatchReader>> readers;
  readers.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    readers.push_back(std::make_unique<WatchReader>(&inbox, i));
    if (options.authorize) options.authorize(readers.back()->context());
  }
  for (size_t i = 0; i < n; ++i) readers[i]->Start(stub, members[i].id);

  struct State {
    bool stopped = false;
    bool detached = false;
    bool given_up = false;
    std::chrono::steady_clock::time_point stopped_at;
  };
  std::vector<State> states(n);
  std::vector<bool> taken(n, false);
  size_t ended = 0;
  std::deque<std::pair<size_t, engine::EpochResult>> epochs;
  std::vector<std::pair<size_t, grpc::Status>> ends;
  while (ended < n) {
    epochs.clear();
    ends.clear();
    inbox.Take(std::chrono::milliseconds(100), &epochs, &ends, &taken);
    for (auto& [member, epoch] : epochs) members[member].on_epoch(epoch);
    // The members still watched: is any to stop?
    for (size_t i = 0; i < n; ++i) {
      State& state = states[i];
      if (taken[i]) continue;
      const engine::RemoteStop asked =
          state.stopped ? engine::RemoteStop::kNone : members[i].stop();
      if (asked == engine::RemoteStop::kDetach) {
        state.stopped = true;
        state.detached = true;
        state.given_up = true;
        readers[i]->context()->TryCancel();
      } else if (asked == engine::RemoteStop::kCancel) {
        state.stopped = true;
        state.stopped_at = std::chrono::steady_clock::now();
        auto* call = new CancelCall;
        if (options.authorize) options.authorize(&call->context);
        call->context.set_deadline(std::chrono::system_clock::now() + options.stop_deadline);
        call->request.set_id(members[i].id);
        inbox.CancelStarted();
        stub->async()->CancelJob(&call->context, &call->request, &call->response,
                                 [call, &inbox](const grpc::Status&) {
                                   delete call;
                                   inbox.CancelEnded();
                                 });
      }
      if (state.stopped && !state.given_up &&
          std::chrono::steady_clock::now() - state.stopped_at > options.stop_deadline) {
        state.given_up = true;
        readers[i]->context()->TryCancel();
      }
    }
    for (auto& [member, status] : ends) {
      readers[member].reset();  // its last callback ran
      WatchEnd end;
      end.status = std::move(status);
      end.stopped = states[member].stopped;
      end.detached = states[member].detached;
      on_end(member, end);
      ++ended;
    }
  }
  inbox.AwaitCancels();
}

}  // namespace trainerd::service
