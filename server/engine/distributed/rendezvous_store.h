// A data-parallel job's rendezvous store: the key-value meeting place where its ranks count
// themselves in and Gloo's ranks tell each other their addresses, as a c10d::TCPStore is for
// torchrun. trainerd's own, because c10d's TCPStore server takes any connection (no credential),
// lists its keys to anyone, and bounds only each value (8 MiB), not how many a connection sets:
// on a daemon that is a stranger's way to grow its memory without end (distributed/README.md,
// "Rendezvous"). The ranks see it through c10d's own Store interface, so c10d's
// PrefixStore and ProcessGroupGloo use it as they use a TCPStore.
//
// What it guards (docs/SECURITY.md, "Peers"): it listens on one address (the daemon's
// --advertise_host), not every interface; a connection must say the job's secret (32 random
// bytes, which the leader hands its peers in the authenticated RunRankRequest) within two seconds
// as its first message, or it is closed; one that says it may set at most StoreLimits' keys and
// bytes, and one that asks for more is cut off; every refusal is one log line, and a store logs at
// most a few.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainerd::engine {

// What one connection may do to a store. The defaults are far above what a job's rank sets
// (its join count, and Gloo's address list of about 150 bytes per rank) and far below what would
// matter to a daemon.
struct StoreLimits {
  int64_t max_key_bytes = 1024;
  int64_t max_value_bytes = int64_t{1} << 20;
  // The bytes (keys and values) and the keys one connection may set, in all, for its life.
  int64_t max_bytes_per_connection = int64_t{2} << 20;
  int64_t max_keys_per_connection = 1024;
  // Connections that said the secret, at once; 0: twice the world size and 4 more (a rank holds
  // one, a clone one more).
  int max_connections = 0;
  // Connections that have not said the secret yet, at once (the oldest is closed for a new one
  // once it has waited 200 ms, else the new one is), and how long each may take to say it.
  int max_pending = 16;
  absl::Duration hello_timeout = absl::Seconds(2);
  // Refusals logged in full per store; after them one line says the rest are not.
  int max_logged_refusals = 5;
};

class StoreServer {
 public:
  // Listens on `host` (an address or a name that resolves to one; never every interface), on the
  // first free port of [port_min, port_max] (0, 0: one the kernel picks), with a fresh secret.
  // UNAVAILABLE when no port of the range is free; INVALID_ARGUMENT for a bad range or a host
  // that resolves to nothing.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port_min,
                                                            int port_max, int world_size,
                                                            StoreLimits limits = {});
  // Closes every connection (a rank waiting in it gets an error) and stops its threads.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // The address it listens on, as the kernel reports it (getsockname): "127.0.0.2:29500".
  std::string address() const;
  // What a connection must say first: 64 lower-case hex digits.
  const std::string& secret() const;

  // Sets `key` from this process (the leader giving the meeting up), outside any connection's
  // limits, and wakes the connections waiting for it.
  void Set(const std::string& key, const std::string& value);

  // What the store holds now (keys and values), and how many connections it closed for a wrong
  // or missing secret, a malformed message or a limit: for tests and the log.
  int64_t stored_bytes() const;
  int64_t refused_connections() const;

  struct State;

 private:
  StoreServer() = default;
  std::shared_ptr<State> state_;
};

// A rank's connection to a StoreServer at host:port that says `secret`, as a c10d::Store: every
// call waits at most `timeout` (a wait for keys too, whatever the caller asks: no rank waits on
// the store longer than its group's timeout). Calls throw std::runtime_error when the store
// cannot be reached or closes the connection, or (saying "timeout") when a wait runs out.
// UNAVAILABLE when the store cannot be reached within `timeout`; PERMISSION_DENIED when it
// refuses the secret.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const std::string& host, int port,
                                                             const std::string& secret,
                                                             absl::Duration timeout);

}  // namespace trainerd::engine
