// Listen (listen.h): getaddrinfo, socket, bind and listen, with errno's reason in the error.
#include "server/http/listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainerd::http {

absl::StatusOr<ListeningSocket> Listen(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:9400
  }
  const std::string port_text = address.substr(colon + 1);
  // getaddrinfo takes "99999" as 99999 mod 65536 and a name such as "http" as its port: a port
  // here is a number a TCP port can be.
  int port_number = -1;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port_text, &port_number) || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not host:port (a port is 0 to 65535)"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int resolved = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
  if (resolved != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", address, "': ", gai_strerror(resolved)));
  }
  ListeningSocket socket_info;
  socket_info.family = found->ai_family;
  socket_info.fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                          found->ai_protocol);
  int error = socket_info.fd < 0 ? errno : 0;
  if (socket_info.fd >= 0) {
    const int one = 1;
    setsockopt(socket_info.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(socket_info.fd, found->ai_addr, found->ai_addrlen) != 0 ||
        listen(socket_info.fd, SOMAXCONN) != 0) {
      error = errno;
    }
  }
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (error == 0 &&
      getsockname(socket_info.fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    error = errno;
  }
  if (error != 0) {
    if (socket_info.fd >= 0) close(socket_info.fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", std::strerror(error)));
  }
  socket_info.port = bound.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return socket_info;
}

}  // namespace trainerd::http
