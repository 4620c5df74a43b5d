// End to end, the Kubernetes steps as README.md and docs/DEPLOY.md give them, run the way a pod
// runs them: the Secret as the documented `kubectl create secret generic trainerd-token` makes
// it (a folder holding one file per --from-file key, which is what a Secret volume mounts), the
// DaemonSet's environment read from deploy/k8s/daemonset.yaml (so the test follows the
// manifest), and the real trainerd binary started with nothing else in its environment. Each
// documented Secret must give a daemon that serves and trains; the one for jobs across nodes
// must give two daemons that train one job together, as the docs' example submits it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/e2e/subprocess.h"
#include "trainerd/v1/jobs.pb.h"
#include "yaml-cpp/yaml.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;

std::string ReadSource(const std::string& relative) {
  std::ifstream in(std::string(TRAINERD_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The keys each documented `kubectl ... create secret generic trainerd-token` gives the Secret
// (its --from-file=KEY=PATH arguments), one set per command, from README.md and docs/DEPLOY.md.
std::vector<std::set<std::string>> DocumentedSecrets() {
  std::vector<std::set<std::string>> secrets;
  for (const std::string file : {"README.md", "docs/DEPLOY.md"}) {
    std::istringstream lines(ReadSource(file));
    std::string line;
    std::string command;
    while (std::getline(lines, line)) {
      // A shell command goes on over lines that end in a backslash.
      const bool more = !line.empty() && line.back() == '\\';
      command += more ? line.substr(0, line.size() - 1) : line;
      if (more) continue;
      if (command.find("create secret generic trainerd-token") != std::string::npos) {
        std::set<std::string> keys;
        const std::regex from_file("--from-file=([A-Za-z0-9_.-]+)=");
        for (auto it = std::sregex_iterator(command.begin(), command.end(), from_file);
             it != std::sregex_iterator(); ++it) {
          keys.insert((*it)[1]);
        }
        secrets.push_back(keys);
      }
      command.clear();
    }
  }
  return secrets;
}

// A port free now (bound, read and closed).
int FreePort(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string RandomHex() {
  std::random_device random;
  std::string out;
  for (int i = 0; i < 32; ++i) {
    char byte[3];
    std::snprintf(byte, sizeof(byte), "%02x", random() & 0xff);
    out += byte;
  }
  return out;
}

class DeployEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-deploy-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    user_token_ = RandomHex();
    admin_token_ = RandomHex();
  }
  void TearDown() override {
    pods_.clear();
    std::filesystem::remove_all(dir_);
  }

  // The Secret's volume as `kubectl create secret generic --from-file=KEY=...` makes it: one file
  // per key. `token` holds a user's line (and, with a peer-token key, the admin line the docs
  // append to it); `peer-token` the admin line.
  std::filesystem::path MakeSecret(const std::string& name, const std::set<std::string>& keys) {
    const std::filesystem::path secret = dir_ / name;
    std::filesystem::create_directories(secret);
    const std::string admin_line = "ops:" + admin_token_ + " admin\n";
    for (const std::string& key : keys) {
      std::ofstream out(secret / key);
      if (key == "token") {
        out << "me:" << user_token_ << "\n" << (keys.count("peer-token") ? admin_line : "");
      } else if (key == "peer-token") {
        out << admin_line;
      }
    }
    return secret;
  }

  // A pod of the DaemonSet on `pod_ip`: the container's environment from the manifest, its
  // volumes' mount paths standing for folders of this test (the Secret's, the node's data
  // folder, /tmp), then trainerd with only that environment. The image's own settings
  // (TRAINERD_LISTEN on 0.0.0.0:50051, the data folder, the metrics port) are given as flags,
  // which win over them as they would in the image, on ports free here. `peers`: what the
  // headless Service's name would resolve to (the other pods), given for TRAINERD_PEERS, whose
  // DNS name has no answer here; empty keeps the manifest's.
  Daemon* StartPod(const std::string& address, const std::filesystem::path& secret,
                   const std::string& peers) {
    const std::string pod_ip = address.substr(0, address.rfind(':'));
    const YAML::Node daemonset =
        YAML::LoadFile(std::string(TRAINERD_SOURCE_DIR) + "/deploy/k8s/daemonset.yaml");
    const YAML::Node pod = daemonset["spec"]["template"]["spec"];
    const YAML::Node container = pod["containers"][0];
    // Each Secret's pods on nodes of their own: no data folder is shared between the cases.
    const std::string name = secret.filename().string() + "-pod-" + pod_ip;
    std::map<std::string, std::filesystem::path> volume_folder;
    for (const YAML::Node& volume : pod["volumes"]) {
      const std::string volume_name = volume["name"].as<std::string>();
      if (volume["secret"]) {
        EXPECT_EQ(volume["secret"]["secretName"].as<std::string>(), "trainerd-token");
        volume_folder[volume_name] = secret;
      } else {
        volume_folder[volume_name] = dir_ / name / volume_name;
        std::filesystem::create_directories(volume_folder[volume_name]);
      }
    }
    std::map<std::string, std::filesystem::path> mounts;  // mount path -> folder here
    for (const YAML::Node& mount : container["volumeMounts"]) {
      mounts[mount["mountPath"].as<std::string>()] =
          volume_folder.at(mount["name"].as<std::string>());
    }
    auto remap = [&](const std::string& value) {
      for (const auto& [path, folder] : mounts) {
        if (value == path || value.rfind(path + "/", 0) == 0) {
          return folder.string() + value.substr(path.size());
        }
      }
      return value;
    };
    std::vector<std::string> argv = {"/usr/bin/env", "-i"};
    for (const YAML::Node& variable : container["env"]) {
      const std::string key = variable["name"].as<std::string>();
      std::string value;
      if (variable["value"]) {
        value = variable["value"].as<std::string>();
      } else {
        const std::string field = variable["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>();
        EXPECT_TRUE(field == "status.podIP" || field == "spec.nodeName") << field;
        value = field == "status.podIP" ? pod_ip : "node-" + pod_ip;
      }
      if (key == "TRAINERD_PEERS" && !peers.empty()) value = peers;
      argv.push_back(key + "=" + remap(value));
    }
    argv.insert(argv.end(),
                {TRAINERD_BIN, "--listen=" + address, "--data_dir=" + remap("/var/lib/trainerd"),
                 "--metrics_listen=", "--diagnose_at_start=false"});
    pods_.push_back(std::make_unique<Daemon>(argv));
    return pods_.back().get();
  }

  RunResult Ctl(const std::string& address, std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", address});
    return e2e::Run(args, {"TRAINERD_TOKEN=" + user_token_});
  }

  v1::Job Watch(const std::string& address, const std::vector<std::string>& args) {
    RunResult run = Ctl(address, args);
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    RunResult got =
        Ctl(address, {"-o", "json", "job", "get", run.out.substr(0, run.out.find('\n'))});
    v1::Job job;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &job).ok()) << got.out;
    return job;
  }

  void Upload(const std::string& address) {
    std::string csv = "a,b,y\n";
    for (int r = 0; r < 200; ++r) {
      csv += std::to_string(r % 7) + "," + std::to_string(r % 5) + "," +
             std::to_string(0.5 * (r % 7) - 0.25 * (r % 5)) + "\n";
    }
    const std::string path = (dir_ / "data.csv").string();
    std::ofstream(path) << csv;
    RunResult up = Ctl(address, {"dataset", "upload", "lines", path});
    ASSERT_EQ(up.exit_code, 0) << up.err;
  }

  std::filesystem::path dir_;
  std::string user_token_;
  std::string admin_token_;
  std::vector<std::unique_ptr<Daemon>> pods_;
};

// Every Secret the docs create gives a pod that starts, serves and trains: the one with the
// `token` key only too (the DaemonSet points TRAINERD_PEER_TOKEN_FILE at a peer-token file that
// Secret does not have; before, every pod exited with "holds no token"). Such a pod says so at
// start and refuses, naming the file, only a job that names another node.
TEST_F(DeployEndToEndTest, EverySecretTheDocsCreateGivesAPodThatServes) {
  const std::vector<std::set<std::string>> secrets = DocumentedSecrets();
  ASSERT_GE(secrets.size(), 2u) << "README.md and docs/DEPLOY.md each create the Secret";
  bool token_only = false;
  for (size_t i = 0; i < secrets.size(); ++i) {
    ASSERT_TRUE(secrets[i].count("token")) << "every documented Secret has the token key";
    token_only = token_only || secrets[i].size() == 1;
    SCOPED_TRACE("Secret with keys: " + ::testing::PrintToString(secrets[i]));
    const std::filesystem::path secret = MakeSecret("secret-" + std::to_string(i), secrets[i]);
    const std::string address = "127.0.0.1:" + std::to_string(FreePort("127.0.0.1"));
    // A peer that is not there: the refusal below must come from the missing token, not the node.
    Daemon* pod = StartPod(address, secret, "127.0.0.3:1");
    std::string line;
    ASSERT_TRUE(pod->ReadLine(&line, 60)) << "the pod did not start: " << pod->Stderr();
    ASSERT_THAT(line, HasSubstr("listening on")) << line;
    RunResult health = Ctl(address, {"health"});
    EXPECT_EQ(health.exit_code, 0) << health.out << health.err;
    Upload(address);
    const v1::Job job = Watch(address, {"submit", "--dataset", "lines", "--model", "linear:1",
                                        "--epochs", "2", "--watch"});
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
    if (!secrets[i].count("peer-token")) {
      EXPECT_THAT(pod->Stderr(), HasSubstr("does not exist: this daemon serves"));
      RunResult across =
          Ctl(address, {"submit", "--dataset", "lines", "--model", "linear:1", "--replicas", "2",
                        "--nodes", "127.0.0.3:1", "--device", "cpu"});
      EXPECT_NE(across.exit_code, 0);
      EXPECT_THAT(across.err, HasSubstr("this daemon has no peer token"));
      EXPECT_THAT(across.err, HasSubstr("peer-token' does not exist"));
    }
    pods_.clear();
  }
  EXPECT_TRUE(token_only) << "the one-node steps create the Secret with its token key only";
}

// The docs' steps for one job across nodes: the Secret with both keys, two pods of the DaemonSet
// (each other's peer, as the headless Service names them), and the documented submit (ranks on
// the CPU) train one job with a rank on each pod.
TEST_F(DeployEndToEndTest, TwoPodsTrainOneJobAsTheDocsSubmitIt) {
  std::set<std::string> both;
  for (const std::set<std::string>& keys : DocumentedSecrets()) {
    if (keys.count("peer-token")) both = keys;
  }
  ASSERT_EQ(both, (std::set<std::string>{"peer-token", "token"}))
      << "docs/DEPLOY.md gives the Secret its peer-token key for jobs across nodes";
  const std::filesystem::path secret = MakeSecret("secret", both);
  const std::string a = "127.0.0.1:" + std::to_string(FreePort("127.0.0.1"));
  const std::string b = "127.0.0.2:" + std::to_string(FreePort("127.0.0.2"));
  for (const auto& [self, other] : {std::pair(a, b), std::pair(b, a)}) {
    Daemon* pod = StartPod(self, secret, other);
    std::string line;
    ASSERT_TRUE(pod->ReadLine(&line, 60)) << "the pod did not start: " << pod->Stderr();
    ASSERT_THAT(line, HasSubstr("listening on")) << line;
  }
  Upload(a);
  const v1::Job job = Watch(
      a, {"submit", "--dataset", "lines", "--model", "linear:8,tanh,linear:1", "--batch-size", "16",
          "--epochs", "3", "--replicas", "2", "--nodes", b, "--device", "cpu", "--watch"});
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error() << pods_[0]->Stderr();
  ASSERT_EQ(job.ranks_size(), 2);
  EXPECT_EQ(job.ranks(0).node(), "node-127.0.0.1");  // TRAINERD_NODE_NAME from spec.nodeName
  EXPECT_EQ(job.ranks(1).node(), b);
  EXPECT_EQ(job.ranks(1).device(), "cpu");
}

}  // namespace
}  // namespace trainerd::e2e
