// A pool of threads for the RPCs whose engine calls may wait on the disk: a job record committed
// with its fsync (SubmitJob, SubmitSweep, CancelJob, DeleteJob), a dataset's files removed or its
// metadata rewritten (DeleteDataset, ShareDataset).
//
// Why: gRPC's callback API runs every reaction of every call on a few threads of its own (two on
// a two-core node), and a reaction that blocks holds one of them. Measured on such a node with 32
// busy clients: those two threads spent much of their time in fdatasync behind the store's write
// lock, so a GetJob that needs only memory waited behind other callers' commits, and any extra
// work (a neighbour's junk calls) queued behind both. Here the commits wait on threads of their
// own and gRPC's threads stay free for what needs only the CPU.
//
// Fair between callers: each caller's calls wait in a queue of their own and the queues are
// served in turn, so that one caller's thousand deletes delay its own calls, not the others'; and
// a caller may have at most `max_queued_per_caller` calls waiting (RESOURCE_EXHAUSTED beyond,
// naming the limit), so that what one caller holds here is bounded.
//
// Thread-safe. The destructor runs what is still queued (each call finishes its RPC), then joins:
// destroy it after the gRPC server has shut down and before the engine the calls use.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

class BlockingCalls {
 public:
  struct Options {
    int threads = 4;                  // at least 1
    int max_queued_per_caller = 256;  // calls one caller may have waiting (0: no limit)
  };

  explicit BlockingCalls(Options options);
  ~BlockingCalls();
  BlockingCalls(const BlockingCalls&) = delete;
  BlockingCalls& operator=(const BlockingCalls&) = delete;

  // Queues `call` for `caller` (the caller's name; "" for an unauthenticated daemon's one local
  // caller). RESOURCE_EXHAUSTED, and `call` is not run, when the caller already has
  // max_queued_per_caller calls waiting; UNAVAILABLE once the pool is stopping.
  absl::Status Run(const std::string& caller, std::function<void()> call);

  // Calls waiting now, all callers together (tests).
  int64_t queued() const;

 private:
  void Loop();

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Each caller's waiting calls, and the callers with calls waiting, in the order they are served.
  std::map<std::string, std::deque<std::function<void()>>> queues_;  // guarded by mu_
  std::deque<std::string> turn_;                                     // guarded by mu_
  int64_t queued_ = 0;                                               // guarded by mu_
  bool stopping_ = false;                                            // guarded by mu_
  std::vector<std::thread> threads_;
};

// A unary RPC answered from `pool`: `call` (returning absl::Status, after filling the response)
// runs there for `caller` and its status finishes the RPC; the pool's refusal finishes it at once.
// Without a pool (a service built alone in a test), `call` runs here.
template <typename Call>
grpc::ServerUnaryReactor* FinishFromPool(BlockingCalls* pool, grpc::CallbackServerContext* context,
                                         const std::string& caller, Call call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (pool == nullptr) {
    reactor->Finish(ToGrpcStatus(call()));
    return reactor;
  }
  const absl::Status queued = pool->Run(caller, [reactor, call = std::move(call)]() mutable {
    reactor->Finish(ToGrpcStatus(call()));
  });
  if (!queued.ok()) reactor->Finish(ToGrpcStatus(queued));
  return reactor;
}

}  // namespace trainerd::service
