// A listening TCP socket for an HTTP server of trainerd's (the metrics endpoint, the console),
// opened by us and handed to libmicrohttpd, so that port 0 and bind errors are reported the same
// way everywhere.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace trainerd::http {

// A bound, listening, non-blocking socket, its family (AF_INET, AF_INET6) and its port.
struct ListeningSocket {
  int fd = -1;
  int family = 0;
  int port = 0;
};

// Listens on `address` ("host:port", "[::1]:port"; port 0 picks a free one). INVALID_ARGUMENT
// for an address that is not host:port or does not resolve; UNAVAILABLE when it cannot listen.
absl::StatusOr<ListeningSocket> Listen(const std::string& address);

}  // namespace trainerd::http
