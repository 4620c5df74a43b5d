// engine::Peers (distributed/peers.h) over gRPC: this daemon's calls to its peers (--peers), with
// this daemon's own credentials for them (--peer_token_file, and TLS with --peer_tls_ca and a
// client certificate for mutual TLS). One channel per peer, made when first used.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/distributed/cluster_directory.h"
#include "server/engine/distributed/peers.h"

namespace trainerd::service {

struct PeerClientOptions {
  // --peers as given: "host:port" entries, and "dns:NAME:PORT" entries that stand for every
  // address NAME resolves to, resolved again when a job asks (at most every few seconds), so that
  // the daemons of a headless Service that start after this one are found too.
  std::string peers;
  // This daemon's own host:port, left out when a DNS name lists it.
  std::string self;
  // Peers found another way, asked at every look (the group a cluster manager started,
  // engine::ClusterDirectory); with --peers' too. Empty: none.
  std::function<std::vector<std::string>()> discovered;
  // The bearer token presented to the peers (the first line of --peer_token_file; a "NAME:"
  // prefix is allowed and dropped, as trainctl allows); empty: none.
  std::string token;
  // --peer_token_file when it names a file that does not exist (the daemon serves without a
  // token): every call to a peer that would need it is refused here, naming the file.
  std::string missing_token_file;
  // PEM files: the CA the peers' certificates are checked against (turns TLS on), and this
  // daemon's client certificate and key for mutual TLS. All empty: plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // This daemon's trainerd and LibTorch versions, which a peer must run too (CheckVersion).
  std::string trainerd_version;
  std::string libtorch_version;
};

// Reads the PEM files and checks --peers' form; INVALID_ARGUMENT naming the flag when one cannot
// be read or an entry is not host:port or dns:NAME:PORT.
absl::StatusOr<std::shared_ptr<engine::Peers>> MakePeerClient(PeerClientOptions options);

// How this daemon, a node other than 0 of a cluster manager's group, meets node 0 at `node0`
// (MASTER_ADDR:MASTER_PORT): PeerService.JoinGroup with the peer credentials (the token, or the
// client certificate), each try within `deadline`. INVALID_ARGUMENT when a PEM file cannot be read.
absl::StatusOr<engine::GroupJoin> MakeGroupJoin(const PeerClientOptions& options,
                                                const std::string& node0, absl::Duration deadline);

// --peers: "host:port" entries as they are, and "dns:NAME:PORT" entries as one peer per address
// NAME resolves to now (a Kubernetes headless Service's A records; none while none of its daemons
// is up). `self`: this daemon's own host:port, left out when a DNS name lists it.
// INVALID_ARGUMENT for an entry that is not host:port.
absl::StatusOr<std::vector<std::string>> ResolvePeers(const std::string& flag,
                                                      const std::string& self);

}  // namespace trainerd::service
