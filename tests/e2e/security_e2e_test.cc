// End to end, the security settings through the real binaries: a token enforced through trainctl
// (--token-file and $TRAINERD_TOKEN, and the one-line hint when it is missing), TLS and mutual TLS
// with certificates made by openssl, an open address refused without authentication, a Unix
// socket, TorchScript modules checked as code, and the health service's Watch streams (which
// need no token) bounded, in number and in the daemon's memory.
#include <arpa/inet.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/create_channel_posix.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/e2e/subprocess.h"
#include "tests/support/certificates.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "5c0ffee5c0ffee5c0ffee5c0ffee5c0f";

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A process's resident set in bytes (/proc/PID/status, VmRSS); -1 when it cannot be read.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// The Watch streams of a test: each settles when its first status arrives (it got in) or when it
// ends (refused); the test waits for all of them to settle.
class HealthWatches {
 public:
  class Stream final : public grpc::ClientReadReactor<HealthCheckResponse> {
   public:
    Stream(HealthWatches* owner, Health::Stub* stub) : owner_(owner) {
      stub->async()->Watch(&context_, &request_, this);
      StartRead(&response_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (ok && !got_in_) {
        got_in_ = true;
        owner_->Settled(this, /*got_in=*/true, std::nullopt);
      }
      if (ok) StartRead(&response_);
    }
    void OnDone(const grpc::Status& status) override {
      owner_->Settled(this, /*got_in=*/false, status.error_code());
    }
    void Cancel() { context_.TryCancel(); }

   private:
    HealthWatches* const owner_;
    grpc::ClientContext context_;
    HealthCheckRequest request_;
    HealthCheckResponse response_;
    bool got_in_ = false;  // the reactor's own thread only
  };

  // Cancels and waits for every stream still open.
  ~HealthWatches() {
    for (auto& stream : streams_) stream->Cancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return done_ == streams_.size(); });
  }

  // Opens `count` streams on `stub` and waits until each got in or was refused.
  void Open(Health::Stub* stub, size_t count) {
    size_t target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      target = settled_ + count;
    }
    std::vector<std::unique_ptr<Stream>> made;
    for (size_t i = 0; i < count; ++i) made.push_back(std::make_unique<Stream>(this, stub));
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& stream : made) streams_.push_back(std::move(stream));
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return settled_ >= target; });
  }
  // Cancels the streams that got in, and waits for them to end.
  void CancelOpen() {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<Stream*> open(open_.begin(), open_.end());
    lock.unlock();
    for (Stream* stream : open) stream->Cancel();
    lock.lock();
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return open_.empty(); });
  }

  size_t open() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_.size();
  }
  size_t refused() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }

 private:
  friend class Stream;
  void Settled(Stream* stream, bool got_in, std::optional<grpc::StatusCode> code) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (got_in) {
        open_.push_back(stream);
        ++settled_;
      } else {
        ++done_;
        auto it = std::find(open_.begin(), open_.end(), stream);
        if (it != open_.end()) {
          open_.erase(it);
        } else {
          ++settled_;
          if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused_;
        }
      }
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Stream>> streams_;  // guarded by mu_
  std::vector<Stream*> open_;                     // guarded by mu_: got in, not ended
  size_t settled_ = 0;                            // guarded by mu_
  size_t done_ = 0;                               // guarded by mu_: ended
  size_t refused_ = 0;                            // guarded by mu_
};

// A channel to 127.0.0.1:`port` whose connection comes from `source` (another loopback address):
// a socket bound to it, connected, and handed to gRPC. Null when that fails.
std::shared_ptr<grpc::Channel> ChannelFrom(const char* source, const std::string& port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
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
  return grpc::CreateInsecureChannelFromFd("127.0.0.1:" + port, fd);
}

class SecurityEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-sec-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    token_file_ = WriteFile("tokens", std::string("ci-runner:") + kToken + "\n");
    csv_ = WriteFile("seed.csv", "x,y\n0,1\n0.5,2\n1,3\n0.25,1.5\n");
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

  // Starts trainerd with `flags` on top of a data folder, the CPU and no metrics; returns false
  // (with the daemon's stderr in *error) when it exits instead of listening.
  bool StartDaemon(const std::vector<std::string>& flags, std::string* error = nullptr) {
    std::vector<std::string> argv = {TRAINERD_BIN, "--data_dir=" + (dir_ / "data").string(),
                                     "--device=cpu",
                                     "--metrics_listen=", "--diagnose_at_start=false"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    daemon_ = std::make_unique<Daemon>(argv);
    std::string line;
    if (!daemon_->ReadLine(&line)) {
      if (error != nullptr) *error = daemon_->Stderr();
      return false;
    }
    const std::string marker = "listening on ";
    const size_t at = line.find(marker);
    addr_ =
        line.substr(at + marker.size(), line.find(' ', at + marker.size()) - at - marker.size());
    port_ = addr_.substr(addr_.rfind(':') + 1);
    return true;
  }

  RunResult Ctl(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr_});
    return e2e::Run(args, env);
  }

  std::filesystem::path dir_;
  std::string token_file_;
  std::string csv_;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
  std::string port_;
};

TEST_F(SecurityEndToEndTest, ATokenIsEnforcedThroughTrainctl) {
  ASSERT_TRUE(StartDaemon({"--listen=127.0.0.1:0", "--auth_token_file=" + token_file_}));
  // Without a token: exit 1 and one line that says what to set.
  RunResult anonymous = Ctl({"dataset", "list"});
  EXPECT_EQ(anonymous.exit_code, 1);
  EXPECT_THAT(anonymous.err, HasSubstr("refused the call"));
  EXPECT_THAT(anonymous.err, HasSubstr("set --token-file FILE or $TRAINERD_TOKEN"));
  EXPECT_EQ(std::count(anonymous.err.begin(), anonymous.err.end(), '\n'), 1);
  // A wrong token says to check it.
  RunResult wrong = Ctl({"dataset", "list"}, {"TRAINERD_TOKEN=not-the-token-at-all-sorry"});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("check the token"));
  // The file, or the variable.
  RunResult upload =
      Ctl({"--token-file", token_file_, "dataset", "upload", "seed", csv_, "-o", "wide"});
  ASSERT_EQ(upload.exit_code, 0) << upload.err;
  EXPECT_THAT(upload.out, HasSubstr("owner:     ci-runner"));
  EXPECT_THAT(upload.out, HasSubstr("\nlast use:  20"));  // its upload, until a job takes it
  RunResult submit = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--epochs", "3",
                          "--batch-size", "2", "--watch"},
                         {std::string("TRAINERD_TOKEN=") + kToken});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  RunResult get = Ctl({"--token-file", token_file_, "-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  EXPECT_EQ(job.owner(), "ci-runner");
  // Health stays open for probes.
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
}

// A shared node's default: one tenant may hold a quarter of the queue (--max_queued_jobs=8: two
// jobs), not the node; the error names the flag.
TEST_F(SecurityEndToEndTest, ByDefaultATenantHoldsAFairShareOfTheQueue) {
  ASSERT_TRUE(StartDaemon({"--listen=127.0.0.1:0", "--auth_token_file=" + token_file_,
                           "--max_queued_jobs=8"}));
  const std::vector<std::string> token = {std::string("TRAINERD_TOKEN=") + kToken};
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}, token).exit_code, 0);
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    RunResult r = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--epochs",
                       "1000000", "--batch-size", "1"},
                      token);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ids.push_back(r.out.substr(0, r.out.find('\n')));
  }
  RunResult third = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--epochs", "3"},
                        token);
  EXPECT_NE(third.exit_code, 0);
  EXPECT_THAT(third.err, HasSubstr("its quota is 2 (--max_jobs_per_caller)"));
  for (const std::string& id : ids) EXPECT_EQ(Ctl({"job", "cancel", id}, token).exit_code, 0);
}

TEST_F(SecurityEndToEndTest, AnOpenAddressWithoutAuthenticationIsRefused) {
  std::string error;
  EXPECT_FALSE(StartDaemon({"--listen=0.0.0.0:0"}, &error));
  EXPECT_EQ(daemon_->Stop(SIGKILL), 1);
  EXPECT_THAT(error, HasSubstr("trainerd: refusing to serve on 0.0.0.0:0, which other machines "
                               "can reach, without authentication"));
  EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  // With a token it starts; so it does with --insecure.
  ASSERT_TRUE(StartDaemon({"--listen=0.0.0.0:0", "--auth_token_file=" + token_file_}));
  daemon_.reset();
  ASSERT_TRUE(StartDaemon({"--listen=0.0.0.0:0", "--insecure"}));
  addr_ = "127.0.0.1:" + port_;
  EXPECT_EQ(Ctl({"dataset", "list"}).exit_code, 0);
}

TEST_F(SecurityEndToEndTest, TlsAndMutualTlsWithOpensslCertificates) {
  const std::string pki_dir = (dir_ / "pki").string();
  std::filesystem::create_directories(pki_dir);
  absl::StatusOr<trainerd::testing::TestPki> pki = trainerd::testing::MakeTestPki(pki_dir);
  ASSERT_TRUE(pki.ok()) << pki.status();

  // TLS: the client trusts the CA and checks the name.
  ASSERT_TRUE(StartDaemon({"--listen=127.0.0.1:0", "--tls_cert_file=" + pki->server_cert,
                           "--tls_key_file=" + pki->server_key}));
  RunResult tls = Ctl({"--tls-ca", pki->ca_cert, "--tls-server-name", "localhost", "dataset",
                       "upload", "seed", csv_});
  EXPECT_EQ(tls.exit_code, 0) << tls.err;
  RunResult plaintext = Ctl({"dataset", "list"});
  EXPECT_EQ(plaintext.exit_code, 1);
  EXPECT_THAT(plaintext.err, HasSubstr("give --tls-ca")) << plaintext.err;
  RunResult untrusted =
      Ctl({"--tls-ca", pki->other_ca_cert, "--tls-server-name", "localhost", "dataset", "list"});
  EXPECT_EQ(untrusted.exit_code, 1);
  EXPECT_THAT(untrusted.err, HasSubstr("check --tls-ca"));
  daemon_.reset();

  // Mutual TLS, on an open address: the certificate authenticates, and names the caller.
  ASSERT_TRUE(
      StartDaemon({"--listen=0.0.0.0:0", "--tls_cert_file=" + pki->server_cert,
                   "--tls_key_file=" + pki->server_key, "--tls_client_ca_file=" + pki->ca_cert}));
  addr_ = "127.0.0.1:" + port_;
  // The dataset uploaded before authentication has no owner: only admins see it. Alice uploads
  // her own.
  RunResult upload =
      Ctl({"--tls-ca", pki->ca_cert, "--tls-server-name", "localhost", "--tls-cert",
           pki->client_cert, "--tls-key", pki->client_key, "dataset", "upload", "alices", csv_});
  ASSERT_EQ(upload.exit_code, 0) << upload.err;
  RunResult alice = Ctl({"--tls-ca", pki->ca_cert, "--tls-server-name", "localhost", "--tls-cert",
                         pki->client_cert, "--tls-key", pki->client_key, "submit", "--dataset",
                         "alices", "--model", "linear:1", "--epochs", "2", "-o", "json"});
  ASSERT_EQ(alice.exit_code, 0) << alice.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(alice.out, &job).ok()) << alice.out;
  EXPECT_THAT(job.owner(), HasSubstr("CN=alice"));
  RunResult no_certificate =
      Ctl({"--tls-ca", pki->ca_cert, "--tls-server-name", "localhost", "dataset", "list"});
  EXPECT_EQ(no_certificate.exit_code, 1);
  RunResult mallory =
      Ctl({"--tls-ca", pki->ca_cert, "--tls-server-name", "localhost", "--tls-cert",
           pki->other_client_cert, "--tls-key", pki->other_client_key, "dataset", "list"});
  EXPECT_EQ(mallory.exit_code, 1);
  EXPECT_THAT(mallory.out, Not(HasSubstr("seed")));
}

// The per-caller bounds and quotas refuse hostile values at start, in one sentence naming them:
// negative, overflowing and non-numeric, and a duration that is negative.
TEST_F(SecurityEndToEndTest, HostileValuesOfTheBoundAndQuotaFlagsAreRefusedAtStart) {
  const std::string data = "--data_dir=" + (dir_ / "flags").string();
  for (const char* flag :
       {"--max_uploads_per_caller", "--max_watches_per_caller", "--max_diagnose_per_caller",
        "--min_upload_bytes_per_second", "--max_jobs_per_caller", "--max_dataset_bytes_per_caller",
        "--max_disk_bytes_per_caller", "--max_datasets", "--max_datasets_per_caller"}) {
    const RunResult negative = e2e::Run({TRAINERD_BIN, data, std::string(flag) + "=-1"});
    EXPECT_EQ(negative.exit_code, 2) << flag << ": " << negative.err;
    EXPECT_THAT(negative.err, HasSubstr(flag))
        << "the refusal names " << flag << ": " << negative.err;
  }
  // Values that do not parse, for an int and an int64 flag (the others parse the same way).
  for (const char* flag : {"--max_uploads_per_caller", "--max_dataset_bytes_per_caller"}) {
    for (const char* junk : {"=99999999999999999999999", "=nan", "=abc"}) {
      const RunResult refused = e2e::Run({TRAINERD_BIN, data, std::string(flag) + junk});
      EXPECT_NE(refused.exit_code, 0) << flag << junk;
      EXPECT_THAT(refused.err, HasSubstr(std::string(flag).substr(2))) << flag << junk;
    }
  }
  // The largest --max_datasets does not wrap the descriptor need around to a small one: the
  // daemon starts and warns that the open-file limit is short (logged before it listens).
  {
    Daemon huge({TRAINERD_BIN, data, "--max_datasets=9223372036854775807", "--listen=127.0.0.1:0",
                 "--device=cpu", "--metrics_listen=", "--diagnose_at_start=false"});
    std::string line;
    ASSERT_TRUE(huge.ReadLine(&line)) << huge.Stderr();
    EXPECT_THAT(huge.Stderr(), HasSubstr("short of the 2199023256576"));
    EXPECT_EQ(huge.Stop(SIGTERM), 0);
  }
  // Each job a device runs at once is a worker thread: a huge value is refused, not a million
  // threads; a negative one too.
  for (const char* workers : {"--cpu_cores=1000000", "--max_concurrent_jobs=2147483647",
                              "--cpu_cores=-1", "--max_concurrent_jobs=-3"}) {
    const RunResult refused = e2e::Run({TRAINERD_BIN, data, workers});
    EXPECT_EQ(refused.exit_code, 2) << workers << ": " << refused.err;
    EXPECT_THAT(refused.err,
                HasSubstr(std::string(workers).substr(0, std::string(workers).find('='))))
        << refused.err;
  }
  for (const char* nice : {"--cpu_training_nice=-1", "--cpu_training_nice=20"}) {
    const RunResult refused = e2e::Run({TRAINERD_BIN, data, nice});
    EXPECT_EQ(refused.exit_code, 2) << nice << ": " << refused.err;
    EXPECT_THAT(refused.err, HasSubstr("--cpu_training_nice must be from 0 to 19")) << refused.err;
  }
  // The data-parallel flags: each hostile value refused at start, naming the flag. (A peer token
  // file that does not exist is not refused: the daemon serves without it, deploy_e2e_test.cc; one
  // that holds no token is.)
  const std::string no_token = WriteFile("empty.token", "# no token here\n\n");
  const std::vector<std::pair<std::string, std::string>> parallel = {
      {"--max_replicas=0", "--max_replicas"},
      {"--max_replicas=-5", "--max_replicas"},
      {"--max_replicas=99999999999999999999", "max_replicas"},
      {"--collective_timeout=0s", "--collective_timeout"},
      {"--collective_timeout=-1s", "--collective_timeout"},
      {"--rendezvous_ports=5-1", "--rendezvous_ports"},
      {"--rendezvous_ports=0-70000", "--rendezvous_ports"},
      {"--rendezvous_ports=abc", "--rendezvous_ports"},
      {"--rendezvous_ports=-", "--rendezvous_ports"},
      {"--peer_token_file=" + no_token, "--peer_token_file"},
      {"--peers=no-port-here", "--peers"},
      {"--peers=dns:name-without-port", "--peers"},
  };
  for (const auto& [value, names] : parallel) {
    const RunResult refused = e2e::Run(
        {TRAINERD_BIN, data, "--listen=127.0.0.1:0", "--device=cpu", "--metrics_listen=", value});
    EXPECT_NE(refused.exit_code, 0) << value << ": " << refused.err;
    EXPECT_THAT(refused.err, HasSubstr(names)) << value << ": " << refused.err;
  }
  {
    const RunResult half =
        e2e::Run({TRAINERD_BIN, data, "--listen=127.0.0.1:0", "--device=cpu",
                  "--metrics_listen=", "--peers=127.0.0.1:1", "--peer_tls_cert=/etc/hostname"});
    EXPECT_NE(half.exit_code, 0) << half.err;
    EXPECT_THAT(half.err, HasSubstr("--peer_tls_cert and --peer_tls_key go together"));
  }
  const RunResult interval = e2e::Run({TRAINERD_BIN, data, "--diagnose_min_interval=-1s"});
  EXPECT_EQ(interval.exit_code, 2) << interval.err;
  EXPECT_THAT(interval.err, HasSubstr("--diagnose_min_interval"));
}

TEST_F(SecurityEndToEndTest, AUnixSocketServesTrainctlWithModeSixSixty) {
  const std::string socket = (dir_ / "trainerd.sock").string();
  ASSERT_TRUE(StartDaemon({"--listen=unix:" + socket}));
  EXPECT_EQ(addr_, "unix:" + socket);
  struct stat info {};
  ASSERT_EQ(::stat(socket.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0660u);
  RunResult upload = Ctl({"dataset", "upload", "seed", csv_});
  EXPECT_EQ(upload.exit_code, 0) << upload.err;
}

TEST_F(SecurityEndToEndTest, TorchScriptModulesAreCheckedAsCode) {
  const std::string evil = (dir_ / "evil.pt").string();
  const std::string good = (dir_ / "good.pt").string();
  ASSERT_EQ(e2e::Run({MAKE_TORCHSCRIPT_FIXTURE_BIN, evil, "1", "1", "reads-file"}).exit_code, 0);
  ASSERT_EQ(e2e::Run({MAKE_TORCHSCRIPT_FIXTURE_BIN, good, "1", "1"}).exit_code, 0);
  ASSERT_TRUE(StartDaemon({"--listen=127.0.0.1:0"}));
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  RunResult refused = Ctl({"submit", "--dataset", "seed", "--torchscript", evil});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("operator 'aten::from_file'"));
  RunResult accepted =
      Ctl({"submit", "--dataset", "seed", "--torchscript", good, "--epochs", "2", "--watch"});
  EXPECT_EQ(accepted.exit_code, 0) << accepted.err;
  daemon_.reset();
  ASSERT_TRUE(StartDaemon({"--listen=127.0.0.1:0", "--allow_torchscript=false"}));
  RunResult off = Ctl({"submit", "--dataset", "seed", "--torchscript", good});
  EXPECT_EQ(off.exit_code, 1);
  EXPECT_THAT(off.err, HasSubstr("--allow_torchscript=false"));
}

// Health needs no token (Kubernetes' probes send none), so its Watch streams, which never end by
// themselves, are bounded: with 16 open from one address (--max_health_watches_per_address), 6,500
// more from it against a daemon that requires a token are refused at once, and over the last
// 6,000 the daemon's resident memory stays within a few MiB of where it was (an open stream costs
// the daemon about 16 KB: 6,000 of them held would be about 100 MiB); another address still gets
// in; and the places come back when the streams are cancelled.
TEST_F(SecurityEndToEndTest, HealthWatchStreamsAreBoundedInNumberAndMemory) {
  ASSERT_TRUE(StartDaemon({"--listen=127.0.0.1:0", "--auth_token_file=" + token_file_}));
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials());
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel);
  HealthWatches first;
  first.Open(stub.get(), 16);
  ASSERT_EQ(first.open(), 16u);
  HealthWatches refused;
  refused.Open(stub.get(), 500);  // the daemon's own first allocations, before the measurement
  const int64_t before = ResidentBytes(daemon_->pid());
  ASSERT_GT(before, 0);
  for (int wave = 0; wave < 12; ++wave) refused.Open(stub.get(), 500);
  const int64_t after = ResidentBytes(daemon_->pid());
  EXPECT_EQ(refused.open(), 0u);
  EXPECT_EQ(refused.refused(), 13u * 500u);
  // Unbounded, the same 6,000 streams held about 100 MiB more (measured with both bounds 0); the
  // refusals themselves leave a few MiB of gRPC's and the allocator's (2.6 to 11 MiB measured).
  EXPECT_LT(after - before, int64_t{32} << 20) << "from " << before << " to " << after << " bytes";

  // Another address gets in meanwhile; Check answers without a token.
  std::shared_ptr<grpc::Channel> other = ChannelFrom("127.0.0.2", port_);
  ASSERT_NE(other, nullptr);
  std::unique_ptr<Health::Stub> other_stub = Health::NewStub(other);
  HealthWatches others;
  others.Open(other_stub.get(), 4);
  EXPECT_EQ(others.open(), 4u);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  HealthCheckResponse response;
  ASSERT_TRUE(stub->Check(&context, HealthCheckRequest(), &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  // Cancelled, they free their places (once the daemon has seen the cancels): from the first
  // address again, 16 get in.
  first.CancelOpen();
  HealthWatches again;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (again.open() < 16u && std::chrono::steady_clock::now() < give_up) {
    again.Open(stub.get(), 16 - again.open());
    if (again.open() < 16u) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(again.open(), 16u);
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
}

}  // namespace
}  // namespace trainerd::e2e
