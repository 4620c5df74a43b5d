// The training paths' gradient exchange (training_path.h) on a c10d group
// (distributed/gradient_exchange.h): ranks as threads of this process, each a LibTorch path on its
// slice of every global batch, end with the model one path trains on the whole global batches,
// also when the last global batch splits unevenly (the exchange weighs each rank by its rows), with
// clipping and Adam; and the same layout repeats bit for bit.
#include "server/engine/distributed/data_parallel.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/file_io.h"
#include "common/job_limits.h"
#include "common/model_spec.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/distributed/collectives.h"
#include "server/engine/distributed/gradient_exchange.h"
#include "server/engine/distributed/peers.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/trainer.h"
#include "server/engine/training/training_path.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

constexpr int64_t kRows = 100;  // MakeDataset's rows

TrainingRun MakeRun(const std::shared_ptr<const Dataset>& dataset, OptimizerKind optimizer) {
  TrainingRun run;
  run.spec.dataset = "dp";
  run.spec.model = "linear:12,tanh,linear:2";
  run.spec.loss = LossKind::kMse;
  run.spec.optimizer = optimizer;
  run.spec.learning_rate = optimizer == OptimizerKind::kSgd ? 0.05 : 0.01;
  run.spec.momentum = optimizer == OptimizerKind::kSgd ? 0.9 : 0.0;
  run.spec.clip_grad_norm = 0.5;  // clipping after the exchange: the global batch's norm
  run.spec.batch_size = 10;
  run.spec.epochs = 3;
  run.spec.seed = 17;
  run.spec.device = "cpu";
  run.model = *ParseModelSpec(run.spec.model);
  run.dataset = dataset;
  return run;
}

std::shared_ptr<const Dataset> MakeDataset() {
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "dp";
  dataset->meta.feature_shape = {4};
  dataset->meta.target_shape = {2};
  dataset->meta.rows = kRows;
  dataset->meta.device = "cpu";
  torch::manual_seed(11);
  dataset->features = torch::randn({kRows, 4});
  dataset->targets =
      torch::stack({dataset->features.sum(1).sin(), dataset->features.narrow(1, 0, 2).prod(1)}, 1);
  return dataset;
}

// Rank `rank` of `world`'s rows of the global batch [begin, begin + rows): equal slices of
// ceil(rows / world), the last ones shorter or empty.
std::pair<int64_t, int64_t> Slice(int64_t begin, int64_t rows, int rank, int world) {
  const int64_t each = (rows + world - 1) / world;
  const int64_t from = std::min(rows, rank * each);
  const int64_t to = std::min(rows, (rank + 1) * each);
  return {begin + from, to - from};
}

std::vector<torch::Tensor> Parameters(TrainingPath& path, const TrainingRun& run) {
  HostTransfers host;
  TrainingOutcome outcome;
  const absl::StatusOr<std::string> model = path.Finish(host, outcome);
  EXPECT_TRUE(model.ok()) << model.status();
  std::vector<torch::Tensor> values;
  for (const ParameterValues& p : outcome.parameters) {
    values.push_back(torch::tensor(p.values));
  }
  return values;
}

// One path on the whole global batches of `world` ranks' batch_size each, in order.
std::vector<torch::Tensor> Alone(const TrainingRun& run, int world) {
  std::unique_ptr<TrainingPath> path =
      MakeLibTorchPath(run, at::detail::createCPUGenerator(*run.spec.seed));
  const int64_t global = run.spec.batch_size * world;
  const int64_t all_rows = run.dataset->features.size(0);
  for (int epoch = 0; epoch < run.spec.epochs; ++epoch) {
    path->BeginEpoch();
    for (int64_t begin = 0; begin < all_rows; begin += global) {
      path->Step(BatchView{&run.dataset->features, &run.dataset->targets, begin,
                           std::min(global, all_rows - begin)});
    }
  }
  return Parameters(*path, run);
}

// `world` ranks, each a path on its slice of every global batch, exchanging gradients. A rank
// whose slice of the last global batch is empty still takes part, with no rows.
std::vector<torch::Tensor> Ranks(const TrainingRun& run, int world, const std::string& prefix) {
  absl::StatusOr<std::unique_ptr<RendezvousHost>> host =
      RendezvousHost::Start("127.0.0.1", 0, 0, world, absl::Seconds(30));
  EXPECT_TRUE(host.ok()) << host.status();
  if (!host.ok()) return {};
  std::vector<std::vector<torch::Tensor>> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GroupOptions options;
      options.store_port = (*host)->port();
      options.store_secret = (*host)->secret();
      options.prefix = prefix;
      options.rank = rank;
      options.world_size = world;
      absl::StatusOr<std::unique_ptr<CpuGroup>> group = CpuGroup::Join(options);
      ASSERT_TRUE(group.ok()) << group.status();
      GroupGradientExchange exchange(**group);
      std::unique_ptr<TrainingPath> path =
          MakeLibTorchPath(run, at::detail::createCPUGenerator(*run.spec.seed));
      ASSERT_TRUE(path->SetGradientExchange(&exchange));
      const int64_t global = run.spec.batch_size * world;
      const int64_t all_rows = run.dataset->features.size(0);
      int64_t steps = 0;
      for (int epoch = 0; epoch < run.spec.epochs; ++epoch) {
        path->BeginEpoch();
        for (int64_t begin = 0; begin < all_rows; begin += global) {
          const auto [from, rows] = Slice(begin, std::min(global, all_rows - begin), rank, world);
          path->Step(BatchView{&run.dataset->features, &run.dataset->targets, from, rows});
          ++steps;
        }
      }
      EXPECT_EQ(exchange.exchanges(), steps);
      results[rank] = Parameters(*path, run);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_EQ(results[rank].size(), results[0].size());
    for (size_t k = 0; k < results[0].size() && k < results[rank].size(); ++k) {
      EXPECT_TRUE(torch::equal(results[rank][k], results[0][k])) << "rank " << rank;
    }
  }
  return results[0];
}

TEST(DataParallelTest, RanksTrainTheModelOnePathTrainsOnTheGlobalBatches) {
  const auto dataset = MakeDataset();
  for (OptimizerKind optimizer : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    // 2 ranks: global batches of 20, all even. 3 ranks: of 30, the last (10 rows) split 4, 4, 2,
    // which only a rows-weighted exchange averages right.
    for (int world : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(OptimizerKindName(optimizer), ", ", world, " ranks"));
      const TrainingRun run = MakeRun(dataset, optimizer);
      const std::vector<torch::Tensor> alone = Alone(run, world);
      const std::vector<torch::Tensor> ranks =
          Ranks(run, world, absl::StrCat("dp-", static_cast<int>(optimizer), "-", world, "/1"));
      const std::vector<torch::Tensor> again =
          Ranks(run, world, absl::StrCat("dp-", static_cast<int>(optimizer), "-", world, "/2"));
      ASSERT_EQ(ranks.size(), alone.size());
      ASSERT_EQ(again.size(), alone.size());
      for (size_t k = 0; k < alone.size(); ++k) {
        EXPECT_TRUE(torch::allclose(ranks[k], alone[k], /*rtol=*/1e-4, /*atol=*/1e-5))
            << "parameter " << k << ": " << (ranks[k] - alone[k]).abs().max();
        EXPECT_TRUE(torch::equal(ranks[k], again[k])) << "parameter " << k;
      }
      // Trained: far from the model the seed starts from.
      TrainingRun untrained = run;
      untrained.spec.epochs = 0;
      EXPECT_FALSE(torch::allclose(alone[0], Alone(untrained, world)[0], 1e-3, 1e-3));
    }
  }
}

// 92 rows on 3 ranks of 10: the last global batch has 2 rows, split 1, 1 and none; the rank with
// none still steps (zero gradients, no weight), so the three stay one model, the one-path model.
TEST(DataParallelTest, ARankWithAnEmptySliceStillStepsWithTheOthers) {
  auto full = MakeDataset();
  auto dataset = std::make_shared<Dataset>(*full);
  dataset->features = full->features.narrow(0, 0, 92).contiguous();
  dataset->targets = full->targets.narrow(0, 0, 92).contiguous();
  dataset->meta.rows = 92;
  const TrainingRun run = MakeRun(dataset, OptimizerKind::kAdam);
  const std::vector<torch::Tensor> alone = Alone(run, 3);
  const std::vector<torch::Tensor> ranks = Ranks(run, 3, "dp-empty/1");
  ASSERT_EQ(ranks.size(), alone.size());
  for (size_t k = 0; k < alone.size(); ++k) {
    EXPECT_TRUE(torch::allclose(ranks[k], alone[k], /*rtol=*/1e-4, /*atol=*/1e-5))
        << "parameter " << k << ": " << (ranks[k] - alone[k]).abs().max();
  }
}

// A whole job as ranks (RunDataParallel: threads, each RunRank on the LibTorch path) against the
// same job as one rank with the global batch: shuffled epochs, a held-out fraction, Adam and
// clipping. Every epoch's loss and validation loss, the steps, the host transfers (one per epoch
// on the leader, plus the model's read-back) and the trained parameters agree, and the ranks'
// run repeats bit for bit.
struct Recorded {
  TrainingOutcome outcome;
  std::vector<EpochResult> epochs;
};

Recorded RunJob(TrainingRun run) {
  Recorded recorded;
  run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { recorded.epochs.push_back(e); };
  recorded.outcome =
      run.spec.replicas > 1 ? RunDataParallel(run, absl::Seconds(30)) : RunTraining(run);
  return recorded;
}

TEST(DataParallelJobTest, RanksTrainTheJobAsOneRankWithTheGlobalBatch) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kAdam);
  run.spec.epochs = 4;
  run.spec.validation_fraction = 0.2;  // 80 rows train: global batches of 30, 30, 20
  run.spec.engine = EngineKind::kLibTorch;
  TrainingRun one = run;
  one.spec.batch_size = 30;
  TrainingRun ranks = run;
  ranks.spec.replicas = 3;

  const Recorded alone = RunJob(one);
  const Recorded first = RunJob(ranks);
  const Recorded again = RunJob(ranks);
  ASSERT_EQ(alone.outcome.state, JobState::kSucceeded) << alone.outcome.error;
  ASSERT_EQ(first.outcome.state, JobState::kSucceeded) << first.outcome.error;
  ASSERT_EQ(first.epochs.size(), 4u);
  ASSERT_EQ(alone.epochs.size(), 4u);
  for (size_t e = 0; e < 4; ++e) {
    EXPECT_NEAR(first.epochs[e].loss, alone.epochs[e].loss, 1e-5 * alone.epochs[e].loss);
    ASSERT_TRUE(first.epochs[e].validation_loss.has_value());
    EXPECT_NEAR(*first.epochs[e].validation_loss, *alone.epochs[e].validation_loss,
                1e-5 * *alone.epochs[e].validation_loss);
    EXPECT_EQ(first.epochs[e].loss, again.epochs[e].loss);  // bit for bit
  }
  EXPECT_LT(first.epochs.back().loss, first.epochs.front().loss);
  EXPECT_EQ(first.outcome.steps, alone.outcome.steps);
  EXPECT_EQ(first.outcome.steps, 4 * 3);
  EXPECT_EQ(first.outcome.host_syncs, alone.outcome.host_syncs);
  ASSERT_EQ(first.outcome.parameters.size(), alone.outcome.parameters.size());
  for (size_t p = 0; p < alone.outcome.parameters.size(); ++p) {
    const auto& want = alone.outcome.parameters[p].values;
    const auto& got = first.outcome.parameters[p].values;
    ASSERT_EQ(got.size(), want.size());
    for (size_t v = 0; v < want.size(); ++v) {
      EXPECT_NEAR(got[v], want[v], 1e-4 * std::max(1.0f, std::fabs(want[v])))
          << alone.outcome.parameters[p].name << "[" << v << "]";
    }
  }
  EXPECT_FALSE(first.outcome.model_archive.empty());  // rank 0 exported the model
}

// model_from best on ranks: rank 0 hands back its best validation epoch's weights, those of the
// same job on one rank with the global batch.
TEST(DataParallelJobTest, RanksHandBackTheBestEpochAsOneRankDoes) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.learning_rate = 0.4;  // a validation loss that goes up and down
  run.spec.epochs = 10;
  run.spec.validation_fraction = 0.2;
  run.spec.model_from = ModelFrom::kBest;
  run.spec.engine = EngineKind::kLibTorch;
  TrainingRun one = run;
  one.spec.batch_size = 20;
  TrainingRun ranks = run;
  ranks.spec.replicas = 2;
  const Recorded alone = RunJob(one);
  const Recorded got = RunJob(ranks);
  ASSERT_EQ(alone.outcome.state, JobState::kSucceeded) << alone.outcome.error;
  ASSERT_EQ(got.outcome.state, JobState::kSucceeded) << got.outcome.error;
  int32_t best = 0;
  double lowest = std::numeric_limits<double>::infinity();
  for (const EpochResult& e : got.epochs) {
    if (*e.validation_loss < lowest) {
      lowest = *e.validation_loss;
      best = e.epoch;
    }
  }
  ASSERT_LT(best, 10) << "the validation loss never turned up";
  EXPECT_EQ(got.outcome.best_epoch, best);
  EXPECT_EQ(got.outcome.model_epoch, best);
  EXPECT_EQ(alone.outcome.model_epoch, best);
  ASSERT_EQ(got.outcome.parameters.size(), alone.outcome.parameters.size());
  for (size_t p = 0; p < alone.outcome.parameters.size(); ++p) {
    const auto& want = alone.outcome.parameters[p].values;
    const auto& have = got.outcome.parameters[p].values;
    ASSERT_EQ(have.size(), want.size());
    for (size_t v = 0; v < want.size(); ++v) {
      EXPECT_NEAR(have[v], want[v], 1e-4 * std::max(1.0f, std::fabs(want[v])))
          << alone.outcome.parameters[p].name << "[" << v << "]";
    }
  }
}

// The ranks agree at each epoch's end on what every one of them decides: a cancel seen by any
// rank ends the job CANCELLED on all, and a diverging loss fails it on all with the sentence of
// one rank, neither waiting for a timeout.
TEST(DataParallelJobTest, RanksEndTogetherOnACancelAndOnADivergingLoss) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.replicas = 2;
  std::atomic<bool> cancel{true};
  run.cancel = &cancel;
  const Recorded cancelled = RunJob(run);
  EXPECT_EQ(cancelled.outcome.state, JobState::kCancelled) << cancelled.outcome.error;
  EXPECT_TRUE(cancelled.epochs.empty());
  EXPECT_EQ(cancelled.outcome.steps, 1);  // the ranks stop together after the step that told them

  // A cancel during the job (here, as the first epoch is reported): the ranks stop together after
  // the next step.
  cancel = false;
  TrainingRun mid = run;
  Recorded during;
  mid.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
    during.epochs.push_back(e);
    cancel = true;
  };
  during.outcome = RunDataParallel(mid, absl::Seconds(30));
  EXPECT_EQ(during.outcome.state, JobState::kCancelled) << during.outcome.error;
  EXPECT_EQ(during.epochs.size(), 1u);
  EXPECT_EQ(during.outcome.steps, 5 + 1);  // 100 rows in global batches of 20, then one more

  TrainingRun diverging = MakeRun(dataset, OptimizerKind::kSgd);
  diverging.spec.replicas = 2;
  diverging.spec.learning_rate = 1e12;
  diverging.spec.clip_grad_norm = 0;
  const auto start = std::chrono::steady_clock::now();
  const Recorded failed = RunJob(diverging);
  EXPECT_EQ(failed.outcome.state, JobState::kFailed);
  EXPECT_THAT(failed.outcome.error, ::testing::HasSubstr("loss became"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
}

TEST(DataParallelJobTest, WhatRanksCannotTrainYetIsRefusedWithAReason) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.replicas = 2;
  run.spec.precision = Precision::kBf16;
  const TrainingOutcome refused = RunDataParallel(run);
  EXPECT_EQ(refused.state, JobState::kFailed);
  EXPECT_EQ(refused.error,
            "this job cannot train as ranks: ranks train in float32 (precision fp32)");
  run.spec.precision = Precision::kFp32;
  run.model = *ParseModelSpec("linear:12,relu,dropout:0.2,linear:2");
  EXPECT_THAT(RunDataParallel(run).error, ::testing::HasSubstr("dropout layers train on one rank"));
  run.model = *ParseModelSpec("linear:12,batchnorm,relu,linear:2");
  EXPECT_THAT(RunDataParallel(run).error,
              ::testing::HasSubstr("batchnorm layers train on one rank"));
  run.model = *ParseModelSpec(run.spec.model);
  run.spec.gradient_accumulation_steps = 2;
  EXPECT_EQ(RunDataParallel(run).error,
            "this job cannot train as ranks: gradient accumulation trains on one rank (the ranks "
            "exchange gradients once per batch, weighted by its rows; accumulated gradients are "
            "not a global batch's mean)");
  run.spec.gradient_accumulation_steps = 1;
  run.spec.precision = Precision::kFp32;
  run.spec.replicas = 1;
  EXPECT_EQ(RunDataParallel(run).error, "a data-parallel job has at least 2 ranks");
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void ExpectParametersNear(const TrainingOutcome& got, const TrainingOutcome& want) {
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  for (size_t p = 0; p < want.parameters.size(); ++p) {
    ASSERT_EQ(got.parameters[p].values.size(), want.parameters[p].values.size());
    for (size_t v = 0; v < want.parameters[p].values.size(); ++v) {
      const float w = want.parameters[p].values[v];
      EXPECT_NEAR(got.parameters[p].values[v], w, 1e-4 * std::max(1.0f, std::fabs(w)))
          << want.parameters[p].name << "[" << v << "]";
    }
  }
}

// drop_last on ranks drops the epoch's short last global batch: 3 ranks of batch 10 train the 100
// rows' 3 whole global batches of 30 (90 rows), as one rank with batch 30 and drop_last does.
TEST(DataParallelJobTest, DropLastDropsTheShortLastGlobalBatch) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kAdam);
  run.spec.engine = EngineKind::kLibTorch;
  run.spec.drop_last = true;
  TrainingRun one = run;
  one.spec.batch_size = 30;
  TrainingRun ranks = run;
  ranks.spec.replicas = 3;
  TrainingRun kept = one;
  kept.spec.drop_last = false;

  const Recorded alone = RunJob(one);
  const Recorded split = RunJob(ranks);
  const Recorded whole = RunJob(kept);
  ASSERT_EQ(alone.outcome.state, JobState::kSucceeded) << alone.outcome.error;
  ASSERT_EQ(split.outcome.state, JobState::kSucceeded) << split.outcome.error;
  ASSERT_EQ(split.epochs.size(), 3u);
  EXPECT_EQ(alone.outcome.steps, 3 * 3);
  EXPECT_EQ(split.outcome.steps, 3 * 3);
  EXPECT_EQ(whole.outcome.steps, 3 * 4);
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(split.epochs[e].loss, alone.epochs[e].loss, 1e-5 * alone.epochs[e].loss);
    EXPECT_NE(alone.epochs[e].loss, whole.epochs[e].loss);
  }
  ExpectParametersNear(split.outcome, alone.outcome);
}

// Rank 0's checkpoint holds the one model all ranks hold, with the optimizer's state and the
// job's generator (the same on every rank): a job taken up from it on another number of ranks
// (or on one), with the same global batch, goes on as the uninterrupted job does.
TEST(DataParallelJobTest, ACheckpointOfRanksResumesOnAnotherNumberOfRanks) {
  const auto dataset = MakeDataset();
  const test_support::ScratchDir dir;
  TrainingRun run = MakeRun(dataset, OptimizerKind::kAdam);
  run.spec.engine = EngineKind::kLibTorch;
  run.spec.epochs = 4;
  run.spec.batch_size = 15;  // 2 ranks: global batches of 30
  run.spec.replicas = 2;
  run.spec.checkpoint_every = 2;
  run.checkpoint_dir = dir.path();
  const Recorded whole = RunJob(run);
  ASSERT_EQ(whole.outcome.state, JobState::kSucceeded) << whole.outcome.error;
  ASSERT_EQ(whole.epochs.size(), 4u);
  const std::string checkpoint = dir.path() + "/" + CheckpointFileName(2);
  ASSERT_TRUE(FileExists(checkpoint));
  for (int world : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    TrainingRun resumed = run;
    resumed.spec.replicas = world;
    resumed.spec.batch_size = 30 / world;
    resumed.checkpoint_dir.clear();
    resumed.resume_from = checkpoint;
    const Recorded after = RunJob(resumed);
    ASSERT_EQ(after.outcome.state, JobState::kSucceeded) << after.outcome.error;
    ASSERT_EQ(after.epochs.size(), 2u);
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_EQ(after.epochs[e].epoch, static_cast<int32_t>(e) + 3);
      EXPECT_NEAR(after.epochs[e].loss, whole.epochs[e + 2].loss, 1e-5 * whole.epochs[e + 2].loss);
    }
    EXPECT_EQ(after.outcome.steps, whole.outcome.steps);
    ExpectParametersNear(after.outcome, whole.outcome);
  }
}

// A drain (the daemon stopping) asked of the job is voted on at the epoch's end: every rank stops
// after the same epoch, rank 0 checkpoints it, and the job taken up from there on its ranks ends
// bit for bit as the uninterrupted job.
TEST(DataParallelJobTest, ADrainStopsEveryRankAfterTheSameEpochAndTheJobResumesExactly) {
  const auto dataset = MakeDataset();
  const test_support::ScratchDir dir;
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.epochs = 4;
  run.spec.replicas = 2;
  run.checkpoint_dir = dir.path();
  const Recorded reference = RunJob(run);
  ASSERT_EQ(reference.outcome.state, JobState::kSucceeded) << reference.outcome.error;

  std::atomic<bool> drain{false};
  TrainingRun draining = run;
  draining.drain = &drain;
  std::vector<EpochResult> before;
  draining.on_epoch = [&](const EpochResult& e, int64_t, int64_t) {
    before.push_back(e);
    drain = true;  // seen at the next epoch's end
  };
  const TrainingOutcome stopped = RunDataParallel(draining, absl::Seconds(30));
  EXPECT_EQ(stopped.state, JobState::kRunning) << stopped.error;
  EXPECT_TRUE(stopped.interrupted);
  ASSERT_EQ(before.size(), 2u);
  const std::string checkpoint = dir.path() + "/" + CheckpointFileName(2);
  ASSERT_TRUE(FileExists(checkpoint));

  TrainingRun resumed = run;
  resumed.checkpoint_dir.clear();
  resumed.resume_from = checkpoint;
  const Recorded after = RunJob(resumed);
  ASSERT_EQ(after.outcome.state, JobState::kSucceeded) << after.outcome.error;
  ASSERT_EQ(after.epochs.size(), 2u);
  EXPECT_EQ(before[0].loss, reference.epochs[0].loss);
  EXPECT_EQ(before[1].loss, reference.epochs[1].loss);
  EXPECT_EQ(after.epochs[0].loss, reference.epochs[2].loss);  // bit for bit
  EXPECT_EQ(after.epochs[1].loss, reference.epochs[3].loss);
}

// Ranks "on a peer" as the ranks' run sees them (PeerRankCalls): each call runs the rank on a
// thread here through RunJoinedRank with what its request says, as a peer daemon's RunRankForPeer
// does (tests/e2e/peers_e2e_test.cc has the real daemons). `mode` breaks the peer on purpose.
class ThreadPeers final : public PeerRankCalls {
 public:
  enum class Mode {
    kRank,       // runs the rank as asked
    kTampered,   // expects another checkpoint than the leader named (its bytes changed on the way)
    kFailsLate,  // trains as asked, then says its rank failed
    kSilent,     // never answers until its call is cancelled (a daemon stopped with SIGSTOP)
  };
  ThreadPeers(TrainingRun run, Mode mode) : run_(std::move(run)), mode_(mode) {}
  ~ThreadPeers() override {
    for (std::thread& t : threads_) t.join();
  }

  std::vector<RemoteRankRequest> requests;  // what the leader asked, in order

  std::unique_ptr<Call> StartRank(const std::string& peer, const RemoteRankRequest& request,
                                  std::function<void(RemoteRankResult)> done) override {
    requests.push_back(request);
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    threads_.emplace_back([this, peer, request, cancel, done = std::move(done)] {
      RemoteRankResult result;
      result.node = peer;
      if (mode_ == Mode::kSilent) {
        while (!cancel->load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        result.status = absl::CancelledError("cancelled by the caller");
        done(result);
        return;
      }
      TrainingRun run = run_;
      run.spec = request.spec;
      run.cancel = cancel.get();
      run.checkpoint_dir.clear();
      run.resume_from.clear();
      run.resume_bytes.reset();
      JoinedGroup joined = JoinedGroupOf(request, "");
      if (request.resume_bytes > 0) {
        run.resume_from = "the leader's checkpoint";
        if (mode_ == Mode::kTampered) joined.resume.expect_sha256 = std::string(64, 'f');
      }
      const TrainingOutcome outcome = RunJoinedRank(run, joined.group, joined.resume);
      result.state = outcome.state;
      result.error = outcome.error;
      result.steps = outcome.steps;
      if (mode_ == Mode::kFailsLate) {
        result.state = JobState::kFailed;
        result.error = "its disk broke after the last step";
      }
      done(result);
    });
    class Handle final : public Call {
     public:
      explicit Handle(std::shared_ptr<std::atomic<bool>> cancel) : cancel_(std::move(cancel)) {}
      void Cancel() override { cancel_->store(true); }

     private:
      std::shared_ptr<std::atomic<bool>> cancel_;
    };
    return std::make_unique<Handle>(cancel);
  }

 private:
  const TrainingRun run_;
  const Mode mode_;
  std::vector<std::thread> threads_;
};

// Rank 0 here, rank 1 "on peer-a:1".
Recorded RunWithPeer(TrainingRun run, ThreadPeers& peers, absl::Duration timeout) {
  Recorded recorded;
  run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { recorded.epochs.push_back(e); };
  DataParallelOptions options;
  options.timeout = timeout;
  options.peers = {"", "peer-a:1"};
  options.remote = &peers;
  options.job_id = "job-peer";
  recorded.outcome = RunDataParallel(run, options);
  return recorded;
}

// A job with a rank on a peer, taken up from its checkpoint (the leader restarted, drained, or
// lost another peer): rank 0 hands the checkpoint's bytes to the peer's rank through the group,
// the peer checks them against the SHA-256 its call carries, and every rank goes on from the same
// epoch: the job ends with the uninterrupted job's every loss and parameter, bit for bit.
TEST(DataParallelJobTest, ARankOnAPeerResumesFromTheLeadersCheckpoint) {
  const auto dataset = MakeDataset();
  const test_support::ScratchDir dir;
  TrainingRun run = MakeRun(dataset, OptimizerKind::kAdam);
  run.spec.engine = EngineKind::kLibTorch;
  run.spec.epochs = 4;
  run.spec.batch_size = 15;
  run.spec.replicas = 2;
  run.spec.checkpoint_every = 2;
  run.checkpoint_dir = dir.path();
  ThreadPeers peers(run, ThreadPeers::Mode::kRank);
  const Recorded whole = RunWithPeer(run, peers, absl::Seconds(30));
  ASSERT_EQ(whole.outcome.state, JobState::kSucceeded) << whole.outcome.error;
  ASSERT_EQ(whole.epochs.size(), 4u);
  EXPECT_EQ(peers.requests.back().resume_bytes, 0);  // from the first epoch
  const std::string checkpoint = dir.path() + "/" + CheckpointFileName(2);
  ASSERT_TRUE(FileExists(checkpoint));

  TrainingRun resumed = run;
  resumed.checkpoint_dir.clear();
  resumed.resume_from = checkpoint;
  const Recorded after = RunWithPeer(resumed, peers, absl::Seconds(30));
  ASSERT_EQ(after.outcome.state, JobState::kSucceeded) << after.outcome.error;
  ASSERT_EQ(after.epochs.size(), 2u);
  EXPECT_EQ(after.epochs[0].epoch, 3);
  EXPECT_EQ(after.epochs[0].loss, whole.epochs[2].loss);  // bit for bit
  EXPECT_EQ(after.epochs[1].loss, whole.epochs[3].loss);
  EXPECT_EQ(after.outcome.steps, whole.outcome.steps);
  ASSERT_EQ(after.outcome.parameters.size(), whole.outcome.parameters.size());
  for (size_t p = 0; p < whole.outcome.parameters.size(); ++p) {
    EXPECT_EQ(after.outcome.parameters[p].values, whole.outcome.parameters[p].values)
        << whole.outcome.parameters[p].name;
  }
  // The peer's call named the checkpoint the leader holds.
  const RemoteRankRequest& asked = peers.requests.back();
  const std::string bytes = *ReadFileToString(checkpoint);
  EXPECT_EQ(asked.resume_bytes, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(asked.resume_sha256, Sha256Hex(bytes));
  EXPECT_EQ(asked.store_secret.size(), 64u);
  // What a peer lets a leader declare bounds the checkpoint it holds, with room to spare.
  absl::StatusOr<MemoryEstimate> estimate =
      EstimateTrainingMemory(run.model, dataset->meta.feature_shape, run.spec.batch_size, 2);
  ASSERT_TRUE(estimate.ok());
  absl::StatusOr<int64_t> most = MostCheckpointBytes(*estimate, run.model.layers.size());
  ASSERT_TRUE(most.ok());
  EXPECT_LT(static_cast<int64_t>(bytes.size()), *most);
}

// A job succeeds only when every rank did: a peer's rank that cannot start from the checkpoint
// (its bytes are not the ones the leader named) or that fails after the last step fails the job,
// naming the rank and the peer, though rank 0 finished.
TEST(DataParallelJobTest, AJobWhoseRankFailedNeverSucceeds) {
  const auto dataset = MakeDataset();
  const test_support::ScratchDir dir;
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.epochs = 2;
  run.spec.replicas = 2;
  run.spec.checkpoint_every = 1;
  run.checkpoint_dir = dir.path();
  {
    ThreadPeers late(run, ThreadPeers::Mode::kFailsLate);
    const Recorded failed = RunWithPeer(run, late, absl::Seconds(30));
    EXPECT_EQ(failed.outcome.state, JobState::kFailed);
    EXPECT_THAT(failed.outcome.error, ::testing::HasSubstr("rank 1 (peer-a:1) did not finish"));
    EXPECT_THAT(failed.outcome.error, ::testing::HasSubstr("its disk broke"));
    EXPECT_TRUE(failed.outcome.model_archive.empty());
  }
  TrainingRun resumed = run;
  resumed.checkpoint_dir.clear();
  resumed.resume_from = dir.path() + "/" + CheckpointFileName(1);
  ThreadPeers tampered(run, ThreadPeers::Mode::kTampered);
  const Recorded refused = RunWithPeer(resumed, tampered, absl::Seconds(30));
  EXPECT_EQ(refused.outcome.state, JobState::kFailed);
  EXPECT_THAT(refused.outcome.error, ::testing::HasSubstr("rank 1"));
  EXPECT_THAT(refused.outcome.error, ::testing::HasSubstr("is not the one the leader named"));
}

// A peer that stops answering (its daemon stopped: SIGSTOP) ends the job once the collective
// timeout and a short grace have passed, failed, naming the rank, the peer and the timeout, and
// counts as lost as a killed one does (the job manager then takes a checkpointed job up without
// it).
TEST(DataParallelJobTest, ASilentPeerIsLostAfterTheCollectiveTimeout) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.replicas = 2;
  ThreadPeers silent(run, ThreadPeers::Mode::kSilent);
  const auto start = std::chrono::steady_clock::now();
  const Recorded lost = RunWithPeer(run, silent, absl::Seconds(2));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(lost.outcome.state, JobState::kFailed);
  EXPECT_THAT(lost.outcome.error, ::testing::HasSubstr("rank 1: peer peer-a:1 did not answer"));
  EXPECT_THAT(lost.outcome.error, ::testing::HasSubstr("collective timeout (2s)"));
  EXPECT_EQ(lost.outcome.lost_peer, "peer-a:1");
  EXPECT_THAT(lost.outcome.lost_peers, ::testing::ElementsAre("peer-a:1"));
  EXPECT_LT(seconds, 20);  // the timeout and the grace, not a hang
}

// Two peers stopped at once are both lost: the job manager takes the job up without either of
// them (each such peer once, in rank order), not with one of them still in the group.
TEST(DataParallelJobTest, EveryPeerThatWentSilentIsLost) {
  const auto dataset = MakeDataset();
  TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  run.spec.replicas = 4;
  ThreadPeers silent(run, ThreadPeers::Mode::kSilent);
  DataParallelOptions options;
  options.timeout = absl::Seconds(2);
  options.peers = {"", "peer-a:1", "peer-b:2", "peer-a:1"};
  options.remote = &silent;
  options.job_id = "job-two-peers";
  const TrainingOutcome lost = RunDataParallel(run, options);
  EXPECT_EQ(lost.state, JobState::kFailed);
  EXPECT_EQ(lost.lost_peer, "peer-a:1");
  EXPECT_THAT(lost.lost_peers, ::testing::ElementsAre("peer-a:1", "peer-b:2"));
}

// Without the exchange the ranks' models part: the test above is not passing by accident.
TEST(DataParallelTest, PathsThatDoNotExchangeEndApart) {
  const auto dataset = MakeDataset();
  const TrainingRun run = MakeRun(dataset, OptimizerKind::kSgd);
  std::vector<std::unique_ptr<TrainingPath>> paths;
  for (int rank = 0; rank < 2; ++rank) {
    paths.push_back(MakeLibTorchPath(run, at::detail::createCPUGenerator(*run.spec.seed)));
    paths.back()->BeginEpoch();
    for (int64_t begin = 0; begin < kRows; begin += 20) {
      const auto [from, rows] = Slice(begin, std::min<int64_t>(20, kRows - begin), rank, 2);
      paths.back()->Step(BatchView{&dataset->features, &dataset->targets, from, rows});
    }
  }
  EXPECT_FALSE(torch::allclose(Parameters(*paths[0], run)[0], Parameters(*paths[1], run)[0]));
}

}  // namespace
}  // namespace trainerd::engine
