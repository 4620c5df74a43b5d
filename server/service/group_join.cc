// How a daemon that is not node 0 of a cluster manager's group meets node 0 (MakeGroupJoin,
// peer_client.h): PeerService.JoinGroup at MASTER_ADDR:MASTER_PORT with the peer credentials.
#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "server/service/peer_client.h"
#include "server/service/peer_credentials.h"
#include "trainerd/v1/peers.grpc.pb.h"

namespace trainerd::service {

absl::StatusOr<engine::GroupJoin> MakeGroupJoin(const PeerClientOptions& options,
                                                const std::string& node0, absl::Duration deadline) {
  TRAINERD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                            PeerCredentials(options));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(node0, credentials);
  const std::string token = options.token;
  return engine::GroupJoin(
      [channel, token, deadline](
          int nodes, int rank,
          const std::string& address) -> absl::StatusOr<std::map<int, std::string>> {
        auto stub = v1::PeerService::NewStub(channel);
        grpc::ClientContext context;
        if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
        context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
        v1::JoinGroupRequest request;
        request.set_nodes(nodes);
        request.set_node_rank(rank);
        request.set_address(address);
        v1::JoinGroupResponse response;
        const grpc::Status status = stub->JoinGroup(&context, request, &response);
        if (!status.ok()) {
          return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                              status.error_message());
        }
        // At most one entry per rank of the group; ClusterDirectory checks each.
        std::map<int, std::string> heard;
        for (const v1::JoinGroupResponse::Node& node : response.nodes()) {
          if (static_cast<int>(heard.size()) >= nodes) break;
          heard.emplace(node.rank(), node.address());
        }
        return heard;
      });
}

}  // namespace trainerd::service
