#include "server/service/peer_service.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/convert/convert.h"
#include "server/service/call_context.h"
#include "server/service/grpc_status.h"

namespace trainerd::service {

using convert::FromProto;
using convert::ToProto;
namespace {

// The call's reactor: its cancellation (the leader cancelled, went away, or this server stops)
// becomes the rank's cancel flag; the rank's thread answers once the rank ended.
class RankReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit RankReactor(std::shared_ptr<std::atomic<bool>> cancel) : cancel_(std::move(cancel)) {}
  void OnCancel() override { cancel_->store(true); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<std::atomic<bool>> cancel_;
};

}  // namespace

PeerServiceImpl::PeerServiceImpl(engine::Engine* engine, Authenticator* authenticator,
                                 engine::ClusterDirectory* group)
    : engine_(engine), authenticator_(authenticator), group_(group) {}

grpc::ServerUnaryReactor* PeerServiceImpl::JoinGroup(grpc::CallbackServerContext* context,
                                                     const v1::JoinGroupRequest* request,
                                                     v1::JoinGroupResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The group's own credentials: the peers' token (an admin's) or their certificates.
  if (!CallContextOf(context, authenticator_).admin) {
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "joining the group of daemons takes the peers' (admin) "
                                 "credentials here"));
    return reactor;
  }
  if (group_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "this daemon is in no group of daemons (no MASTER_ADDR)"));
    return reactor;
  }
  absl::StatusOr<std::map<int, std::string>> joined =
      group_->Join(request->nodes(), request->node_rank(), request->address());
  if (!joined.ok()) {
    reactor->Finish(ToGrpcStatus(joined.status()));
    return reactor;
  }
  for (const auto& [rank, address] : *joined) {
    v1::JoinGroupResponse::Node* node = response->add_nodes();
    node->set_rank(rank);
    node->set_address(address);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

PeerServiceImpl::~PeerServiceImpl() {
  std::vector<Rank> ranks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks.swap(ranks_);
  }
  for (Rank& rank : ranks) rank.thread.join();
}

grpc::ServerUnaryReactor* PeerServiceImpl::RunRank(grpc::CallbackServerContext* context,
                                                   const v1::RunRankRequest* request,
                                                   v1::RunRankResponse* response) {
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  auto* reactor = new RankReactor(cancel);
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  // Who may ask first (the engine asks again): a tenant learns nothing from its request's parse.
  if (!caller.admin) {
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "running a rank for another daemon takes an admin's credentials "
                                 "here"));
    return reactor;
  }
  absl::StatusOr<engine::JobSpec> spec = FromProto(request->spec());
  if (!spec.ok()) {
    reactor->Finish(ToGrpcStatus(spec.status()));
    return reactor;
  }
  engine::RemoteRankRequest rank;
  rank.spec = *std::move(spec);
  rank.job_id = request->job_id();
  rank.rank = request->rank();
  rank.world_size = request->world_size();
  rank.store_host = request->store_host();
  rank.store_port = request->store_port();
  rank.prefix = request->prefix();
  rank.timeout_seconds = request->timeout_seconds();
  rank.dataset_sha256 = request->dataset_sha256();
  rank.store_secret = request->store_secret();
  rank.resume_bytes = request->resume_bytes();
  rank.resume_sha256 = request->resume_sha256();
  // The rank trains for the job's length: on a thread of its own. It touches the reactor and the
  // response only to answer, after which gRPC may free them.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = ranks_.erase(it);
    } else {
      ++it;
    }
  }
  if (ranks_.size() >= kMaxPeerRanks) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "this daemon already runs its most ranks for its peers"));
    return reactor;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  Rank& started = ranks_.emplace_back();
  started.done = done;
  started.thread = std::thread(
      [engine = engine_, reactor, response, cancel, caller, done, rank = std::move(rank)] {
        struct Done {
          std::atomic<bool>* flag;
          ~Done() { flag->store(true); }
        } mark{done.get()};
        const engine::RemoteRankResult result = engine->RunRankForPeer(rank, caller, cancel.get());
        if (!result.status.ok()) {
          reactor->Finish(ToGrpcStatus(result.status));
          return;
        }
        response->set_state(ToProto(result.state));
        response->set_error(result.error);
        response->set_steps(result.steps);
        response->set_collective_seconds(result.collective_seconds);
        response->set_node(result.node);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::CheckCredentials(
    grpc::CallbackServerContext* context, const v1::CheckCredentialsRequest* /*request*/,
    v1::CheckCredentialsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const engine::CallContext caller = CallContextOf(context, authenticator_);
  if (!caller.admin) {
    // Its own name, quoted in part: nothing it does not know already.
    reactor->Finish(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat(
            "the caller '", absl::CHexEscape(caller.owner.substr(0, 64)),
            "' is not an admin here: another daemon's calls take an admin's credentials")));
    return reactor;
  }
  response->set_caller(caller.owner);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace trainerd::service
