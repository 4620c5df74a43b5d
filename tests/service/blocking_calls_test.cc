#include "server/service/blocking_calls.h"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// With one thread held by a gate, the calls queued meanwhile run one caller at a time in turn:
// a caller with many calls waiting delays its own, not the others'.
TEST(BlockingCallsTest, CallersAreServedInTurnNotInArrivalOrder) {
  std::vector<std::string> order;
  std::mutex order_mu;
  absl::Notification gate;
  absl::Notification all_ran;
  std::atomic<int> left{7};
  {
    BlockingCalls pool(BlockingCalls::Options{/*threads=*/1, /*max_queued_per_caller=*/0});
    absl::Notification held;
    ASSERT_TRUE(pool.Run("gate",
                         [&] {
                           held.Notify();
                           gate.WaitForNotification();
                         })
                    .ok());
    held.WaitForNotification();  // the one thread is taken: what follows waits in the queues
    auto record = [&](const std::string& what) {
      return [&, what] {
        {
          std::lock_guard<std::mutex> lock(order_mu);
          order.push_back(what);
        }
        if (--left == 0) all_ran.Notify();
      };
    };
    // The flood arrives first.
    for (int i = 1; i <= 5; ++i) {
      ASSERT_TRUE(pool.Run("mallory", record("mallory-" + std::to_string(i))).ok());
    }
    ASSERT_TRUE(pool.Run("alice", record("alice-1")).ok());
    ASSERT_TRUE(pool.Run("bob", record("bob-1")).ok());
    EXPECT_EQ(pool.queued(), 7);
    gate.Notify();
    ASSERT_TRUE(all_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_THAT(order, ElementsAre("mallory-1", "alice-1", "bob-1", "mallory-2", "mallory-3",
                                 "mallory-4", "mallory-5"));
}

// A caller may have at most max_queued_per_caller calls waiting; the refusal names the limit,
// and other callers are still queued.
TEST(BlockingCallsTest, ACallerPastItsLimitIsRefusedOthersAreNot) {
  absl::Notification gate;
  BlockingCalls pool(BlockingCalls::Options{/*threads=*/1, /*max_queued_per_caller=*/2});
  ASSERT_TRUE(pool.Run("gate", [&] { gate.WaitForNotification(); }).ok());
  std::atomic<int> ran{0};
  EXPECT_TRUE(pool.Run("mallory", [&] { ++ran; }).ok());
  EXPECT_TRUE(pool.Run("mallory", [&] { ++ran; }).ok());
  const absl::Status third = pool.Run("mallory", [&] { ++ran; });
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("caller 'mallory' already has 2 calls waiting"));
  EXPECT_TRUE(pool.Run("alice", [&] { ++ran; }).ok());
  gate.Notify();
}

// Everything queued still runs when the pool is destroyed (each call finishes an RPC); nothing
// is queued after.
TEST(BlockingCallsTest, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  absl::Notification gate;
  {
    BlockingCalls pool(BlockingCalls::Options{/*threads=*/1, /*max_queued_per_caller=*/0});
    ASSERT_TRUE(pool.Run("gate", [&] { gate.WaitForNotification(); }).ok());
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(pool.Run("alice", [&] { ++ran; }).ok());
    gate.Notify();
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace trainerd::service
