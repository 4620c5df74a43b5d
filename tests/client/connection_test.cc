// Tests for client/connection.h (the one line trainctl prints for a failed call) and the
// hand-encoded messages of client/health_check.h. Most channels are created but never connect
// (nothing listens; DescribeError only reads their state); the "connected" cases use an
// in-process gRPC server on 127.0.0.1:0 whose JobService implements nothing.
#include "client/connection.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/health_check.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

constexpr char kAddress[] = "127.0.0.1:1";

class DescribeErrorTest : public ::testing::Test {
 protected:
  DescribeErrorTest() : connection_({kAddress, absl::Seconds(5)}) {}

  std::string Describe(grpc::StatusCode code, const std::string& message,
                       bool had_replies = false) const {
    return connection_.DescribeError(grpc::Status(code, message), absl::Seconds(5), had_replies);
  }

  Connection connection_;
};

TEST_F(DescribeErrorTest, ConnectionKeepsTheAddress) {
  EXPECT_EQ(connection_.address(), kAddress);
  EXPECT_NE(connection_.channel(), nullptr);
}

TEST_F(DescribeErrorTest, UnavailableBeforeConnectingCannotReachTheAddress) {
  EXPECT_EQ(Describe(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses"),
            "cannot reach trainerd at 127.0.0.1:1: failed to connect to all addresses");
}

TEST_F(DescribeErrorTest, UnavailableWithoutMessageStillNamesTheAddress) {
  EXPECT_EQ(Describe(grpc::StatusCode::UNAVAILABLE, ""),
            "cannot reach trainerd at 127.0.0.1:1: unavailable");
}

TEST_F(DescribeErrorTest, UnavailableAfterRepliesIsALostConnection) {
  EXPECT_EQ(Describe(grpc::StatusCode::UNAVAILABLE, "Socket closed", /*had_replies=*/true),
            "lost connection to trainerd at 127.0.0.1:1: Socket closed");
}

TEST_F(DescribeErrorTest, DeadlineBeforeConnectingSaysNoConnectionWithinTimeout) {
  EXPECT_EQ(Describe(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"),
            "cannot reach trainerd at 127.0.0.1:1: no connection within 5 s");
}

TEST_F(DescribeErrorTest, DeadlineAfterRepliesSaysTrainerdDidNotAnswer) {
  EXPECT_EQ(Describe(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded",
                     /*had_replies=*/true),
            "trainerd did not answer within 5 s (--timeout sets the limit)");
}

TEST_F(DescribeErrorTest, FractionalTimeoutIsShownAsWritten) {
  EXPECT_EQ(connection_.DescribeError(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""),
                                      absl::Milliseconds(2500), /*had_replies=*/true),
            "trainerd did not answer within 2.5 s (--timeout sets the limit)");
}

TEST_F(DescribeErrorTest, DaemonMessageIsPrintedAsIs) {
  EXPECT_EQ(Describe(grpc::StatusCode::NOT_FOUND, "dataset 'iris' not found"),
            "dataset 'iris' not found");
}

TEST_F(DescribeErrorTest, MultiLineDaemonMessageBecomesOneLine) {
  EXPECT_EQ(Describe(grpc::StatusCode::INVALID_ARGUMENT,
                     "the model does not fit the dataset:\nlayer 1 wants 4 inputs\r\nthe "
                     "dataset has 3\rfeatures\n"),
            "the model does not fit the dataset: layer 1 wants 4 inputs the dataset has 3 "
            "features");
}

TEST_F(DescribeErrorTest, OverlongDaemonMessageIsCut) {
  const std::string line = Describe(grpc::StatusCode::FAILED_PRECONDITION, std::string(5000, 'x'));
  EXPECT_THAT(line, SizeIs(1003));
  EXPECT_THAT(line, EndsWith("x..."));
}

TEST_F(DescribeErrorTest, EmptyDaemonMessageNamesTheCode) {
  EXPECT_EQ(Describe(grpc::StatusCode::ALREADY_EXISTS, ""), "trainerd: already exists");
}

TEST_F(DescribeErrorTest, InternalErrorIsLabelled) {
  EXPECT_EQ(Describe(grpc::StatusCode::INTERNAL, "CUDA error:\nout of memory"),
            "trainerd internal error: CUDA error: out of memory");
}

TEST_F(DescribeErrorTest, UnimplementedSuggestsAnOlderDaemon) {
  EXPECT_EQ(Describe(grpc::StatusCode::UNIMPLEMENTED, ""),
            "trainerd at 127.0.0.1:1 does not implement this call (is it an older version?)");
}

TEST_F(DescribeErrorTest, NoDescriptionHasANewline) {
  for (grpc::StatusCode code : {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::DEADLINE_EXCEEDED,
                                grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::INTERNAL,
                                grpc::StatusCode::UNKNOWN, grpc::StatusCode::NOT_FOUND}) {
    EXPECT_THAT(Describe(code, "first\nsecond\n"), Not(HasSubstr("\n"))) << code;
  }
}

// A connection whose channel is READY: a server answers (every call UNIMPLEMENTED), so a failed
// call on it came from the other side rather than from failing to connect.
class ConnectedDescribeErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
    connection_ = std::make_unique<Connection>(ConnectionOptions{address_, absl::Seconds(5)});
    ASSERT_TRUE(connection_->channel()->WaitForConnected(std::chrono::system_clock::now() +
                                                         std::chrono::seconds(5)));
  }

  void TearDown() override {
    connection_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  v1::JobService::Service service_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Connection> connection_;
};

TEST_F(ConnectedDescribeErrorTest, UnavailableFromTheDaemonKeepsItsMessage) {
  EXPECT_EQ(connection_->DescribeError(
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "trainerd is shutting down"),
                absl::Seconds(5)),
            "trainerd is shutting down");
}

TEST_F(ConnectedDescribeErrorTest, UnavailableWithoutMessageSaysTryAgain) {
  EXPECT_EQ(
      connection_->DescribeError(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""), absl::Seconds(5)),
      "trainerd is unavailable; try again");
}

TEST_F(ConnectedDescribeErrorTest, DeadlineWhileConnectedSaysTrainerdDidNotAnswer) {
  EXPECT_EQ(connection_->DescribeError(
                grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"),
                absl::Seconds(30)),
            "trainerd did not answer within 30 s (--timeout sets the limit)");
}

// ---- Authentication ---------------------------------------------------------------------------

TEST_F(DescribeErrorTest, UnauthenticatedSaysWhichFlagsToSet) {
  EXPECT_EQ(Describe(grpc::StatusCode::UNAUTHENTICATED,
                     "this trainerd requires a bearer token ('authorization: Bearer <token>')"),
            "trainerd at 127.0.0.1:1 refused the call: this trainerd requires a bearer token "
            "('authorization: Bearer <token>'); set --token-file FILE or $TRAINERD_TOKEN (or "
            "--tls-cert and --tls-key for a client certificate)");
}

TEST(DescribeUnauthenticatedTest, WithATokenItSaysToCheckIt) {
  ClientSecurity security;
  security.token = "0123456789abcdef0123";
  Connection connection({"127.0.0.1:1", absl::Seconds(5), security});
  EXPECT_THAT(connection.DescribeError(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "not valid"),
                                       absl::Seconds(5)),
              EndsWith("; check the token of --token-file or $TRAINERD_TOKEN"));
}

TEST(DescribeHandshakeTest, AFailedHandshakeSuggestsTheTlsFlags) {
  ClientSecurity security;
  security.use_tls = true;
  Connection tls({"127.0.0.1:1", absl::Seconds(5), security});
  EXPECT_THAT(tls.DescribeError(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                             "failed to connect: Ssl handshake failed"),
                                absl::Seconds(5)),
              EndsWith("(check --tls-ca, --tls-server-name and, for mutual TLS, --tls-cert and "
                       "--tls-key)"));
  Connection plain({"127.0.0.1:1", absl::Seconds(5)});
  EXPECT_THAT(
      plain.DescribeError(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Ssl handshake failed"),
                          absl::Seconds(5)),
      EndsWith("(if trainerd serves TLS, give --tls-ca)"));
  // A TLS daemon closes a plaintext client's connection: gRPC says only that.
  EXPECT_THAT(plain.DescribeError(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"),
                                  absl::Seconds(5)),
              EndsWith("(if trainerd serves TLS, give --tls-ca)"));
  EXPECT_THAT(tls.DescribeError(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"),
                                absl::Seconds(5)),
              Not(HasSubstr("--tls-ca")));
}

class LoadClientSecurityTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path =
        ::testing::TempDir() + "/trainctl-" + std::to_string(::getpid()) + "-" + name;
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    paths_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }
  std::vector<std::string> paths_;
};

TEST_F(LoadClientSecurityTest, TheTokenFileWinsOverTheVariableAndMayNameItsToken) {
  GlobalOptions global;
  global.token_file = Write("token", "# mine\n\nci:abcdef0123456789abcdef\n");
  const absl::StatusOr<ClientSecurity> security = LoadClientSecurity(global, "from-env-token");
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->token, "abcdef0123456789abcdef");
  EXPECT_FALSE(security->use_tls);
  const absl::StatusOr<ClientSecurity> from_env =
      LoadClientSecurity(GlobalOptions(), " from-env-token\n");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->token, "from-env-token");
  EXPECT_EQ(LoadClientSecurity(GlobalOptions(), nullptr)->token, "");
}

TEST_F(LoadClientSecurityTest, UnreadableOrEmptyFilesAreUsageErrorsNamingTheFlag) {
  GlobalOptions global;
  global.token_file = "/nonexistent/token";
  EXPECT_THAT(LoadClientSecurity(global, nullptr).status().message(), HasSubstr("--token-file"));
  global.token_file = Write("empty", "# nothing here\n");
  EXPECT_THAT(LoadClientSecurity(global, nullptr).status().message(), HasSubstr("holds no token"));
  GlobalOptions half;
  half.tls_cert = Write("cert", "PEM");
  EXPECT_EQ(LoadClientSecurity(half, nullptr).status().message(),
            "a client certificate needs both --tls-cert and --tls-key");
  GlobalOptions ca;
  ca.tls_ca = "/nonexistent/ca.crt";
  EXPECT_THAT(LoadClientSecurity(ca, nullptr).status().message(), HasSubstr("--tls-ca"));
}

TEST_F(LoadClientSecurityTest, AnyTlsFlagTurnsTlsOn) {
  GlobalOptions global;
  global.tls_server_name = "gpu-node-1";
  const absl::StatusOr<ClientSecurity> name_only = LoadClientSecurity(global, nullptr);
  ASSERT_TRUE(name_only.ok());
  EXPECT_TRUE(name_only->use_tls);
  EXPECT_EQ(name_only->server_name, "gpu-node-1");
  global.tls_ca = Write("ca", "CA PEM");
  global.tls_cert = Write("cert", "CERT PEM");
  global.tls_key = Write("key", "KEY PEM");
  const absl::StatusOr<ClientSecurity> all = LoadClientSecurity(global, nullptr);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->ca_pem, "CA PEM");
  EXPECT_EQ(all->cert_pem, "CERT PEM");
  EXPECT_EQ(all->key_pem, "KEY PEM");
}

// The token reaches the server on every call, as "authorization: Bearer <token>".
class RecordingJobService final : public v1::JobService::Service {
 public:
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override {
    const auto it = context->client_metadata().find("authorization");
    if (it != context->client_metadata().end()) {
      authorization = std::string(it->second.data(), it->second.size());
    }
    return grpc::Status::OK;
  }
  std::string authorization;
};

TEST(BearerTokenTest, EveryCallCarriesTheToken) {
  RecordingJobService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ClientSecurity security;
  security.token = "0123456789abcdef0123";
  Connection connection({"127.0.0.1:" + std::to_string(port), absl::Seconds(5), security});
  grpc::ClientContext context;
  Connection::SetDeadline(&context, absl::Seconds(5));
  v1::ListJobsResponse response;
  ASSERT_TRUE(connection.jobs().ListJobs(&context, v1::ListJobsRequest(), &response).ok());
  EXPECT_EQ(service.authorization, "Bearer 0123456789abcdef0123");
  server->Shutdown();
}

// ---- Health check messages -----------------------------------------------------------------

TEST(HealthCheckTest, WholeServerRequestIsEmpty) { EXPECT_EQ(EncodeHealthCheckRequest(""), ""); }

TEST(HealthCheckTest, ServiceRequestIsFieldOneLengthDelimited) {
  EXPECT_EQ(EncodeHealthCheckRequest("trainerd.v1.JobService"),
            std::string("\x0a\x16", 2) + "trainerd.v1.JobService");
}

TEST(HealthCheckTest, ServingResponseDecodes) {
  const absl::StatusOr<int64_t> status = DecodeHealthCheckResponse(std::string("\x08\x01", 2));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, kHealthServing);
}

TEST(HealthCheckTest, EmptyResponseIsUnknown) {
  const absl::StatusOr<int64_t> status = DecodeHealthCheckResponse("");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, 0);
}

TEST(HealthCheckTest, GarbageResponseIsInvalidArgument) {
  const absl::StatusOr<int64_t> status = DecodeHealthCheckResponse(std::string("\xff", 1));
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HealthCheckTest, StatusNamesFollowTheHealthProto) {
  EXPECT_EQ(ServingStatusName(0), "UNKNOWN");
  EXPECT_EQ(ServingStatusName(1), "SERVING");
  EXPECT_EQ(ServingStatusName(2), "NOT_SERVING");
  EXPECT_EQ(ServingStatusName(3), "SERVICE_UNKNOWN");
  EXPECT_EQ(ServingStatusName(7), "STATUS_7");
}

}  // namespace
}  // namespace trainerd::client
