// Where a job that names no device goes on a daemon with several GPUs. The policy is a pure
// function of what the engine sees at submit, so it is tested here without GPUs; the engine's
// wiring (Engine::Impl::Place) only runs with two or more CUDA devices.
#include "server/engine/devices/placement.h"

#include <gtest/gtest.h>

namespace trainerd::engine {
namespace {

PlacementCandidate Gpu(int index, bool holds, int64_t jobs, int64_t free_memory = -1) {
  PlacementCandidate c;
  c.device = "cuda:" + std::to_string(index);
  c.holds_datasets = holds;
  c.jobs = jobs;
  c.free_memory = free_memory;
  return c;
}

TEST(PlacementTest, TheDeviceThatHoldsTheDatasetWinsOverAnIdleOne) {
  EXPECT_EQ(ChooseDevice({Gpu(0, false, 0), Gpu(1, true, 2), Gpu(2, false, 0)}, 100), 1u);
}

TEST(PlacementTest, WithoutAHolderTheLeastLoadedWinsAndTiesGoToTheLowestIndex) {
  EXPECT_EQ(ChooseDevice({Gpu(0, false, 3), Gpu(1, false, 1), Gpu(2, false, 1)}, 100), 1u);
  EXPECT_EQ(ChooseDevice({Gpu(0, false, 0), Gpu(1, false, 0)}, 100), 0u);
}

TEST(PlacementTest, AmongHoldersTheLeastLoadedWins) {
  EXPECT_EQ(ChooseDevice({Gpu(0, true, 4), Gpu(1, true, 1), Gpu(2, false, 0)}, 100), 1u);
}

TEST(PlacementTest, AHolderWithoutRoomForTheJobGivesWayToADeviceWithRoom) {
  EXPECT_EQ(ChooseDevice({Gpu(0, true, 0, /*free=*/50), Gpu(1, false, 2, /*free=*/1000),
                          Gpu(2, false, 1, /*free=*/10)},
                         100),
            1u);
}

TEST(PlacementTest, EqualJobCountsGoToTheDeviceWithMoreFreeMemory) {
  EXPECT_EQ(
      ChooseDevice({Gpu(0, false, 1, 200), Gpu(1, false, 1, 900), Gpu(2, false, 1, 500)}, 100), 1u);
}

TEST(PlacementTest, WhenNoDeviceHasRoomTheLeastLoadedWaitsForIt) {
  EXPECT_EQ(ChooseDevice({Gpu(0, true, 2, 10), Gpu(1, false, 1, 20), Gpu(2, false, 3, 30)}, 100),
            1u);
}

TEST(PlacementTest, OneDeviceIsAlwaysChosen) {
  EXPECT_EQ(ChooseDevice({Gpu(0, false, 7, 0)}, 100), 0u);
}

}  // namespace
}  // namespace trainerd::engine
