// The group of daemons a cluster manager starts (cluster_directory.h): its variables read as
// Kubeflow and torchrun set them, and its directory on node 0's c10d::TCPStore on loopback, where
// every node finds the others in whatever order they start, again after node 0 restarts, and never
// an entry that is not signed with the group's token.
#include "server/engine/distributed/cluster_directory.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
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

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

class ClusterDirectoryTest : public ::testing::Test {
 protected:
  ClusterOptions Node(int rank, const std::string& key = "the-group-token") {
    ClusterOptions options;
    options.master_addr = "127.0.0.1";
    options.master_port = port_;
    options.nodes = 3;
    options.node_rank = rank;
    options.self = "127.0.0.1:" + std::to_string(50000 + rank);
    options.key = key;
    options.interval = absl::Milliseconds(100);
    return options;
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

  int port_ = FreePort();
};

TEST_F(ClusterDirectoryTest, NodesFindEachOtherWhateverOrderTheyStartIn) {
  // The followers first: they wait for node 0's store without failing.
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> two = ClusterDirectory::Start(Node(2));
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> one = ClusterDirectory::Start(Node(1));
  ASSERT_TRUE(two.ok() && one.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE((*one)->peers().empty());
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> zero = ClusterDirectory::Start(Node(0));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE(Lists(**zero, {"127.0.0.1:50001", "127.0.0.1:50002"})) << (*zero)->peers().size();
  EXPECT_TRUE(Lists(**one, {"127.0.0.1:50000", "127.0.0.1:50002"}));
  EXPECT_TRUE(Lists(**two, {"127.0.0.1:50000", "127.0.0.1:50001"}));
  // Node 0 restarts with an empty store: the others write their entries again.
  zero->reset();
  zero = ClusterDirectory::Start(Node(0));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE(Lists(**zero, {"127.0.0.1:50001", "127.0.0.1:50002"}));
  // A second node 0 on the same port cannot host the store.
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> again = ClusterDirectory::Start(Node(0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.status().message(), HasSubstr("cannot host the group's directory on port"));
}

TEST_F(ClusterDirectoryTest, AnEntryNotSignedWithTheGroupsTokenIsNeverAPeer) {
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> zero = ClusterDirectory::Start(Node(0));
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> one = ClusterDirectory::Start(Node(1));
  // A stranger who reaches the store writes node 2's entry with another token.
  absl::StatusOr<std::unique_ptr<ClusterDirectory>> stranger =
      ClusterDirectory::Start(Node(2, "a-stranger's-token"));
  ASSERT_TRUE(zero.ok() && one.ok() && stranger.ok());
  EXPECT_TRUE(Lists(**zero, {"127.0.0.1:50001"}));
  EXPECT_TRUE(Lists(**one, {"127.0.0.1:50000"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_THAT((*zero)->peers(), ElementsAre("127.0.0.1:50001"));
  EXPECT_TRUE((*stranger)->peers().empty());  // and it trusts none of theirs
}

TEST_F(ClusterDirectoryTest, OptionsThatAreNoGroupsNodeAreRefused) {
  ClusterOptions bad = Node(3);  // of 3
  EXPECT_EQ(ClusterDirectory::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Node(0);
  bad.self.clear();
  EXPECT_EQ(ClusterDirectory::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Node(0);
  bad.nodes = 1;
  EXPECT_EQ(ClusterDirectory::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainerd::engine
