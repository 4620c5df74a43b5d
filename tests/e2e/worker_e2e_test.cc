// End to end, untrusted TorchScript modules against the real trainerd, trainerd-worker and
// trainctl: modules that misbehave only in training mode (which the checker's eval-mode trial
// cannot see) or that the checks refuse. Each test asserts that the job ends with its reason, that
// the daemon serves throughout and runs the next job, and, across a kill -9 or a SIGTERM, that a
// restart serves at once and does not take a cancelled job up again.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/subprocess.h"

namespace trainerd::e2e {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

class WorkerEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-worker-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::string csv = "x,y\n";
    for (int i = 0; i < 64; ++i) {
      const double x = i / 64.0;
      csv += std::to_string(x) + "," + std::to_string(2 * x + 1) + "\n";
    }
    csv_ = (dir_ / "seed.csv").string();
    std::ofstream(csv_) << csv;
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {TRAINERD_BIN,        "--listen=127.0.0.1:0",
                                     "--data_dir=" + (dir_ / "data").string(),
                                     "--device=cpu",      "--metrics_listen=",
                                     "--diagnose_at_start=false", "--worker_grace=1s"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    daemon_ = std::make_unique<Daemon>(argv);
    std::string line;
    ASSERT_TRUE(daemon_->ReadLine(&line, 60)) << "trainerd did not start: " << daemon_->Stderr();
    addr_ = ListeningAddress(line);
    ASSERT_FALSE(addr_.empty()) << line;
  }

  RunResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr_});
    return e2e::Run(args);
  }

  std::string Module(const std::string& kind) {
    const std::string path = (dir_ / ("net-" + (kind.empty() ? "plain" : kind) + ".pt")).string();
    std::vector<std::string> argv = {MAKE_TORCHSCRIPT_FIXTURE_BIN, path, "1", "1"};
    if (!kind.empty()) argv.push_back(kind);
    RunResult r = e2e::Run(argv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return path;
  }

  // Submits a module job of `epochs` epochs; returns its id (empty when refused: `refusal` then
  // holds trainctl's error).
  std::string Submit(const std::string& module, std::vector<std::string> extra = {},
                     std::string* refusal = nullptr) {
    std::vector<std::string> args = {"submit",       "--dataset", "seed", "--torchscript", module,
                                     "--lr",         "0.1",       "--batch-size", "16",
                                     "--epochs",     "30",        "--seed",       "7"};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = Ctl(args);
    if (r.exit_code != 0) {
      if (refusal != nullptr) *refusal = r.err;
      return "";
    }
    return r.out.substr(0, r.out.find('\n'));
  }

  std::string Field(const std::string& id, const std::string& name) {
    RunResult r = Ctl({"-o", "json", "job", "get", id});
    const std::string key = "\"" + name + "\": ";
    const size_t at = r.out.find(key);
    if (at == std::string::npos) return "";
    const size_t start = at + key.size();
    size_t end = r.out.find_first_of(",\n", start);
    std::string value = r.out.substr(start, end - start);
    if (!value.empty() && value.front() == '"') {
      end = r.out.find("\",\n", start);
      if (end == std::string::npos) end = r.out.find("\"\n", start);
      value = r.out.substr(start + 1, end - start - 1);
    }
    return value;
  }

  bool WaitFor(const std::string& id, const std::string& state, int seconds = 60) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < until) {
      if (Field(id, "state") == state) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  void ExpectServesAndTrains() {
    RunResult health = Ctl({"health"});
    EXPECT_EQ(health.exit_code, 0) << health.err;
    const std::string next = Submit(Module(""));
    ASSERT_FALSE(next.empty());
    EXPECT_TRUE(WaitFor(next, "JOB_STATE_SUCCEEDED")) << Field(next, "error");
  }

  std::filesystem::path dir_;
  std::string csv_;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
};

TEST_F(WorkerEndToEndTest, ModulesThatMisbehaveInTrainingEndAloneWithTheirReason) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);

  const std::string loops = Submit(Module("loops-in-training"), {"--max-job-time", "2"});
  ASSERT_FALSE(loops.empty());
  ASSERT_TRUE(WaitFor(loops, "JOB_STATE_FAILED"));
  EXPECT_THAT(Field(loops, "error"), HasSubstr("ran past its time limit of 2s"));

  const std::string allocates = Submit(Module("allocates-in-training"));
  ASSERT_FALSE(allocates.empty());
  ASSERT_TRUE(WaitFor(allocates, "JOB_STATE_FAILED"));
  EXPECT_FALSE(Field(allocates, "error").empty());

  ExpectServesAndTrains();
}

TEST_F(WorkerEndToEndTest, UninitialisedMemoryAndForgedLogLinesAreRefusedAtSubmit) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  std::string refusal;
  EXPECT_TRUE(Submit(Module("uninitialised"), {}, &refusal).empty());
  EXPECT_THAT(refusal, HasSubstr("aten::empty_like"));
  EXPECT_TRUE(Submit(Module("warns"), {}, &refusal).empty());
  EXPECT_THAT(refusal, HasSubstr("aten::warn"));
  EXPECT_THAT(daemon_->Stderr(), ::testing::Not(HasSubstr("job SUCCEEDED")));
  ExpectServesAndTrains();
}

TEST_F(WorkerEndToEndTest, CodeNestedDeeperThanTheParsersStackCrashesOnlyItsCheck) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  // TorchScript itself has no recursion; its parser does, and 200,000 parentheses overflow it.
  std::string refusal;
  EXPECT_TRUE(Submit(Module("deep-nesting"), {}, &refusal).empty());
  EXPECT_THAT(refusal, HasSubstr("crashed its check (signal 11"));
  ExpectServesAndTrains();
}

TEST_F(WorkerEndToEndTest, TensorMetadataPastItsStorageIsRefusedBeforeLibTorchReadsIt) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  std::string refusal;
  const std::string id = Submit(Module("metadata-past-storage"), {}, &refusal);
  // Refused by the archive check before anything parses it, naming the numbers: [3, 64] over a
  // storage of 3 x 37 values.
  EXPECT_TRUE(id.empty());
  EXPECT_THAT(refusal, HasSubstr("reaches element 191 of storage '3', which holds 111"));
  ExpectServesAndTrains();
}

TEST_F(WorkerEndToEndTest, ACancelledLoopStaysCancelledAcrossKillNine) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  const std::string id = Submit(Module("loops-in-training"));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor(id, "JOB_STATE_RUNNING"));
  RunResult cancel = Ctl({"job", "cancel", id});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  // Killed before the worker's grace is over: the cancel was recorded when it was answered.
  daemon_->Stop(SIGKILL, 10);
  Start();
  EXPECT_EQ(Field(id, "state"), "JOB_STATE_CANCELLED");
  ExpectServesAndTrains();
}

TEST_F(WorkerEndToEndTest, SigtermWithALoopingWorkerExitsWithinTheShutdownTimeout) {
  Start({"--shutdown_timeout=2s"});
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  const std::string id = Submit(Module("loops-in-training"), {"--max-job-time", "3"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor(id, "JOB_STATE_RUNNING"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon_->Stop(SIGTERM, 30), 0);
  // The drain's 2 s, then the interrupt's grace of 1 s before the worker is killed.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // A restart serves at once; the job resumes and its time limit ends it.
  const auto restart = std::chrono::steady_clock::now();
  Start({"--shutdown_timeout=2s"});
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - restart, std::chrono::seconds(15));
  ASSERT_TRUE(WaitFor(id, "JOB_STATE_FAILED", 60));
  EXPECT_THAT(Field(id, "error"), HasSubstr("time limit"));
}

TEST_F(WorkerEndToEndTest, AJobTakenUpThreeTimesInARowIsFailedNotTakenUpAgain) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  const std::string id = Submit(Module("loops-in-training"));
  ASSERT_FALSE(id.empty());
  // Whatever ends it (here kill -9 of the daemon, and its worker with it) ends it every time.
  for (int restart = 1; restart <= 2; ++restart) {
    ASSERT_TRUE(WaitFor(id, "JOB_STATE_RUNNING")) << "restart " << restart;
    daemon_->Stop(SIGKILL, 10);
    Start();
  }
  ASSERT_TRUE(WaitFor(id, "JOB_STATE_RUNNING"));
  daemon_->Stop(SIGKILL, 10);
  Start();
  EXPECT_EQ(Field(id, "state"), "JOB_STATE_FAILED");
  EXPECT_THAT(Field(id, "error"), HasSubstr("taken up 3 times in a row from epoch 0"));
  ExpectServesAndTrains();
}

TEST_F(WorkerEndToEndTest, ARestartThatRefusesModulesFailsTheirJobsWithTheReason) {
  Start();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  const std::string running = Submit(Module("loops-in-training"));
  ASSERT_FALSE(running.empty());
  ASSERT_TRUE(WaitFor(running, "JOB_STATE_RUNNING"));
  const std::string queued = Submit(Module(""));
  ASSERT_FALSE(queued.empty());
  daemon_->Stop(SIGKILL, 10);
  Start({"--allow_torchscript=false"});
  for (const std::string& id : {running, queued}) {
    EXPECT_EQ(Field(id, "state"), "JOB_STATE_FAILED") << id;
    EXPECT_THAT(Field(id, "error"), HasSubstr("--allow_torchscript=false")) << id;
  }
}

}  // namespace
}  // namespace trainerd::e2e
