// HttpEndpoint on libmicrohttpd: our own listening socket handed to MHD, MHD's callbacks (routing
// and authentication, the connection table, admission), and the deadline reaper.
#include "server/http/http_endpoint.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/http/listen.h"

namespace trainerd::http {
namespace {

constexpr size_t kThreadStackBytes = size_t{8} << 20;  // see the header: LibTorch's static TLS
constexpr size_t kMinRequestBytes = 4096;
constexpr absl::Duration kReapInterval = absl::Milliseconds(100);
constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";

// Compares in time that depends only on the length of `expected`, so that a client cannot find
// the token byte by byte from response times.
bool ConstantTimeEquals(absl::string_view presented, absl::string_view expected) {
  unsigned char difference = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char byte = i < presented.size() ? presented[i] : 0;
    difference |= byte ^ static_cast<unsigned char>(expected[i]);
  }
  return difference == 0;
}

absl::Status CheckOptions(const HttpEndpointOptions& options) {
  if (options.path.empty() || options.path.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("path '", options.path, "' does not start with '/'"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections is ", options.max_connections, "; it must be at least 1"));
  }
  if (options.max_connections_per_ip < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_connections_per_ip is ",
                                                   options.max_connections_per_ip,
                                                   "; it must be 0 (no limit) or more"));
  }
  if (options.idle_timeout < absl::ZeroDuration() ||
      options.request_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "idle_timeout (", absl::FormatDuration(options.idle_timeout), ") and request_deadline (",
        absl::FormatDuration(options.request_deadline), ") must not be negative"));
  }
  if (options.max_request_bytes < kMinRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("max_request_bytes is ",
                                                   options.max_request_bytes,
                                                   "; it must be at least ", kMinRequestBytes));
  }
  return absl::OkStatus();
}

// The client's IP address as text ("127.0.0.2", "::1"), without its port: what the per-address
// limits count by.
std::string AddressKey(const sockaddr* address) {
  if (address == nullptr) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
              sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

// Queues one complete response; `headers` are extra (name, value) pairs.
MHD_Result Reply(MHD_Connection* connection, unsigned int code, const char* content_type,
                 const std::string& body,
                 std::initializer_list<std::pair<const char*, const char*>> headers = {}) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;  // out of memory: MHD closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  for (const auto& [name, value] : headers) MHD_add_response_header(response, name, value);
  const MHD_Result queued = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

// MHD's C callbacks; `cls` is always the HttpEndpoint. All run on MHD's polling thread.
struct HttpEndpoint::Callbacks {
  // Admission (MHD's accept policy). Below max_connections every connection is admitted. At the
  // limit, a connection is admitted only when its address holds fewer connections than the
  // address that holds the most; room is made by shutting down, among that address's
  // connections, the one whose current request began longest ago (a client that never finishes
  // a request, not a scraper that keeps its connection alive between scrapes). So slow clients
  // from many addresses cannot keep a new scraper out; one address still cannot push out others
  // (it holds no fewer than any). MHD's own connection limit is one higher: at its limit MHD
  // stops accepting, which would leave new connections waiting in the kernel's backlog instead of
  // closing them.
  static MHD_Result Admit(void* cls, const sockaddr* address, socklen_t /*length*/) {
    HttpEndpoint* self = static_cast<HttpEndpoint*>(cls);
    absl::MutexLock lock(&self->mu_);
    std::map<std::string, int> per_address;
    size_t active = 0;
    for (const auto& [connection, open] : self->connections_) {
      if (open.shut_down) continue;
      ++active;
      ++per_address[open.address];
    }
    if (active < static_cast<size_t>(self->options_.max_connections)) return MHD_YES;
    int most = 0;
    for (const auto& [key, count] : per_address) most = std::max(most, count);
    const std::string key = AddressKey(address);
    if (per_address[key] >= most) return MHD_NO;
    OpenConnection* victim = nullptr;
    for (auto& [connection, open] : self->connections_) {
      if (open.shut_down || open.fd < 0 || per_address[open.address] != most) continue;
      if (victim == nullptr || open.request_start < victim->request_start) victim = &open;
    }
    if (victim == nullptr) return MHD_NO;
    // As the reaper does: MHD sees end-of-stream on its next poll and closes it itself.
    shutdown(victim->fd, SHUT_RDWR);
    victim->shut_down = true;
    return MHD_YES;
  }

  static void NotifyConnection(void* cls, MHD_Connection* connection, void** /*socket_context*/,
                               MHD_ConnectionNotificationCode code) {
    HttpEndpoint* self = static_cast<HttpEndpoint*>(cls);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
      OpenConnection open;
      open.fd = info != nullptr ? info->connect_fd : -1;
      const MHD_ConnectionInfo* peer =
          MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
      open.address = peer != nullptr ? AddressKey(peer->client_addr) : "";
      open.request_start = std::chrono::steady_clock::now();
      absl::MutexLock lock(&self->mu_);
      self->connections_[connection] = open;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
      absl::MutexLock lock(&self->mu_);
      self->connections_.erase(connection);
    }
  }

  // A request ended: on a kept-alive connection the next request gets a deadline of its own.
  static void RequestCompleted(void* cls, MHD_Connection* connection, void** /*request_context*/,
                               MHD_RequestTerminationCode /*code*/) {
    HttpEndpoint* self = static_cast<HttpEndpoint*>(cls);
    absl::MutexLock lock(&self->mu_);
    auto it = self->connections_.find(connection);
    if (it != self->connections_.end()) {
      it->second.request_start = std::chrono::steady_clock::now();
    }
  }

  // MHD's error log, kept off stderr: the last message explains a failed start.
  static void Log(void* cls, const char* format, va_list arguments) {
    HttpEndpoint* self = static_cast<HttpEndpoint*>(cls);
    char message[512];
    std::vsnprintf(message, sizeof(message), format, arguments);
    absl::MutexLock lock(&self->mu_);
    self->last_mhd_message_ = std::string(absl::StripTrailingAsciiWhitespace(message));
  }

  // MHD calls this once the request head is in, then once per piece of body, then once more
  // when the whole request is in. Refusals (401, 405) are queued on the first call: MHD then
  // reads no body and closes the connection after the response. Served requests are answered
  // on the last call, which lets MHD keep the connection alive for the scraper's next request.
  static MHD_Result Access(void* cls, MHD_Connection* connection, const char* url,
                           const char* method, const char* /*version*/, const char* /*upload_data*/,
                           size_t* upload_data_size, void** request_context) {
    HttpEndpoint* self = static_cast<HttpEndpoint*>(cls);
    const HttpEndpointOptions& options = self->options_;
    static char accepted;  // its address marks a request that passed the first call
    if (*request_context == nullptr) {
      if (!options.bearer_token.empty()) {
        const char* authorization =
            MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        absl::string_view credentials = authorization != nullptr ? authorization : "";
        const bool bearer = absl::StartsWithIgnoreCase(credentials, "Bearer ");
        if (bearer) credentials = absl::StripAsciiWhitespace(credentials.substr(7));
        if (!bearer || !ConstantTimeEquals(credentials, options.bearer_token)) {
          return Reply(connection, MHD_HTTP_UNAUTHORIZED, kTextContentType, "unauthorized\n",
                       {{MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"trainerd\""}});
        }
      }
      const absl::string_view verb = method;
      if (verb != MHD_HTTP_METHOD_GET && verb != MHD_HTTP_METHOD_HEAD) {
        return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, kTextContentType,
                     "only GET and HEAD\n", {{MHD_HTTP_HEADER_ALLOW, "GET, HEAD"}});
      }
      *request_context = &accepted;
      return MHD_YES;
    }
    if (*upload_data_size != 0) {  // a body on a GET: ignored
      *upload_data_size = 0;
      return MHD_YES;
    }
    // MHD has already split the query string off `url`; for HEAD it sends no body.
    const absl::string_view target = url;
    if (target == options.path) {
      std::string body;
      try {
        body = self->render_();
      } catch (const std::exception& e) {
        return Reply(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, kTextContentType,
                     absl::StrCat("cannot render: ", e.what(), "\n"));
      }
      return Reply(connection, MHD_HTTP_OK, kPrometheusContentType, body);
    }
    if (target == "/") {
      return Reply(connection, MHD_HTTP_OK, "text/html; charset=utf-8",
                   absl::StrCat("<html><body>trainerd: metrics at <a href=\"", options.path, "\">",
                                options.path, "</a></body></html>\n"));
    }
    return Reply(connection, MHD_HTTP_NOT_FOUND, kTextContentType, "not found\n");
  }
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& address, HttpEndpointOptions options, std::function<std::string()> render) {
  if (absl::Status valid = CheckOptions(options); !valid.ok()) return valid;
  absl::StatusOr<ListeningSocket> listening = Listen(address);
  if (!listening.ok()) return listening.status();
  std::unique_ptr<HttpEndpoint> endpoint(
      new HttpEndpoint(listening->port, std::move(options), std::move(render)));
  const HttpEndpointOptions& set = endpoint->options_;

  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
  if (listening->family == AF_INET6) flags |= MHD_USE_IPv6;
  const int64_t idle_seconds =
      absl::ToInt64Seconds(absl::Ceil(set.idle_timeout, absl::Seconds(1)));  // MHD counts seconds
  const unsigned int idle_timeout =
      static_cast<unsigned int>(idle_seconds > UINT_MAX ? UINT_MAX : idle_seconds);
  const unsigned int connection_limit = static_cast<unsigned int>(set.max_connections) + 1;
  const unsigned int per_ip_limit = static_cast<unsigned int>(set.max_connections_per_ip);
  // From here MHD owns the socket: MHD_stop_daemon closes it. A failed start closes it on some of
  // MHD's error paths and not on others; leaking it then is safer than closing a number that
  // another thread may already have reused.
  endpoint->daemon_ = MHD_start_daemon(
      flags, /*port=*/0, &Callbacks::Admit, endpoint.get(), &Callbacks::Access, endpoint.get(),
      MHD_OPTION_EXTERNAL_LOGGER, &Callbacks::Log, endpoint.get(),       // first, as MHD asks
      MHD_OPTION_LISTEN_SOCKET, static_cast<MHD_socket>(listening->fd),  //
      MHD_OPTION_THREAD_STACK_SIZE, kThreadStackBytes,                   //
      MHD_OPTION_CONNECTION_LIMIT, connection_limit,                     // see Admit
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip_limit,                  //
      MHD_OPTION_CONNECTION_TIMEOUT, idle_timeout,                       //
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, set.max_request_bytes,         //
      MHD_OPTION_NOTIFY_CONNECTION, &Callbacks::NotifyConnection, endpoint.get(),
      MHD_OPTION_NOTIFY_COMPLETED, &Callbacks::RequestCompleted, endpoint.get(),  //
      MHD_OPTION_END);
  if (endpoint->daemon_ == nullptr) {
    absl::MutexLock lock(&endpoint->mu_);
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", address, ": libmicrohttpd did not start",
                     endpoint->last_mhd_message_.empty() ? "" : ": ", endpoint->last_mhd_message_));
  }
  if (set.request_deadline > absl::ZeroDuration() &&
      set.request_deadline != absl::InfiniteDuration()) {
    HttpEndpoint* raw = endpoint.get();
    endpoint->reaper_ = std::thread([raw] { raw->Reap(); });
  }
  return endpoint;
}

HttpEndpoint::HttpEndpoint(int port, HttpEndpointOptions options,
                           std::function<std::string()> render)
    : port_(port), options_(std::move(options)), render_(std::move(render)) {}

HttpEndpoint::~HttpEndpoint() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  // Closes every connection (each notifying NOTIFY_CLOSED) and joins MHD's thread.
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

void HttpEndpoint::Reap() {
  const std::chrono::nanoseconds deadline = absl::ToChronoNanoseconds(options_.request_deadline);
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), kReapInterval)) {
    const auto now = std::chrono::steady_clock::now();
    for (auto& [connection, open] : connections_) {
      if (open.shut_down || open.fd < 0 || now - open.request_start < deadline) continue;
      // MHD sees end-of-stream on its next poll and closes the connection itself.
      shutdown(open.fd, SHUT_RDWR);
      open.shut_down = true;
    }
  }
}

}  // namespace trainerd::http
