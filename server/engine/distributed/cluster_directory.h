// The daemons a cluster manager starts as one group, found without a list of peers: a Kubeflow
// PyTorchJob or TrainJob, torchrun-style launchers and batch schedulers start each node's process
// with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (or Kubeflow's PET_MASTER_ADDR,
// PET_MASTER_PORT, PET_NNODES and PET_NODE_RANK). trainerd reads them as torchrun reads
// --nnodes and --node_rank: WORLD_SIZE daemons, this one number RANK.
//
// Node 0 hosts a c10d::TCPStore on MASTER_PORT, as torchrun's rendezvous does; every daemon writes
// its gRPC address there under its node rank and reads the others', again and again, so that
// each daemon's peers are the group's other daemons, in whatever order they start or restart.
// An entry is signed with the peers' shared token (HMAC-SHA256): the store takes any connection,
// and a daemon must never send its token to an address a stranger wrote.
#pragma once

#include <cstdint>
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
  int node_rank = 0;  // this one's number, 0 hosts the store
  // Which variables they came from, for the log: "PET_" or "".
  std::string source;
  // This daemon's gRPC address as the others reach it ("host:port"), written under its rank.
  std::string self;
  // Signs this daemon's entry and checks the others' (the peers' shared token); empty: entries
  // are neither signed nor checked (a group without tokens, e.g. mutual TLS, whose calls check
  // the peer's certificate instead).
  std::string key;
  // How often the entries are read again, and how long a connection to the store may take.
  absl::Duration interval = absl::Seconds(2);
};

// The group described by the environment `env` ("NAME=VALUE" entries): nullopt when it names no
// group (no MASTER_ADDR nor PET_MASTER_ADDR, or a group of one); INVALID_ARGUMENT naming the
// variable when a group is named but a value is missing, not a number, out of range, or an
// elastic range ("1:4"), which a fixed group of daemons cannot honour. The PET_ forms win.
absl::StatusOr<std::optional<ClusterOptions>> ClusterFromEnvironment(
    const std::vector<std::string>& env);

class ClusterDirectory {
 public:
  // Node 0 hosts the store on master_port (UNAVAILABLE when the port is taken); every node then
  // registers and reads in a thread of its own, retrying while the store cannot be reached.
  static absl::StatusOr<std::unique_ptr<ClusterDirectory>> Start(ClusterOptions options);
  ~ClusterDirectory();
  ClusterDirectory(const ClusterDirectory&) = delete;
  ClusterDirectory& operator=(const ClusterDirectory&) = delete;

  // The other daemons' addresses known now, in node order ("host:port"). An entry whose signature
  // does not check is left out (and logged once).
  std::vector<std::string> peers() const;

  struct State;

 private:
  ClusterDirectory() = default;
  std::unique_ptr<State> state_;
};

}  // namespace trainerd::engine
