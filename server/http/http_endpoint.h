// trainerd's HTTP endpoint for Prometheus's scrapes, built on Debian's libmicrohttpd (MHD): GET or
// HEAD of one path answers with a body the caller renders (the text exposition format), `/` with
// a small page linking to it, everything else with 404/405; an optional bearer token guards every
// path. MHD multiplexes all connections on one internal polling thread (epoll), so a slow or idle
// client never holds up another's scrape, and the limits below bound what clients can hold.
//
// Why MHD and not prometheus-cpp's Exposer: the Exposer serves through CivetWeb, whose Debian build
// starts its threads with a fixed 100 KiB stack, smaller than the static TLS that LibTorch's CUDA
// libraries need, so inside trainerd pthread_create fails with EINVAL and the exposer cannot
// start. MHD lets us choose the stack size of its thread (MHD_OPTION_THREAD_STACK_SIZE): 8 MiB,
// the usual default, which leaves room for that TLS. The metrics themselves are prometheus-cpp's;
// only the HTTP part is here.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct MHD_Connection;
struct MHD_Daemon;

namespace trainerd::http {

struct HttpEndpointOptions {
  // The path served with render(); must start with '/'. Query strings are ignored.
  std::string path = "/metrics";
  // Empty: no authentication. Otherwise every request, on every path, needs
  // "Authorization: Bearer <token>" (compared in constant time) or gets 401 with
  // `WWW-Authenticate: Bearer realm="trainerd"`.
  std::string bearer_token;
  // Open connections at most; at least 1. At the limit a new connection from an address that
  // holds fewer connections than another takes the place of that address's connection whose
  // request began longest ago; otherwise it is accepted and closed at once, so that a scraper
  // fails fast instead of waiting in the kernel's backlog.
  int max_connections = 64;
  // Open connections from one IP address at most; 0: no per-address limit.
  int max_connections_per_ip = 16;
  // A connection that sends and receives nothing for this long is closed. MHD counts whole
  // seconds: rounded up. Zero: no idle timeout.
  absl::Duration idle_timeout = absl::Seconds(5);
  // Whole-request deadline: a connection whose current request (counted from the connection's
  // start or from the end of its previous request) has lasted this long is closed, even one that
  // keeps dripping bytes. Checked every 100 ms. Zero: no deadline.
  absl::Duration request_deadline = absl::Seconds(10);
  // Bytes of memory per connection for its request head and buffers
  // (MHD_OPTION_CONNECTION_MEMORY_LIMIT); a head that does not fit is refused (414/431). At least
  // 4 KiB. The response body is held outside this pool.
  size_t max_request_bytes = 16 * 1024;
};

// Serves one path over HTTP/1.1 until destroyed. Created by Start, owned by the caller (in
// trainerd, by Metrics). Thread-safe: port() may be called from any thread; the destructor must not
// run concurrently with other calls. render() is called on MHD's polling thread, one request at a
// time, and holds up every other connection while it runs: keep it quick and non-blocking.
class HttpEndpoint {
 public:
  // Listens on `address` ("host:port", "[::1]:port"; port 0 picks a free one) and serves GET and
  // HEAD of options.path with `render()`. INVALID_ARGUMENT for an address that is not host:port or
  // does not resolve, or for invalid options; UNAVAILABLE when it cannot listen (the port is in
  // use) or MHD cannot start.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& address,
                                                             HttpEndpointOptions options,
                                                             std::function<std::string()> render);
  // Closes every connection, stops MHD's thread and the deadline reaper; returns promptly while
  // clients are connected (it waits only for a render() in progress).
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // The port it listens on (the chosen one when the address asked for port 0).
  int port() const { return port_; }

 private:
  struct Callbacks;  // MHD's C callbacks (http_endpoint.cc)

  // An open connection as the deadline reaper sees it.
  struct OpenConnection {
    int fd = -1;
    std::string address;  // the client's IP address (AddressKey), for admission's fairness
    std::chrono::steady_clock::time_point request_start;
    bool shut_down = false;  // the reaper or admission shut it down; MHD will close it
  };

  HttpEndpoint(int port, HttpEndpointOptions options, std::function<std::string()> render);
  // Runs on reaper_: every 100 ms, shuts down the connections whose request is past the deadline.
  void Reap();

  const int port_;
  const HttpEndpointOptions options_;
  const std::function<std::string()> render_;
  MHD_Daemon* daemon_ = nullptr;  // set by Start; null if MHD failed to start

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every connection MHD has open, from MHD_CONNECTION_NOTIFY_STARTED to ..._CLOSED. MHD closes a
  // connection's fd only after that notification, which waits for mu_: the reaper, holding mu_,
  // can shut an fd down without racing its close and a reuse of the number.
  std::unordered_map<MHD_Connection*, OpenConnection> connections_ ABSL_GUARDED_BY(mu_);
  std::string last_mhd_message_ ABSL_GUARDED_BY(mu_);  // MHD's log, kept quiet; for Start's error
  std::thread reaper_;                                 // only with a request deadline
};

}  // namespace trainerd::http
