// Bounds on what one caller may hold open at a time (uploads in progress, watches, Diagnose
// calls), so that one tenant's scripts, however many, cannot take what the others need. Keyed by
// the caller's name (auth.h: Caller); without authentication every caller is one name, "".
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace trainerd::service {

class CallerSlots {
 public:
  // Held while the call lasts; the slot is given back when the last copy goes.
  using Slot = std::shared_ptr<void>;

  // `what`: the plural noun of the refusal ("uploads in progress"); `flag`: the daemon flag that
  // sets `limit` (0: no limit).
  CallerSlots(std::string what, std::string flag, int limit)
      : state_(std::make_shared<State>()),
        what_(std::move(what)),
        flag_(std::move(flag)),
        limit_(limit) {}

  // A slot for `caller`; RESOURCE_EXHAUSTED naming the limit and its flag when the caller holds
  // `limit` already.
  absl::StatusOr<Slot> Take(const std::string& caller) {
    std::lock_guard<std::mutex> lock(state_->mu);
    int& held = state_->held[caller];
    if (limit_ > 0 && held >= limit_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          caller.empty() ? "this daemon's callers" : absl::StrCat("caller '", caller, "'"),
          " already hold ", held, " ", what_, ", the most one caller may (", flag_, "=", limit_,
          "); wait for one to end"));
    }
    ++held;
    // The state outlives the service if a call does: the deleter holds it.
    return Slot(static_cast<void*>(nullptr), [state = state_, caller](void*) {
      std::lock_guard<std::mutex> lock(state->mu);
      auto it = state->held.find(caller);
      if (it != state->held.end() && --it->second <= 0) state->held.erase(it);
    });
  }

  // What `caller` holds now (tests, metrics).
  int held(const std::string& caller) const {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->held.find(caller);
    return it == state_->held.end() ? 0 : it->second;
  }

 private:
  struct State {
    mutable std::mutex mu;
    std::map<std::string, int> held;
  };
  const std::shared_ptr<State> state_;
  const std::string what_;
  const std::string flag_;
  const int limit_;
};

}  // namespace trainerd::service
