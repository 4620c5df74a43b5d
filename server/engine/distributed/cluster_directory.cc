#include "server/engine/distributed/cluster_directory.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// The value of `name` in `env`, or nullopt.
std::optional<std::string> Lookup(const std::vector<std::string>& env, const std::string& name) {
  const std::string prefix = name + "=";
  for (const std::string& entry : env) {
    if (absl::StartsWith(entry, prefix)) return entry.substr(prefix.size());
  }
  return std::nullopt;
}

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::optional<ClusterOptions>> ClusterFromEnvironment(
    const std::vector<std::string>& env) {
  const bool pet = Lookup(env, "PET_MASTER_ADDR").has_value();
  if (!pet && !Lookup(env, "MASTER_ADDR").has_value()) return std::nullopt;
  const std::string source = pet ? "PET_" : "";
  auto number = [&](const std::string& name, int low, int high) -> absl::StatusOr<int> {
    const std::optional<std::string> value = Lookup(env, name);
    if (!value) {
      return absl::InvalidArgumentError(absl::StrCat(
          "$", source, "MASTER_ADDR names a group of daemons but $", name, " is not set"));
    }
    if (absl::StrContains(*value, ':')) {
      return absl::InvalidArgumentError(
          absl::StrCat("$", name, "=", *value,
                       " is an elastic range; a trainerd group has a fixed number of daemons"));
    }
    int n = 0;
    if (!absl::SimpleAtoi(*value, &n) || n < low || n > high) {
      return absl::InvalidArgumentError(
          absl::StrCat("$", name, "=", *value, " is not a number from ", low, " to ", high));
    }
    return n;
  };
  auto set = [&](const std::string& name) { return Lookup(env, name).has_value(); };
  // One daemon per node: a launcher's second process of a node (torchrun's LOCAL_RANK > 0) is
  // not a daemon of the group.
  if (set("LOCAL_RANK")) {
    absl::StatusOr<int> local = number("LOCAL_RANK", 0, std::numeric_limits<int>::max());
    if (!local.ok()) return local.status();
    if (*local > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "$LOCAL_RANK=", *local, " says this is process ", *local,
          " of its node; trainerd runs one daemon per node (start it once per node, e.g. "
          "torchrun --nproc-per-node=1 or one pod per node)"));
    }
  }
  ClusterOptions options;
  options.source = source;
  options.master_addr = *Lookup(env, source + "MASTER_ADDR");
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("$", source, "MASTER_ADDR is empty"));
  }
  absl::StatusOr<int> port = number(source + "MASTER_PORT", 1, 65535);
  if (!port.ok()) return port.status();
  // The node count and this node's rank, from node-level variables only: Kubeflow's PET_NNODES
  // and PET_NODE_RANK, torchrun's GROUP_WORLD_SIZE and GROUP_RANK (its worker's node), or else
  // WORLD_SIZE and RANK where nothing says they count processes (PyTorchJob without
  // nprocPerNode, batch launchers that start one process per node). Two node-level forms that
  // disagree are refused, naming both.
  struct Form {
    std::string nodes;
    std::string rank;
  };
  const std::vector<Form> node_level = {{"PET_NNODES", "PET_NODE_RANK"},
                                        {"GROUP_WORLD_SIZE", "GROUP_RANK"}};
  std::optional<Form> chosen;
  int nodes = 0;
  int rank = 0;
  for (const Form& form : node_level) {
    if (!set(form.nodes) && !set(form.rank)) continue;
    absl::StatusOr<int> n = number(form.nodes, 1, kMaxClusterNodes);
    if (!n.ok()) return n.status();
    absl::StatusOr<int> r = number(form.rank, 0, *n - 1);
    if (!r.ok()) return r.status();
    if (!chosen) {
      chosen = form;
      nodes = *n;
      rank = *r;
    } else if (*n != nodes || *r != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("$", chosen->nodes, "=", nodes, " and $", chosen->rank, "=", rank,
                       " disagree with $", form.nodes, "=", *n, " and $", form.rank, "=", *r,
                       ": which node this daemon is is ambiguous"));
    }
  }
  if (!chosen) {
    // WORLD_SIZE and RANK count processes under torchrun (LOCAL_WORLD_SIZE per node): they are
    // this daemon's node count and rank only when each node runs one.
    if (set("LOCAL_WORLD_SIZE")) {
      absl::StatusOr<int> per_node = number("LOCAL_WORLD_SIZE", 1, std::numeric_limits<int>::max());
      if (!per_node.ok()) return per_node.status();
      if (*per_node != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "$LOCAL_WORLD_SIZE=", *per_node,
            " says $WORLD_SIZE and $RANK count processes, not nodes; trainerd needs the nodes: "
            "set $GROUP_WORLD_SIZE and $GROUP_RANK (torchrun sets them) or $PET_NNODES and "
            "$PET_NODE_RANK"));
      }
    } else if (set("LOCAL_RANK")) {
      return absl::InvalidArgumentError(
          "$LOCAL_RANK is set without $LOCAL_WORLD_SIZE, so $WORLD_SIZE and $RANK may count "
          "processes rather than nodes: set $GROUP_WORLD_SIZE and $GROUP_RANK, or $PET_NNODES "
          "and $PET_NODE_RANK, or $LOCAL_WORLD_SIZE=1");
    }
    chosen = Form{"WORLD_SIZE", "RANK"};
    absl::StatusOr<int> n = number("WORLD_SIZE", 1, kMaxClusterNodes);
    if (!n.ok()) return n.status();
    absl::StatusOr<int> r = number("RANK", 0, *n - 1);
    if (!r.ok()) return r.status();
    nodes = *n;
    rank = *r;
  }
  if (nodes == 1) return std::nullopt;  // a group of one: nothing to find
  options.master_port = *port;
  options.nodes = nodes;
  options.node_rank = rank;
  options.counted_by = absl::StrCat("$", chosen->nodes, " and $", chosen->rank);
  return options;
}

bool IsGroupAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (address.empty() || address.size() > 255 || colon == std::string::npos || colon == 0) {
    return false;
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return false;
  }
  return std::all_of(address.begin(), address.begin() + static_cast<std::ptrdiff_t>(colon),
                     [](char c) {
                       return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_' ||
                              c == ':' || c == '[' || c == ']';
                     });
}

struct ClusterDirectory::State {
  ClusterOptions options;
  GroupJoin join;  // nodes other than 0

  mutable std::mutex mu;
  std::condition_variable wake;
  bool stop = false;                 // guarded by mu
  std::map<int, std::string> known;  // guarded by mu: rank -> address, this node's left out
  std::thread thread;

  std::string Name() const {
    return absl::StrCat("node ", options.node_rank, " of ", options.nodes);
  }

  // Under mu: `address` is now node `rank`'s.
  void KnowLocked(int rank, const std::string& address) {
    if (rank == options.node_rank) return;
    auto [it, added] = known.try_emplace(rank, address);
    if (!added && it->second == address) return;
    it->second = address;
    LogInfo(absl::StrCat(Name(), ": node ", rank, " is at ", address));
  }

  // Says where this node is, hears where the others are, every interval until told to stop.
  void Loop() {
    bool said_unreachable = false;
    bool joined = false;
    while (true) {
      absl::StatusOr<std::map<int, std::string>> heard =
          join(options.nodes, options.node_rank, options.self);
      if (heard.ok()) {
        if (said_unreachable || !joined) {
          LogInfo(absl::StrCat(Name(), ": joined the group at node 0, ", options.master_addr, ":",
                               options.master_port, ", as ", options.self));
        }
        said_unreachable = false;
        joined = true;
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& [rank, address] : *heard) {
          // What node 0 says is checked as node 0 checks what it is told.
          if (rank >= 0 && rank < options.nodes && IsGroupAddress(address)) {
            KnowLocked(rank, address);
          }
        }
      } else if (!said_unreachable) {
        LogWarning(absl::StrCat(Name(), ": node 0 of the group, ", options.master_addr, ":",
                                options.master_port, ", cannot be joined (",
                                heard.status().message(), "); trying again every ",
                                absl::FormatDuration(options.interval)));
        said_unreachable = true;
      }
      std::unique_lock<std::mutex> lock(mu);
      if (wake.wait_for(lock, Millis(options.interval), [this] { return stop; })) {
        return;
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<ClusterDirectory>> ClusterDirectory::Start(ClusterOptions options,
                                                                          GroupJoin join) {
  if (options.nodes < 2 || options.nodes > kMaxClusterNodes || options.node_rank < 0 ||
      options.node_rank >= options.nodes || options.master_port <= 0 ||
      options.master_port > 65535 || options.self.empty() ||
      options.interval <= absl::ZeroDuration() || (options.node_rank != 0 && !join)) {
    return absl::InvalidArgumentError(absl::StrCat("node ", options.node_rank, " of ",
                                                   options.nodes, " on port ", options.master_port,
                                                   " is not a group's node"));
  }
  auto directory = std::unique_ptr<ClusterDirectory>(new ClusterDirectory());
  directory->state_ = std::make_unique<State>();
  State& state = *directory->state_;
  state.options = std::move(options);
  state.join = std::move(join);
  if (state.options.node_rank != 0) state.thread = std::thread([&state] { state.Loop(); });
  return directory;
}

absl::StatusOr<std::map<int, std::string>> ClusterDirectory::Join(int nodes, int rank,
                                                                  const std::string& address) {
  State& state = *state_;
  const ClusterOptions& options = state.options;
  if (options.node_rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("this daemon is ", state.Name(), ": the group meets at node 0, ",
                     options.master_addr, ":", options.master_port));
  }
  if (nodes != options.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("this group has ", options.nodes, " nodes; the caller says ", nodes));
  }
  if (rank < 1 || rank >= nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("node rank ", rank, " is not one of 1..", nodes - 1));
  }
  if (!IsGroupAddress(address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", rank, "'s address is not host:port of at most 255 letters, digits and '.-_:[]' (",
        address.size(), " characters)"));
  }
  std::lock_guard<std::mutex> lock(state.mu);
  state.KnowLocked(rank, address);
  std::map<int, std::string> out = state.known;
  out[0] = options.self;
  return out;
}

ClusterDirectory::~ClusterDirectory() {
  if (state_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

std::vector<std::string> ClusterDirectory::peers() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<std::string> out;
  for (const auto& [rank, address] : state_->known) out.push_back(address);
  return out;
}

}  // namespace trainerd::engine
