// Who may call trainerd, through a real server and real channels: token files and their parsing,
// the authenticator's decisions, tokens required on every method but health (reflection
// included), the caller recorded on what it creates, token rotation, TLS and mutual TLS with
// certificates made by openssl (and rotated on disk), the refusal of an open address without
// authentication, Unix sockets, and the bearer token of /metrics.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/auth.h"
#include "server/service/credentials.h"
#include "tests/service/service_fixture.h"
#include "tests/support/certificates.h"

namespace trainerd::service::testing {
namespace {

using ::testing::HasSubstr;
using trainerd::testing::MakeTestPki;
using trainerd::testing::ReadFileOrEmpty;
using trainerd::testing::SignCertificate;
using trainerd::testing::TestPki;

constexpr char kAliceToken[] = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
constexpr char kBobToken[] = "0f9e8d7c6b5a49382716a5b4c3d2e1f0";

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path + ".tmp", std::ios::trunc);
  out << text;
  out.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// Adds "authorization: Bearer <token>" to a call (as trainctl's interceptor does).
void Authorize(grpc::ClientContext* context, const std::string& token) {
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

grpc::Status ListWith(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  auto stub = v1::DatasetService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  if (!token.empty()) Authorize(&context, token);
  v1::ListDatasetsResponse response;
  return stub->ListDatasets(&context, v1::ListDatasetsRequest(), &response);
}

// ---- Token files and decisions ----------------------------------------------------------------

TEST(ParseTokenFileTest, NamedAndUnnamedTokensAdminsCommentsAndBlankLines) {
  const TokenFile file = ParseTokenFile(
      "# operators\n\nalice:a1b2c3d4e5f60718293a4b5c6d7e8f90\n"
      "  0f9e8d7c6b5a49382716a5b4c3d2e1f0  \nops:00112233445566778899aabbccddeeff admin\n");
  EXPECT_THAT(file.skipped, ::testing::IsEmpty());
  ASSERT_EQ(file.tokens.size(), 3u);
  EXPECT_EQ(file.tokens[0].name, "alice");
  EXPECT_FALSE(file.tokens[0].admin);
  EXPECT_EQ(file.tokens[1].name.substr(0, 6), "token-");
  EXPECT_EQ(file.tokens[1].name.size(), 14u);
  EXPECT_EQ(file.tokens[2].name, "ops");
  EXPECT_TRUE(file.tokens[2].admin);
  // Only digests are kept.
  EXPECT_EQ(file.tokens[0].sha256.size(), 64u);
  EXPECT_EQ(file.tokens[0].sha256.find(kAliceToken), std::string::npos);
}

TEST(ParseTokenFileTest, BadLinesAreSkippedWithoutEchoingTheirTokensAndTheOthersLoad) {
  const TokenFile file = ParseTokenFile(absl::StrCat(
      "x:short\n", kAliceToken, "\nbob:", kAliceToken, "\ncarol:", kBobToken, " root\n"));
  ASSERT_EQ(file.tokens.size(), 1u);
  EXPECT_EQ(file.tokens[0].sha256, Sha256Hex(kAliceToken));
  ASSERT_EQ(file.skipped.size(), 3u);
  EXPECT_EQ(file.skipped[0],
            "line 1 of the token file has a token of 5 characters; tokens need at least 16 "
            "(make one with: openssl rand -hex 32); skipped");
  EXPECT_THAT(file.skipped[1], HasSubstr("line 3 of the token file repeats an earlier token"));
  EXPECT_THAT(file.skipped[2], HasSubstr("line 4 of the token file has a word after its token"));
  for (const std::string& why : file.skipped) {
    EXPECT_THAT(why, ::testing::Not(HasSubstr(kAliceToken)));
    EXPECT_THAT(why, ::testing::Not(HasSubstr(kBobToken)));
  }
  EXPECT_THAT(ParseTokenFile("# nothing\n\n").tokens, ::testing::IsEmpty());
}

class AuthenticatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/tokens-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    WriteFile(path_, absl::StrCat("alice:", kAliceToken, "\n"));
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
};

TEST_F(AuthenticatorTest, ATokenNamesItsCallerAndHealthNeedsNone) {
  AuthOptions options;
  options.token_file = path_;
  const absl::StatusOr<std::shared_ptr<Authenticator>> auth = Authenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string alice = absl::StrCat("Bearer ", kAliceToken);
  const std::string bob = absl::StrCat("Bearer ", kBobToken);
  const absl::StatusOr<Caller> caller =
      (*auth)->Authenticate("/trainerd.v1.JobService/ListJobs", {alice}, "");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->name, "alice");
  EXPECT_FALSE(caller->admin);
  EXPECT_TRUE((*auth)->Authenticate("/grpc.health.v1.Health/Check", {}, "").ok());
  EXPECT_TRUE((*auth)->Authenticate("/grpc.health.v1.Health/Watch", {}, "").ok());
  // Only the health service's own methods, not everything under its prefix.
  EXPECT_EQ((*auth)->Authenticate("/grpc.health.v1.Health/Junk", {}, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  const absl::StatusOr<Caller> none = (*auth)->Authenticate(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {}, "");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate("/x", {bob}, "").status().message(),
            "the bearer token is not valid for this trainerd");
  EXPECT_EQ((*auth)->Authenticate("/x", {absl::StrCat("Basic ", kAliceToken)}, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  // One authorization header, not two (a junk one first and a good one after is no caller).
  EXPECT_EQ((*auth)->Authenticate("/x", {bob, alice}, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A certificate subject does not stand in for a token unless client certificates are on.
  EXPECT_EQ((*auth)->Authenticate("/x", {}, "CN=alice").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->rejected_calls(), 6);
}

TEST_F(AuthenticatorTest, AClientCertificateNamesItsCaller) {
  AuthOptions options;
  options.client_certificates = true;
  const absl::StatusOr<std::shared_ptr<Authenticator>> auth = Authenticator::Create(options);
  ASSERT_TRUE(auth.ok());
  EXPECT_EQ((*auth)->Authenticate("/x", {}, "CN=alice")->name, "CN=alice");
  EXPECT_FALSE((*auth)->Authenticate("/x", {}, "CN=alice")->admin);
  EXPECT_EQ((*auth)->Authenticate("/x", {}, "").status().message(),
            "this trainerd requires a client certificate (mutual TLS)");
  // --admin names admins by their subject.
  options.admins = {"CN=ops"};
  const absl::StatusOr<std::shared_ptr<Authenticator>> with_admin = Authenticator::Create(options);
  ASSERT_TRUE(with_admin.ok());
  EXPECT_TRUE((*with_admin)->Authenticate("/x", {}, "CN=ops")->admin);
  EXPECT_FALSE((*with_admin)->Authenticate("/x", {}, "CN=alice")->admin);
}

TEST_F(AuthenticatorTest, WithoutTokensOrCertificatesEveryoneIsLetIn) {
  const absl::StatusOr<std::shared_ptr<Authenticator>> auth = Authenticator::Create({});
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->required());
  EXPECT_EQ((*auth)->Authenticate("/x", {}, "")->name, "");
  EXPECT_TRUE((*auth)->Authenticate("/x", {}, "")->admin);  // one local admin
}

TEST_F(AuthenticatorTest, AMissingOrBadTokenFileNamesTheFlag) {
  AuthOptions options;
  options.token_file = path_ + ".missing";
  EXPECT_THAT(Authenticator::Create(options).status().message(), HasSubstr("--auth_token_file"));
  // At the start a file must hold a usable token (a typo in the flag must not start a daemon
  // that refuses everyone); the reason of the first bad line is given.
  WriteFile(path_, "tooshort\n");
  options.token_file = path_;
  EXPECT_THAT(Authenticator::Create(options).status().message(),
              HasSubstr("holds no usable token (line 1 of the token file has a token of 8 "
                        "characters; tokens need at least 16"));
}

TEST(IsLocalAddressTest, LoopbackAndUnixSocketsAreLocal) {
  EXPECT_TRUE(IsLocalAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLocalAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLocalAddress("localhost:50051"));
  EXPECT_TRUE(IsLocalAddress("[::1]:50051"));
  EXPECT_TRUE(IsLocalAddress("unix:/run/trainerd.sock"));
  EXPECT_FALSE(IsLocalAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLocalAddress("[::]:50051"));
  EXPECT_FALSE(IsLocalAddress(":50051"));
  EXPECT_FALSE(IsLocalAddress("10.0.0.5:50051"));
  EXPECT_FALSE(IsLocalAddress("127.0.0.1.example.com:50051"));
  EXPECT_FALSE(IsLocalAddress("gpu-node-3:50051"));
  // No file, no mode: any process may connect to an abstract socket.
  EXPECT_FALSE(IsLocalAddress("unix-abstract:trainerd"));
}

// ---- Through a real server --------------------------------------------------------------------

class SecurityTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    token_file_ = data_dir_ + "-tokens";
    WriteFile(token_file_,
              absl::StrCat("alice:", kAliceToken, "\nbob:", kBobToken, "\n"));
  }
  void TearDown() override {
    ServiceTest::TearDown();
    std::remove(token_file_.c_str());
  }
  // Starts the server with the token file and returns a plaintext channel to it.
  std::shared_ptr<grpc::Channel> StartWithTokens() {
    ServerOptions options = Options();
    options.auth_token_file = token_file_;
    StartServer(options);
    return channel_;
  }

  std::string token_file_;
};

TEST_F(SecurityTest, EveryMethodButHealthNeedsAToken) {
  const std::shared_ptr<grpc::Channel> channel = StartWithTokens();
  const grpc::Status anonymous = ListWith(channel, "");
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("requires a bearer token"));
  EXPECT_EQ(ListWith(channel, "0000000000000000000000000").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListWith(channel, kAliceToken).ok());
  // Health stays open: Kubernetes' probes send no metadata.
  int64_t serving = 0;
  ASSERT_TRUE(CheckHealth(channel, "", &serving).ok());
  EXPECT_EQ(serving, 1);
  // Reflection is not: it would list the API to anyone.
  std::vector<std::string> services;
  EXPECT_EQ(ListReflectedServices(channel, &services).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Every API method refuses before its handler runs: nothing was created.
  auto jobs = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = LinearSpec("seed", 1);
  v1::Job job;
  EXPECT_EQ(jobs->SubmitJob(&context, request, &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(server_->engine()->ListJobs()->jobs.empty());
  // Operators see the refusals: the anonymous list, the bad token, reflection and the submit.
  EXPECT_THAT(server_->metrics()->Render(), HasSubstr("\ntrainerd_auth_rejected_total 4\n"));
}

TEST_F(SecurityTest, ReflectionWorksWithAToken) {
  const std::shared_ptr<grpc::Channel> channel = StartWithTokens();
  std::vector<std::string> services;
  ASSERT_TRUE(ListReflectedServices(channel, &services, kAliceToken).ok());
  EXPECT_THAT(services, ::testing::Contains("trainerd.v1.JobService"));
}

TEST_F(SecurityTest, TheCallerIsRecordedOnDatasetsAndJobs) {
  const std::shared_ptr<grpc::Channel> channel = StartWithTokens();
  auto datasets = v1::DatasetService::NewStub(channel);
  const Table table = SeedTable();
  grpc::ClientContext upload_context;
  upload_context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  Authorize(&upload_context, kAliceToken);
  v1::Dataset dataset;
  auto writer = datasets->UploadDataset(&upload_context, &dataset);
  for (const v1::UploadDatasetRequest& message :
       UploadMessages(HeaderFor("seed", table), EncodePayload(table))) {
    ASSERT_TRUE(writer->Write(message));
  }
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(dataset.owner(), "alice");
  // Shared, so that bob's job may train on it (tenancy_test.cc has the rest).
  grpc::ClientContext share_context;
  share_context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  Authorize(&share_context, kAliceToken);
  v1::ShareDatasetRequest share;
  share.set_name("seed");
  share.set_shared(true);
  ASSERT_TRUE(datasets->ShareDataset(&share_context, share, &dataset).ok());

  auto jobs = v1::JobService::NewStub(channel);
  grpc::ClientContext submit_context;
  submit_context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  Authorize(&submit_context, kBobToken);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = LinearSpec("alice/seed", 1);  // hers: named with its owner
  v1::Job job;
  ASSERT_TRUE(jobs->SubmitJob(&submit_context, request, &job).ok());
  EXPECT_EQ(job.owner(), "bob");
  EXPECT_EQ(server_->engine()->GetJob(job.id())->owner, "bob");
}

TEST_F(SecurityTest, ARewrittenTokenFileTakesEffectWithoutARestart) {
  const std::shared_ptr<grpc::Channel> channel = StartWithTokens();
  ASSERT_TRUE(ListWith(channel, kAliceToken).ok());
  WriteFile(token_file_, absl::StrCat("bob:", kBobToken, "\n"));
  // The file is checked at most once a second.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (ListWith(channel, kAliceToken).ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(ListWith(channel, kAliceToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListWith(channel, kBobToken).ok());
  // A file with no usable line revokes every token (tenancy_test.cc: line by line, missing).
  WriteFile(token_file_, "short\n");
  const absl::Time later = absl::Now() + absl::Seconds(10);
  while (ListWith(channel, kBobToken).ok() && absl::Now() < later) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(ListWith(channel, kBobToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, APortInUseIsRefusedNotShared) {
  StartServer();
  // A second daemon on the first one's port (its own data folder): refused at start, so that a
  // client never reaches one or the other by chance.
  ServerOptions options = Options();
  options.listen = absl::StrCat("127.0.0.1:", server_->port());
  options.engine.data_dir = data_dir_ + "/second";  // removed with data_dir_
  const absl::StatusOr<std::unique_ptr<Server>> second = Server::BuildAndStart(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("cannot listen on '127.0.0.1:", server_->port(),
                                     "' (address in use or not valid)")));
}

TEST_F(SecurityTest, AnOpenAddressWithoutAuthenticationIsRefusedInOneSentence) {
  ServerOptions options = Options();
  options.listen = "0.0.0.0:0";
  const absl::StatusOr<std::unique_ptr<Server>> refused = Server::BuildAndStart(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("refusing to serve on 0.0.0.0:0, which other machines can reach, without "
                        "authentication: give --auth_token_file or mutual TLS"));
  EXPECT_THAT(refused.status().message(), HasSubstr("or --insecure"));
  options.insecure = true;
  StartServer(options);
  EXPECT_GT(server_->port(), 0);
  StopServer();
  options.insecure = false;
  options.auth_token_file = token_file_;
  StartServer(options);
  EXPECT_GT(server_->port(), 0);
}

TEST_F(SecurityTest, AUnixSocketIsModeSixSixtyAndServes) {
  const std::string path = data_dir_ + ".sock";
  ServerOptions options = Options();
  options.listen = absl::StrCat("unix:", path);
  StartServer(options);
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode));
  EXPECT_EQ(info.st_mode & 0777, 0660u);
  EXPECT_EQ(server_->address(), options.listen);
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials());
  EXPECT_TRUE(ListWith(channel, "").ok());
  StopServer();
  std::remove(path.c_str());
}

// ---- TLS --------------------------------------------------------------------------------------

class TlsTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    pki_dir_ = data_dir_ + "-pki";
    ASSERT_EQ(::mkdir(pki_dir_.c_str(), 0700), 0);
    absl::StatusOr<TestPki> pki = MakeTestPki(pki_dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
  }
  void TearDown() override {
    SecurityTest::TearDown();
    std::system(absl::StrCat("rm -rf '", pki_dir_, "'").c_str());
  }

  // A TLS channel that trusts `ca` and checks the name "localhost", with a client certificate
  // when `cert` is given.
  std::shared_ptr<grpc::Channel> TlsChannel(const std::string& ca, const std::string& cert = "",
                                            const std::string& key = "") {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFileOrEmpty(ca);
    if (!cert.empty()) {
      tls.pem_cert_chain = ReadFileOrEmpty(cert);
      tls.pem_private_key = ReadFileOrEmpty(key);
    }
    grpc::ChannelArguments arguments;
    arguments.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                     grpc::SslCredentials(tls), arguments);
  }

  std::string pki_dir_;
  TestPki pki_;
};

TEST_F(TlsTest, TlsServesClientsThatTrustItsCaAndNotPlaintextOnes) {
  ServerOptions options = Options();
  options.tls.cert_file = pki_.server_cert;
  options.tls.key_file = pki_.server_key;
  StartServer(options);
  EXPECT_TRUE(ListWith(TlsChannel(pki_.ca_cert), "").ok());
  EXPECT_EQ(ListWith(TlsChannel(pki_.other_ca_cert), "").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ListWith(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                         grpc::InsecureChannelCredentials()),
                     "")
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MutualTlsNamesTheCallerByItsCertificate) {
  ServerOptions options = Options();
  options.tls.cert_file = pki_.server_cert;
  options.tls.key_file = pki_.server_key;
  options.tls.client_ca_file = pki_.ca_cert;
  options.listen = "0.0.0.0:0";  // mutual TLS is authentication enough for an open address
  StartServer(options);
  EXPECT_EQ(ListWith(TlsChannel(pki_.ca_cert), "").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ListWith(TlsChannel(pki_.ca_cert, pki_.other_client_cert, pki_.other_client_key), "")
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  const std::shared_ptr<grpc::Channel> alice =
      TlsChannel(pki_.ca_cert, pki_.client_cert, pki_.client_key);
  ASSERT_TRUE(ListWith(alice, "").ok());
  auto jobs = v1::JobService::NewStub(alice);
  datasets_ = v1::DatasetService::NewStub(alice);
  UploadSeed();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = LinearSpec("seed", 1);
  v1::Job job;
  ASSERT_TRUE(jobs->SubmitJob(&context, request, &job).ok());
  EXPECT_THAT(job.owner(), HasSubstr("CN=alice"));
}

// The console vouches for a browser's verified certificate over the in-process channel with a
// secret of the process; metadata that claims a subject without it names nobody, on any channel.
TEST_F(TlsTest, ACertificateSubjectCannotBeClaimedWithoutTheConsolesSecret) {
  ServerOptions options = Options();
  options.tls.cert_file = pki_.server_cert;
  options.tls.key_file = pki_.server_key;
  options.tls.client_ca_file = pki_.ca_cert;
  options.auth_token_file = token_file_;
  StartServer(options);
  const std::shared_ptr<grpc::Channel> alice =
      TlsChannel(pki_.ca_cert, pki_.client_cert, pki_.client_key);
  datasets_ = v1::DatasetService::NewStub(alice);
  UploadSeed();  // owned by alice's certificate's subject
  auto list = [](const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
                 const std::string& claimed) {
    auto stub = v1::DatasetService::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    if (!token.empty()) Authorize(&context, token);
    context.AddMetadata("trainerd-console-subject-bin", claimed);
    context.AddMetadata("trainerd-console-secret", std::string(64, '0'));
    v1::ListDatasetsResponse response;
    const grpc::Status status = stub->ListDatasets(&context, v1::ListDatasetsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.datasets_size();
  };
  std::string alice_subject;
  {
    auto stub = v1::DatasetService::NewStub(alice);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::ListDatasetsResponse response;
    ASSERT_TRUE(stub->ListDatasets(&context, v1::ListDatasetsRequest(), &response).ok());
    ASSERT_EQ(response.datasets_size(), 1);
    alice_subject = response.datasets(0).owner();
  }
  EXPECT_THAT(alice_subject, HasSubstr("CN=alice"));
  // In process (no TLS): bob's token with alice's subject claimed is bob, and the claim alone is
  // nobody; neither sees alice's dataset.
  EXPECT_EQ(list(server_->InProcessChannel(), kBobToken, alice_subject), 0);
  EXPECT_EQ(list(server_->InProcessChannel(), "", alice_subject), 0);
  // Over TLS the connection's certificate names the caller, whatever is claimed.
  EXPECT_EQ(list(alice, "", "CN=bob"), 1);
}

TEST_F(TlsTest, CertificatesRotateWithoutARestart) {
  ServerOptions options = Options();
  options.tls.cert_file = pki_.server_cert;
  options.tls.key_file = pki_.server_key;
  options.tls.reload_interval = absl::Seconds(1);
  StartServer(options);
  ASSERT_TRUE(ListWith(TlsChannel(pki_.ca_cert), "").ok());
  // A new CA and a server certificate from it, written over the old files.
  const std::string new_ca = pki_dir_ + "/new-ca.crt";
  const std::string new_ca_key = pki_dir_ + "/new-ca.key";
  ASSERT_EQ(std::system(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt "
                                     "ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "
                                     "'/CN=rotated CA' -keyout '",
                                     new_ca_key, "' -out '", new_ca, "' 2>/dev/null")
                            .c_str()),
            0);
  ASSERT_TRUE(SignCertificate(new_ca, new_ca_key, "localhost", /*server=*/true, pki_.server_cert,
                              pki_.server_key)
                  .ok());
  // New connections get the new certificate within a few reload intervals.
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  bool rotated = false;
  while (!rotated && absl::Now() < give_up) {
    rotated = ListWith(TlsChannel(new_ca), "").ok();
    if (!rotated) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(rotated);
  EXPECT_EQ(ListWith(TlsChannel(pki_.ca_cert), "").error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, UnusableTlsFilesAreRefusedAtStartNamingTheFlag) {
  ServerOptions options = Options();
  options.tls.cert_file = pki_.server_cert;
  EXPECT_THAT(Server::BuildAndStart(options).status().message(),
              HasSubstr("needs both --tls_cert_file and --tls_key_file"));
  options.tls.key_file = pki_.client_key;  // another certificate's key
  EXPECT_THAT(Server::BuildAndStart(options).status().message(),
              HasSubstr("is not the key of --tls_cert_file"));
  options.tls.key_file = pki_.server_key;
  options.tls.client_ca_file = pki_dir_ + "/missing.crt";
  EXPECT_THAT(Server::BuildAndStart(options).status().message(),
              HasSubstr("--tls_client_ca_file"));
}

// ---- /metrics ---------------------------------------------------------------------------------

// The status line of GET /metrics on 127.0.0.1:port with an optional bearer token.
std::string MetricsStatusLine(int port, const std::string& token) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return "";
  }
  std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  if (!token.empty()) request += absl::StrCat("Authorization: Bearer ", token, "\r\n");
  request += "\r\n";
  (void)::send(fd, request.data(), request.size(), 0);
  std::string reply;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) reply.append(buffer, n);
  ::close(fd);
  return reply.substr(0, reply.find("\r\n"));
}

TEST_F(SecurityTest, MetricsCanRequireABearerToken) {
  const std::string metrics_token_file = data_dir_ + "-metrics-token";
  WriteFile(metrics_token_file, "prometheus:feedfacefeedfacefeedface\n");
  ServerOptions options = Options();
  options.metrics_listen = "127.0.0.1:0";
  options.metrics_token_file = metrics_token_file;
  StartServer(options);
  const int port = std::stoi(server_->metrics_address().substr(
      server_->metrics_address().rfind(':') + 1));
  EXPECT_EQ(MetricsStatusLine(port, ""), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(MetricsStatusLine(port, "feedfacefeedface"), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(MetricsStatusLine(port, "feedfacefeedfacefeedface"), "HTTP/1.1 200 OK");
  std::remove(metrics_token_file.c_str());
}

}  // namespace
}  // namespace trainerd::service::testing
