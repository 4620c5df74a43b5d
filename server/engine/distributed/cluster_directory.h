// The daemons a cluster manager starts as one group, found without a list of peers: a Kubeflow
// PyTorchJob or TrainJob, torchrun-style launchers and batch schedulers start each node's process
// with MASTER_ADDR and MASTER_PORT (or Kubeflow's PET_MASTER_ADDR and PET_MASTER_PORT) and a
// node count and rank. trainerd runs one daemon per node and reads only node-level variables, as
// torchrun reads --nnodes and --node_rank: PET_NNODES and PET_NODE_RANK, or torchrun's
// GROUP_WORLD_SIZE and GROUP_RANK, or WORLD_SIZE and RANK where nothing says they count
// processes (LOCAL_WORLD_SIZE above 1, or LOCAL_RANK without it, is refused naming the variable,
// as is a LOCAL_RANK above 0: a node's second process).
//
// Node 0 keeps the group's directory, and serves it on MASTER_PORT with the daemon's own gRPC
// server and credentials (PeerService.JoinGroup): every other daemon says there, again and
// again, where it is under its node rank and hears where the others are, so that each daemon's
// peers are the group's other daemons, in whatever order they start or restart. The meeting
// carries the peers' credentials like every other call between daemons; there is no
// unauthenticated port, and node 0 keeps at most one bounded entry per rank.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainerd::engine {

// At most this many daemons in a group (JobSpec.nodes' bound, job_limits.h).
constexpr int kMaxClusterNodes = 256;

struct ClusterOptions {
  std::string master_addr;
  int master_port = 0;
  int nodes = 0;      // the group's daemons
  int node_rank = 0;  // this one's number, 0 keeps the directory
  // Which master variables they came from: "PET_" or "" (PET_MASTER_ADDR or MASTER_ADDR).
  std::string source;
  // The variables the node count and rank came from, for the log ("$PET_NNODES and
  // $PET_NODE_RANK").
  std::string counted_by;
  // This daemon's gRPC address as the others reach it ("host:port"), its entry.
  std::string self;
  // How often a node says where it is again (and hears the others), and how long one try may
  // take.
  absl::Duration interval = absl::Seconds(2);
};

// How a node other than 0 meets node 0: it sends the group's size, its rank and its address,
// and gets back every entry node 0 knows, rank -> address. The service layer implements it over
// gRPC (PeerService.JoinGroup at MASTER_ADDR:MASTER_PORT, with the peer credentials).
using GroupJoin = std::function<absl::StatusOr<std::map<int, std::string>>(
    int nodes, int rank, const std::string& address)>;

// Whether `address` may be a node's entry: host:port, at most 255 characters of letters, digits
// and ".-_:[]", the port 1..65535.
bool IsGroupAddress(const std::string& address);

// The group described by the environment `env` ("NAME=VALUE" entries): nullopt when it names no
// group (no MASTER_ADDR nor PET_MASTER_ADDR, or a group of one); INVALID_ARGUMENT naming the
// variable when a group is named but a value is missing, not a number, out of range, or an
// elastic range ("1:4"), which a fixed group of daemons cannot honour, and when the variables are
// ambiguous (above; or two node-level forms that disagree). PET_MASTER_ADDR wins over
// MASTER_ADDR, PET_NNODES over GROUP_WORLD_SIZE over WORLD_SIZE.
absl::StatusOr<std::optional<ClusterOptions>> ClusterFromEnvironment(
    const std::vector<std::string>& env);

class ClusterDirectory {
 public:
  // Node 0 keeps the entries (Join); every other node joins through `join` in a thread of its
  // own, every interval, retrying while node 0 cannot be reached. INVALID_ARGUMENT for options
  // that are no group's node, or a node other than 0 without `join`.
  static absl::StatusOr<std::unique_ptr<ClusterDirectory>> Start(ClusterOptions options,
                                                                 GroupJoin join);
  ~ClusterDirectory();
  ClusterDirectory(const ClusterDirectory&) = delete;
  ClusterDirectory& operator=(const ClusterDirectory&) = delete;

  // Node 0: node `rank` of a group of `nodes` is at `address` (PeerService.JoinGroup, from an
  // admin caller). FAILED_PRECONDITION on any other node; INVALID_ARGUMENT for a group of another
  // size, a rank out of 1..nodes-1 or an address IsGroupAddress refuses. Returns every entry,
  // node 0's own and this one included.
  absl::StatusOr<std::map<int, std::string>> Join(int nodes, int rank, const std::string& address);

  // The other daemons' addresses known now, in node order ("host:port").
  std::vector<std::string> peers() const;

  struct State;

 private:
  ClusterDirectory() = default;
  std::unique_ptr<State> state_;
};

}  // namespace trainerd::engine
