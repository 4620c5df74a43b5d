// End to end, the worker's sandbox where trainerd is deployed with the shipped systemd unit
// (deploy/systemd/trainerd.service): the real trainerd started by unit_launcher under the unit's
// system call filter, namespace restriction, no new privileges and a dynamic user of its own, as
// systemd starts it. With the unit as shipped, submitted code gets the whole sandbox (Landlock,
// seccomp, a network namespace) and trains, and the daemon itself cannot be read from /proc by a
// process of its own user. With the filter an older release shipped (@system-service alone, which
// refuses Landlock's calls and seccomp(2) with EPERM), a TorchScript job is refused naming what is
// missing and the fix, and runs only when the operator accepts that by name.
//
// Needs root (to start the daemon as another user) and systemd-analyze (the unit's @groups, as
// this machine's systemd expands them); skips without them.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

// A dynamic user's id, as systemd allocates them (61184-65519).
constexpr uid_t kUnitUser = 61234;
// The filter an older unit shipped: Landlock's calls and seccomp(2) are not in @system-service.
constexpr char kOlderFilter[] = "@system-service mbind get_mempolicy set_mempolicy";

bool UserNamespacesAllowed() {
  std::ifstream max("/proc/sys/user/max_user_namespaces");
  int64_t n = 0;
  if (!(max >> n) || n <= 0) return false;
  std::ifstream clone("/proc/sys/kernel/unprivileged_userns_clone");
  int allowed = 1;
  if (clone >> allowed) return allowed != 0;
  return true;
}

class UnitSandboxEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root, to start the daemon as the unit's user";
    if (e2e::Run({"/bin/sh", "-c", "command -v systemd-analyze"}).exit_code != 0) {
      GTEST_SKIP() << "needs systemd-analyze (Debian's systemd package)";
    }
    dir_ = std::filesystem::path("/tmp") /
           ("trainerd-unit-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "data");
    ::chmod(dir_.c_str(), 0755);
    ASSERT_EQ(::chown((dir_ / "data").c_str(), kUnitUser, kUnitUser), 0);
    ::chmod((dir_ / "data").c_str(), 0750);
    std::string csv = "x,y\n";
    for (int i = 0; i < 64; ++i) {
      csv += std::to_string(i / 64.0) + "," + std::to_string(2 * i / 64.0 + 1) + "\n";
    }
    csv_ = (dir_ / "seed.csv").string();
    std::ofstream(csv_) << csv;
    module_ = (dir_ / "net.pt").string();
    RunResult made = e2e::Run({MAKE_TORCHSCRIPT_FIXTURE_BIN, module_, "1", "1"});
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  void TearDown() override {
    daemon_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // trainerd under the unit's properties; `filter` replaces its SystemCallFilter= when set.
  void Start(const std::string& filter = "", const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {
        UNIT_LAUNCHER_BIN,
        std::string("--unit=") + TRAINERD_SOURCE_DIR + "/deploy/systemd/trainerd.service",
        "--uid=" + std::to_string(kUnitUser),
        "--gid=" + std::to_string(kUnitUser),
        std::string("--expose=") + TORCH_SITE_PACKAGES,
        std::string("--expose=") + TRAINERD_BINARY_DIR};
    if (!filter.empty()) argv.push_back("--filter=" + filter);
    argv.insert(argv.end(), {"--", TRAINERD_BIN, "--listen=127.0.0.1:0",
                             "--data_dir=" + (dir_ / "data").string(), "--device=cpu",
                             "--metrics_listen=", "--diagnose_at_start=false"});
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

  // `trainctl diagnose` once the module checker's sandbox, measured at the start, is in it.
  std::string DiagnoseWithSandbox() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::string out;
    while (std::chrono::steady_clock::now() < until) {
      out = Ctl({"diagnose"}).out;
      if (out.find("trainerd-module-check:") != std::string::npos) return out;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return out;
  }

  std::string JobJson(const std::string& id) { return Ctl({"-o", "json", "job", "get", id}).out; }

  std::string WaitForEnd(const std::string& id) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (std::chrono::steady_clock::now() < until) {
      const std::string json = JobJson(id);
      for (const char* end : {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}) {
        if (json.find(end) != std::string::npos) return json;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return JobJson(id);
  }

  RunResult SubmitModule() {
    return Ctl({"submit", "--dataset", "seed", "--torchscript", module_, "--lr", "0.1",
                "--batch-size", "16", "--epochs", "3", "--seed", "7"});
  }

  std::filesystem::path dir_;
  std::string csv_;
  std::string module_;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
};

TEST_F(UnitSandboxEndToEndTest, TheShippedUnitGivesSubmittedCodeTheWholeSandbox) {
  Start();
  const std::string diagnose = DiagnoseWithSandbox();
  EXPECT_THAT(diagnose, HasSubstr("trainerd-module-check: complete")) << diagnose;
  EXPECT_THAT(diagnose, HasSubstr("Landlock ABI"));
  EXPECT_THAT(diagnose, HasSubstr("seccomp, no new privileges, not dumpable"));
  // The daemon's own user (a dynamic user cannot switch), which Landlock and seccomp confine.
  EXPECT_THAT(diagnose, HasSubstr("user 61234 (the daemon's)"));
  if (UserNamespacesAllowed()) {
    // RestrictNamespaces=user net lets the worker make its network namespace.
    EXPECT_THAT(diagnose, Not(HasSubstr("no network namespace"))) << diagnose;
  }

  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  RunResult submitted = SubmitModule();
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err << daemon_->Stderr();
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  const std::string job = WaitForEnd(id);
  EXPECT_THAT(job, HasSubstr("JOB_STATE_SUCCEEDED")) << job << daemon_->Stderr();
  // The job's report says what its worker got.
  EXPECT_THAT(job, HasSubstr("\"program\": \"trainerd-worker\""));
  EXPECT_THAT(job, HasSubstr("\"landlock\": true"));
  EXPECT_THAT(job, HasSubstr("\"seccomp\": true"));
  EXPECT_THAT(job, HasSubstr("\"not_dumpable\": true"));
  EXPECT_THAT(job, HasSubstr("\"uid\": \"61234\""));

  // A process of the daemon's own user (what a worker without its sandbox would be) cannot open
  // the daemon's /proc files: the daemon is not dumpable.
  const pid_t daemon = daemon_->pid();
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setresgid(kUnitUser, kUnitUser, kUnitUser) != 0 ||
        ::setresuid(kUnitUser, kUnitUser, kUnitUser) != 0) {
      ::_exit(10);
    }
    int opened = 0;
    for (const char* file : {"environ", "mem", "maps", "fd/0"}) {
      const std::string path = "/proc/" + std::to_string(daemon) + "/" + file;
      const int fd = ::open(path.c_str(), O_RDONLY);
      if (fd >= 0) ++opened;
    }
    ::_exit(opened);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "files of the daemon's /proc a process of its user opened";
}

TEST_F(UnitSandboxEndToEndTest, AnOlderUnitsFilterRefusesSubmittedCodeWithTheFix) {
  Start(kOlderFilter);
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", csv_}).exit_code, 0);
  RunResult refused = SubmitModule();
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("lacks landlock"));
  EXPECT_THAT(refused.err, HasSubstr("SystemCallFilter="));
  EXPECT_THAT(refused.err, HasSubstr("--worker_sandbox_may_lack="));
  const std::string diagnose = DiagnoseWithSandbox();
  EXPECT_THAT(diagnose, HasSubstr("trainerd-module-check: REFUSED, lacks landlock"));
  EXPECT_THAT(diagnose, HasSubstr("no Landlock (EPERM)"));
  EXPECT_THAT(Ctl({"devices"}).out, HasSubstr("TorchScript jobs are refused"));
  // Spec-built jobs are not submitted code: they train as ever.
  RunResult spec = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--epochs", "2"});
  EXPECT_EQ(spec.exit_code, 0) << spec.err;

  // The operator accepts what is missing, by name: the job trains, and its report says so.
  daemon_->Stop(SIGTERM, 30);
  Start(kOlderFilter, {"--worker_sandbox_may_lack=landlock,seccomp"});
  RunResult accepted = SubmitModule();
  ASSERT_EQ(accepted.exit_code, 0) << accepted.err;
  const std::string job = WaitForEnd(accepted.out.substr(0, accepted.out.find('\n')));
  EXPECT_THAT(job, HasSubstr("JOB_STATE_SUCCEEDED")) << job;
  EXPECT_THAT(job, HasSubstr("\"landlock_error\": \"EPERM\""));
  EXPECT_THAT(DiagnoseWithSandbox(), HasSubstr("accepted by --worker_sandbox_may_lack"));
}

}  // namespace
}  // namespace trainerd::e2e
