#include "server/metrics/http_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainerd::metrics {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr int kPollMillis = 200;  // how soon the thread notices Stop

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // the scraper went away
    }
    sent += static_cast<size_t>(n);
  }
}

std::string Response(int code, const char* reason, const std::string& content_type,
                     const std::string& body, bool head_only) {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ",
                                 content_type, "\r\nContent-Length: ", body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (!head_only) out += body;
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& address, std::string path, std::function<std::string()> render) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:9400
  }
  const std::string port_text = address.substr(colon + 1);
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
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  int error = fd < 0 ? errno : 0;
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 16) != 0) error = errno;
  }
  freeaddrinfo(found);
  if (error != 0) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", std::strerror(error)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int port = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<HttpEndpoint>(
      new HttpEndpoint(fd, port, std::move(path), std::move(render)));
}

HttpEndpoint::HttpEndpoint(int fd, int port, std::string path, std::function<std::string()> render)
    : fd_(fd), port_(port), path_(std::move(path)), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

HttpEndpoint::~HttpEndpoint() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void HttpEndpoint::Serve() {
  while (!stopping_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMillis) <= 0) continue;
    const int connection = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Handle(connection);
    close(connection);
  }
}

void HttpEndpoint::Handle(int connection) {
  // A scraper that stalls must not hold the endpoint: 5 s to send its request.
  timeval timeout{5, 0};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string head;
  char buffer[1024];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < kMaxRequestHead) {
    const ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    head.append(buffer, static_cast<size_t>(n));
  }
  const std::string line = head.substr(0, head.find("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0) {
    SendAll(connection, Response(400, "Bad Request", "text/plain", "bad request\n", false));
    return;
  }
  const std::string& method = parts[0];
  const std::string target = parts[1].substr(0, parts[1].find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    SendAll(connection,
            Response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false));
    return;
  }
  if (target == path_) {
    SendAll(connection, Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render_(),
                                 head_only));
  } else if (target == "/") {
    SendAll(connection,
            Response(200, "OK", "text/html; charset=utf-8",
                     absl::StrCat("<html><body>trainerd: metrics at <a href=\"", path_, "\">",
                                  path_, "</a></body></html>\n"),
                     head_only));
  } else {
    SendAll(connection, Response(404, "Not Found", "text/plain", "not found\n", head_only));
  }
}

}  // namespace trainerd::metrics
