// Where a job's ranks and a spread sweep's members go among the daemon and its nodes, and what the
// nodes call the job's datasets (distributed/node_placement.h). The nodes' own checks and the
// calls to them are the e2e tests' (peers_e2e_test.cc).
#include "server/engine/distributed/node_placement.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

TEST(NodePlacementTest, RanksAndMembersGoRoundThisDaemonAndTheNodesStartingHere) {
  const std::vector<std::string> two = {"b:1", "c:1"};
  std::vector<std::string> placed;
  for (int64_t i = 0; i < 7; ++i) placed.push_back(NodeOf(two, i));
  EXPECT_EQ(placed, (std::vector<std::string>{"", "b:1", "c:1", "", "b:1", "c:1", ""}));
  // Without nodes, or for no index, everything is here.
  EXPECT_EQ(NodeOf({}, 3), "");
  EXPECT_EQ(NodeOf(two, -1), "");
  // One node and two ranks: rank 0 here, rank 1 there.
  EXPECT_EQ(NodeOf({"b:1"}, 0), "");
  EXPECT_EQ(NodeOf({"b:1"}, 1), "b:1");
}

TEST(NodePlacementTest, AnotherOwnersDatasetGetsItsDigestSoItNeverTakesTheSubmittersName) {
  DatasetMeta mine;
  mine.owner = "alice";
  mine.name = "digits";
  mine.sha256 = std::string(64, 'a');
  EXPECT_EQ(NodeDatasetName(mine, "alice"), "alice/digits");

  DatasetMeta shared = mine;
  shared.owner = "bob";
  shared.sha256 = "0123456789abcdef" + std::string(48, 'f');
  EXPECT_EQ(NodeDatasetName(shared, "alice"), "alice/digits-0123456789abcdef");

  // A name at the limit is cut so that the suffix keeps it within 128 characters.
  shared.name = std::string(128, 'x');
  const std::string there = NodeDatasetName(shared, "alice");
  EXPECT_EQ(there.size(), std::string("alice/").size() + 128);
  EXPECT_EQ(there.substr(there.size() - 17), "-0123456789abcdef");
  // A caller without a name (no tenants) names it with an empty owner.
  DatasetMeta anonymous = mine;
  anonymous.owner = "";
  EXPECT_EQ(NodeDatasetName(anonymous, ""), "/digits");
}

}  // namespace
}  // namespace trainerd::engine
