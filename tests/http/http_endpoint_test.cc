// Tests for server/http/http_endpoint.h over real loopback sockets: routing and status codes, the
// bearer token, address errors, and the limits that keep one client from holding up the others
// (idle timeout, whole-request deadline, connection limits). Every wait is bounded; the waits
// that last a while are the timeouts under test.
#include "server/http/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::http {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

// No single wait in these tests lasts longer.
constexpr absl::Duration kWaitBound = absl::Seconds(5);
constexpr char kScrape[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Received {
  std::string data;
  bool closed = false;  // the server closed (or reset) the connection
};

// One client connection to the endpoint over loopback; closed when destroyed.
class Client {
 public:
  // `source`: the IPv4 loopback address to connect from ("127.0.0.2"); null for any.
  explicit Client(int port, int family = AF_INET, const char* source = nullptr) {
    fd_ = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      inet_pton(AF_INET, source, &from.sin_addr);
      if (bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
        close(fd_);
        fd_ = -1;
        return;
      }
    }
    const timeval bound{static_cast<time_t>(absl::ToInt64Seconds(kWaitBound)), 0};
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof(bound));
    int result;
    if (family == AF_INET6) {
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_port = htons(static_cast<uint16_t>(port));
      address.sin6_addr = in6addr_loopback;
      result = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(port));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      result = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    }
    if (result != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return fd_ >= 0; }

  // False once the server has closed the connection.
  bool Send(absl::string_view data) {
    size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads until the server closes the connection or `bound` has passed.
  Received ReadUntilClosed(absl::Duration bound) {
    Received received;
    const Clock::time_point end = Clock::now() + absl::ToChronoMilliseconds(bound);
    while (!received.closed && ReadSome(end, received)) {
    }
    return received;
  }

  // Reads one response to a kept-alive request: its head and Content-Length bytes of body.
  // Empty if the connection closed or `bound` passed first.
  std::string ReadOneResponse(absl::Duration bound) {
    Received received;
    const Clock::time_point end = Clock::now() + absl::ToChronoMilliseconds(bound);
    while (true) {
      const size_t head_end = received.data.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t field = received.data.find("Content-Length: ");
        size_t length = 0;
        if (field != std::string::npos && field < head_end) {
          const size_t start = field + 16;
          const size_t stop = received.data.find("\r\n", start);
          if (!absl::SimpleAtoi(received.data.substr(start, stop - start), &length)) return "";
        }
        if (received.data.size() >= head_end + 4 + length) return received.data;
      }
      if (received.closed || !ReadSome(end, received)) return "";
    }
  }

 private:
  // One poll and recv; false when `end` has passed with nothing to read.
  bool ReadSome(Clock::time_point end, Received& received) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    pollfd ready{fd_, POLLIN, 0};
    const int polled = poll(&ready, 1, left.count() > 0 ? static_cast<int>(left.count()) : 0);
    if (polled < 0 && errno == EINTR) return true;
    if (polled <= 0) return false;
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n > 0) {
      received.data.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      received.closed = true;  // end of stream, or reset
    }
    return true;
  }

  int fd_ = -1;
};

// The whole response to one request on a fresh connection (the request should ask the server to
// close the connection).
std::string Request(int port, absl::string_view request, int family = AF_INET) {
  Client client(port, family);
  EXPECT_TRUE(client.connected());
  EXPECT_TRUE(client.Send(request));
  Received received = client.ReadUntilClosed(kWaitBound);
  EXPECT_TRUE(received.closed) << "no end of response within " << kWaitBound;
  return received.data;
}

std::unique_ptr<HttpEndpoint> MustStart(HttpEndpointOptions options = {},
                                        const std::string& address = "127.0.0.1:0") {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> endpoint =
      HttpEndpoint::Start(address, std::move(options), [] { return std::string("up 1\n"); });
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  if (!endpoint.ok()) return nullptr;
  EXPECT_GT((*endpoint)->port(), 0);
  return *std::move(endpoint);
}

TEST(HttpEndpointTest, ServesTheBodyOnItsPathWithThePrometheusContentType) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  const std::string response = Request(endpoint->port(), kScrape);
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response,
              HasSubstr("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(response, HasSubstr("\r\nContent-Length: 5\r\n"));
  EXPECT_THAT(response, EndsWith("\r\n\r\nup 1\n"));
}

TEST(HttpEndpointTest, HeadAnswersWithTheHeadAndNoBody) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  const std::string response =
      Request(endpoint->port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response,
              HasSubstr("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(response, HasSubstr("\r\nContent-Length: 5\r\n"));  // what GET would send
  EXPECT_THAT(response, EndsWith("\r\n\r\n"));
  EXPECT_THAT(response, Not(HasSubstr("up 1")));
}

TEST(HttpEndpointTest, RootPageLinksToTheConfiguredPath) {
  HttpEndpointOptions options;
  options.path = "/custom";
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  const std::string root =
      Request(endpoint->port(), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(root, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(root, HasSubstr("\r\nContent-Type: text/html; charset=utf-8\r\n"));
  EXPECT_THAT(root, HasSubstr("<a href=\"/custom\">/custom</a>"));
  EXPECT_THAT(
      Request(endpoint->port(), "GET /custom HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      EndsWith("\r\n\r\nup 1\n"));
}

TEST(HttpEndpointTest, AnotherPathIsNotFound) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  EXPECT_THAT(
      Request(endpoint->port(), "GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      StartsWith("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_THAT(
      Request(endpoint->port(), "GET /metrics/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      StartsWith("HTTP/1.1 404 Not Found\r\n"));
}

TEST(HttpEndpointTest, OtherMethodsAreNotAllowed) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    const std::string response = Request(
        endpoint->port(), absl::StrCat(method,
                                       " /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                       "Connection: close\r\n\r\nhi"));
    EXPECT_THAT(response, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n")) << method;
    EXPECT_THAT(response, HasSubstr("\r\nAllow: GET, HEAD\r\n")) << method;
  }
}

TEST(HttpEndpointTest, GarbageIsABadRequest) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  EXPECT_THAT(Request(endpoint->port(), "GET /metrics nonsense\r\n\r\n"),
              StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(Request(endpoint->port(), "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n"),
              StartsWith("HTTP/1.1 400 Bad Request\r\n"));
}

TEST(HttpEndpointTest, GarbageRequestLineIsClosedUnanswered) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  // No method and target to answer: MHD 0.9.75 closes the connection without a response.
  EXPECT_THAT(Request(endpoint->port(), "nonsense\r\n\r\n"), IsEmpty());
}

TEST(HttpEndpointTest, QueryStringIsIgnored) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();
  ASSERT_NE(endpoint, nullptr);
  const std::string response =
      Request(endpoint->port(),
              "GET /metrics?name[]=up&x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, EndsWith("\r\n\r\nup 1\n"));
}

TEST(HttpEndpointTest, AnAddressInUseIsUnavailable) {
  std::unique_ptr<HttpEndpoint> first = MustStart();
  ASSERT_NE(first, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", first->port());
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> second =
      HttpEndpoint::Start(address, {}, [] { return std::string(); });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              StartsWith(absl::StrCat("cannot listen on ", address)));
}

TEST(HttpEndpointTest, AMalformedAddressIsInvalid) {
  for (const char* address : {"no-port", ":9400"}) {
    EXPECT_EQ(HttpEndpoint::Start(address, {}, [] { return std::string(); }).status().code(),
              absl::StatusCode::kInvalidArgument)
        << address;
  }
}

TEST(HttpEndpointTest, InvalidOptionsAreRefused) {
  HttpEndpointOptions relative;
  relative.path = "metrics";
  HttpEndpointOptions no_connections;
  no_connections.max_connections = 0;
  HttpEndpointOptions tiny_requests;
  tiny_requests.max_request_bytes = 100;
  HttpEndpointOptions negative_deadline;
  negative_deadline.request_deadline = absl::Seconds(-1);
  for (const HttpEndpointOptions& options :
       {relative, no_connections, tiny_requests, negative_deadline}) {
    EXPECT_EQ(
        HttpEndpoint::Start("127.0.0.1:0", options, [] { return std::string(); }).status().code(),
        absl::StatusCode::kInvalidArgument);
  }
}

TEST(HttpEndpointTest, ServesOverIpv6Loopback) {
  {  // Is there IPv6 loopback here?
    const int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_loopback;
    const bool bound =
        probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    if (probe >= 0) close(probe);
    if (!bound) GTEST_SKIP() << "no IPv6 loopback on this machine";
  }
  std::unique_ptr<HttpEndpoint> endpoint = MustStart({}, "[::1]:0");
  ASSERT_NE(endpoint, nullptr);
  EXPECT_THAT(Request(endpoint->port(), kScrape, AF_INET6), EndsWith("\r\n\r\nup 1\n"));
}

// The reason for MHD (see the header): its thread's stack must leave room for LibTorch's static
// TLS, which a 100 KiB stack does not.
TEST(HttpEndpointTest, RendersOnAThreadWithAnEightMebibyteStack) {
  std::atomic<size_t> stack_bytes{0};  // written on MHD's thread
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> endpoint =
      HttpEndpoint::Start("127.0.0.1:0", {}, [&stack_bytes] {
        pthread_attr_t attributes;
        size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &attributes) == 0) {
          pthread_attr_getstacksize(&attributes, &size);
          pthread_attr_destroy(&attributes);
        }
        stack_bytes.store(size);
        return std::string("up 1\n");
      });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_THAT(Request((*endpoint)->port(), kScrape), EndsWith("\r\n\r\nup 1\n"));
  EXPECT_GE(stack_bytes.load(), size_t{8} << 20);
}

// Bearer tokens.

constexpr char kToken[] = "s3cret-Token_42";

std::string ScrapeWith(int port, absl::string_view authorization, absl::string_view path) {
  return Request(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n", authorization,
                                    "Connection: close\r\n\r\n"));
}

std::unique_ptr<HttpEndpoint> StartWithToken() {
  HttpEndpointOptions options;
  options.bearer_token = kToken;
  return MustStart(options);
}

TEST(HttpEndpointTest, MissingTokenIsUnauthorizedWithABearerChallenge) {
  std::unique_ptr<HttpEndpoint> endpoint = StartWithToken();
  ASSERT_NE(endpoint, nullptr);
  const std::string response = ScrapeWith(endpoint->port(), "", "/metrics");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 401 Unauthorized\r\n"));
  EXPECT_THAT(response, HasSubstr("\r\nWWW-Authenticate: Bearer realm=\"trainerd\"\r\n"));
  EXPECT_THAT(response, Not(HasSubstr("up 1")));
}

TEST(HttpEndpointTest, WrongTokenOrSchemeIsUnauthorized) {
  std::unique_ptr<HttpEndpoint> endpoint = StartWithToken();
  ASSERT_NE(endpoint, nullptr);
  for (const std::string& authorization :
       {std::string("Authorization: Bearer s3cret-Token_43\r\n"),
        std::string("Authorization: Bearer \r\n"),
        absl::StrCat("Authorization: Basic ", kToken, "\r\n"),
        absl::StrCat("Authorization: Bearer ", kToken, "x\r\n")}) {
    EXPECT_THAT(ScrapeWith(endpoint->port(), authorization, "/metrics"),
                StartsWith("HTTP/1.1 401 Unauthorized\r\n"))
        << authorization;
  }
}

TEST(HttpEndpointTest, APrefixOfTheTokenIsUnauthorized) {
  std::unique_ptr<HttpEndpoint> endpoint = StartWithToken();
  ASSERT_NE(endpoint, nullptr);
  const std::string token = kToken;
  for (size_t length : {size_t{1}, token.size() / 2, token.size() - 1}) {
    EXPECT_THAT(ScrapeWith(endpoint->port(),
                           absl::StrCat("Authorization: Bearer ", token.substr(0, length), "\r\n"),
                           "/metrics"),
                StartsWith("HTTP/1.1 401 Unauthorized\r\n"))
        << length;
  }
}

TEST(HttpEndpointTest, RightTokenIsServed) {
  std::unique_ptr<HttpEndpoint> endpoint = StartWithToken();
  ASSERT_NE(endpoint, nullptr);
  const std::string response = ScrapeWith(
      endpoint->port(), absl::StrCat("Authorization: Bearer ", kToken, "\r\n"), "/metrics");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, EndsWith("\r\n\r\nup 1\n"));
}

TEST(HttpEndpointTest, TokenIsRequiredOnEveryPath) {
  std::unique_ptr<HttpEndpoint> endpoint = StartWithToken();
  ASSERT_NE(endpoint, nullptr);
  EXPECT_THAT(ScrapeWith(endpoint->port(), "", "/"), StartsWith("HTTP/1.1 401 Unauthorized\r\n"));
  EXPECT_THAT(ScrapeWith(endpoint->port(), "", "/other"),
              StartsWith("HTTP/1.1 401 Unauthorized\r\n"));
  EXPECT_THAT(ScrapeWith(endpoint->port(), absl::StrCat("Authorization: Bearer ", kToken, "\r\n"),
                         "/other"),
              StartsWith("HTTP/1.1 404 Not Found\r\n"));
}

// Slow, idle and surplus clients.

TEST(HttpEndpointTest, IdleClientDoesNotDelayAConcurrentScrape) {
  HttpEndpointOptions options;
  options.idle_timeout = absl::Seconds(1);
  options.request_deadline = absl::Seconds(2);
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  Client idle(endpoint->port());  // accepted before the scrape's connection
  ASSERT_TRUE(idle.Send("GET /metr"));

  const Clock::time_point start = Clock::now();
  const std::string response = Request(endpoint->port(), kScrape);
  EXPECT_LT(SecondsSince(start), 1.0);
  EXPECT_THAT(response, EndsWith("\r\n\r\nup 1\n"));
}

TEST(HttpEndpointTest, IdleClientIsClosedAfterTheIdleTimeout) {
  HttpEndpointOptions options;
  options.idle_timeout = absl::Seconds(1);
  options.request_deadline = absl::Seconds(30);  // so that only the idle timeout can close it
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  const Clock::time_point start = Clock::now();
  Client idle(endpoint->port());
  ASSERT_TRUE(idle.Send("GET /metr"));

  const Received received = idle.ReadUntilClosed(kWaitBound);
  const double elapsed = SecondsSince(start);
  EXPECT_TRUE(received.closed);
  EXPECT_GE(elapsed, 0.9);
  EXPECT_LT(elapsed, 3.0);
}

TEST(HttpEndpointTest, DrippingClientIsClosedAtTheRequestDeadline) {
  HttpEndpointOptions options;
  options.idle_timeout = absl::Seconds(1);
  options.request_deadline = absl::Seconds(2);
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  const Clock::time_point start = Clock::now();
  Client dripping(endpoint->port());
  ASSERT_TRUE(dripping.Send("GET /metrics HTTP/1.1\r\nX-Drip: "));

  // One byte every 300 ms, well inside the idle timeout, until the server closes (or 6 s pass).
  Received received;
  while (!received.closed && SecondsSince(start) < 6.0) {
    received = dripping.ReadUntilClosed(absl::Milliseconds(300));
    if (!received.closed) dripping.Send("a");
  }
  const double elapsed = SecondsSince(start);
  EXPECT_TRUE(received.closed);
  EXPECT_GE(elapsed, 1.9);
  EXPECT_LT(elapsed, 4.0);
  EXPECT_THAT(received.data, Not(HasSubstr("200 OK")));
}

TEST(HttpEndpointTest, KeptAliveConnectionGetsAFreshDeadlineForEachRequest) {
  HttpEndpointOptions options;
  options.idle_timeout = absl::Seconds(5);
  options.request_deadline = absl::Seconds(1);
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  Client client(endpoint->port());
  // Three quick requests 600 ms apart: the third comes after the first deadline.
  for (int i = 0; i < 3; ++i) {
    if (i > 0) {
      const Received between = client.ReadUntilClosed(absl::Milliseconds(600));
      ASSERT_FALSE(between.closed) << "closed before request " << i;
      EXPECT_THAT(between.data, IsEmpty());
    }
    ASSERT_TRUE(client.Send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_THAT(client.ReadOneResponse(kWaitBound), EndsWith("\r\n\r\nup 1\n")) << i;
  }
}

TEST(HttpEndpointTest, ConnectionsBeyondTheLimitAreClosedAtOnce) {
  HttpEndpointOptions options;
  options.max_connections = 4;
  options.idle_timeout = absl::Seconds(30);
  options.request_deadline = absl::Seconds(30);
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  std::vector<std::unique_ptr<Client>> holders;
  for (int i = 0; i < 4; ++i) {
    holders.push_back(std::make_unique<Client>(endpoint->port()));
    ASSERT_TRUE(holders.back()->connected());
  }

  // MHD accepts in arrival order, so the fifth finds all four holders admitted.
  Client fifth(endpoint->port());
  fifth.Send(kScrape);  // may fail: the server may have closed it already
  const Clock::time_point start = Clock::now();
  const Received refused = fifth.ReadUntilClosed(kWaitBound);
  EXPECT_TRUE(refused.closed);
  EXPECT_LT(SecondsSince(start), 1.0);
  EXPECT_THAT(refused.data, IsEmpty());

  // Once the holders have gone, scrapes are served again. MHD notices their end on its next poll,
  // so the first attempts may still be turned away.
  holders.clear();
  std::string response;
  for (const Clock::time_point retry_start = Clock::now();
       SecondsSince(retry_start) < absl::ToDoubleSeconds(kWaitBound);) {
    Client client(endpoint->port());
    client.Send(kScrape);
    response = client.ReadUntilClosed(kWaitBound).data;
    if (!response.empty()) break;
  }
  EXPECT_THAT(response, EndsWith("\r\n\r\nup 1\n"));
}

TEST(HttpEndpointTest, ConnectionsBeyondThePerAddressLimitAreClosedAtOnce) {
  HttpEndpointOptions options;
  options.max_connections_per_ip = 2;
  options.idle_timeout = absl::Seconds(30);
  options.request_deadline = absl::Seconds(30);
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  Client first(endpoint->port());
  Client second(endpoint->port());
  Client third(endpoint->port());
  third.Send(kScrape);
  const Received refused = third.ReadUntilClosed(kWaitBound);
  EXPECT_TRUE(refused.closed);
  EXPECT_THAT(refused.data, IsEmpty());
  // The two admitted ones are served.
  ASSERT_TRUE(first.Send(kScrape));
  EXPECT_THAT(first.ReadUntilClosed(kWaitBound).data, EndsWith("\r\n\r\nup 1\n"));
}

// Slow clients from many addresses (127.0.0.2 to .5, one each) fill the endpoint; a scraper from
// another address still gets in, in place of the connection whose request began longest ago.
TEST(HttpEndpointTest, AFullEndpointStillAdmitsAnAddressThatHoldsFewerConnections) {
  HttpEndpointOptions options;
  options.max_connections = 4;
  options.idle_timeout = absl::Seconds(30);
  options.request_deadline = absl::Seconds(30);
  std::unique_ptr<HttpEndpoint> endpoint = MustStart(options);
  ASSERT_NE(endpoint, nullptr);
  std::vector<std::unique_ptr<Client>> holders;
  for (const char* source : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}) {
    holders.push_back(std::make_unique<Client>(endpoint->port(), AF_INET, source));
    ASSERT_TRUE(holders.back()->connected()) << source;
    holders.back()->Send("GET /met");  // a request that never ends
    absl::SleepFor(absl::Milliseconds(50));  // in order: the first is the oldest
  }
  Client scraper(endpoint->port());
  ASSERT_TRUE(scraper.Send(kScrape));
  EXPECT_THAT(scraper.ReadUntilClosed(kWaitBound).data, EndsWith("\r\n\r\nup 1\n"));
  // The oldest slow client made the room.
  EXPECT_TRUE(holders[0]->ReadUntilClosed(kWaitBound).closed);
}

TEST(HttpEndpointTest, DestructorReturnsPromptlyWhileClientsAreConnected) {
  std::unique_ptr<HttpEndpoint> endpoint = MustStart();  // 5 s idle timeout, 10 s deadline
  ASSERT_NE(endpoint, nullptr);
  Client idle(endpoint->port());
  ASSERT_TRUE(idle.Send("GET /metr"));
  Client silent(endpoint->port());
  // Served after both of them were accepted (arrival order): MHD holds them open.
  EXPECT_THAT(Request(endpoint->port(), kScrape), EndsWith("\r\n\r\nup 1\n"));

  const Clock::time_point start = Clock::now();
  endpoint.reset();
  EXPECT_LT(SecondsSince(start), 1.0);
  EXPECT_TRUE(idle.ReadUntilClosed(kWaitBound).closed);
  EXPECT_TRUE(silent.ReadUntilClosed(kWaitBound).closed);
}

}  // namespace
}  // namespace trainerd::http
