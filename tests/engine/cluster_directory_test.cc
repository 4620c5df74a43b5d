// The group of daemons a cluster manager starts (cluster_directory.h): its variables read as
// Kubeflow and torchrun set them, and its directory kept by node 0, where every node finds the
// others in whatever order they start, again after node 0 restarts, and node 0 keeps nothing it
// was told beyond one checked entry per rank. The nodes join through node 0's Join here, in
// process; the gRPC call between daemons is the e2e tests' (peers_e2e_test.cc).
#include "server/engine/distributed/cluster_directory.h"

#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ClusterFromEnvironmentTest, ReadsTheVariablesAsAClusterManagerSetsThem) {
  // No group named: none (also a group of one).
  EXPECT_FALSE(ClusterFromEnvironment({"PATH=/bin", "WORLD_SIZE=4", "RANK=1"})->has_value());
  EXPECT_FALSE(
      ClusterFromEnvironment({"MASTER_ADDR=a", "MASTER_PORT=29400", "WORLD_SIZE=1", "RANK=0"})
          ->has_value());
  // PyTorchJob's form: WORLD_SIZE daemons, this one RANK.
  absl::StatusOr<std::optional<ClusterOptions>> plain = ClusterFromEnvironment(
      {"MASTER_ADDR=job-master-0", "MASTER_PORT=23456", "WORLD_SIZE=3", "RANK=2"});
  ASSERT_TRUE(plain.ok() && plain->has_value()) << plain.status();
  EXPECT_EQ((*plain)->master_addr, "job-master-0");
  EXPECT_EQ((*plain)->master_port, 23456);
  EXPECT_EQ((*plain)->nodes, 3);
  EXPECT_EQ((*plain)->node_rank, 2);
  EXPECT_EQ((*plain)->source, "");
  EXPECT_EQ((*plain)->counted_by, "$WORLD_SIZE and $RANK");
  // Kubeflow Trainer's PET_ form wins over the plain one (where WORLD_SIZE counts processes).
  absl::StatusOr<std::optional<ClusterOptions>> pet = ClusterFromEnvironment(
      {"MASTER_ADDR=x", "MASTER_PORT=1", "WORLD_SIZE=16", "RANK=9", "PET_MASTER_ADDR=node-0",
       "PET_MASTER_PORT=29400", "PET_NNODES=2", "PET_NODE_RANK=1", "PET_NPROC_PER_NODE=8"});
  ASSERT_TRUE(pet.ok() && pet->has_value()) << pet.status();
  EXPECT_EQ((*pet)->master_addr, "node-0");
  EXPECT_EQ((*pet)->master_port, 29400);
  EXPECT_EQ((*pet)->nodes, 2);
  EXPECT_EQ((*pet)->node_rank, 1);
  EXPECT_EQ((*pet)->source, "PET_");
  // What cannot be honoured is refused, naming the variable.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"MASTER_ADDR=a", "WORLD_SIZE=2", "RANK=0"}, "$MASTER_PORT is not set"},
      {{"MASTER_ADDR=a", "MASTER_PORT=29400", "RANK=0"}, "$WORLD_SIZE is not set"},
      {{"MASTER_ADDR=a", "MASTER_PORT=29400", "WORLD_SIZE=2"}, "$RANK is not set"},
      {{"MASTER_ADDR=", "MASTER_PORT=29400", "WORLD_SIZE=2", "RANK=0"}, "$MASTER_ADDR is empty"},
      {{"MASTER_ADDR=a", "MASTER_PORT=70000", "WORLD_SIZE=2", "RANK=0"},
       "$MASTER_PORT=70000 is not a number from 1 to 65535"},
      {{"MASTER_ADDR=a", "MASTER_PORT=29400", "WORLD_SIZE=2", "RANK=2"},
       "$RANK=2 is not a number from 0 to 1"},
      {{"MASTER_ADDR=a", "MASTER_PORT=29400", "WORLD_SIZE=100000", "RANK=0"},
       "$WORLD_SIZE=100000 is not a number from 1 to 256"},
      {{"MASTER_ADDR=a", "MASTER_PORT=29400", "WORLD_SIZE=two", "RANK=0"},
       "$WORLD_SIZE=two is not a number"},
      {{"PET_MASTER_ADDR=a", "PET_MASTER_PORT=29400", "PET_NNODES=1:4", "PET_NODE_RANK=0"},
       "$PET_NNODES=1:4 is an elastic range"},
  };
  for (const auto& [env, message] : refused) {
    absl::StatusOr<std::optional<ClusterOptions>> got = ClusterFromEnvironment(env);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(got.status().message(), HasSubstr(message));
  }
}

// Only node-level variables say which node a daemon is: torchrun's WORLD_SIZE and RANK count
// processes (WORLD_SIZE=16 RANK=3 LOCAL_RANK=3 is the fourth process of the first node, not node
// 3 of 16), so its GROUP_WORLD_SIZE and GROUP_RANK are read instead, and WORLD_SIZE and RANK only
// where nothing says they count processes; what is ambiguous is refused naming the variables.
TEST(ClusterFromEnvironmentTest, ReadsNodesAndNotProcesses) {
  const std::vector<std::string> master = {"MASTER_ADDR=node-0", "MASTER_PORT=29400"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), master.begin(), master.end());
    return ClusterFromEnvironment(more);
  };
  // A torchrun worker (one process a node): its node from GROUP_RANK, the nodes from
  // GROUP_WORLD_SIZE, whatever WORLD_SIZE and RANK count.
  absl::StatusOr<std::optional<ClusterOptions>> worker =
      with({"WORLD_SIZE=4", "RANK=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=2",
            "GROUP_WORLD_SIZE=4"});
  ASSERT_TRUE(worker.ok() && worker->has_value()) << worker.status();
  EXPECT_EQ((*worker)->nodes, 4);
  EXPECT_EQ((*worker)->node_rank, 2);
  EXPECT_EQ((*worker)->counted_by, "$GROUP_WORLD_SIZE and $GROUP_RANK");
  // Process 0 of node 3 of 4 nodes of 4 processes: node 3, not rank 12 of 16.
  absl::StatusOr<std::optional<ClusterOptions>> first_process =
      with({"WORLD_SIZE=16", "RANK=12", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=4", "GROUP_RANK=3",
            "GROUP_WORLD_SIZE=4"});
  ASSERT_TRUE(first_process.ok() && first_process->has_value()) << first_process.status();
  EXPECT_EQ((*first_process)->nodes, 4);
  EXPECT_EQ((*first_process)->node_rank, 3);
  // One process a node said so, or nothing said: WORLD_SIZE and RANK are the nodes.
  absl::StatusOr<std::optional<ClusterOptions>> one_each =
      with({"WORLD_SIZE=3", "RANK=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"});
  ASSERT_TRUE(one_each.ok() && one_each->has_value()) << one_each.status();
  EXPECT_EQ((*one_each)->nodes, 3);
  EXPECT_EQ((*one_each)->node_rank, 1);
  EXPECT_EQ((*one_each)->counted_by, "$WORLD_SIZE and $RANK");
  // Kubeflow's node-level PET_ variables with a plain MASTER_ADDR, and with torchrun's agreeing.
  absl::StatusOr<std::optional<ClusterOptions>> pet =
      with({"WORLD_SIZE=16", "RANK=1", "PET_NNODES=2", "PET_NODE_RANK=1", "GROUP_RANK=1",
            "GROUP_WORLD_SIZE=2"});
  ASSERT_TRUE(pet.ok() && pet->has_value()) << pet.status();
  EXPECT_EQ((*pet)->nodes, 2);
  EXPECT_EQ((*pet)->node_rank, 1);
  EXPECT_EQ((*pet)->master_addr, "node-0");
  EXPECT_EQ((*pet)->counted_by, "$PET_NNODES and $PET_NODE_RANK");

  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      // The review's case: process 3 of its node.
      {{"WORLD_SIZE=16", "RANK=3", "LOCAL_RANK=3"}, "$LOCAL_RANK=3 says this is process 3"},
      {{"WORLD_SIZE=16", "RANK=3", "LOCAL_RANK=3", "GROUP_RANK=0", "GROUP_WORLD_SIZE=4"},
       "trainerd runs one daemon per node"},
      {{"WORLD_SIZE=16", "RANK=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=4"},
       "$LOCAL_WORLD_SIZE=4 says $WORLD_SIZE and $RANK count processes"},
      {{"WORLD_SIZE=16", "RANK=4", "LOCAL_RANK=0"}, "$LOCAL_RANK is set without $LOCAL_WORLD_SIZE"},
      {{"PET_NNODES=2", "PET_NODE_RANK=1", "GROUP_RANK=0", "GROUP_WORLD_SIZE=2"},
       "$PET_NNODES=2 and $PET_NODE_RANK=1 disagree with $GROUP_WORLD_SIZE=2 and $GROUP_RANK=0"},
      {{"GROUP_RANK=1"}, "$GROUP_WORLD_SIZE is not set"},
      {{"GROUP_WORLD_SIZE=2", "GROUP_RANK=2"}, "$GROUP_RANK=2 is not a number from 0 to 1"},
      {{"LOCAL_RANK=x", "WORLD_SIZE=2", "RANK=0"}, "$LOCAL_RANK=x is not a number"},
  };
  for (const auto& [env, message] : refused) {
    absl::StatusOr<std::optional<ClusterOptions>> got = with(env);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(got.status().message(), HasSubstr(message));
  }
}

class ClusterDirectoryTest : public ::testing::Test {
 protected:
  ClusterOptions Node(int rank) {
    ClusterOptions options;
    options.master_addr = "127.0.0.1";
    options.master_port = 29400;
    options.nodes = 3;
    options.node_rank = rank;
    options.self = "127.0.0.1:" + std::to_string(50000 + rank);
    options.interval = absl::Milliseconds(100);
    return options;
  }

  // A join that reaches node 0 (while there is one) as PeerService.JoinGroup would.
  GroupJoin ThroughNode0() {
    return [this](int nodes, int rank,
                  const std::string& address) -> absl::StatusOr<std::map<int, std::string>> {
      std::lock_guard<std::mutex> lock(mu_);
      if (zero_ == nullptr) return absl::UnavailableError("node 0 is not up");
      return zero_->Join(nodes, rank, address);
    };
  }
  void StartNode0() {
    absl::StatusOr<std::unique_ptr<ClusterDirectory>> zero = ClusterDirectory::Start(Node(0), {});
    ASSERT_TRUE(zero.ok()) << zero.status();
    std::lock_guard<std::mutex> lock(mu_);
    zero_ = *std::move(zero);
  }
  void StopNode0() {
    std::lock_guard<std::mutex> lock(mu_);
    zero_.reset();
  }

  // Waits (at most 20 s) until `directory` lists `want`.
  static bool Lists(const ClusterDirectory& directory, const std::vector<std::string>& want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (directory.peers() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::mutex mu_;
  std::unique_ptr<ClusterDirectory> zero_;
};

TEST_F(ClusterDirectoryTest, NodesFindEachOtherWhateverOrderTheyStartIn) {
  // The followers first: they wait for node 0 without failing.
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> two =
      ClusterDirectory::Start(Node(2), ThroughNode0());
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> one =
      ClusterDirectory::Start(Node(1), ThroughNode0());
  ASSERT_TRUE(two.ok() && one.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE((*one)->peers().empty());
  StartNode0();
  EXPECT_TRUE(Lists(*zero_, {"127.0.0.1:50001", "127.0.0.1:50002"})) << zero_->peers().size();
  EXPECT_TRUE(Lists(**one, {"127.0.0.1:50000", "127.0.0.1:50002"}));
  EXPECT_TRUE(Lists(**two, {"127.0.0.1:50000", "127.0.0.1:50001"}));
  // Node 0 restarts with nothing: the others say where they are again.
  StopNode0();
  StartNode0();
  EXPECT_TRUE(Lists(*zero_, {"127.0.0.1:50001", "127.0.0.1:50002"}));
  // A node that moves is found where it is now.
  two->reset();
  ClusterOptions moved = Node(2);
  moved.self = "10.0.0.7:50051";
  two = ClusterDirectory::Start(moved, ThroughNode0());
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(Lists(**one, {"127.0.0.1:50000", "10.0.0.7:50051"}));
}

TEST_F(ClusterDirectoryTest, Node0KeepsOneCheckedEntryPerRankAndNothingElse) {
  StartNode0();
  // Another group's size, a rank out of range, node 0's own rank, and addresses that are no
  // host:port are refused, naming what is wrong; nothing of them is kept.
  EXPECT_THAT(zero_->Join(4, 1, "10.0.0.1:50051").status().message(),
              HasSubstr("this group has 3 nodes; the caller says 4"));
  for (int nodes : {-1, 0, 2, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()}) {
    EXPECT_EQ(zero_->Join(nodes, 1, "10.0.0.1:50051").status().code(),
              absl::StatusCode::kInvalidArgument)
        << nodes;
  }
  for (int rank : {0, 3, -1, 1 << 30, std::numeric_limits<int>::min()}) {
    EXPECT_EQ(zero_->Join(3, rank, "10.0.0.1:50051").status().code(),
              absl::StatusCode::kInvalidArgument)
        << rank;
  }
  for (const std::string& address :
       {std::string(), std::string("10.0.0.1"), std::string("10.0.0.1:0"),
        std::string("10.0.0.1:65536"), std::string(":50051"), std::string("a b:50051"),
        std::string("host\n:50051"), std::string(300, 'h') + ":50051"}) {
    EXPECT_EQ(zero_->Join(3, 1, address).status().code(), absl::StatusCode::kInvalidArgument)
        << address;
  }
  EXPECT_TRUE(zero_->peers().empty());
  // A thousand joins keep one entry per rank: the last word of each.
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(zero_->Join(3, 1 + i % 2, "10.0.0." + std::to_string(i % 250) + ":50051").ok());
  }
  EXPECT_THAT(zero_->peers(), ElementsAre("10.0.0.248:50051", "10.0.0.249:50051"));
  absl::StatusOr<std::map<int, std::string>> all = zero_->Join(3, 1, "[::1]:50051");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 3u);
  EXPECT_EQ(all->at(0), "127.0.0.1:50000");
  EXPECT_EQ(all->at(1), "[::1]:50051");
  // Only node 0 keeps the directory.
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> one =
      ClusterDirectory::Start(Node(1), ThroughNode0());
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->Join(3, 2, "10.0.0.1:50051").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ClusterDirectoryTest, WhatNode0SaysIsCheckedToo) {
  // A node 0 (or a stand-in for it) that answers with entries no node could have written.
  GroupJoin lying = [](int, int, const std::string&) -> absl::StatusOr<std::map<int, std::string>> {
    return std::map<int, std::string>{{0, "10.0.0.1:50051"},
                                      {2, "not an address"},
                                      {7, "10.0.0.9:50051"},
                                      {-1, "10.0.0.8:50051"}};
  };
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> one = ClusterDirectory::Start(Node(1), lying);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(Lists(**one, {"10.0.0.1:50051"}));
}

TEST_F(ClusterDirectoryTest, OptionsThatAreNoGroupsNodeAreRefused) {
  ClusterOptions bad = Node(3);  // of 3
  EXPECT_EQ(ClusterDirectory::Start(bad, ThroughNode0()).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = Node(0);
  bad.self.clear();
  EXPECT_EQ(ClusterDirectory::Start(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Node(0);
  bad.nodes = 1;
  EXPECT_EQ(ClusterDirectory::Start(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A node other than 0 with no way to reach node 0.
  EXPECT_EQ(ClusterDirectory::Start(Node(1), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainerd::engine
