// A data-parallel job's group on c10d with Gloo (server/engine/distributed/), its ranks as threads
// of this process on loopback: exact sums for 1 to 4 ranks, the step's gradient bucket, a
// data-parallel step equal to one process training on the global batch (and repeatable bit for
// bit), groups apart by prefix on one store, and a rank that never comes or leaves ending the
// others' calls with an error within the timeout rather than a hang.
#include "server/engine/distributed/collectives.h"

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::engine {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<RendezvousHost> Host(int world_size, absl::Duration timeout = absl::Seconds(20)) {
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, world_size, timeout);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *std::move(host) : nullptr;
}

GroupOptions Options(const RendezvousHost& host, const std::string& prefix, int rank, int world,
                     absl::Duration timeout = absl::Seconds(20)) {
  GroupOptions options;
  options.store_port = host.port();
  options.store_secret = host.secret();
  options.prefix = prefix;
  options.rank = rank;
  options.world_size = world;
  options.timeout = timeout;
  return options;
}

// Runs `body(rank, group)` on `world` threads, each a rank of one group; the statuses of Join.
std::vector<absl::Status> RunRanks(const RendezvousHost& host, const std::string& prefix, int world,
                                   const std::function<void(int, CpuGroup&)>& body) {
  std::vector<absl::Status> joined(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<CpuGroup>> group =
          CpuGroup::Join(Options(host, prefix, rank, world));
      joined[rank] = group.status();
      if (group.ok()) body(rank, **group);
    });
  }
  for (std::thread& t : threads) t.join();
  return joined;
}

TEST(CollectivesTest, AllReduceSumIsExactForOneToFourRanks) {
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    std::unique_ptr<RendezvousHost> host = Host(world);
    ASSERT_NE(host, nullptr);
    std::vector<torch::Tensor> results(world);
    std::vector<absl::Status> statuses(world);
    const auto joined = RunRanks(*host, "job-sum/1", world, [&](int rank, CpuGroup& group) {
      EXPECT_EQ(group.rank(), rank);
      EXPECT_EQ(group.world_size(), world);
      // Rank r holds r + 1 and r + 0.5 times 1..5: the sums are exact in float32.
      torch::Tensor t = (torch::arange(1, 6, torch::kFloat32) * (rank + 0.5)).contiguous();
      statuses[rank] = group.AllReduceSum(t);
      results[rank] = t;
    });
    const double factor = world * world / 2.0;  // sum over r of (r + 0.5)
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(joined[rank].ok()) << joined[rank];
      ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
      EXPECT_TRUE(torch::equal(results[rank], torch::arange(1, 6, torch::kFloat32) * factor))
          << results[rank];
    }
  }
}

TEST(CollectivesTest, AllReduceMeanAveragesEveryTensorOfTheBucketInPlace) {
  std::unique_ptr<RendezvousHost> host = Host(3);
  ASSERT_NE(host, nullptr);
  std::vector<std::vector<torch::Tensor>> got(3);
  RunRanks(*host, "job-mean/1", 3, [&](int rank, CpuGroup& group) {
    // A weight, a bias and a scalar, as a model's gradients are: shapes kept, values averaged.
    std::vector<torch::Tensor> grads = {torch::full({2, 3}, 3.0f * rank),
                                        torch::full({3}, -6.0f * rank), torch::full({}, 9.0f)};
    ASSERT_TRUE(group.AllReduceMean(grads).ok());
    got[rank] = grads;
  });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_EQ(got[rank].size(), 3u);
    EXPECT_TRUE(torch::equal(got[rank][0], torch::full({2, 3}, 3.0f)));  // (0 + 3 + 6) / 3
    EXPECT_TRUE(torch::equal(got[rank][1], torch::full({3}, -6.0f)));
    EXPECT_TRUE(torch::equal(got[rank][2], torch::full({}, 9.0f)));
  }
}

// What a job with replicas does each step: rank r takes the r-th slice of the global batch,
// computes its gradients, and the group averages them before the update. With equal slices that
// is one process's step on the whole global batch (the mean loss's gradient is the mean of the
// slices' mean losses' gradients), within float32 rounding; and a fixed layout repeats bit for
// bit.
std::vector<torch::Tensor> DataParallelRun(const RendezvousHost& host, const std::string& prefix,
                                           int world, const torch::Tensor& x,
                                           const torch::Tensor& y, int steps) {
  std::vector<std::vector<torch::Tensor>> parameters(world);
  // The same initial model on every rank: made once (the ranks' threads share LibTorch's default
  // generator, so seeding it in each would interleave their draws) and copied.
  torch::manual_seed(7);
  torch::nn::Sequential initial(torch::nn::Linear(4, 8), torch::nn::Tanh(),
                                torch::nn::Linear(8, 1));
  RunRanks(host, prefix, world, [&](int rank, CpuGroup& group) {
    auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(initial->clone());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const int64_t global = x.size(0) / steps;  // rows per step, over all ranks
    const int64_t slice = global / world;
    for (int step = 0; step < steps; ++step) {
      const int64_t begin = step * global + rank * slice;
      sgd.zero_grad();
      torch::Tensor loss =
          torch::mse_loss(model->forward(x.narrow(0, begin, slice)), y.narrow(0, begin, slice));
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (const torch::Tensor& p : model->parameters()) grads.push_back(p.mutable_grad());
      ASSERT_TRUE(group.AllReduceMean(grads).ok());
      sgd.step();
    }
    for (const torch::Tensor& p : model->parameters()) {
      parameters[rank].push_back(p.detach().clone());
    }
  });
  // Every rank ends with the same model.
  for (int rank = 1; rank < world; ++rank) {
    for (size_t k = 0; k < parameters[0].size(); ++k) {
      EXPECT_TRUE(torch::equal(parameters[rank][k], parameters[0][k])) << "rank " << rank;
    }
  }
  return parameters[0];
}

TEST(CollectivesTest, DataParallelStepsEqualOneProcessOnTheGlobalBatchAndRepeat) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({96, 4});
  const torch::Tensor y = x.sum(1, /*keepdim=*/true).sin();
  std::unique_ptr<RendezvousHost> host = Host(4);
  ASSERT_NE(host, nullptr);
  const std::vector<torch::Tensor> one = DataParallelRun(*host, "job-dp/1", 1, x, y, 6);
  for (int world : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    const std::vector<torch::Tensor> first =
        DataParallelRun(*host, absl::StrCat("job-dp", world, "/1"), world, x, y, 6);
    const std::vector<torch::Tensor> again =
        DataParallelRun(*host, absl::StrCat("job-dp", world, "/2"), world, x, y, 6);
    ASSERT_EQ(first.size(), one.size());
    for (size_t k = 0; k < one.size(); ++k) {
      EXPECT_TRUE(torch::allclose(first[k], one[k], /*rtol=*/1e-5, /*atol=*/1e-6))
          << (first[k] - one[k]).abs().max();
      EXPECT_TRUE(torch::equal(first[k], again[k]));  // bit for bit, run to run
    }
    // And the parameters moved: the comparison is not of two untrained models.
    EXPECT_FALSE(torch::allclose(one[0], DataParallelRun(*host, "job-dp0/1", 1, x, y, 1)[0]));
  }
}

TEST(CollectivesTest, GroupsWithOtherPrefixesShareAStoreWithoutMeeting) {
  std::unique_ptr<RendezvousHost> host = Host(2);
  ASSERT_NE(host, nullptr);
  std::vector<float> sums(4);
  std::vector<std::thread> jobs;
  for (int job = 0; job < 2; ++job) {
    jobs.emplace_back([&, job] {
      RunRanks(*host, absl::StrCat("job-", job, "/1"), 2, [&](int rank, CpuGroup& group) {
        torch::Tensor t = torch::full({1}, static_cast<float>(10 * job + rank + 1));
        ASSERT_TRUE(group.AllReduceSum(t).ok());
        sums[job * 2 + rank] = t.item<float>();
      });
    });
  }
  for (std::thread& t : jobs) t.join();
  EXPECT_EQ(sums[0], 3.0f);  // 1 + 2
  EXPECT_EQ(sums[1], 3.0f);
  EXPECT_EQ(sums[2], 23.0f);  // 11 + 12
  EXPECT_EQ(sums[3], 23.0f);
}

TEST(CollectivesTest, ARankThatNeverComesEndsTheJoinWithinTheTimeoutSayingWhoCame) {
  // 5 s: long enough for two ranks to reach the store on a loaded machine, short for a test.
  std::unique_ptr<RendezvousHost> host = Host(3, absl::Seconds(5));
  ASSERT_NE(host, nullptr);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < 2; ++rank) {  // rank 2 never comes
    threads.emplace_back([&, rank] {
      statuses[rank] =
          CpuGroup::Join(Options(*host, "job-late/1", rank, 3, absl::Seconds(5))).status();
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(), HasSubstr("only 2 of 3 ranks joined within 5s"));
    EXPECT_THAT(status.message(), HasSubstr("group 'job-late/1'"));
  }
  EXPECT_LT(seconds, 20);
}

TEST(CollectivesTest, ARankThatLeavesEndsTheOthersCollectiveWithAnErrorNotAHang) {
  std::unique_ptr<RendezvousHost> host = Host(2, absl::Seconds(5));
  ASSERT_NE(host, nullptr);
  absl::Status survivor;
  double seconds = 0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<CpuGroup>> group =
          CpuGroup::Join(Options(*host, "job-leaves/1", rank, 2, absl::Seconds(5)));
      ASSERT_TRUE(group.ok()) << group.status();
      torch::Tensor t = torch::ones({4});
      ASSERT_TRUE((*group)->AllReduceSum(t).ok());
      if (rank == 1) return;  // leaves: its group (and its connections) go away
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto start = std::chrono::steady_clock::now();
      survivor = (*group)->AllReduceSum(t);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(survivor.ok());
  EXPECT_TRUE(survivor.code() == absl::StatusCode::kUnavailable ||
              survivor.code() == absl::StatusCode::kDeadlineExceeded)
      << survivor;
  EXPECT_THAT(survivor.message(), HasSubstr("group 'job-leaves/1' rank 0 of 2: all-reduce failed"));
  EXPECT_LT(seconds, 8);  // within the timeout (Gloo sees a closed peer at once)
}

TEST(CollectivesTest, BadOptionsAndAnUnreachableStoreAreRefusedWithASentence) {
  GroupOptions options;
  options.prefix = "job-x/1";
  options.rank = 2;
  options.world_size = 2;
  EXPECT_EQ(CpuGroup::Join(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  options.prefix = "";
  EXPECT_EQ(CpuGroup::Join(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousHost::Start("127.0.0.1", 5, 4, 2, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing listens on the port a store just gave back.
  int port = 0;
  {
    std::unique_ptr<RendezvousHost> gone = Host(1);
    ASSERT_NE(gone, nullptr);
    port = gone->port();
  }
  options.prefix = "job-x/1";
  options.store_port = port;
  options.timeout = absl::Seconds(1);
  const absl::Status unreachable = CpuGroup::Join(options).status();
  EXPECT_EQ(unreachable.code(), absl::StatusCode::kUnavailable) << unreachable;
  EXPECT_THAT(unreachable.message(), HasSubstr("cannot reach the rendezvous store at 127.0.0.1:"));
}

}  // namespace
}  // namespace trainerd::engine
