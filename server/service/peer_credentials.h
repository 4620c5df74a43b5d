// The credentials of this daemon's calls to its peers (PeerClientOptions: TLS with --peer_tls_*,
// a client certificate for mutual TLS, else plaintext), shared by the peer client
// (peer_client.cc) and the group join (group_join.cc).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/service/peer_client.h"

namespace trainerd::service {

// The file's bytes; INVALID_ARGUMENT naming `flag` when it cannot be read.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path, const std::string& flag);

// The channel credentials of calls to peers; INVALID_ARGUMENT when a PEM file cannot be read or
// a certificate comes without its key.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerCredentials(
    const PeerClientOptions& options);

}  // namespace trainerd::service
