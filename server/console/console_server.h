// trainerd's web console over HTTP, or HTTPS when the daemon serves TLS (--console_listen, off by
// default): the page's three assets,
// compiled into the binary (no CDN: a node may have no internet), and the JSON API the page reads
// (json_gateway.h): POST /api/v1/<Service>/<Method>, and JobService/WatchJob as a stream of
// server-sent events. Every response carries a Content-Security-Policy that allows the page's own
// script and style only.
//
// On libmicrohttpd, a thread per connection (a watch blocks on its gRPC stream), each with an
// 8 MiB stack (LibTorch's static TLS, as server/http's), bounded in number overall and per
// address; request bodies are bounded before they are read. With mutual TLS every connection is
// asked for a client certificate, verified on its first API call and kept for the connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/console/console_tls.h"
#include "server/console/json_gateway.h"

struct MHD_Daemon;

namespace trainerd::console {

struct ConsoleOptions {
  // Open connections at most, and from one address; a page holds one for its watch and one or
  // two for its calls.
  int max_connections = 256;
  int max_connections_per_ip = 64;
  // Open watches (WatchJob streams) at most; more are RESOURCE_EXHAUSTED (429). The daemon's own
  // per-caller bound on watches applies too.
  int max_streams = 128;
  // A request's body at most (413 beyond); the console's requests are a few hundred bytes.
  size_t max_request_bytes = 64 * 1024;
  // A connection that sends and receives nothing for this long is closed; a watch sends a
  // comment every keepalive to stay open.
  absl::Duration idle_timeout = absl::Seconds(60);
  absl::Duration keepalive = absl::Seconds(15);
  // HTTPS with the daemon's certificate, and mutual TLS with its client CA (console_tls.h).
  // Empty: plain HTTP.
  ConsoleTls tls;
  // Decides a call before it is made, as the gRPC server's own check does for its connections
  // (which the in-process channel does not pass through), from the request's Authorization
  // header (its value; empty when absent) and the subject of the client certificate its
  // connection presented and the console verified ("" when none): the metadata the call carries
  // into the daemon, or the error (UNAUTHENTICATED) that is the reply. Unset: the Authorization
  // header as it is, unchecked (a daemon without authentication).
  std::function<absl::StatusOr<CallMetadata>(absl::string_view authorization,
                                             absl::string_view certificate_subject)>
      authenticate;
  // Logs what the operator should know of (TLS files that could not be re-read).
  std::function<void(absl::string_view)> warn;
};

class ConsoleServer {
 public:
  // Listens on `address` (host:port; port 0 picks one) and serves the console, calling the daemon
  // through `channel` (its in-process channel). INVALID_ARGUMENT for an address that is not
  // host:port; UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<ConsoleServer>> Start(
      const std::string& address, ConsoleOptions options, std::shared_ptr<grpc::Channel> channel);
  // Closes every connection (open watches are cancelled) and stops.
  ~ConsoleServer();
  ConsoleServer(const ConsoleServer&) = delete;
  ConsoleServer& operator=(const ConsoleServer&) = delete;

  int port() const { return port_; }
  // "https" when it serves TLS, else "http".
  const char* scheme() const { return tls_ != nullptr ? "https" : "http"; }
  // Watches open now.
  int open_streams() const { return streams_.load(); }

 private:
  struct Callbacks;
  struct Request;
  struct Stream;
  struct Connection;
  ConsoleServer(int port, ConsoleOptions options, std::shared_ptr<grpc::Channel> channel);

  const int port_;
  const ConsoleOptions options_;
  const JsonGateway gateway_;
  std::unique_ptr<TlsFiles> tls_;  // null: plain HTTP
  std::atomic<int> streams_{0};
  std::atomic<bool> stopping_{false};
  MHD_Daemon* daemon_ = nullptr;
};

}  // namespace trainerd::console
