// trainerd.v1.PeerService over the engine: a rank of a data-parallel job another daemon leads
// (peers.proto). Each call's rank trains on a thread of its own (never on gRPC's callback
// threads), for as long as the job runs; the leader cancelling the call, or going away, ends the
// rank at its next step. Engine::RunRankForPeer checks the call (an admin caller, the store on one
// of this daemon's --peers, the dataset the leader's). On node 0 of a cluster manager's group it
// also keeps the group's directory (JoinGroup), which it serves on MASTER_PORT too.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/engine/engine.h"
#include "server/service/auth.h"
#include "trainerd/v1/peers.grpc.pb.h"

namespace trainerd::service {

// Thread-safe. The engine must outlive it; the destructor cancels the ranks still running and
// joins their threads.
class PeerServiceImpl final : public v1::PeerService::CallbackService {
 public:
  // `authenticator` may be null (every caller is an admin: a daemon without authentication).
  // `group`: the cluster manager's group this daemon is in (JoinGroup), or null; it must outlive
  // this service.
  PeerServiceImpl(engine::Engine* engine, Authenticator* authenticator,
                  engine::ClusterDirectory* group = nullptr);
  ~PeerServiceImpl() override;

  grpc::ServerUnaryReactor* RunRank(grpc::CallbackServerContext* context,
                                    const v1::RunRankRequest* request,
                                    v1::RunRankResponse* response) override;
  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* context,
                                      const v1::JoinGroupRequest* request,
                                      v1::JoinGroupResponse* response) override;
  // OK for an admin caller (its name in the answer), PERMISSION_DENIED naming it otherwise.
  grpc::ServerUnaryReactor* CheckCredentials(grpc::CallbackServerContext* context,
                                             const v1::CheckCredentialsRequest* request,
                                             v1::CheckCredentialsResponse* response) override;

 private:
  struct Rank {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  engine::Engine* const engine_;
  Authenticator* const authenticator_;
  engine::ClusterDirectory* const group_;
  std::mutex mu_;
  std::vector<Rank> ranks_;  // guarded by mu_; the ended ones joined at the next call
};

// Ranks one daemon runs for its peers at once; beyond, RunRank is RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxPeerRanks = 16;

}  // namespace trainerd::service
