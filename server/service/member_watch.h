// Following sweep members that train on a peer (peer_client.cc's RunJob and RunSweep): each
// member's WatchJob stream there as a callback reactor, every event handled on the calling
// thread, so that following a peer's share of a sweep costs no thread per member.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "server/engine/distributed/peers.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::service {

// One member's job on the peer, and what to tell of it.
struct WatchedMember {
  std::string id;  // the job's id there
  std::function<void(const engine::EpochResult&)> on_epoch;
  // Asked every 100 ms while the stream is open, until it says to stop.
  std::function<engine::RemoteStop()> stop;
};

// How a member's stream ended.
struct WatchEnd {
  grpc::Status status;    // the stream's: OK once the job ended there
  bool stopped = false;   // a stop was asked (a cancel or a detach)
  bool detached = false;  // given up by a detach: the job goes on there
};

struct WatchOptions {
  // Adds the peer credentials to a call's context.
  std::function<void(grpc::ClientContext*)> authorize;
  // A stopping member's peer has this long to end the member's stream after its cancel; then the
  // stream is given up.
  std::chrono::milliseconds stop_deadline{5000};
};

// Follows every member of `members` there to the end of its stream, on the calling thread:
// epochs are handed to on_epoch as they come (in order per member, from the first), each
// member's stop is asked every 100 ms, and `on_end(i, end)` is called once per member as its
// stream ends (while the others' streams go on). A kCancel cancels the job there (an
// asynchronous CancelJob: a peer that does not answer holds no one up) and gives the stream up
// should it not end within stop_deadline; a kDetach gives it up at once. Returns once every
// member's on_end returned and every cancel call ended. `stub` outlives the call.
void WatchMembers(v1::JobService::Stub* stub, const std::vector<WatchedMember>& members,
                  const WatchOptions& options,
                  const std::function<void(size_t, const WatchEnd&)>& on_end);

}  // namespace trainerd::service
