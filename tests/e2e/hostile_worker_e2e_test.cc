// End to end, a worker that turns on the daemon: the real trainerd with --worker pointing at a
// stand-in (hostile_worker.cc) that confines itself as trainerd-worker does and then does what a
// module that escaped its interpreter could: write and truncate its dataset's shared memory, send
// checkpoints the job's schedule does not have, hand back a model no loader should see, fail with
// an error full of terminal controls. Each is refused or made harmless, the job ends with the
// reason, and the daemon serves and trains on the same, unchanged dataset afterwards.
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

using ::testing::HasSubstr;
using ::testing::Not;

class HostileWorkerEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-hostile-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::string csv = "x,y\n";
    for (int i = 0; i < 64; ++i) {
      csv += std::to_string(i / 64.0) + "," + std::to_string(2 * i / 64.0 + 1) + "\n";
    }
    const std::string csv_path = (dir_ / "seed.csv").string();
    std::ofstream(csv_path) << csv;
    module_ = (dir_ / "net.pt").string();
    RunResult made = e2e::Run({MAKE_TORCHSCRIPT_FIXTURE_BIN, module_, "1", "1"});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    daemon_ = std::make_unique<Daemon>(std::vector<std::string>{
        TRAINERD_BIN, "--listen=127.0.0.1:0", "--data_dir=" + (dir_ / "data").string(),
        "--device=cpu", "--metrics_listen=", "--diagnose_at_start=false", "--worker_grace=1s",
        std::string("--worker=") + HOSTILE_WORKER_BIN});
    std::string line;
    ASSERT_TRUE(daemon_->ReadLine(&line, 60)) << daemon_->Stderr();
    addr_ = ListeningAddress(line);
    ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_path}).exit_code, 0);
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  RunResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr_});
    return e2e::Run(args);
  }

  // A module job whose seed picks the stand-in's attack; returns its id.
  std::string SubmitAttack(int attack, int epochs = 30, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"submit",  "--dataset", "seed",
                                     "--torchscript", module_, "--epochs",
                                     std::to_string(epochs), "--seed", std::to_string(attack)};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.substr(0, r.out.find('\n'));
  }

  std::string WaitForEnd(const std::string& id, const std::string& format = "json") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      const std::string json = Ctl({"-o", "json", "job", "get", id}).out;
      if (json.find("JOB_STATE_FAILED") != std::string::npos ||
          json.find("JOB_STATE_SUCCEEDED") != std::string::npos) {
        return json;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return "";
  }

  // The final loss of a spec-built job on the dataset: equal before and after an attack only if
  // not a byte of the dataset changed.
  std::string SpecJobLoss() {
    RunResult r = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--epochs", "3",
                       "--seed", "5", "--no-shuffle", "--watch"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string id = r.out.substr(0, r.out.find('\n'));
    const std::string json = WaitForEnd(id);
    const size_t at = json.find("\"final_loss\": ");
    return at == std::string::npos ? "" : json.substr(at, json.find_first_of(",\n", at) - at);
  }

  std::filesystem::path dir_;
  std::string module_;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
};

TEST_F(HostileWorkerEndToEndTest, ItCanNeitherWriteNorTruncateItsDataset) {
  const std::string before = SpecJobLoss();
  ASSERT_FALSE(before.empty());
  const std::string job = WaitForEnd(SubmitAttack(101));
  // What each attempt gave, as the stand-in reported it.
  EXPECT_THAT(job, Not(HasSubstr("write=done")));
  EXPECT_THAT(job, Not(HasSubstr("map=done")));
  EXPECT_THAT(job, Not(HasSubstr("truncate=done")));
  EXPECT_THAT(job, HasSubstr("features: reopen="));
  // The daemon still serves (no SIGBUS), and trains on the same bytes.
  EXPECT_EQ(Ctl({"health"}).exit_code, 0) << daemon_->Stderr();
  EXPECT_EQ(SpecJobLoss(), before);
}

TEST_F(HostileWorkerEndToEndTest, CheckpointsTheScheduleDoesNotHaveEndTheWorker) {
  const std::string id = SubmitAttack(102, 2000, {"--checkpoint-every", "1000"});
  const std::string job = WaitForEnd(id);
  EXPECT_THAT(job, HasSubstr("JOB_STATE_FAILED"));
  EXPECT_THAT(job, HasSubstr("sent a checkpoint of epoch 1, which the job's schedule (every 1000 "
                             "epochs, after epoch 0) does not have"));
  EXPECT_THAT(job, Not(HasSubstr("epoch-000001.pt")));
  std::error_code ignored;
  EXPECT_TRUE(std::filesystem::is_empty(dir_ / "data" / "checkpoints" / id, ignored) ||
              !std::filesystem::exists(dir_ / "data" / "checkpoints" / id));
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
}

TEST_F(HostileWorkerEndToEndTest, AModelThatIsNoSoundArchiveIsNotKept) {
  const std::string id = SubmitAttack(103);
  const std::string job = WaitForEnd(id);
  EXPECT_THAT(job, HasSubstr("JOB_STATE_FAILED"));
  EXPECT_THAT(job, HasSubstr("sent a model that is not kept"));
  RunResult model = Ctl({"job", "model", id, (dir_ / "model.pt").string()});
  EXPECT_NE(model.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "model.pt"));
}

TEST_F(HostileWorkerEndToEndTest, AnErrorFullOfTerminalControlsIsShownAsText) {
  const std::string id = SubmitAttack(104);
  ASSERT_FALSE(WaitForEnd(id).empty());
  RunResult shown = Ctl({"job", "get", id});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_EQ(shown.out.find('\x1b'), std::string::npos) << "an escape reached the terminal";
  EXPECT_EQ(shown.out.find('\r'), std::string::npos);
  EXPECT_EQ(shown.out.find("\xc2\x9b"), std::string::npos);
  EXPECT_THAT(shown.out, HasSubstr("\\x1b]0;owned\\x07\\x1b[2J"));
  // The forged line stays inside the error's line.
  EXPECT_THAT(shown.out, Not(HasSubstr("\njob-000000000000  SUCCEEDED")));
  RunResult listed = Ctl({"job", "list"});
  EXPECT_EQ(listed.out.find('\x1b'), std::string::npos);
  // The JSON form is valid and carries the escapes, not the controls.
  const std::string json = Ctl({"-o", "json", "job", "get", id}).out;
  EXPECT_THAT(json, HasSubstr("\\\\x1b]0;owned"));
}

}  // namespace
}  // namespace trainerd::e2e
