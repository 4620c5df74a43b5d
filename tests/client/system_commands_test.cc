// Runs `devices`, `diagnose` and `top` (client/commands.h) against a fake trainerd in this process:
// what each sends, what it prints, and that Ctrl-C ends `top` with exit 0.
#include <signal.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/output.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class FakeSystem final : public v1::SystemService::Service {
 public:
  grpc::Status ListDevices(grpc::ServerContext*, const v1::ListDevicesRequest*,
                           v1::ListDevicesResponse* response) override {
    v1::DeviceStatus* device = response->add_devices();
    device->set_device("cpu");
    device->set_is_default(true);
    return grpc::Status::OK;
  }
  grpc::Status Diagnose(grpc::ServerContext* context, const v1::DiagnoseRequest* request,
                        v1::DiagnoseResponse* response) override {
    refresh = request->refresh();
    deadline_seconds = absl::ToDoubleSeconds(absl::FromChrono(context->deadline()) - absl::Now());
    response->set_libtorch_version("2.11.0");
    response->set_cached(!request->refresh());
    response->add_devices()->set_device("cpu");
    return grpc::Status::OK;
  }
  bool refresh = false;
  double deadline_seconds = 0;
};

class FakeJobs final : public v1::JobService::Service {
 public:
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    ++calls;
    v1::Job* job = response->add_jobs();
    job->set_id("job-0123456789ab");
    job->set_state(v1::JOB_STATE_RUNNING);
    job->mutable_spec()->set_epochs(4);
    job->add_epochs()->set_epoch(1);
    // As Ctrl-C would, while the call is under way; top then stops after this refresh.
    if (calls == interrupt_at) std::raise(SIGINT);
    return grpc::Status::OK;
  }
  int calls = 0;
  int interrupt_at = -1;
};

class SystemCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&system_);
    builder.RegisterService(&jobs_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs trainctl with `words` against the fake; its stdout in `out_`.
  int Run(std::vector<std::string> words) {
    words.insert(words.begin(), {"trainctl", "--addr", absl::StrCat("127.0.0.1:", port_)});
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    EXPECT_TRUE(invocation.ok()) << invocation.status();
    if (!invocation.ok()) return -1;
    std::ostringstream captured;
    std::streambuf* previous = std::cout.rdbuf(captured.rdbuf());
    const int code = RunCommand(*invocation);
    std::cout.rdbuf(previous);
    out_ = captured.str();
    return code;
  }

  FakeSystem system_;
  FakeJobs jobs_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string out_;
};

TEST_F(SystemCommandsTest, DevicesPrintsTheTable) {
  EXPECT_EQ(Run({"devices"}), kExitOk);
  EXPECT_THAT(out_, StartsWith("DEVICE  NAME  UTIL  MEMORY"));
  EXPECT_THAT(out_, HasSubstr("\ncpu*    -     -     -"));
}

TEST_F(SystemCommandsTest, DiagnoseSendsRefreshWithItsLongDeadline) {
  EXPECT_EQ(Run({"diagnose", "--refresh"}), kExitOk);
  EXPECT_TRUE(system_.refresh);
  EXPECT_GT(system_.deadline_seconds, 100);
  EXPECT_THAT(out_, StartsWith("libtorch:  2.11.0 (CPU-only build)\n"));
  EXPECT_THAT(out_, Not(HasSubstr("cached")));
}

TEST_F(SystemCommandsTest, DiagnoseKeepsAGivenTimeoutAndSaysCached) {
  EXPECT_EQ(Run({"--timeout", "7", "diagnose"}), kExitOk);
  EXPECT_FALSE(system_.refresh);
  EXPECT_LT(system_.deadline_seconds, 10);  // neither 30 nor 120; the server rounds up a little
  EXPECT_THAT(out_, HasSubstr("(cached; --refresh measures again)"));
}

// One refresh of `top` as the fakes answer.
std::string FakeScreen() {
  v1::ListDevicesResponse devices;
  FakeSystem().ListDevices(nullptr, nullptr, &devices);
  v1::ListJobsResponse jobs;
  FakeJobs().ListJobs(nullptr, nullptr, &jobs);
  return TopScreen(devices, jobs);
}

TEST_F(SystemCommandsTest, TopIterationsAreSeparatedByABlankLineOffATerminal) {
  EXPECT_EQ(Run({"top", "--iterations", "2", "--interval", "0.1"}), kExitOk);
  EXPECT_EQ(jobs_.calls, 2);
  EXPECT_EQ(out_, absl::StrCat(FakeScreen(), "\n", FakeScreen()));
  EXPECT_THAT(out_, HasSubstr("  1/4  "));
}

TEST_F(SystemCommandsTest, TopJsonIsOneObjectPerRefresh) {
  EXPECT_EQ(Run({"top", "--iterations", "1", "-o", "json"}), kExitOk);
  EXPECT_THAT(out_, StartsWith("{\"devices\":[{\"device\":\"cpu\""));
  EXPECT_THAT(out_, HasSubstr("],\"jobs\":[{\"id\":\"job-0123456789ab\""));
  EXPECT_EQ(out_.find('\n'), out_.size() - 1);
}

TEST_F(SystemCommandsTest, CtrlCEndsTopWithExitZero) {
  jobs_.interrupt_at = 2;
  EXPECT_EQ(Run({"top", "--interval", "0.1"}), kExitOk);
  EXPECT_EQ(jobs_.calls, 2);
  // The refresh during which Ctrl-C came is not printed.
  EXPECT_EQ(out_, FakeScreen());
  // The handler is gone again: SIGINT is back to what it was.
  struct sigaction current = {};
  sigaction(SIGINT, nullptr, &current);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
}

TEST_F(SystemCommandsTest, TopRejectsTooShortAnInterval) {
  EXPECT_EQ(Run({"top", "--interval", "0.01"}), kExitUsage);
  EXPECT_EQ(jobs_.calls, 0);
}

}  // namespace
}  // namespace trainerd::client
