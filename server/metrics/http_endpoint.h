// A minimal HTTP/1.1 server for Prometheus's scrapes: GET /metrics answers with a body the caller
// renders (the text exposition format), everything else with 404/405; one connection at a time,
// closed after each response.
//
// Why not prometheus-cpp's Exposer: it serves through CivetWeb, whose Debian build gives its
// threads a fixed 100 KiB stack, smaller than the static TLS that LibTorch's CUDA libraries need,
// so in trainerd's process pthread_create fails with EINVAL and the exposer cannot start. The
// metrics themselves are prometheus-cpp's (Registry, TextSerializer); only the HTTP part is ours.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace trainerd::metrics {

class HttpEndpoint {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one) and serves GET `path` with
  // `render()` on a thread of its own. UNAVAILABLE when it cannot listen, INVALID_ARGUMENT for an
  // address that is not host:port.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& address,
                                                             std::string path,
                                                             std::function<std::string()> render);
  ~HttpEndpoint();  // stops accepting, joins the thread
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }

 private:
  HttpEndpoint(int fd, int port, std::string path, std::function<std::string()> render);
  void Serve();
  void Handle(int connection);

  const int fd_;
  const int port_;
  const std::string path_;
  const std::function<std::string()> render_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace trainerd::metrics
