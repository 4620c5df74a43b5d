// ConsoleServer (console_server.h) on libmicrohttpd: routing, the request bodies, the assets and
// the security headers, the JSON calls, and the watches as server-sent events.
#include "server/console/console_server.h"

#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "server/console/console_assets.h"
#include "server/http/listen.h"

namespace trainerd::console {
namespace {

constexpr size_t kThreadStackBytes = size_t{8} << 20;

// What a watch holds for its browser at most: past it the stream is read no further until the
// browser takes some (the daemon's watch then pages a lagging reader from the records, and the
// job never waits for it).
constexpr size_t kMaxBufferedBytes = size_t{256} << 10;

// The page runs its own script and style only, talks to its own origin only, and is framed by
// nobody.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

MHD_Result Queue(MHD_Connection* connection, unsigned int code, MHD_Response* response,
                 const char* content_type, bool cacheable) {
  if (response == nullptr) return MHD_NO;  // out of memory: MHD closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  MHD_add_response_header(response, "Content-Security-Policy", kContentSecurityPolicy);
  MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(response, "X-Frame-Options", "DENY");
  MHD_add_response_header(response, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(response, "Cache-Control", cacheable ? "no-cache" : "no-store");
  const MHD_Result queued = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return queued;
}

MHD_Result ReplyJson(MHD_Connection* connection, const JsonReply& reply) {
  MHD_Response* response = MHD_create_response_from_buffer(
      reply.json.size(), const_cast<char*>(reply.json.data()), MHD_RESPMEM_MUST_COPY);
  return Queue(connection, static_cast<unsigned int>(reply.http_status), response,
               "application/json", false);
}

MHD_Result ReplyError(MHD_Connection* connection, int grpc_code, absl::string_view message,
                      int http_status = 0) {
  return ReplyJson(connection, {http_status != 0 ? http_status : HttpStatusOf(grpc_code),
                                JsonError(grpc_code, message)});
}

std::string Header(MHD_Connection* connection, const char* name) {
  const char* value = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, name);
  return value == nullptr ? "" : value;
}

}  // namespace

// A request's body, read before the request is answered (bounded by max_request_bytes).
struct ConsoleServer::Request {
  std::string body;
  bool too_large = false;
};

// One connection's: the TLS files it was served with, and what its client certificate proved
// (looked at on its first API call; a connection's requests come one after another on its
// thread).
struct ConsoleServer::Connection {
  std::shared_ptr<const TlsIdentity> tls;
  bool checked = false;
  absl::StatusOr<std::string> subject = std::string();
};

// One watch or download: a thread reads the gRPC stream into `buffer`; MHD's connection thread
// sends it.
struct ConsoleServer::Stream {
  ConsoleServer* server = nullptr;
  bool download = false;
  grpc::ClientContext context;
  std::thread reader;
  absl::Mutex mu;
  std::string buffer ABSL_GUARDED_BY(mu);
  size_t sent ABSL_GUARDED_BY(mu) = 0;  // of buffer, already given to MHD
  bool done ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;  // the browser went away
  bool produced ABSL_GUARDED_BY(mu) = false;  // anything was appended
  JsonReply end ABSL_GUARDED_BY(mu);          // the call's end, once done

  ~Stream() {
    {
      absl::MutexLock lock(&mu);
      closed = true;
    }
    context.TryCancel();
    if (reader.joinable()) reader.join();
    server->streams_.fetch_sub(1);
  }
};

struct ConsoleServer::Callbacks {
  static MHD_Result Access(void* cls, MHD_Connection* connection, const char* url,
                           const char* method, const char* /*version*/, const char* upload_data,
                           size_t* upload_data_size, void** request_state) {
    auto* server = static_cast<ConsoleServer*>(cls);
    auto* request = static_cast<Request*>(*request_state);
    if (request == nullptr) {  // the head: the body (if any) comes in the next calls
      *request_state = new Request();
      return MHD_YES;
    }
    if (*upload_data_size > 0) {
      if (request->body.size() + *upload_data_size > server->options_.max_request_bytes) {
        request->too_large = true;  // read and dropped; answered below
      } else {
        request->body.append(upload_data, *upload_data_size);
      }
      *upload_data_size = 0;
      return MHD_YES;
    }
    return Answer(server, connection, url, method, *request);
  }

  static void Completed(void* /*cls*/, MHD_Connection* /*connection*/, void** request_state,
                        MHD_RequestTerminationCode /*code*/) {
    delete static_cast<Request*>(*request_state);
    *request_state = nullptr;
  }

  static ssize_t Read(void* cls, uint64_t /*pos*/, char* out, size_t max) {
    auto* stream = static_cast<Stream*>(cls);
    absl::MutexLock lock(&stream->mu);
    auto ready = [stream]() ABSL_SHARED_LOCKS_REQUIRED(stream->mu) {
      return stream->sent < stream->buffer.size() || stream->done;
    };
    // In slices, so that a stopping console is noticed within a second.
    const absl::Time keepalive_at = absl::Now() + stream->server->options_.keepalive;
    while (!stream->mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1))) {
      if (stream->server->stopping_.load()) return MHD_CONTENT_READER_END_OF_STREAM;
      if (absl::Now() >= keepalive_at) {
        stream->buffer = ": keepalive\n\n";  // a comment: keeps proxies and the idle timeout away
        stream->sent = 0;
        break;
      }
    }
    if (stream->sent == stream->buffer.size()) {
      // A download cut short must not look whole; a watch said its error in an event.
      return stream->download && stream->end.http_status != 200 ? MHD_CONTENT_READER_END_WITH_ERROR
                                                                : MHD_CONTENT_READER_END_OF_STREAM;
    }
    const size_t n = std::min(max, stream->buffer.size() - stream->sent);
    std::memcpy(out, stream->buffer.data() + stream->sent, n);
    stream->sent += n;
    if (stream->sent == stream->buffer.size()) {  // all given: start over, keeping the memory
      stream->buffer.clear();
      stream->sent = 0;
    } else if (stream->sent >= kMaxBufferedBytes) {  // what was given goes, now and then
      stream->buffer.erase(0, stream->sent);
      stream->sent = 0;
    }
    return static_cast<ssize_t>(n);
  }

  static void Free(void* cls) { delete static_cast<Stream*>(cls); }

  static void Log(void* /*cls*/, const char* /*format*/, va_list /*args*/) {}

  static MHD_Result Answer(ConsoleServer* server, MHD_Connection* connection, const char* url,
                           const char* method, const Request& request);
  static Connection* ConnectionOf(MHD_Connection* connection);
  static void Notify(void* cls, MHD_Connection* connection, void** socket_context,
                     MHD_ConnectionNotificationCode code);
  // WatchJob (server-sent events) or DownloadModel (the bytes) as a streamed response.
  static MHD_Result Streamed(ConsoleServer* server, MHD_Connection* connection,
                             const std::string& body, const CallMetadata& caller, bool download);
};

MHD_Result ConsoleServer::Callbacks::Answer(ConsoleServer* server, MHD_Connection* connection,
                                            const char* url, const char* method,
                                            const Request& request) {
  const absl::string_view path(url);
  const absl::string_view verb(method);
  if (verb == "GET" || verb == "HEAD") {
    const ConsoleAsset* asset = FindConsoleAsset(path == "/" ? "/index.html" : path);
    if (asset == nullptr) return ReplyError(connection, grpc::StatusCode::NOT_FOUND, "not found");
    MHD_Response* response = MHD_create_response_from_buffer(
        asset->size, const_cast<char*>(asset->data), MHD_RESPMEM_PERSISTENT);
    return Queue(connection, MHD_HTTP_OK, response, asset->content_type, true);
  }
  if (verb != "POST") {
    return ReplyError(connection, grpc::StatusCode::UNIMPLEMENTED, "GET, HEAD or POST only", 405);
  }
  if (request.too_large) {
    return ReplyError(
        connection, grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the request is larger than ", server->options_.max_request_bytes, " bytes"),
        413);
  }
  // Another site's page cannot call the API with a user's token: no browser sends a cross-origin
  // JSON POST without asking first (and nobody answers), and an Origin, when sent, must be ours.
  if (!absl::StartsWith(Header(connection, "Content-Type"), "application/json")) {
    return ReplyError(connection, grpc::StatusCode::INVALID_ARGUMENT,
                      "the API takes Content-Type: application/json", 415);
  }
  const std::string origin = Header(connection, "Origin");
  const std::string host = Header(connection, "Host");
  if (!origin.empty() && origin != absl::StrCat("http://", host) &&
      origin != absl::StrCat("https://", host)) {
    return ReplyError(connection, grpc::StatusCode::PERMISSION_DENIED,
                      "the console's API answers its own page only");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  // "", "api", "v1", service, method
  if (parts.size() != 5 || parts[1] != "api" || parts[2] != "v1") {
    return ReplyError(connection, grpc::StatusCode::NOT_FOUND, "not found");
  }
  const std::string authorization = Header(connection, "Authorization");
  std::string subject;
  if (server->tls_ != nullptr && server->options_.tls.mutual()) {
    Connection* state = ConnectionOf(connection);
    if (state == nullptr || state->tls == nullptr) {  // never: Notify made it before the handshake
      return ReplyError(connection, grpc::StatusCode::UNAUTHENTICATED,
                        "this connection's client certificate is unknown; connect again");
    }
    if (!state->checked) {
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
      state->subject = state->tls->VerifiedSubject(
          info == nullptr ? nullptr : static_cast<gnutls_session_t>(info->tls_session));
      state->checked = true;
    }
    // As the gRPC API with mutual TLS: no call without a verified certificate (a token, when
    // sent too, then names the caller).
    if (!state->subject.ok()) {
      return ReplyError(connection, static_cast<int>(state->subject.status().code()),
                        state->subject.status().message());
    }
    subject = *state->subject;
  }
  CallMetadata caller;
  if (server->options_.authenticate) {
    absl::StatusOr<CallMetadata> admitted = server->options_.authenticate(authorization, subject);
    if (!admitted.ok()) {
      return ReplyError(connection, static_cast<int>(admitted.status().code()),
                        admitted.status().message());
    }
    caller = *std::move(admitted);
  } else if (!authorization.empty()) {
    caller.emplace_back("authorization", authorization);
  }
  if (parts[3] == "JobService" && (parts[4] == "WatchJob" || parts[4] == "DownloadModel")) {
    return Streamed(server, connection, request.body, caller,
                    /*download=*/parts[4] == "DownloadModel");
  }
  return ReplyJson(connection, server->gateway_.Call(parts[3], parts[4], request.body, caller));
}

ConsoleServer::Connection* ConsoleServer::Callbacks::ConnectionOf(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info == nullptr ? nullptr : static_cast<Connection*>(info->socket_context);
}

void ConsoleServer::Callbacks::Notify(void* cls, MHD_Connection* connection, void** socket_context,
                                      MHD_ConnectionNotificationCode code) {
  auto* server = static_cast<ConsoleServer*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    delete static_cast<Connection*>(*socket_context);
    *socket_context = nullptr;
    return;
  }
  if (server->tls_ == nullptr) return;
  // Before the handshake (libmicrohttpd starts the connection's thread after this): the files
  // as they are now, and the request for a client certificate with mutual TLS. The handshake
  // takes any certificate whose key the browser holds; the CA decides on the first call.
  auto* state = new Connection();
  *socket_context = state;
  state->tls = server->tls_->Current();
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (info == nullptr || info->tls_session == nullptr) return;
  auto session = static_cast<gnutls_session_t>(info->tls_session);
  gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, state->tls->credentials());
  if (state->tls->mutual()) gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUEST);
}

MHD_Result ConsoleServer::Callbacks::Streamed(ConsoleServer* server, MHD_Connection* connection,
                                              const std::string& body, const CallMetadata& caller,
                                              bool download) {
  if (server->streams_.fetch_add(1) >= server->options_.max_streams) {
    server->streams_.fetch_sub(1);
    return ReplyError(
        connection, grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(server->options_.max_streams,
                     " watches and downloads are open on this console; close a page"));
  }
  auto* stream = new ConsoleServer::Stream();  // from here its destructor gives the slot back
  stream->server = server;
  stream->download = download;
  stream->reader = std::thread([server, stream, body, caller, download] {
    // A watch's events as server-sent events, a download's bytes as they are; at most
    // kMaxBufferedBytes wait for the browser.
    auto append = [stream, download](const std::string& data) {
      absl::MutexLock lock(&stream->mu);
      auto room = [stream]() ABSL_SHARED_LOCKS_REQUIRED(stream->mu) {
        return stream->buffer.size() - stream->sent < kMaxBufferedBytes || stream->closed;
      };
      stream->mu.Await(absl::Condition(&room));
      if (download) {
        stream->buffer.append(data);
      } else {
        absl::StrAppend(&stream->buffer, "data: ", data, "\n\n");
      }
      stream->produced = true;
      return !stream->closed;
    };
    JsonReply end = download ? server->gateway_.Download(body, caller, &stream->context, append)
                             : server->gateway_.Watch(body, caller, &stream->context, append);
    absl::MutexLock lock(&stream->mu);
    if (end.http_status != 200 && !download) {
      absl::StrAppend(&stream->buffer, "event: error\ndata: ", end.json, "\n\n");
    }
    stream->end = std::move(end);
    stream->done = true;
  });
  if (download) {
    // A download that fails before its first bytes is an error reply with its status; one that
    // fails later ends the response with an error (the browser's download fails).
    JsonReply failed;
    {
      absl::MutexLock lock(&stream->mu);
      auto started = [stream]() ABSL_SHARED_LOCKS_REQUIRED(stream->mu) {
        return stream->produced || stream->done;
      };
      stream->mu.Await(absl::Condition(&started));
      if (!stream->produced && stream->end.http_status != 200) failed = stream->end;
    }
    if (failed.http_status != 200) {
      delete stream;
      return ReplyJson(connection, failed);
    }
  }
  MHD_Response* response = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 64 * 1024, &Callbacks::Read, stream, &Callbacks::Free);
  if (response == nullptr) {
    delete stream;
    return MHD_NO;
  }
  if (download) {
    MHD_add_response_header(response, "Content-Disposition", "attachment");
    return Queue(connection, MHD_HTTP_OK, response, "application/octet-stream", false);
  }
  return Queue(connection, MHD_HTTP_OK, response, "text/event-stream", false);
}

ConsoleServer::ConsoleServer(int port, ConsoleOptions options,
                             std::shared_ptr<grpc::Channel> channel)
    : port_(port), options_(std::move(options)), gateway_(std::move(channel)) {}

absl::StatusOr<std::unique_ptr<ConsoleServer>> ConsoleServer::Start(
    const std::string& address, ConsoleOptions options, std::shared_ptr<grpc::Channel> channel) {
  std::unique_ptr<TlsFiles> tls;
  if (options.tls.enabled()) {  // read first: a bad file leaves no socket behind
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      return absl::FailedPreconditionError(
          "this libmicrohttpd has no TLS: the console cannot serve HTTPS");
    }
    absl::StatusOr<std::unique_ptr<TlsFiles>> files = TlsFiles::Load(options.tls, options.warn);
    if (!files.ok()) return files.status();
    tls = *std::move(files);
  }
  absl::StatusOr<http::ListeningSocket> listening = http::Listen(address);
  if (!listening.ok()) return listening.status();
  std::unique_ptr<ConsoleServer> server(
      new ConsoleServer(listening->port, std::move(options), std::move(channel)));
  server->tls_ = std::move(tls);
  const ConsoleOptions& set = server->options_;
  unsigned int flags =
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (listening->family == AF_INET6) flags |= MHD_USE_IPv6;
  if (server->tls_ != nullptr) flags |= MHD_USE_TLS;
  const int64_t idle = absl::ToInt64Seconds(absl::Ceil(set.idle_timeout, absl::Seconds(1)));
  // libmicrohttpd wants a certificate to start with; each connection is given the files current
  // when it starts (Notify).
  MHD_OptionItem tls_options[] = {
      {MHD_OPTION_HTTPS_MEM_CERT, 0,
       server->tls_ ? const_cast<char*>(server->tls_->cert_pem().c_str()) : nullptr},
      {MHD_OPTION_HTTPS_MEM_KEY, 0,
       server->tls_ ? const_cast<char*>(server->tls_->key_pem().c_str()) : nullptr},
      {MHD_OPTION_END, 0, nullptr}};
  server->daemon_ = MHD_start_daemon(
      flags, /*port=*/0, nullptr, nullptr, &Callbacks::Access, server.get(),
      MHD_OPTION_EXTERNAL_LOGGER, &Callbacks::Log, nullptr,  // first, as MHD asks
      MHD_OPTION_LISTEN_SOCKET, static_cast<MHD_socket>(listening->fd),
      MHD_OPTION_THREAD_STACK_SIZE, kThreadStackBytes, MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(set.max_connections), MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      static_cast<unsigned int>(set.max_connections_per_ip), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned int>(idle > UINT_MAX ? UINT_MAX : idle), MHD_OPTION_NOTIFY_COMPLETED,
      &Callbacks::Completed, nullptr, MHD_OPTION_NOTIFY_CONNECTION, &Callbacks::Notify,
      server.get(), MHD_OPTION_ARRAY, server->tls_ ? tls_options : tls_options + 2, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    ::close(listening->fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve the console on ", address, ": libmicrohttpd did not start"));
  }
  return server;
}

ConsoleServer::~ConsoleServer() {
  stopping_.store(true);
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace trainerd::console
