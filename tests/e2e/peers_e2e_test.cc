// End to end, a data-parallel job whose ranks run on several trainerd daemons (--peers, submit
// --nodes) on loopback, each daemon a process of its own with authentication on: the ranks train
// as one rank with the global batch does, repeat bit for bit and say where they ran; what cannot
// run is refused at submit naming the peer and the reason (a missing dataset, credentials the
// peer refuses, a peer that is down, a node that is no peer); and a peer killed (-9) or stopped
// (SIGTERM) mid-job, or a leader killed, ends the job (or the peer's rank) within a bounded time
// while every daemon left keeps serving.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/free_port.h"
#include "tests/e2e/subprocess.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/peers.grpc.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;

constexpr char kLeaderToken[] = "0123456789abcdef0123456789abcdef-leader";
constexpr char kUserToken[] = "0123456789abcdef0123456789abcdef-user00";
constexpr char kOtherToken[] = "0123456789abcdef0123456789abcdef-other0";

using trainerd::testing::FreePort;  // tests/support/free_port.h

class PeersEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-peers-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    tokens_ = Write("tokens", std::string("leader:") + kLeaderToken + " admin\nuser:" + kUserToken +
                                  "\nother:" + kOtherToken + "\n");
    leader_token_ = Write("leader.token", std::string("leader:") + kLeaderToken + "\n");
    user_token_ = Write("user.token", std::string(kUserToken) + "\n");
    other_token_ = Write("other.token", std::string(kOtherToken) + "\n");
  }
  void TearDown() override {
    daemons_.clear();
    std::filesystem::remove_all(dir_);
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // Daemons 0..n-1 on ports chosen now, each a peer of every other, each with `extra` flags.
  void StartAll(int n, const std::vector<std::string>& extra = {}) {
    for (int i = 0; i < n; ++i) addresses_.push_back("127.0.0.1:" + std::to_string(FreePort()));
    daemons_.resize(n);
    for (int i = 0; i < n; ++i) Start(i, extra);
  }

  // `got`'s trained parameters are `want`'s (within float32 rounding of a resumed run's reads).
  static void ExpectSameModel(const v1::Job& got, const v1::Job& want) {
    ASSERT_GT(want.parameters_size(), 0);
    ASSERT_EQ(got.parameters_size(), want.parameters_size());
    for (int p = 0; p < want.parameters_size(); ++p) {
      ASSERT_EQ(got.parameters(p).values_size(), want.parameters(p).values_size());
      for (int v = 0; v < want.parameters(p).values_size(); ++v) {
        const double w = want.parameters(p).values(v);
        EXPECT_NEAR(got.parameters(p).values(v), w, 1e-5 * std::max(1.0, std::fabs(w)))
            << want.parameters(p).name() << "[" << v << "]";
      }
    }
    EXPECT_NEAR(got.final_loss(), want.final_loss(), 1e-6 * want.final_loss());
  }

  // Daemon `i`, each other daemon its peer; with `env` ("NAME=VALUE", a cluster manager's
  // variables), no --peers: the group's directory finds them.
  void Start(int i, const std::vector<std::string>& extra = {},
             const std::vector<std::string>& env = {}) {
    std::string peers;
    for (size_t j = 0; j < addresses_.size() && env.empty(); ++j) {
      if (static_cast<int>(j) == i) continue;
      peers += (peers.empty() ? "" : ",") + addresses_[j];
    }
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "MASTER_ADDR", "-u", "PET_MASTER_ADDR"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {TRAINERD_BIN, "--listen=" + addresses_[i],
                             "--data_dir=" + (dir_ / ("data-" + std::to_string(i))).string(),
                             "--device=cpu", "--metrics_listen=", "--diagnose_at_start=false",
                             "--auth_token_file=" + tokens_, "--peers=" + peers,
                             "--peer_token_file=" + leader_token_, "--collective_timeout=20s",
                             "--shutdown_timeout=5s", "--node_name=node-" + std::to_string(i),
                             // one CPU job at a time, whatever this machine's cores
                             "--max_concurrent_jobs=1"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    daemons_[i] = std::make_unique<Daemon>(argv);
    std::string line;
    ASSERT_TRUE(daemons_[i]->ReadLine(&line, 60))
        << "trainerd " << i << " did not start: " << daemons_[i]->Stderr();
    ASSERT_THAT(line, HasSubstr("listening on")) << line;
  }

  RunResult Ctl(int i, std::vector<std::string> args) { return CtlAs(user_token_, i, args); }
  RunResult CtlAs(const std::string& token_file, int i, std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addresses_[i], "--token-file", token_file});
    return e2e::Run(args);
  }

  // `rows` rows of y = sin(x0 + x1) + x2 * x3 as CSV, uploaded to each daemon of `to` as the
  // caller of `token_file` (the user's when empty).
  void Upload(const std::vector<int>& to, int rows = 240, const std::string& name = "waves",
              const std::string& token_file = "") {
    std::mt19937 rng(5);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::string csv = "a,b,c,d,y\n";
    for (int r = 0; r < rows; ++r) {
      double x[4];
      for (double& v : x) v = normal(rng);
      csv += std::to_string(x[0]) + "," + std::to_string(x[1]) + "," + std::to_string(x[2]) + "," +
             std::to_string(x[3]) + "," + std::to_string(std::sin(x[0] + x[1]) + x[2] * x[3]) +
             "\n";
    }
    const std::string path = Write(name + ".csv", csv);
    for (int i : to) {
      RunResult up = CtlAs(token_file.empty() ? user_token_ : token_file, i,
                           {"dataset", "upload", name, path});
      ASSERT_EQ(up.exit_code, 0) << up.err;
    }
  }

  std::vector<std::string> SpecFlags(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "submit",      "--dataset", "waves", "--model",  "linear:16,tanh,linear:1",
        "--optimizer", "adam",      "--lr",  "0.01",     "--epochs",
        "6",           "--seed",    "21",    "--engine", "libtorch"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // The ranks daemon `i` lists on its CPU for peers (DeviceStatus.peer_ranks), as the caller
  // whose token file is `token_file` sees them.
  std::vector<std::string> PeerRanks(int i, const std::string& token_file) {
    RunResult got = e2e::Run({TRAINCTL_BIN, "--addr", addresses_[i], "--token-file", token_file,
                              "-o", "json", "devices"});
    v1::ListDevicesResponse devices;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &devices).ok())
        << got.out << got.err;
    for (const v1::DeviceStatus& device : devices.devices()) {
      if (device.device() == "cpu") return {device.peer_ranks().begin(), device.peer_ranks().end()};
    }
    return {};
  }

  // The member ids a `sweep` printed (its lines that start with a job id).
  static std::vector<std::string> MemberIds(const std::string& out) {
    std::vector<std::string> ids;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("job-", 0) == 0) ids.push_back(line.substr(0, line.find(' ')));
    }
    return ids;
  }

  v1::Job Get(int i, const std::string& id) {
    RunResult got = Ctl(i, {"-o", "json", "job", "get", id});
    v1::Job job;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &job).ok())
        << got.out << got.err;
    return job;
  }

  // Submits on daemon `i`, follows the job to its end, returns it.
  v1::Job Train(int i, const std::vector<std::string>& extra) {
    std::vector<std::string> args = SpecFlags(extra);
    args.push_back("--watch");
    RunResult run = Ctl(i, args);
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    return Get(i, run.out.substr(0, run.out.find('\n')));
  }

  // Submits on daemon `i` without waiting; the job's id.
  std::string Submit(int i, const std::vector<std::string>& extra) {
    RunResult run = Ctl(i, SpecFlags(extra));
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    return run.out.substr(0, run.out.find('\n'));
  }

  // Every daemon's log, for a failure's message: where a job waited shows there.
  std::string Logs() const {
    std::string out;
    for (size_t i = 0; i < daemons_.size(); ++i) {
      if (daemons_[i] == nullptr) continue;
      const std::string log = daemons_[i]->Stderr();
      out += "\n--- trainerd " + std::to_string(i) + " (last 6000 bytes):\n" +
             log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
    }
    return out;
  }

  v1::Job WaitFor(int i, const std::string& id, int epochs, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    v1::Job job;
    while (std::chrono::steady_clock::now() < deadline) {
      job = Get(i, id);
      if (job.epochs_completed() >= epochs || job.state() == v1::JOB_STATE_SUCCEEDED ||
          job.state() == v1::JOB_STATE_FAILED || job.state() == v1::JOB_STATE_CANCELLED) {
        return job;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return job;
  }

  std::filesystem::path dir_;
  std::string tokens_;
  std::string leader_token_;
  std::string user_token_;
  std::string other_token_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
};

// Three daemons, one rank each: the job trains as one rank with the global batch of 24 does
// (within float32 rounding), again bit for bit, and says where its ranks ran.
TEST_F(PeersEndToEndTest, RanksOnThreeDaemonsTrainAsOneRankWithTheGlobalBatch) {
  StartAll(3);
  Upload({0, 1, 2});
  const std::string nodes = addresses_[1] + "," + addresses_[2];
  const v1::Job one = Train(0, {"--batch-size", "24"});
  const v1::Job ranks = Train(0, {"--batch-size", "8", "--replicas", "3", "--nodes", nodes});
  const v1::Job again = Train(0, {"--batch-size", "8", "--replicas", "3", "--nodes", nodes});
  ASSERT_EQ(one.state(), v1::JOB_STATE_SUCCEEDED) << one.error();
  ASSERT_EQ(ranks.state(), v1::JOB_STATE_SUCCEEDED) << ranks.error();
  ASSERT_EQ(again.state(), v1::JOB_STATE_SUCCEEDED) << again.error();
  ASSERT_EQ(ranks.epochs_size(), 6);
  for (int e = 0; e < 6; ++e) {
    EXPECT_NEAR(ranks.epochs(e).loss(), one.epochs(e).loss(), 1e-5 * one.epochs(e).loss());
    EXPECT_EQ(again.epochs(e).loss(), ranks.epochs(e).loss());  // bit for bit
  }
  EXPECT_EQ(ranks.steps(), one.steps());
  EXPECT_EQ(ranks.host_syncs(), one.host_syncs());  // one transfer per epoch, on the leader
  for (int p = 0; p < one.parameters_size(); ++p) {
    for (int v = 0; v < one.parameters(p).values_size(); ++v) {
      const double want = one.parameters(p).values(v);
      EXPECT_NEAR(ranks.parameters(p).values(v), want, 1e-4 * std::max(1.0, std::fabs(want)));
    }
  }
  ASSERT_EQ(ranks.ranks_size(), 3);
  EXPECT_EQ(ranks.ranks(0).node(), "node-0");
  EXPECT_EQ(ranks.ranks(1).node(), addresses_[1]);
  EXPECT_EQ(ranks.ranks(2).node(), addresses_[2]);
  EXPECT_EQ(ranks.global_batch_size(), 24);
  EXPECT_GT(ranks.report().collective_seconds(), 0.0);
  // The model is the leader's to give: it downloads there.
  RunResult model = Ctl(0, {"job", "model", ranks.id(), "-f", (dir_ / "m.pt").string()});
  EXPECT_EQ(model.exit_code, 0) << model.err;
  EXPECT_GT(std::filesystem::file_size(dir_ / "m.pt"), 100u);
}

// Daemons a cluster manager starts (its variables, no --peers) find each other through node 0's
// directory whatever order they start in, and `--nodes all` puts a job's ranks on every one: it
// trains as one rank with the global batch does. Variables that name a group badly stop the
// daemon at start, naming the variable.
TEST_F(PeersEndToEndTest, DaemonsAClusterManagerStartsFindEachOtherAndTakeEveryNode) {
  for (int i = 0; i < 3; ++i) addresses_.push_back("127.0.0.1:" + std::to_string(FreePort()));
  daemons_.resize(3);
  const std::string port = std::to_string(FreePort());
  // Node 2 with Kubeflow Trainer's PET_ variables, 1 with a torchrun worker's (its WORLD_SIZE and
  // RANK count processes: two a node), 0 with a PyTorchJob's; node 0 last.
  Start(
      2, {},
      {"PET_MASTER_ADDR=127.0.0.1", "PET_MASTER_PORT=" + port, "PET_NNODES=3", "PET_NODE_RANK=2"});
  Start(1, {},
        {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "WORLD_SIZE=6", "RANK=2", "LOCAL_RANK=0",
         "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1", "GROUP_WORLD_SIZE=3"});
  Start(0, {}, {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "WORLD_SIZE=3", "RANK=0"});
  Upload({0, 1, 2});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto knows = [&](int node) {
    return daemons_[0]->Stderr().find("node " + std::to_string(node) + " is at " +
                                      addresses_[node]) != std::string::npos;
  };
  while (!(knows(1) && knows(2)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(knows(1) && knows(2)) << daemons_[0]->Stderr();
  // The group meets over node 0's gRPC on MASTER_PORT, with the peers' credentials only.
  auto join = [&](const std::string& address, const std::string& token, int nodes) {
    auto stub =
        v1::PeerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::JoinGroupRequest request;
    request.set_nodes(nodes);
    request.set_node_rank(1);
    request.set_address(addresses_[1]);
    v1::JoinGroupResponse response;
    const grpc::Status status = stub->JoinGroup(&context, request, &response);
    return std::make_pair(status, response);
  };
  const std::string group = "127.0.0.1:" + port;
  EXPECT_EQ(join(group, "", 3).first.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(join(group, kUserToken, 3).first.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(join(group, kLeaderToken, 4).first.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(join(addresses_[1], kLeaderToken, 3).first.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  const auto [joined, heard] = join(group, kLeaderToken, 3);
  ASSERT_TRUE(joined.ok()) << joined.error_message();
  ASSERT_EQ(heard.nodes_size(), 3);
  EXPECT_EQ(heard.nodes(0).address(), addresses_[0]);
  EXPECT_EQ(heard.nodes(2).address(), addresses_[2]);
  const v1::Job one = Train(0, {"--batch-size", "24"});
  const v1::Job ranks = Train(0, {"--batch-size", "8", "--replicas", "3", "--nodes", "all"});
  ASSERT_EQ(one.state(), v1::JOB_STATE_SUCCEEDED) << one.error();
  ASSERT_EQ(ranks.state(), v1::JOB_STATE_SUCCEEDED) << ranks.error();
  ASSERT_EQ(ranks.epochs_size(), 6);
  for (int e = 0; e < 6; ++e) {
    EXPECT_NEAR(ranks.epochs(e).loss(), one.epochs(e).loss(), 1e-5 * one.epochs(e).loss());
  }
  EXPECT_THAT(ranks.spec().nodes(), ::testing::ElementsAre(addresses_[1], addresses_[2]));
  ASSERT_EQ(ranks.ranks_size(), 3);
  EXPECT_EQ(ranks.ranks(1).node(), addresses_[1]);
  EXPECT_EQ(ranks.ranks(2).node(), addresses_[2]);
  // Two ranks take one node: the first the daemon knows.
  const v1::Job two = Train(0, {"--batch-size", "12", "--replicas", "2", "--nodes", "all"});
  ASSERT_EQ(two.state(), v1::JOB_STATE_SUCCEEDED) << two.error();
  EXPECT_THAT(two.spec().nodes(), ::testing::ElementsAre(addresses_[1]));
  // A group named without its size: the daemon does not start, and says which variable.
  RunResult bad = e2e::Run({"/usr/bin/env", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                            "RANK=1", TRAINERD_BIN, "--listen=127.0.0.1:0", "--device=cpu",
                            "--data_dir=" + (dir_ / "bad").string()});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("$WORLD_SIZE is not set"));
  // torchrun's process counts are not nodes: its fourth process of a node does not start as node
  // 3 of 16, and says why.
  RunResult process =
      e2e::Run({"/usr/bin/env", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "WORLD_SIZE=16",
                "RANK=3", "LOCAL_RANK=3", TRAINERD_BIN, "--listen=127.0.0.1:0", "--device=cpu",
                "--data_dir=" + (dir_ / "bad").string()});
  EXPECT_EQ(process.exit_code, 2);
  EXPECT_THAT(process.err, HasSubstr("$LOCAL_RANK=3 says this is process 3 of its node"));
}

// A sweep spread over two daemons (--nodes without --replicas): its members go round them, each
// trains whole where it lands (those on the peer packed there, as one sweep of the peer's) and
// ends with the results of the same job submitted alone; the
// leader keeps every member's record and model, and nothing of them stays on the peer.
TEST_F(PeersEndToEndTest, ASweepSpreadOverDaemonsGivesEachMemberTheResultsOfTheMemberAlone) {
  StartAll(2);
  Upload({0, 1});
  RunResult run =
      Ctl(0, {"sweep",       "--dataset", "waves",   "--model",      "linear:16,tanh,linear:1",
              "--optimizer", "adam",      "--lr",    "0.01,0.03",    "--seed",
              "3,4",         "--epochs",  "5",       "--batch-size", "16",
              "--engine",    "libtorch",  "--nodes", "all",          "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("4 succeeded, 0 failed, 0 cancelled"));
  const std::vector<std::string> ids = MemberIds(run.out);
  ASSERT_EQ(ids.size(), 4u) << run.out;
  int on_peer = 0;
  std::set<std::string> sweep_requests_there;
  std::set<int> places_there;
  for (const std::string& id : ids) {
    const v1::Job member = Get(0, id);
    ASSERT_EQ(member.state(), v1::JOB_STATE_SUCCEEDED) << member.error();
    const bool there = member.spec().nodes_size() == 1;
    if (there) {
      ++on_peer;
      EXPECT_EQ(member.spec().nodes(0), addresses_[1]);
      ASSERT_EQ(member.ranks_size(), 1);
      EXPECT_EQ(member.ranks(0).node(), addresses_[1]);
      EXPECT_EQ(member.ranks(0).device(), "cpu");
      // Sent there with the other member dealt to the peer, as one sweep: packed there.
      EXPECT_EQ(member.report().packed_members(), 2);
      places_there.insert(member.ranks(0).sweep_member());
      sweep_requests_there.insert(member.ranks(0).request_id());
      EXPECT_THAT(Ctl(0, {"job", "get", id}).out, HasSubstr("cpu on " + addresses_[1]));
    }
    // The same job alone, on the leader: the member's every epoch, bit for bit.
    const v1::Job alone =
        Train(0, {"--lr", std::to_string(member.spec().optimizer().learning_rate()), "--seed",
                  std::to_string(member.spec().seed()), "--epochs", "5", "--batch-size", "16"});
    ASSERT_EQ(alone.state(), v1::JOB_STATE_SUCCEEDED) << alone.error();
    ASSERT_EQ(member.epochs_size(), 5);
    for (int e = 0; e < 5; ++e) {
      EXPECT_NEAR(member.epochs(e).loss(), alone.epochs(e).loss(), 1e-6 * alone.epochs(e).loss())
          << id << (there ? " on the peer" : " here") << ", epoch " << e + 1;
    }
    EXPECT_EQ(member.steps(), alone.steps());
    // Its model is the leader's to give, wherever it trained.
    RunResult model = Ctl(0, {"job", "model", id, "-f", (dir_ / (id + ".pt")).string()});
    EXPECT_EQ(model.exit_code, 0) << model.err;
    EXPECT_GT(std::filesystem::file_size(dir_ / (id + ".pt")), 100u);
    // Its state_dict too, under the leader's id for it.
    const std::string state_path = (dir_ / (id + ".safetensors")).string();
    RunResult state = Ctl(0, {"job", "model", id, "--format", "safetensors", "-f", state_path});
    ASSERT_EQ(state.exit_code, 0) << state.err;
    std::ifstream state_file(state_path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(state_file)),
                            std::istreambuf_iterator<char>());
    const absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(bytes);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_THAT(parsed->metadata, ::testing::Contains(::testing::Pair("trainerd.job", id)));
    EXPECT_EQ(parsed->tensors.size(), 4u);  // 0.weight, 0.bias, 2.weight, 2.bias
  }
  EXPECT_EQ(on_peer, 2);  // members 1 and 3 of 0-3
  EXPECT_EQ(sweep_requests_there.size(), 1u);
  EXPECT_THAT(places_there, ::testing::ElementsAre(1, 2));
  // Nothing of the members stays on the peer.
  RunResult listed = e2e::Run({TRAINCTL_BIN, "--addr", addresses_[1], "--token-file", leader_token_,
                               "job", "list", "--all"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, ::testing::Not(HasSubstr("job-"))) << listed.out;
}

// A spread sweep's members may vary any field, as a sweep's on one daemon may: those with a model
// of their own train it on the peer too (sent as a point with its spec and fields), each the same
// job alone; members of one shape still pack there.
TEST_F(PeersEndToEndTest, ASpreadSweepsMembersOfTheirOwnModelTrainItOnThePeer) {
  StartAll(2);
  Upload({0, 1});
  const std::string points = Write("points.csv",
                                   "lr,model\n"
                                   "0.01,\"linear:16,tanh,linear:1\"\n"
                                   "0.01,\"linear:8,tanh,linear:1\"\n"
                                   "0.03,\"linear:16,tanh,linear:1\"\n"
                                   "0.03,\"linear:8,tanh,linear:1\"\n");
  RunResult run =
      Ctl(0, {"sweep",       "--dataset", "waves",    "--model",      "linear:16,tanh,linear:1",
              "--optimizer", "adam",      "--points", points,         "--seed",
              "3",           "--epochs",  "4",        "--batch-size", "16",
              "--engine",    "libtorch",  "--nodes",  "all",          "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("4 succeeded, 0 failed, 0 cancelled"));
  const std::vector<std::string> ids = MemberIds(run.out);
  ASSERT_EQ(ids.size(), 4u) << run.out;
  int narrow_on_peer = 0;
  for (const std::string& id : ids) {
    const v1::Job member = Get(0, id);
    ASSERT_EQ(member.state(), v1::JOB_STATE_SUCCEEDED) << member.error();
    const bool there = member.spec().nodes_size() == 1;
    const bool narrow = member.spec().model() == "linear:8,tanh,linear:1";
    if (there && narrow) ++narrow_on_peer;
    // Members 2 and 4 (the narrow ones) went to the peer, one pack of one shape there.
    EXPECT_EQ(there, narrow) << id;
    if (there) {
      EXPECT_EQ(member.report().packed_members(), 2);
    }
    const v1::Job alone = Train(0, {"--model", member.spec().model(), "--lr",
                                    std::to_string(member.spec().optimizer().learning_rate()),
                                    "--seed", "3", "--epochs", "4", "--batch-size", "16"});
    ASSERT_EQ(alone.state(), v1::JOB_STATE_SUCCEEDED) << alone.error();
    ASSERT_EQ(member.epochs_size(), 4);
    for (int e = 0; e < 4; ++e) {
      EXPECT_NEAR(member.epochs(e).loss(), alone.epochs(e).loss(), 1e-6 * alone.epochs(e).loss())
          << id << (there ? " on the peer" : " here") << ", epoch " << e + 1;
    }
  }
  EXPECT_EQ(narrow_on_peer, 2);
}

// A spread sweep's member on the peer cancelled on the leader ends CANCELLED, there as here; one
// whose peer is killed fails naming the peer; a node without the dataset gets it from the leader
// at submit (checksummed there), once, and the member trains on it there.
TEST_F(PeersEndToEndTest, ASpreadSweepsMemberOnAPeerCancelsOrFailsThereAndANodeWithoutDataGetsIt) {
  StartAll(3);
  Upload({0, 1}, 6000);
  const std::vector<std::string> sweep = {
      "sweep", "--dataset", "waves",    "--model", "linear:16,tanh,linear:1",
      "--lr",  "0.01,0.03", "--epochs", "500",     "--batch-size",
      "16",    "--engine",  "libtorch", "--nodes"};
  auto dataset_on = [&](int i) {
    v1::Dataset dataset;
    // The submitter's dataset, as the leader's admin identity names it.
    RunResult got = e2e::Run({TRAINCTL_BIN, "--addr", addresses_[i], "--token-file", leader_token_,
                              "-o", "json", "dataset", "get", "user/waves"});
    EXPECT_EQ(got.exit_code, 0) << got.err;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &dataset).ok()) << got.out;
    return dataset;
  };
  for (int twice = 0; twice < 2; ++twice) {
    RunResult sent = Ctl(
        0, {"sweep", "--dataset", "waves", "--model", "linear:4,tanh,linear:1", "--lr", "0.01,0.03",
            "--epochs", "2", "--batch-size", "64", "--nodes", addresses_[2], "--watch"});
    ASSERT_EQ(sent.exit_code, 0) << sent.out << sent.err;
    EXPECT_THAT(sent.out, HasSubstr("2 succeeded"));
  }
  const v1::Dataset on_leader = dataset_on(0);
  const v1::Dataset copied = dataset_on(2);
  EXPECT_EQ(copied.sha256(), on_leader.sha256());
  EXPECT_EQ(copied.row_count(), 6000);
  EXPECT_EQ(copied.owner(), "user");  // the submitter's there, as a copy for peer jobs
  EXPECT_TRUE(copied.peer_copy());
  EXPECT_FALSE(on_leader.peer_copy());
  const std::string leader_log = daemons_[0]->Stderr();
  size_t copies = 0;
  for (size_t at = leader_log.find("sent to peer"); at != std::string::npos;
       at = leader_log.find("sent to peer", at + 1)) {
    ++copies;
  }
  EXPECT_EQ(copies, 1u) << leader_log;  // once: the second sweep found it there
  std::vector<std::string> spread = sweep;
  spread.push_back(addresses_[1]);
  RunResult run = Ctl(0, spread);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<std::string> ids = MemberIds(run.out);
  ASSERT_EQ(ids.size(), 2u) << run.out;
  const std::string there = Get(0, ids[0]).spec().nodes_size() == 1 ? ids[0] : ids[1];
  ASSERT_EQ(WaitFor(0, there, 2, 60).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Ctl(0, {"job", "cancel", ids[0] == there ? ids[1] : ids[0]}).exit_code, 0);
  EXPECT_EQ(Ctl(0, {"job", "cancel", there}).exit_code, 0);
  const v1::Job ended = WaitFor(0, there, 1 << 30, 30);
  EXPECT_EQ(ended.state(), v1::JOB_STATE_CANCELLED) << ended.error();
  EXPECT_LT(ended.epochs_completed(), 500);
  // There it was cancelled too, and deleted once read: nothing of it goes on or stays.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string log;
  while (std::chrono::steady_clock::now() < deadline) {
    log = daemons_[1]->Stderr();
    if (log.find("deleted with its model") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(log, HasSubstr("deleted with its model"));
  RunResult listed = e2e::Run({TRAINCTL_BIN, "--addr", addresses_[1], "--token-file", leader_token_,
                               "job", "list", "--all"});
  EXPECT_THAT(listed.out, ::testing::Not(HasSubstr("job-"))) << listed.out;
  // A peer killed while a member trains there fails that member, naming the peer, at once.
  RunResult again = Ctl(0, spread);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const std::vector<std::string> second = MemberIds(again.out);
  ASSERT_EQ(second.size(), 2u) << again.out;
  const std::string lost = Get(0, second[0]).spec().nodes_size() == 1 ? second[0] : second[1];
  ASSERT_EQ(WaitFor(0, lost, 2, 60).state(), v1::JOB_STATE_RUNNING);
  daemons_[1]->Stop(SIGKILL, 30);
  const v1::Job failed = WaitFor(0, lost, 1 << 30, 30);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("peer " + addresses_[1] + " cannot be reached"));
  EXPECT_EQ(Ctl(0, {"job", "cancel", lost == second[0] ? second[1] : second[0]}).exit_code, 0);
}

// The leader stopped (SIGTERM), then killed (-9), while a spread sweep's member trains on the
// peer: the member goes on there, and each next start of the leader takes it up again by its id
// there (Job.ranks[0].job_id), reading its epochs from the first. It trains there once, to the
// results of the member alone, and nothing of it stays on the peer.
TEST_F(PeersEndToEndTest, ASpreadSweepsMemberOnAPeerGoesOnThereWhileItsLeaderRestarts) {
  StartAll(2);
  Upload({0, 1}, 6000);
  constexpr int kEpochs = 150;
  RunResult run =
      Ctl(0, {"sweep", "--dataset", "waves", "--model", "linear:16,tanh,linear:1", "--optimizer",
              "adam", "--lr", "0.01,0.03", "--seed", "9", "--epochs", std::to_string(kEpochs),
              "--batch-size", "16", "--engine", "libtorch", "--nodes", addresses_[1]});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<std::string> ids = MemberIds(run.out);
  ASSERT_EQ(ids.size(), 2u) << run.out;
  const std::string there = Get(0, ids[0]).spec().nodes_size() == 1 ? ids[0] : ids[1];
  const v1::Job started = WaitFor(0, there, 2, 60);
  ASSERT_EQ(started.state(), v1::JOB_STATE_RUNNING) << started.error();
  ASSERT_EQ(started.ranks_size(), 1);
  const std::string peer_id = started.ranks(0).job_id();
  ASSERT_EQ(peer_id.rfind("job-", 0), 0u) << peer_id;
  // The peer's job, as the leader's credentials read it there.
  auto on_peer = [&]() -> RunResult {
    return e2e::Run({TRAINCTL_BIN, "--addr", addresses_[1], "--token-file", leader_token_, "-o",
                     "json", "job", "get", peer_id});
  };
  auto epochs_on_peer = [&] {
    v1::Job job;
    RunResult got = on_peer();
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &job).ok()) << got.err;
    EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.error();
    return job.epochs_completed();
  };
  // Stopped: the member is left training there, RUNNING here.
  EXPECT_EQ(daemons_[0]->Stop(SIGTERM, 60), 0) << daemons_[0]->Stderr();
  // It goes on while the leader is down (polled: on a loaded machine an epoch may take seconds).
  const int before = epochs_on_peer();
  int later = before;
  for (int i = 0; i < 600 && later <= before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    later = epochs_on_peer();
  }
  EXPECT_GT(later, before);
  Start(0);
  // Taken up again: the epochs so far, then new ones; killed, it is found again once more.
  const v1::Job again = WaitFor(0, there, epochs_on_peer() + 2, 60);
  ASSERT_EQ(again.state(), v1::JOB_STATE_RUNNING) << again.error();
  EXPECT_EQ(again.ranks(0).job_id(), peer_id);
  daemons_[0]->Stop(SIGKILL, 30);
  EXPECT_GT(epochs_on_peer(), 0);
  Start(0);
  const v1::Job ended = WaitFor(0, there, 1 << 30, 120);
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  ASSERT_EQ(ended.epochs_size(), kEpochs);
  EXPECT_EQ(ended.restarts_size(), 2);
  EXPECT_EQ(ended.ranks(0).job_id(), peer_id);
  EXPECT_EQ(ended.ranks(0).node(), addresses_[1]);
  EXPECT_THAT(Ctl(0, {"job", "get", there}).out, HasSubstr(addresses_[1] + " as " + peer_id));
  const v1::Job alone =
      Train(0, {"--lr", std::to_string(ended.spec().optimizer().learning_rate()), "--seed", "9",
                "--epochs", std::to_string(kEpochs), "--batch-size", "16"});
  ASSERT_EQ(alone.state(), v1::JOB_STATE_SUCCEEDED) << alone.error();
  for (int e = 0; e < kEpochs; ++e) {
    EXPECT_NEAR(ended.epochs(e).loss(), alone.epochs(e).loss(), 1e-6 * alone.epochs(e).loss());
  }
  // Its end read, it was deleted there.
  RunResult gone = on_peer();
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_THAT(gone.err, HasSubstr("not found")) << gone.out;

  // A cancel the leader recorded but could not pass on before it was killed (the peer paused):
  // its next start finds the member there and cancels it there, and nothing of it stays.
  RunResult next = Ctl(0, {"sweep", "--dataset", "waves", "--model", "linear:16,tanh,linear:1",
                           "--lr", "0.01,0.03", "--epochs", "5000", "--batch-size", "16",
                           "--engine", "libtorch", "--nodes", addresses_[1]});
  ASSERT_EQ(next.exit_code, 0) << next.err;
  const std::vector<std::string> more = MemberIds(next.out);
  ASSERT_EQ(more.size(), 2u) << next.out;
  const std::string far = Get(0, more[0]).spec().nodes_size() == 1 ? more[0] : more[1];
  const v1::Job running = WaitFor(0, far, 2, 60);
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.error();
  const std::string far_id = running.ranks(0).job_id();
  ASSERT_EQ(::kill(daemons_[1]->pid(), SIGSTOP), 0);
  EXPECT_EQ(Ctl(0, {"job", "cancel", far}).exit_code, 0);
  daemons_[0]->Stop(SIGKILL, 30);
  ASSERT_EQ(::kill(daemons_[1]->pid(), SIGCONT), 0);
  Start(0);
  const v1::Job cancelled = WaitFor(0, far, 1 << 30, 60);
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED) << cancelled.error();
  EXPECT_EQ(cancelled.ranks(0).job_id(), far_id);
  RunResult far_gone = e2e::Run(
      {TRAINCTL_BIN, "--addr", addresses_[1], "--token-file", leader_token_, "job", "get", far_id});
  EXPECT_NE(far_gone.exit_code, 0);
  EXPECT_THAT(far_gone.err, HasSubstr("not found")) << far_gone.out;
  EXPECT_EQ(Ctl(0, {"job", "cancel", far == more[0] ? more[1] : more[0]}).exit_code, 0);
}

// What cannot run on the peers is refused at submit, naming the peer and the reason, and nothing
// is queued.
TEST_F(PeersEndToEndTest, WhatThePeersCannotRunIsRefusedAtSubmitNamingThePeer) {
  StartAll(3);
  Upload({0, 1});
  Upload({2}, 100);  // another dataset of that name
  RunResult other = Ctl(0, SpecFlags({"--replicas", "2", "--nodes", addresses_[2]}));
  EXPECT_NE(other.exit_code, 0);
  EXPECT_THAT(other.err, HasSubstr("dataset 'waves' on peer " + addresses_[2]));
  EXPECT_THAT(other.err, HasSubstr("is not this daemon's"));
  {
    // Nothing of the dataset there is shown: not its SHA-256.
    RunResult there = e2e::Run({TRAINCTL_BIN, "--addr", addresses_[2], "--token-file",
                                leader_token_, "-o", "json", "dataset", "get", "user/waves"});
    v1::Dataset theirs;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(there.out, &theirs).ok()) << there.out;
    ASSERT_EQ(theirs.sha256().size(), 64u);
    EXPECT_EQ(other.err.find(theirs.sha256()), std::string::npos) << other.err;
  }

  RunResult stranger = Ctl(0, SpecFlags({"--replicas", "2", "--nodes", "127.0.0.1:1"}));
  EXPECT_NE(stranger.exit_code, 0);
  EXPECT_THAT(stranger.err, HasSubstr("is not one of this daemon's --peers"));

  RunResult no_replicas = Ctl(0, SpecFlags({"--nodes", addresses_[1]}));
  EXPECT_EQ(no_replicas.exit_code, 2);  // refused before anything was sent
  EXPECT_THAT(no_replicas.err, HasSubstr("--replicas"));

  // A peer that is down.
  daemons_[2]->Stop(SIGKILL, 30);
  RunResult down = Ctl(0, SpecFlags({"--replicas", "2", "--nodes", addresses_[2]}));
  EXPECT_NE(down.exit_code, 0);
  EXPECT_THAT(down.err, HasSubstr("peer " + addresses_[2] + " cannot be reached"));

  // A leader whose token the peer does not accept as an admin's: refused at submit, before
  // anything is sent there (a tenant's token could upload in that tenant's name only).
  const std::string wrong = Write("wrong.token", std::string("user:") + kUserToken + "\n");
  daemons_[0].reset();
  Start(0, {"--peer_token_file=" + wrong});
  Upload({0}, 240, "unsent");
  RunResult refused = Ctl(0, {"submit", "--dataset", "unsent", "--model", "linear:1", "--epochs",
                              "1", "--replicas", "2", "--nodes", addresses_[1]});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("does not take this daemon's peer credentials as an admin's"));
  EXPECT_THAT(refused.err, HasSubstr("--peer_token_file"));
  EXPECT_THAT(Ctl(0, {"job", "list", "--all"}).out, ::testing::Not(HasSubstr("job-")));
  RunResult peers_datasets = Ctl(1, {"dataset", "list", "-o", "name"});
  EXPECT_THAT(peers_datasets.out, ::testing::Not(HasSubstr("unsent"))) << peers_datasets.out;

  RunResult list = Ctl(1, {"job", "list"});
  EXPECT_EQ(list.exit_code, 0) << list.err;  // the peer serves on

  // A rank's peer that lacks the dataset gets it from the leader at submit, and the job trains.
  Upload({0}, 240, "solo");
  daemons_[0].reset();
  Start(0);
  RunResult solo =
      Ctl(0, {"submit", "--dataset", "solo", "--model", "linear:8,tanh,linear:1", "--epochs", "3",
              "--seed", "4", "--engine", "libtorch", "--replicas", "2", "--nodes", addresses_[1]});
  ASSERT_EQ(solo.exit_code, 0) << solo.err;
  const v1::Job trained = WaitFor(0, solo.out.substr(0, solo.out.find('\n')), 99, 60);
  EXPECT_EQ(trained.state(), v1::JOB_STATE_SUCCEEDED) << trained.error();
  ASSERT_EQ(trained.ranks_size(), 2);
  EXPECT_EQ(trained.ranks(1).node(), addresses_[1]);
}

// Admission and the tenant's quotas come first: at her job quota on the leader, a submit with
// nodes is refused before anything reaches the peer. Once admitted, the dataset goes to the peer
// as her copy there (in her names, marked a copy for peer jobs, under her quotas there: at her
// dataset quota there the submit is refused naming it), and the peer deletes the copy once no job
// has used it for its --peer_copy_retention (8 s here).
TEST_F(PeersEndToEndTest, CopiesToAPeerComeAfterAdmissionAreTheTenantsAndGoWhenIdle) {
  for (int i = 0; i < 2; ++i) addresses_.push_back("127.0.0.1:" + std::to_string(FreePort()));
  daemons_.resize(2);
  Start(0, {"--max_jobs_per_caller=1"});
  Start(1, {"--peer_copy_retention=8s", "--max_datasets_per_caller=1"});
  Upload({0});
  Upload({0}, 240, "solo");
  const std::vector<std::string> on_solo = {
      "submit",   "--dataset",  "solo",   "--model", "linear:8,tanh,linear:1",
      "--epochs", "2",          "--seed", "4",       "--engine",
      "libtorch", "--replicas", "2",      "--nodes", addresses_[1]};
  auto peers_datasets = [&](const std::string& token_file) {
    return CtlAs(token_file, 1, {"dataset", "list", "-o", "name"}).out;
  };
  // At her quota (one long job): refused on the leader, and nothing was sent.
  const std::string blocker = Submit(0, {"--epochs", "100000"});
  RunResult at_quota = Ctl(0, on_solo);
  EXPECT_NE(at_quota.exit_code, 0);
  EXPECT_THAT(at_quota.err, HasSubstr("--max_jobs_per_caller"));
  EXPECT_EQ(peers_datasets(leader_token_), "") << "the peer got something";
  EXPECT_EQ(Ctl(0, {"job", "cancel", blocker}).exit_code, 0);
  WaitFor(0, blocker, 1 << 30, 30);

  // Admitted: the copy is hers there.
  RunResult sent = Ctl(0, on_solo);
  ASSERT_EQ(sent.exit_code, 0) << sent.err;
  const v1::Job trained = WaitFor(0, sent.out.substr(0, sent.out.find('\n')), 1 << 30, 60);
  EXPECT_EQ(trained.state(), v1::JOB_STATE_SUCCEEDED) << trained.error();
  EXPECT_EQ(trained.spec().node_dataset(), "user/solo");
  RunResult copy = Ctl(1, {"-o", "json", "dataset", "get", "solo"});
  v1::Dataset there;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(copy.out, &there).ok()) << copy.out;
  EXPECT_EQ(there.owner(), "user");
  EXPECT_TRUE(there.peer_copy());
  EXPECT_EQ(peers_datasets(leader_token_), "user/solo\n");
  // Her dataset quota there holds: a second dataset of hers cannot be sent.
  RunResult over = Ctl(0, SpecFlags({"--replicas", "2", "--nodes", addresses_[1]}));
  EXPECT_NE(over.exit_code, 0);
  EXPECT_THAT(over.err, HasSubstr("--max_datasets_per_caller"));
  EXPECT_THAT(over.err, HasSubstr("dataset 'waves' is not on peer " + addresses_[1]));

  // Idle for 8 s, the copy goes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (peers_datasets(user_token_) != "" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(peers_datasets(user_token_), "");
  EXPECT_THAT(daemons_[1]->Stderr(), HasSubstr("a copy a peer made for its jobs, deleted"));
}

// Names are per tenant on a peer too: another tenant's "waves" there, with other bytes, does not
// refuse (nor otherwise tell) the user anything when her own "waves" is sent there; a dataset
// another tenant shared with her on the leader goes there as hers, under a name of its own.
TEST_F(PeersEndToEndTest, APeerTellsATenantNothingOfAnotherTenantsDatasets) {
  StartAll(2);
  Upload({1}, 100, "waves", other_token_);  // other's, on the peer only
  Upload({0});                              // the user's, on the leader only
  const v1::Job own = Train(0, {"--replicas", "2", "--nodes", addresses_[1]});
  EXPECT_EQ(own.state(), v1::JOB_STATE_SUCCEEDED) << own.error();
  EXPECT_EQ(own.spec().dataset(), "waves");
  EXPECT_EQ(own.spec().node_dataset(), "user/waves");
  RunResult others = CtlAs(other_token_, 1, {"-o", "json", "dataset", "get", "waves"});
  v1::Dataset theirs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(others.out, &theirs).ok()) << others.out;
  EXPECT_EQ(theirs.row_count(), 100);  // untouched
  EXPECT_FALSE(theirs.peer_copy());

  // Other's dataset shared with her on the leader: sent as hers, named with its checksum.
  Upload({0}, 300, "shared", other_token_);
  ASSERT_EQ(CtlAs(other_token_, 0, {"dataset", "share", "shared"}).exit_code, 0);
  RunResult described = Ctl(0, {"-o", "json", "dataset", "get", "other/shared"});
  v1::Dataset shared;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(described.out, &shared).ok())
      << described.out;
  RunResult run = Ctl(0, {"submit", "--dataset", "other/shared", "--model", "linear:1", "--epochs",
                          "1", "--replicas", "2", "--nodes", addresses_[1]});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const v1::Job on_shared = WaitFor(0, run.out.substr(0, run.out.find('\n')), 1 << 30, 60);
  EXPECT_EQ(on_shared.state(), v1::JOB_STATE_SUCCEEDED) << on_shared.error();
  EXPECT_EQ(on_shared.spec().dataset(), "other/shared");
  const std::string copy_name = "shared-" + shared.sha256().substr(0, 16);
  EXPECT_EQ(on_shared.spec().node_dataset(), "user/" + copy_name);
  EXPECT_EQ(CtlAs(user_token_, 1, {"dataset", "list", "-o", "name"}).out, copy_name + "\nwaves\n");
  EXPECT_EQ(CtlAs(other_token_, 1, {"dataset", "list", "-o", "name"}).out, "waves\n");
}

// A peer killed mid-job: the leader's job fails within the bounded time naming the rank; both
// survivors serve on and train the next job.
TEST_F(PeersEndToEndTest, APeerKilledOrStoppedMidJobFailsTheJobNamingTheRank) {
  StartAll(3);
  Upload({0, 1, 2}, 6000);
  for (const int signal : {SIGKILL, SIGTERM}) {
    const int peer = signal == SIGKILL ? 1 : 2;
    SCOPED_TRACE(signal == SIGKILL ? "kill -9" : "SIGTERM");
    const std::string id = Submit(0, {"--epochs", "500", "--batch-size", "16", "--replicas", "2",
                                      "--nodes", addresses_[peer]});
    const v1::Job running = WaitFor(0, id, 2, 60);
    ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.error();
    const auto stopped = std::chrono::steady_clock::now();
    if (signal == SIGKILL) {
      daemons_[peer]->Stop(SIGKILL, 30);
    } else {
      EXPECT_EQ(daemons_[peer]->Stop(SIGTERM, 60), 0) << daemons_[peer]->Stderr();
    }
    const v1::Job ended = WaitFor(0, id, 1 << 30, 40);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    EXPECT_EQ(ended.state(), v1::JOB_STATE_FAILED) << ended.error() << daemons_[0]->Stderr();
    EXPECT_THAT(ended.error(), HasSubstr("rank 1"));
    EXPECT_LT(seconds, 30);  // within the collective timeout (20 s), never a hang
    // SIGTERM: the peer's rank stops after its step and says why; kill -9: its connections close.
    EXPECT_THAT(ended.error(), signal == SIGTERM
                                   ? HasSubstr("stopped the job: the daemon there is stopping")
                                   : HasSubstr("peer " + addresses_[peer] + " cannot be reached"));
  }
  // The leader serves on and trains the next job.
  const v1::Job next = Train(0, {"--batch-size", "64", "--epochs", "1"});
  EXPECT_EQ(next.state(), v1::JOB_STATE_SUCCEEDED) << next.error();
}

// A peer lost mid-job, with checkpoints: once, the job goes on from its last checkpoint with that
// peer's rank on the leader (a new attempt), and ends as the job without the loss does.
TEST_F(PeersEndToEndTest, APeerLostMidJobWithCheckpointsGoesOnWithoutItFromTheLastCheckpoint) {
  StartAll(2);
  Upload({0, 1}, 6000);
  const std::vector<std::string> flags = {"--epochs",           "30", "--batch-size", "16",
                                          "--replicas",         "2",  "--nodes",      addresses_[1],
                                          "--checkpoint-every", "5"};
  const v1::Job reference = WaitFor(0, Submit(0, flags), 1 << 30, 120);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.error();
  const std::string id = Submit(0, flags);
  const v1::Job midway = WaitFor(0, id, 7, 60);
  ASSERT_EQ(midway.state(), v1::JOB_STATE_RUNNING) << midway.error();
  daemons_[1]->Stop(SIGKILL, 30);
  const v1::Job ended = WaitFor(0, id, 1 << 30, 120);
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  ASSERT_EQ(ended.restarts_size(), 1);
  EXPECT_GE(ended.restarts(0).from_epoch(), 5);
  EXPECT_EQ(ended.restarts(0).from_epoch() % 5, 0);
  ASSERT_EQ(ended.epochs_size(), 30);
  for (int e = 0; e < 30; ++e) {
    EXPECT_EQ(ended.epochs(e).epoch(), e + 1);
    EXPECT_NEAR(ended.epochs(e).loss(), reference.epochs(e).loss(),
                1e-6 * reference.epochs(e).loss());
  }
  ASSERT_EQ(ended.ranks_size(), 2);
  EXPECT_EQ(ended.ranks(1).node(), "node-0");  // the lost peer's rank, now on the leader
  const std::string log = daemons_[0]->Stderr();
  EXPECT_THAT(log, HasSubstr("lost its peer " + addresses_[1]));
}

// A data-parallel job across daemons taken up from its checkpoint ends with the model of the
// uninterrupted job: every rank resumes from the same checkpoint (the peer's from the bytes the
// leader sends it), whether the leader was killed (-9) or drained (SIGTERM, as a DaemonSet's
// rolling update does) and restarted. Before, the peer's rank started again at epoch 1 with fresh
// weights beside a resumed rank 0, and the job reported SUCCEEDED with another model.
TEST_F(PeersEndToEndTest, AJobTakenUpAfterItsLeaderRestartsEndsWithTheUninterruptedModel) {
  StartAll(2);
  Upload({0, 1}, 3000);
  const std::vector<std::string> flags = {"--epochs",           "12", "--batch-size", "16",
                                          "--replicas",         "2",  "--nodes",      addresses_[1],
                                          "--checkpoint-every", "2"};
  const v1::Job reference = WaitFor(0, Submit(0, flags), 1 << 30, 120);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.error();
  for (const int signal : {SIGKILL, SIGTERM}) {
    SCOPED_TRACE(signal == SIGKILL ? "leader killed" : "leader drained");
    const std::string id = Submit(0, flags);
    const v1::Job midway = WaitFor(0, id, 3, 60);
    ASSERT_EQ(midway.state(), v1::JOB_STATE_RUNNING) << midway.error();
    ASSERT_LT(midway.epochs_completed(), 12) << "the job ended before the leader could stop";
    if (signal == SIGKILL) {
      daemons_[0]->Stop(SIGKILL, 30);
    } else {
      EXPECT_EQ(daemons_[0]->Stop(SIGTERM, 60), 0) << daemons_[0]->Stderr();
    }
    Start(0);
    const v1::Job ended = WaitFor(0, id, 1 << 30, 120);
    ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
    EXPECT_GE(ended.restarts_size(), 1);
    ASSERT_EQ(ended.epochs_size(), 12);
    for (int e = 0; e < 12; ++e) {
      EXPECT_NEAR(ended.epochs(e).loss(), reference.epochs(e).loss(),
                  1e-6 * reference.epochs(e).loss());
    }
    ExpectSameModel(ended, reference);
    ASSERT_EQ(ended.ranks_size(), 2);
    EXPECT_EQ(ended.ranks(1).node(), addresses_[1]);  // the peer trained its rank again
    EXPECT_THAT(daemons_[1]->Stderr(), HasSubstr("from its checkpoint ("));
  }
}

// Three daemons, one rank each, one peer killed mid-job: the job goes on from its last checkpoint
// with that peer's rank on the leader and the other peer's rank resuming from the same checkpoint,
// and ends with the uninterrupted job's model.
TEST_F(PeersEndToEndTest, AJobOfThreeDaemonsThatLosesOneEndsWithTheUninterruptedModel) {
  StartAll(3);
  Upload({0, 1, 2}, 3000);
  const std::vector<std::string> flags = {
      "--epochs",           "12", "--batch-size", "16",
      "--replicas",         "3",  "--nodes",      addresses_[1] + "," + addresses_[2],
      "--checkpoint-every", "2"};
  const v1::Job reference = WaitFor(0, Submit(0, flags), 1 << 30, 120);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.error() << Logs();
  const std::string id = Submit(0, flags);
  const v1::Job midway = WaitFor(0, id, 3, 60);
  ASSERT_EQ(midway.state(), v1::JOB_STATE_RUNNING) << midway.error() << Logs();
  ASSERT_LT(midway.epochs_completed(), 12) << "the job ended before the peer could be killed";
  daemons_[2]->Stop(SIGKILL, 30);
  const v1::Job ended = WaitFor(0, id, 1 << 30, 120);
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error() << Logs();
  ASSERT_EQ(ended.restarts_size(), 1) << Logs();
  ASSERT_EQ(ended.epochs_size(), 12) << Logs();
  ExpectSameModel(ended, reference);
  ASSERT_EQ(ended.ranks_size(), 3) << Logs();
  EXPECT_EQ(ended.ranks(1).node(), addresses_[1]) << Logs();
  EXPECT_EQ(ended.ranks(2).node(), "node-0") << Logs();
  EXPECT_THAT(daemons_[1]->Stderr(), HasSubstr("from its checkpoint (")) << Logs();
  if (std::getenv("TRAINERD_TEST_PRINT_LOGS") != nullptr) std::cerr << Logs();
}

// A peer stopped with SIGSTOP is a lost peer, as one killed is: without a checkpoint the job
// fails within the collective timeout and a few seconds, naming the rank, the peer and the
// timeout; with one it goes on from its last checkpoint without that peer and ends with the
// uninterrupted job's model.
TEST_F(PeersEndToEndTest, APeerStoppedWithSigstopIsLostAsAKilledOneIs) {
  StartAll(2, {"--collective_timeout=5s"});
  Upload({0, 1}, 3000);
  const std::string id = Submit(
      0, {"--epochs", "500", "--batch-size", "16", "--replicas", "2", "--nodes", addresses_[1]});
  ASSERT_EQ(WaitFor(0, id, 2, 45).state(), v1::JOB_STATE_RUNNING) << Logs();
  ASSERT_EQ(::kill(daemons_[1]->pid(), SIGSTOP), 0);
  const auto stopped = std::chrono::steady_clock::now();
  const v1::Job failed = WaitFor(0, id, 1 << 30, 45);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  ASSERT_EQ(::kill(daemons_[1]->pid(), SIGCONT), 0);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED) << failed.error() << Logs();
  EXPECT_THAT(failed.error(), HasSubstr("rank 1"));
  EXPECT_THAT(failed.error(), HasSubstr("peer " + addresses_[1]));
  EXPECT_THAT(failed.error(), HasSubstr("collective timeout (5s)"));
  EXPECT_LT(seconds, 30);  // the timeout and a grace of a second or so, never a hang

  const std::vector<std::string> flags = {"--epochs",           "12", "--batch-size", "16",
                                          "--replicas",         "2",  "--nodes",      addresses_[1],
                                          "--checkpoint-every", "2"};
  const v1::Job reference = WaitFor(0, Submit(0, flags), 1 << 30, 80);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.error() << Logs();
  const std::string again = Submit(0, flags);
  const v1::Job midway = WaitFor(0, again, 3, 45);
  ASSERT_EQ(midway.state(), v1::JOB_STATE_RUNNING) << midway.error() << Logs();
  ASSERT_LT(midway.epochs_completed(), 12) << "the job ended before the peer could be stopped";
  ASSERT_EQ(::kill(daemons_[1]->pid(), SIGSTOP), 0);
  const v1::Job ended = WaitFor(0, again, 1 << 30, 80);
  ASSERT_EQ(::kill(daemons_[1]->pid(), SIGCONT), 0);
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error() << Logs();
  ASSERT_EQ(ended.restarts_size(), 1);
  ExpectSameModel(ended, reference);
  EXPECT_EQ(ended.ranks(1).node(), "node-0");
  EXPECT_THAT(daemons_[0]->Stderr(), HasSubstr("lost its peer " + addresses_[1]));
}

// A job's rendezvous store listens on --advertise_host only (not every interface), and a stranger
// on this machine who connects to it and sends what a c10d TCPStore client sends to set 64 values
// of 8 MiB is closed at once: the daemon's memory does not grow with them (c10d's store kept them,
// 536 MB, until the job ended), it logs a line for each of the first few and no backtrace, and
// the job ends as it would have.
TEST_F(PeersEndToEndTest, TheRendezvousStoreListensWhereDocumentedAndClosesAStranger) {
  addresses_.push_back("127.0.0.1:" + std::to_string(FreePort()));
  daemons_.resize(1);
  const int port = FreePort();
  Start(0, {"--advertise_host=127.0.0.2",
            "--rendezvous_ports=" + std::to_string(port) + "-" + std::to_string(port)});
  Upload({0}, 6000);
  const std::string id = Submit(0, {"--epochs", "15", "--batch-size", "16", "--replicas", "2"});
  ASSERT_EQ(WaitFor(0, id, 1, 60).state(), v1::JOB_STATE_RUNNING);
  // /proc/net/tcp: the listening socket (state 0A) on the store's port, by local address.
  auto listening = [&] {
    std::vector<std::string> local;
    std::ifstream tcp("/proc/net/tcp");
    std::string line;
    std::getline(tcp, line);
    char hex_port[8];
    std::snprintf(hex_port, sizeof(hex_port), "%04X", port);
    while (std::getline(tcp, line)) {
      std::istringstream fields(line);
      std::string slot, local_address, remote, state;
      fields >> slot >> local_address >> remote >> state;
      if (state == "0A" && local_address.substr(9) == hex_port) {
        local.push_back(local_address.substr(0, 8));
      }
    }
    std::ifstream tcp6("/proc/net/tcp6");
    std::getline(tcp6, line);
    while (std::getline(tcp6, line)) {
      std::istringstream fields(line);
      std::string slot, local_address, remote, state;
      fields >> slot >> local_address >> remote >> state;
      if (state == "0A" && local_address.substr(33) == hex_port) local.push_back(local_address);
    }
    return local;
  };
  EXPECT_THAT(listening(), ::testing::ElementsAre("0200007F"));  // 127.0.0.2, and nothing else
  auto resident_kib = [&] {
    std::ifstream status("/proc/" + std::to_string(daemons_[0]->pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return 0L;
  };
  const long before = resident_kib();
  std::string value(8 << 20, 'x');
  for (int i = 0; i < 64; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(0x7F000002);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    // What a c10d TCPStore client sends: VALIDATE with its magic number, then SET with the key
    // and the value, each with a 64-bit length (c10d/TCPStoreBackend.hpp).
    std::string message(1, '\0');
    const uint32_t magic = 0x3C85F7CE;
    message.append(reinterpret_cast<const char*>(&magic), 4);
    message.push_back('\1');
    const std::string key = "stranger/" + std::to_string(i);
    uint64_t n = key.size();
    message.append(reinterpret_cast<const char*>(&n), 8);
    message += key;
    n = value.size();
    message.append(reinterpret_cast<const char*>(&n), 8);
    message += value;
    size_t sent = 0;
    while (sent < message.size()) {
      const ssize_t w = ::send(fd, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
      if (w <= 0) break;
      sent += static_cast<size_t>(w);
    }
    ::close(fd);
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // whatever reads them has read them
  const long after = resident_kib();
  EXPECT_LT(after - before, 64 * 1024) << before << " KiB before, " << after << " KiB after";
  const v1::Job ended = WaitFor(0, id, 1 << 30, 120);
  EXPECT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  const std::string log = daemons_[0]->Stderr();
  size_t lines = 0;
  for (size_t at = log.find("rendezvous store on 127.0.0.2:"); at != std::string::npos;
       at = log.find("rendezvous store on 127.0.0.2:", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u) << log;
  EXPECT_LE(lines, 6u) << log;
  EXPECT_THAT(log, ::testing::Not(HasSubstr("Exception raised from")));
}

// The leader killed mid-job: the peer's rank ends within the bounded time, and nothing of the job
// is left running there.
TEST_F(PeersEndToEndTest, ALeaderKilledMidJobLeavesNothingRunningOnItsPeer) {
  StartAll(2);
  Upload({0, 1}, 6000);
  const std::string id = Submit(
      0, {"--epochs", "500", "--batch-size", "16", "--replicas", "2", "--nodes", addresses_[1]});
  ASSERT_EQ(WaitFor(0, id, 2, 60).state(), v1::JOB_STATE_RUNNING);
  // While it runs, the peer lists the rank on its CPU: by name to an admin, unnamed to a tenant.
  const std::string rank = id + "/rank-1 for 127.0.0.1";
  EXPECT_THAT(PeerRanks(1, leader_token_), ::testing::ElementsAre(rank));
  EXPECT_THAT(PeerRanks(1, user_token_), ::testing::ElementsAre("a rank for a peer"));
  RunResult table = Ctl(1, {"devices"});
  EXPECT_THAT(table.out, HasSubstr("a rank for a peer")) << table.err;
  daemons_[0]->Stop(SIGKILL, 30);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() < deadline) {
    ended = daemons_[1]->Stderr().find("rank 1 of job '" + id + "' ended") != std::string::npos;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ended) << daemons_[1]->Stderr();
  RunResult list = Ctl(1, {"dataset", "list"});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(PeerRanks(1, leader_token_), ::testing::IsEmpty());
}

// PeerService.RunRank called directly: a tenant's token may not run a rank (PERMISSION_DENIED),
// and even an admin's may not point a daemon at a store that is not on one of its peers
// (FAILED_PRECONDITION): no caller makes a daemon connect where it chooses.
TEST_F(PeersEndToEndTest, RunRankTakesAnAdminAndAStoreOnAPeer) {
  StartAll(2);
  Upload({0, 1});
  auto stub = v1::PeerService::NewStub(
      grpc::CreateChannel(addresses_[1], grpc::InsecureChannelCredentials()));
  v1::RunRankRequest request;
  request.mutable_spec()->set_dataset("waves");
  request.mutable_spec()->set_model("linear:1");
  request.mutable_spec()->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD);
  request.mutable_spec()->mutable_optimizer()->set_learning_rate(0.1);
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->set_epochs(1);
  request.mutable_spec()->set_device("cpu");
  request.set_job_id("job-000000000000");
  request.set_rank(1);
  request.set_world_size(2);
  request.set_store_port(29500);
  request.set_prefix("job-000000000000/1");
  request.set_timeout_seconds(5);
  request.set_store_secret(std::string(64, 'a'));
  auto call = [&](const std::string& token, const std::string& store) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    request.set_store_host(store);
    v1::RunRankResponse response;
    return stub->RunRank(&context, request, &response);
  };
  const grpc::Status tenant = call(kUserToken, "127.0.0.1");
  EXPECT_EQ(tenant.error_code(), grpc::StatusCode::PERMISSION_DENIED) << tenant.error_message();
  EXPECT_THAT(tenant.error_message(), HasSubstr("admin"));
  const grpc::Status elsewhere = call(kLeaderToken, "10.9.9.9");
  EXPECT_EQ(elsewhere.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << elsewhere.error_message();
  EXPECT_THAT(elsewhere.error_message(), HasSubstr("is not on one of this daemon's --peers"));
  // Hostile numbers from an admin: refused before anything joins or is acquired.
  for (const auto& [field, set] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"NaN timeout", [&] { request.set_timeout_seconds(std::nan("")); }},
           {"a day's timeout", [&] { request.set_timeout_seconds(86400); }},
           {"rank 0", [&] { request.set_rank(0); }},
           {"rank past the world", [&] { request.set_rank(7); }},
           {"a huge world", [&] { request.set_world_size(1 << 30); }},
           {"port 0", [&] { request.set_store_port(0); }},
           {"port 70000", [&] { request.set_store_port(70000); }},
           {"no prefix", [&] { request.set_prefix(""); }},
           {"no store secret", [&] { request.set_store_secret(""); }},
           {"a negative checkpoint", [&] { request.set_resume_bytes(-1); }},
           {"a checkpoint without its SHA-256", [&] { request.set_resume_bytes(1000); }},
       }) {
    const v1::RunRankRequest kept = request;
    set();
    const grpc::Status refused = call(kLeaderToken, "127.0.0.1");
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << field << ": " << refused.error_message();
    request = kept;
  }
  const grpc::Status stranger = call("not-a-token-at-all-0123456789", "127.0.0.1");
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A checkpoint larger than one of this model can be is refused before anything is reserved or
  // received (the dataset and the spec are otherwise right).
  {
    // The user's dataset, as the leader's admin names it there.
    RunResult got = e2e::Run({TRAINCTL_BIN, "--addr", addresses_[1], "--token-file", leader_token_,
                              "-o", "json", "dataset", "get", "user/waves"});
    v1::Dataset dataset;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &dataset).ok()) << got.out;
    request.set_dataset_sha256(dataset.sha256());
    request.mutable_spec()->set_dataset("user/waves");
    request.mutable_spec()->set_model("linear:1");
    request.set_resume_bytes(int64_t{1} << 40);
    request.set_resume_sha256(std::string(64, 'b'));
    const grpc::Status huge = call(kLeaderToken, "127.0.0.1");
    EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << huge.error_message();
    EXPECT_THAT(huge.error_message(), HasSubstr("more than a checkpoint of this model can be"));
  }
}

}  // namespace
}  // namespace trainerd::e2e
