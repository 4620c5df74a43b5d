// Tests server/service/health_service.h through a real server and real channels: Check and Watch
// answer as gRPC's default health service did (statuses, NOT_FOUND, SERVICE_UNKNOWN, the drain's
// and the shutdown's NOT_SERVING), with no credentials on a server that requires them; Watch
// streams are bounded per client address and in all (connections made from 127.0.0.2 and others
// through sockets bound to those addresses), and a stream that ends frees its place.
#include <arpa/inet.h>
#include <grpcpp/create_channel_posix.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/service/health_service.h"
#include "tests/service/service_fixture.h"

namespace trainerd::service::testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A safety net for a hung stream, never a stand-in for synchronisation: every wait ends as soon as
// what it waits for happens.
constexpr absl::Duration kWaitBound = absl::Seconds(30);

// A channel whose one connection comes from `source` (an IPv4 loopback address, "127.0.0.2"): a
// socket bound to it and connected to the server on 127.0.0.1:`port`, handed to gRPC (which
// closes it; *socket_fd, when given, says which it is). Null when the socket cannot be made.
std::shared_ptr<grpc::Channel> ChannelFrom(const char* source, int port, int* socket_fd = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return nullptr;
  }
  // As gRPC sets on the sockets it makes itself: without it, Nagle's algorithm holds each small
  // message for the peer's delayed acknowledgement.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (socket_fd != nullptr) *socket_fd = fd;
  return grpc::CreateInsecureChannelFromFd(absl::StrCat("127.0.0.1:", port), fd);
}

// One Watch stream, read by a callback reactor: the statuses received and how it ended.
class WatchStream final : public grpc::ClientReadReactor<HealthCheckResponse> {
 public:
  WatchStream(Health::Stub* stub, const std::string& service) {
    request_.set_service(service);
    stub->async()->Watch(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  ~WatchStream() override {
    Cancel();
    WaitForEnd();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      std::lock_guard<std::mutex> lock(mu_);
      statuses_.push_back(response_.status());
    }
    cv_.notify_all();
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
    }
    cv_.notify_all();
  }

  // Waits until `count` statuses arrived or the stream ended; true for the former.
  bool WaitForStatuses(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoSeconds(kWaitBound),
                 [&] { return statuses_.size() >= count || status_.has_value(); });
    return statuses_.size() >= count;
  }
  // Waits for the end of the stream; its status (DEADLINE_EXCEEDED, made up here, when it did
  // not end within the bound).
  grpc::Status WaitForEnd() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoSeconds(kWaitBound),
                      [&] { return status_.has_value(); })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the stream did not end");
    }
    return *status_;
  }
  void Cancel() { context_.TryCancel(); }
  std::vector<int> statuses() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::vector<int>(statuses_.begin(), statuses_.end());
  }

 private:
  grpc::ClientContext context_;
  HealthCheckRequest request_;
  HealthCheckResponse response_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<HealthCheckResponse::ServingStatus> statuses_;  // guarded by mu_
  std::optional<grpc::Status> status_;                        // guarded by mu_
};

class HealthTest : public ServiceTest {
 protected:
  // A server whose Watch streams are bounded at `per_address` from one address and `total` in
  // all.
  void StartBounded(int per_address, int total) {
    server_.reset();
    ServerOptions options = Options();
    options.health.max_watches_per_address = per_address;
    options.health.max_watches = total;
    StartServer(options);
  }
  std::unique_ptr<Health::Stub> StubFrom(const char* source, int* socket_fd = nullptr) {
    std::shared_ptr<grpc::Channel> channel = ChannelFrom(source, server_->port(), socket_fd);
    if (channel == nullptr) return nullptr;
    channels_.push_back(channel);
    return Health::NewStub(channel);
  }
  // Waits until the server holds `count` watches from `address`; false past the bound.
  bool WaitForOpenWatches(const std::string& address, int count) {
    const absl::Time give_up = absl::Now() + kWaitBound;
    while (server_->health_service()->open_watches(address) != count) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }
  grpc::Status Check(Health::Stub* stub, const std::string& service,
                     HealthCheckResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    HealthCheckRequest request;
    request.set_service(service);
    return stub->Check(&context, request, response);
  }

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
};

TEST(ClientAddressTest, LeavesThePortOut) {
  EXPECT_EQ(ClientAddress("ipv4:127.0.0.2:54321"), "ipv4:127.0.0.2");
  EXPECT_EQ(ClientAddress("ipv6:[::1]:54321"), "ipv6:[::1]");
  EXPECT_EQ(ClientAddress("ipv6:[fe80::1%eth0]:80"), "ipv6:[fe80::1%eth0]");
  EXPECT_EQ(ClientAddress("unix:/run/trainerd.sock"), "unix:/run/trainerd.sock");
  EXPECT_EQ(ClientAddress("ipv4:"), "ipv4:");
  EXPECT_EQ(ClientAddress(""), "");
}

TEST_F(HealthTest, CheckAndWatchAnswerAsTheStandardServiceDoes) {
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel_);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(stub.get(), "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  for (const char* service :
       {"trainerd.v1.JobService", "trainerd.v1.DatasetService", "trainerd.v1.SystemService"}) {
    ASSERT_TRUE(Check(stub.get(), service, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << service;
  }
  EXPECT_EQ(Check(stub.get(), "no.such.Service", &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Check(stub.get(), std::string(201, 'x'), &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  WatchStream server_wide(stub.get(), "");
  WatchStream unknown(stub.get(), "no.such.Service");
  ASSERT_TRUE(server_wide.WaitForStatuses(1));
  ASSERT_TRUE(unknown.WaitForStatuses(1));
  EXPECT_THAT(server_wide.statuses(), ElementsAre(HealthCheckResponse::SERVING));
  EXPECT_THAT(unknown.statuses(), ElementsAre(HealthCheckResponse::SERVICE_UNKNOWN));
  // A service registered later is sent to its watchers.
  server_->health_service()->SetServingStatus("no.such.Service", true);
  ASSERT_TRUE(unknown.WaitForStatuses(2));
  EXPECT_THAT(unknown.statuses(),
              ElementsAre(HealthCheckResponse::SERVICE_UNKNOWN, HealthCheckResponse::SERVING));
  WatchStream long_name(stub.get(), std::string(201, 'x'));
  EXPECT_EQ(long_name.WaitForEnd().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The CLI's and the probes' path on a server that requires a token for everything else.
TEST_F(HealthTest, HealthNeedsNoCredentialsWhereEverythingElseDoes) {
  const std::string tokens = ::testing::TempDir() + "/health-test-tokens";
  {
    FILE* file = std::fopen(tokens.c_str(), "w");
    ASSERT_NE(file, nullptr);
    std::fputs("ci:0123456789abcdef0123456789abcdef\n", file);
    std::fclose(file);
  }
  server_.reset();
  ServerOptions options = Options();
  options.auth_token_file = tokens;
  StartServer(options);
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel_);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(stub.get(), "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  WatchStream watch(stub.get(), "");
  ASSERT_TRUE(watch.WaitForStatuses(1));
  EXPECT_THAT(watch.statuses(), ElementsAre(HealthCheckResponse::SERVING));
  v1::ListDatasetsResponse datasets;
  EXPECT_EQ(ListDatasets(&datasets).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  std::remove(tokens.c_str());
}

// A drain (SIGTERM) turns every service NOT_SERVING for good; watchers see it, and the server's
// stop then ends their streams (UNAVAILABLE) rather than waiting for them.
TEST_F(HealthTest, WatchersSeeTheDrainsNotServingThenTheStop) {
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel_);
  WatchStream server_wide(stub.get(), "");
  WatchStream jobs(stub.get(), "trainerd.v1.JobService");
  ASSERT_TRUE(server_wide.WaitForStatuses(1));
  ASSERT_TRUE(jobs.WaitForStatuses(1));
  server_->Drain(absl::Seconds(30), absl::Seconds(30));
  EXPECT_EQ(server_wide.WaitForEnd().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(jobs.WaitForEnd().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(server_wide.statuses(),
              ElementsAre(HealthCheckResponse::SERVING, HealthCheckResponse::NOT_SERVING));
  EXPECT_THAT(jobs.statuses(),
              ElementsAre(HealthCheckResponse::SERVING, HealthCheckResponse::NOT_SERVING));
}

TEST_F(HealthTest, ShutdownIsNotServingForGood) {
  HealthService* health = server_->health_service();
  health->Shutdown();
  health->SetServingStatus("trainerd.v1.JobService", true);  // ignored: NOT_SERVING stays
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel_);
  HealthCheckResponse response;
  for (const char* service : {"", "trainerd.v1.JobService"}) {
    ASSERT_TRUE(Check(stub.get(), service, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING) << service;
  }
}

// Beyond the bound from one address a Watch gets RESOURCE_EXHAUSTED at once, naming the flag,
// while other addresses get in, Check still answers, and the total bound holds over addresses.
TEST_F(HealthTest, WatchesAreBoundedPerAddressAndInAllWhileOtherAddressesGetIn) {
  StartBounded(/*per_address=*/4, /*total=*/10);
  std::unique_ptr<Health::Stub> first = StubFrom("127.0.0.1");
  std::unique_ptr<Health::Stub> second = StubFrom("127.0.0.2");
  std::unique_ptr<Health::Stub> third = StubFrom("127.0.0.3");
  std::unique_ptr<Health::Stub> fourth = StubFrom("127.0.0.4");
  ASSERT_TRUE(first && second && third && fourth);
  std::vector<std::unique_ptr<WatchStream>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(std::make_unique<WatchStream>(first.get(), ""));
    ASSERT_TRUE(open.back()->WaitForStatuses(1)) << open.back()->WaitForEnd().error_message();
  }
  EXPECT_EQ(server_->health_service()->open_watches("ipv4:127.0.0.1"), 4);
  for (int i = 0; i < 3; ++i) {  // refused, again and again, without holding anything
    WatchStream refused(first.get(), "");
    const grpc::Status status = refused.WaitForEnd();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--max_health_watches_per_address=4"));
    EXPECT_THAT(status.error_message(), HasSubstr("127.0.0.1"));
    EXPECT_TRUE(refused.statuses().empty());
  }
  EXPECT_EQ(server_->health_service()->open_watches(), 4);
  HealthCheckResponse response;
  ASSERT_TRUE(Check(first.get(), "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  // Other addresses get in, up to the total.
  for (int i = 0; i < 4; ++i) {
    open.push_back(std::make_unique<WatchStream>(second.get(), ""));
    ASSERT_TRUE(open.back()->WaitForStatuses(1)) << open.back()->WaitForEnd().error_message();
  }
  for (int i = 0; i < 2; ++i) {
    open.push_back(std::make_unique<WatchStream>(third.get(), "trainerd.v1.JobService"));
    ASSERT_TRUE(open.back()->WaitForStatuses(1)) << open.back()->WaitForEnd().error_message();
  }
  EXPECT_EQ(server_->health_service()->open_watches(), 10);
  WatchStream over_total(fourth.get(), "");
  const grpc::Status status = over_total.WaitForEnd();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_health_watches=10"));
  ASSERT_TRUE(Check(fourth.get(), "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  // Every stream that got in is still open and still told of changes.
  server_->health_service()->SetServingStatus("", false);
  for (size_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(open[i]->WaitForStatuses(2)) << i;
    EXPECT_THAT(open[i]->statuses(),
                ElementsAre(HealthCheckResponse::SERVING, HealthCheckResponse::NOT_SERVING));
  }
  for (size_t i = 8; i < open.size(); ++i) {  // another service's watchers: nothing new
    EXPECT_THAT(open[i]->statuses(), ElementsAre(HealthCheckResponse::SERVING));
  }
}

// A stream that ends (cancelled by its caller, or its connection gone) gives its place back: round
// after round of the bound's worth of streams opened and cancelled, the server never holds more
// than the bound, holds none between rounds, and the next round gets in whole.
TEST_F(HealthTest, EndedWatchesFreeTheirPlacesAndNothingAccumulates) {
  StartBounded(/*per_address=*/4, /*total=*/6);
  std::unique_ptr<Health::Stub> stub = StubFrom("127.0.0.2");
  ASSERT_NE(stub, nullptr);
  for (int round = 0; round < 50; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    std::vector<std::unique_ptr<WatchStream>> open;
    for (int i = 0; i < 4; ++i) {
      open.push_back(std::make_unique<WatchStream>(stub.get(), ""));
      ASSERT_TRUE(open.back()->WaitForStatuses(1)) << open.back()->WaitForEnd().error_message();
    }
    {
      WatchStream refused(stub.get(), "");
      EXPECT_EQ(refused.WaitForEnd().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    }
    EXPECT_LE(server_->health_service()->open_watches(), 4);
    for (auto& watch : open) watch->Cancel();
    for (auto& watch : open)
      EXPECT_EQ(watch->WaitForEnd().error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_TRUE(WaitForOpenWatches("ipv4:127.0.0.2", 0));
    EXPECT_EQ(server_->health_service()->open_watches(), 0);
  }
  // A client that goes away without cancelling (killed, its network gone) takes its streams'
  // places with it: here its connection is shut down under gRPC's feet.
  int fd = -1;
  std::unique_ptr<Health::Stub> other = StubFrom("127.0.0.3", &fd);
  ASSERT_NE(other, nullptr);
  std::vector<std::unique_ptr<WatchStream>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(std::make_unique<WatchStream>(other.get(), ""));
    ASSERT_TRUE(open.back()->WaitForStatuses(1));
  }
  EXPECT_EQ(server_->health_service()->open_watches("ipv4:127.0.0.3"), 4);
  ASSERT_EQ(::shutdown(fd, SHUT_RDWR), 0);
  for (auto& watch : open) EXPECT_NE(watch->WaitForEnd().error_code(), grpc::StatusCode::OK);
  EXPECT_TRUE(WaitForOpenWatches("ipv4:127.0.0.3", 0));
}

}  // namespace
}  // namespace trainerd::service::testing
