// End to end, a data-parallel job (JobSpec.replicas) against the real trainerd and trainctl: the
// ranks train as one rank with the global batch does, repeat bit for bit, report where they ran
// and their time in collectives, and what ranks cannot train is refused at submit with the reason
// and the right status. The daemon runs the ranks as threads on the CPU (Gloo on loopback).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/e2e/subprocess.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;

class DataParallelEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-dp-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<std::string> argv = {
        TRAINERD_BIN,       "--listen=127.0.0.1:0", "--data_dir=" + (dir_ / "data").string(),
        "--device=cpu",     "--metrics_listen=",    "--diagnose_at_start=false",
        "--max_replicas=4", "--node_name=node-a"};
    daemon_ = std::make_unique<Daemon>(argv);
    std::string line;
    ASSERT_TRUE(daemon_->ReadLine(&line, 60)) << "trainerd did not start: " << daemon_->Stderr();
    addr_ = ListeningAddress(line);
    ASSERT_FALSE(addr_.empty()) << line;

    // 240 rows of y = sin(x0 + x1) + x2 * x3, as CSV.
    std::mt19937 rng(5);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::string csv = "a,b,c,d,y\n";
    for (int i = 0; i < 240; ++i) {
      double x[4];
      for (double& v : x) v = normal(rng);
      csv += std::to_string(x[0]) + "," + std::to_string(x[1]) + "," + std::to_string(x[2]) + "," +
             std::to_string(x[3]) + "," + std::to_string(std::sin(x[0] + x[1]) + x[2] * x[3]) +
             "\n";
    }
    const std::string path = (dir_ / "data.csv").string();
    std::ofstream(path) << csv;
    RunResult up = Ctl({"dataset", "upload", "waves", path});
    ASSERT_EQ(up.exit_code, 0) << up.err;
  }

  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  RunResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr_});
    return e2e::Run(args);
  }

  // Submits with `extra` flags, follows the job to its end, and returns it (full view).
  v1::Job Train(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"submit",
                                     "--dataset",
                                     "waves",
                                     "--model",
                                     "linear:16,tanh,linear:1",
                                     "--optimizer",
                                     "adam",
                                     "--lr",
                                     "0.01",
                                     "--epochs",
                                     "6",
                                     "--seed",
                                     "21",
                                     "--validation-fraction",
                                     "0.25",
                                     "--engine",
                                     "libtorch",
                                     "--watch"};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult run = Ctl(args);
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    const std::string id = run.out.substr(0, run.out.find('\n'));
    RunResult got = Ctl({"-o", "json", "job", "get", id});
    v1::Job job;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &job).ok()) << got.out;
    return job;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
};

// Two ranks of 12 rows train as one rank of 24 (within float32 rounding), and again bit for bit;
// the job says where its ranks ran, its global batch and its time in collectives.
TEST_F(DataParallelEndToEndTest, RanksTrainAsOneRankWithTheGlobalBatchAndRepeatBitForBit) {
  const v1::Job one = Train({"--batch-size", "24"});
  const v1::Job ranks = Train({"--batch-size", "12", "--replicas", "2"});
  const v1::Job again = Train({"--batch-size", "12", "--replicas", "2"});
  ASSERT_EQ(one.state(), v1::JOB_STATE_SUCCEEDED) << one.error();
  ASSERT_EQ(ranks.state(), v1::JOB_STATE_SUCCEEDED) << ranks.error();
  ASSERT_EQ(again.state(), v1::JOB_STATE_SUCCEEDED) << again.error();
  ASSERT_EQ(ranks.epochs_size(), 6);
  ASSERT_EQ(one.epochs_size(), 6);
  for (int e = 0; e < 6; ++e) {
    EXPECT_NEAR(ranks.epochs(e).loss(), one.epochs(e).loss(), 1e-5 * one.epochs(e).loss());
    EXPECT_NEAR(ranks.epochs(e).validation_loss(), one.epochs(e).validation_loss(),
                1e-5 * one.epochs(e).validation_loss());
    EXPECT_EQ(again.epochs(e).loss(), ranks.epochs(e).loss());  // bit for bit
  }
  EXPECT_LT(ranks.epochs(5).loss(), ranks.epochs(0).loss());
  EXPECT_EQ(ranks.steps(), one.steps());  // 180 training rows: 8 global batches an epoch
  EXPECT_EQ(ranks.steps(), 6 * 8);
  ASSERT_EQ(ranks.parameters_size(), one.parameters_size());
  for (int p = 0; p < one.parameters_size(); ++p) {
    for (int v = 0; v < one.parameters(p).values_size(); ++v) {
      const double want = one.parameters(p).values(v);
      EXPECT_NEAR(ranks.parameters(p).values(v), want, 1e-4 * std::max(1.0, std::fabs(want)));
      EXPECT_EQ(again.parameters(p).values(v), ranks.parameters(p).values(v));
    }
  }
  // One host transfer per epoch on the leader, as a one-rank job.
  EXPECT_EQ(ranks.host_syncs(), one.host_syncs());

  EXPECT_EQ(ranks.spec().replicas(), 2);
  EXPECT_EQ(ranks.global_batch_size(), 24);
  EXPECT_EQ(one.global_batch_size(), 24);
  EXPECT_EQ(one.ranks_size(), 0);
  ASSERT_EQ(ranks.ranks_size(), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.ranks(r).rank(), r);
    EXPECT_EQ(ranks.ranks(r).device(), "cpu");
    EXPECT_EQ(ranks.ranks(r).node(), "node-a");
  }
  EXPECT_EQ(ranks.report().engine(), "libtorch");
  EXPECT_GT(ranks.report().collective_seconds(), 0.0);
  EXPECT_LE(ranks.report().collective_seconds(), ranks.report().compute_seconds());
  ASSERT_TRUE(ranks.report().has_collective_fraction());
  EXPECT_GT(ranks.report().collective_fraction(), 0.0);
  EXPECT_EQ(one.report().collective_seconds(), 0.0);
  EXPECT_FALSE(one.report().has_collective_fraction());

  RunResult text = Ctl({"job", "get", ranks.id()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("12 per rank, 24 global"));
  EXPECT_THAT(text.out, HasSubstr("2 (0: cpu on node-a, 1: cpu on node-a)"));
  EXPECT_THAT(text.out, HasSubstr("collectives"));
}

// What ranks cannot train is refused at submit, saying why, with INVALID_ARGUMENT (trainctl exits
// 2 for a request the daemon refused as invalid); the daemon serves on.
TEST_F(DataParallelEndToEndTest, WhatRanksCannotTrainIsRefusedAtSubmitWithTheReason) {
  struct Case {
    std::vector<std::string> flags;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {{"--replicas", "5"}, "replicas 5 is more than this daemon runs for one job (4"},
      {{"--replicas", "2", "--precision", "bf16"}, "ranks train in float32"},
      {{"--replicas", "2", "--engine", "fused"}, "ranks train on the LibTorch path"},
      {{"--replicas", "2", "--model", "linear:8,relu,dropout:0.1,linear:1"},
       "dropout layers train on one rank"},
      {{"--replicas", "0"}, "--replicas"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"submit", "--dataset", "waves", "--model", "linear:1"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    RunResult refused = Ctl(args);
    EXPECT_NE(refused.exit_code, 0) << refused.out;
    EXPECT_THAT(refused.err, HasSubstr(c.reason)) << c.flags[1];
    EXPECT_THAT(refused.err, ::testing::Not(HasSubstr("internal"))) << refused.err;
  }
  RunResult list = Ctl({"job", "list"});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, ::testing::Not(HasSubstr("job-")));  // nothing was queued
}

}  // namespace
}  // namespace trainerd::e2e
