#include "server/engine/distributed/cluster_directory.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/engine/log.h"

namespace trainerd::engine {
namespace {

// Every key of the directory: a job's rendezvous never shares this store, but a prefix of our
// own keeps the keys apart from anything else a cluster manager's store may hold.
constexpr char kKeyPrefix[] = "trainerd/v1/nodes/";

std::string FirstLine(const std::exception& error) {
  const std::string what = error.what();
  return what.substr(0, what.find('\n'));
}

std::string Hex(const unsigned char* bytes, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 15]);
  }
  return out;
}

// HMAC-SHA256 of what an entry says (the group's size, the node's rank and its address), in hex.
std::string Sign(const std::string& key, int nodes, int rank, const std::string& address) {
  const std::string message = absl::StrCat("trainerd node\n", nodes, "\n", rank, "\n", address);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &size);
  return Hex(mac, size);
}

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
  const std::string nodes_name = pet ? "PET_NNODES" : "WORLD_SIZE";
  const std::string rank_name = pet ? "PET_NODE_RANK" : "RANK";
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
  ClusterOptions options;
  options.source = source;
  options.master_addr = *Lookup(env, source + "MASTER_ADDR");
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("$", source, "MASTER_ADDR is empty"));
  }
  absl::StatusOr<int> port = number(source + "MASTER_PORT", 1, 65535);
  if (!port.ok()) return port.status();
  absl::StatusOr<int> nodes = number(nodes_name, 1, kMaxClusterNodes);
  if (!nodes.ok()) return nodes.status();
  absl::StatusOr<int> rank = number(rank_name, 0, *nodes - 1);
  if (!rank.ok()) return rank.status();
  if (*nodes == 1) return std::nullopt;  // a group of one: nothing to find
  options.master_port = *port;
  options.nodes = *nodes;
  options.node_rank = *rank;
  return options;
}

struct ClusterDirectory::State {
  ClusterOptions options;
  c10::intrusive_ptr<c10d::TCPStore> server;  // node 0's

  mutable std::mutex mu;
  std::condition_variable wake;
  bool stop = false;                 // guarded by mu
  std::map<int, std::string> known;  // guarded by mu: rank -> address
  std::set<std::string> refused;     // guarded by mu: entries logged as refused
  std::thread thread;

  // Connects (or reconnects), then registers and reads until told to stop.
  void Loop() {
    c10::intrusive_ptr<c10d::TCPStore> client;
    bool said_unreachable = false;
    const std::string own_key = absl::StrCat(kKeyPrefix, options.node_rank);
    const std::string own_value =
        options.key.empty()
            ? options.self
            : absl::StrCat(options.self, " ",
                           Sign(options.key, options.nodes, options.node_rank, options.self));
    while (true) {
      try {
        if (client == nullptr) {
          c10d::TCPStoreOptions connect;
          connect.port = static_cast<uint16_t>(options.master_port);
          connect.isServer = false;
          connect.waitWorkers = false;
          connect.timeout = Millis(options.interval);
          client = c10::make_intrusive<c10d::TCPStore>(options.master_addr, connect);
          LogInfo(absl::StrCat("node ", options.node_rank, " of ", options.nodes,
                               ": joined the group's directory at ", options.master_addr, ":",
                               options.master_port, " as ", options.self));
          said_unreachable = false;
        }
        // Written again whenever it is missing: node 0 may have restarted with an empty store.
        if (!client->check({own_key})) {
          client->set(own_key, std::vector<uint8_t>(own_value.begin(), own_value.end()));
        }
        for (int rank = 0; rank < options.nodes; ++rank) {
          if (rank == options.node_rank) continue;
          const std::string key = absl::StrCat(kKeyPrefix, rank);
          if (!client->check({key})) continue;
          const std::vector<uint8_t> bytes = client->get(key);
          Read(rank, std::string(bytes.begin(), bytes.end()));
        }
      } catch (const std::exception& error) {
        client.reset();
        if (!said_unreachable) {
          LogWarning(absl::StrCat(
              "node ", options.node_rank, " of ", options.nodes, ": the group's directory at ",
              options.master_addr, ":", options.master_port, " cannot be reached (",
              FirstLine(error), "); trying again every ", absl::FormatDuration(options.interval)));
          said_unreachable = true;
        }
      }
      std::unique_lock<std::mutex> lock(mu);
      if (wake.wait_for(lock, Millis(options.interval), [this] { return stop; })) return;
    }
  }

  // One entry read: kept when its signature checks.
  void Read(int rank, const std::string& value) {
    const std::vector<std::string> parts = absl::StrSplit(value, ' ');
    std::string address = parts[0];
    bool good = !address.empty() && parts.size() <= 2;
    if (good && !options.key.empty()) {
      const std::string want = Sign(options.key, options.nodes, rank, address);
      good = parts.size() == 2 && parts[1].size() == want.size() &&
             CRYPTO_memcmp(parts[1].data(), want.data(), want.size()) == 0;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (good) {
      if (known[rank] != address) {
        LogInfo(absl::StrCat("node ", options.node_rank, " of ", options.nodes, ": node ", rank,
                             " is at ", address));
      }
      known[rank] = address;
    } else if (refused.size() < 64 && refused.insert(value).second) {
      LogWarning(absl::StrCat("node ", options.node_rank, " of ", options.nodes,
                              ": ignoring the directory's entry for node ", rank, " ('",
                              value.substr(0, 80),
                              "'): it is not signed with this daemon's peer token"));
    }
  }
};

absl::StatusOr<std::unique_ptr<ClusterDirectory>> ClusterDirectory::Start(ClusterOptions options) {
  if (options.nodes < 2 || options.nodes > kMaxClusterNodes || options.node_rank < 0 ||
      options.node_rank >= options.nodes || options.master_port <= 0 ||
      options.master_port > 65535 || options.self.empty() ||
      options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", options.node_rank, " of ",
                                                   options.nodes, " on port ", options.master_port,
                                                   " is not a group's node"));
  }
  auto directory = std::unique_ptr<ClusterDirectory>(new ClusterDirectory());
  directory->state_ = std::make_unique<State>();
  State& state = *directory->state_;
  state.options = std::move(options);
  if (state.options.node_rank == 0) {
    try {
      c10d::TCPStoreOptions host;
      host.port = static_cast<uint16_t>(state.options.master_port);
      host.isServer = true;
      host.waitWorkers = false;
      host.timeout = Millis(state.options.interval);
      state.server = c10::make_intrusive<c10d::TCPStore>(state.options.master_addr, host);
    } catch (const std::exception& error) {
      return absl::UnavailableError(
          absl::StrCat("node 0 of ", state.options.nodes,
                       " cannot host the group's directory on port ", state.options.master_port,
                       " ($", state.options.source, "MASTER_PORT): ", FirstLine(error)));
    }
  }
  state.thread = std::thread([&state] { state.Loop(); });
  return directory;
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
