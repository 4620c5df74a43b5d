// End to end, the security settings through the real binaries: a token enforced through trainctl
// (--token-file and $TRAINERD_TOKEN, and the one-line hint when it is missing), TLS and mutual TLS
// with certificates made by openssl, an open address refused without authentication, a Unix
// socket, and TorchScript modules checked as code.
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
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

}  // namespace
}  // namespace trainerd::e2e
