#include "server/service/blocking_calls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainerd::service {

BlockingCalls::BlockingCalls(Options options) : options_(options) {
  const int threads = std::max(1, options_.threads);
  threads_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

BlockingCalls::~BlockingCalls() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

absl::Status BlockingCalls::Run(const std::string& caller, std::function<void()> call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    std::deque<std::function<void()>>& queue = queues_[caller];
    if (options_.max_queued_per_caller > 0 &&
        static_cast<int64_t>(queue.size()) >= options_.max_queued_per_caller) {
      return absl::ResourceExhaustedError(absl::StrCat(
          caller.empty() ? "this daemon's callers already have "
                         : absl::StrCat("caller '", caller, "' already has "),
          queue.size(),
          " calls waiting for the disk (job submissions, cancellations and deletions), the most "
          "one caller may (",
          options_.max_queued_per_caller, "); wait for them to be answered"));
    }
    if (queue.empty()) turn_.push_back(caller);
    queue.push_back(std::move(call));
    ++queued_;
  }
  cv_.notify_one();
  return absl::OkStatus();
}

int64_t BlockingCalls::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

void BlockingCalls::Loop() {
  while (true) {
    std::function<void()> call;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !turn_.empty(); });
      // What is queued still runs when stopping: each call finishes an RPC.
      if (turn_.empty()) return;
      const std::string caller = std::move(turn_.front());
      turn_.pop_front();
      auto it = queues_.find(caller);
      call = std::move(it->second.front());
      it->second.pop_front();
      --queued_;
      // The caller goes to the back of the line with what it has left.
      if (it->second.empty()) {
        queues_.erase(it);
      } else {
        turn_.push_back(caller);
      }
    }
    call();
  }
}

}  // namespace trainerd::service
