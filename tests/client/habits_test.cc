// trainctl's scripting habits against a fake trainerd in this process: job wait and
// job watch exit codes, version (and --client offline), the refusals of -o where it cannot apply,
// the completion helper, and the bash completion script run by bash.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/completion.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/client/run_captured.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::client {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// Jobs whose end is set by the test: WatchJob sends the Job in its end state, or, for a job
// without one, keeps the stream open until the client gives up.
class FakeJobs final : public v1::JobService::Service {
 public:
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    if (request->id() == "job-missing") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job 'job-missing' not found");
    }
    v1::JobEvent event;
    v1::Job& job = *event.mutable_job();
    job.set_id(request->id());
    job.mutable_spec()->set_epochs(2);
    auto end = ends.find(request->id());
    if (end == ends.end()) {
      job.set_state(v1::JOB_STATE_RUNNING);
      writer->Write(event);
      while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(10));
      return grpc::Status::CANCELLED;
    }
    for (int i = 1; i <= 2; ++i) {
      v1::JobEvent epoch;
      epoch.mutable_epoch()->set_epoch(i);
      epoch.mutable_epoch()->set_loss(1.0 / i);
      writer->Write(epoch);
    }
    job.set_state(end->second);
    job.set_final_loss(0.5);
    if (end->second == v1::JOB_STATE_FAILED) job.set_error("loss became NaN at epoch 2");
    writer->Write(event);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    response->add_jobs()->set_id("job-aaaaaaaaaaaa");
    response->add_jobs()->set_id("job-bbbbbbbbbbbb");
    return grpc::Status::OK;
  }

  std::map<std::string, v1::JobState> ends;
};

class FakeDatasets final : public v1::DatasetService::Service {
 public:
  grpc::Status ListDatasets(grpc::ServerContext*, const v1::ListDatasetsRequest*,
                            v1::ListDatasetsResponse* response) override {
    v1::Dataset* iris = response->add_datasets();
    iris->set_name("iris");
    iris->add_feature_shape(4);
    iris->set_target_dtype(v1::DTYPE_INT64);
    iris->set_row_count(150);
    iris->set_size_bytes(3600);
    iris->set_device("cpu");
    v1::Dataset* mnist = response->add_datasets();
    mnist->set_name("mnist");
    mnist->add_feature_shape(784);
    mnist->set_target_dtype(v1::DTYPE_INT64);
    mnist->set_row_count(60000);
    mnist->set_size_bytes(188640000);
    mnist->set_device("cpu");
    return grpc::Status::OK;
  }
};

class FakeSystem final : public v1::SystemService::Service {
 public:
  grpc::Status GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*,
                          v1::VersionInfo* response) override {
    response->set_trainerd_version("9.8.7");
    response->set_libtorch_version("2.11.0");
    response->set_cuda_version("13.0");
    response->set_driver_version("580.65.06");
    return grpc::Status::OK;
  }
};

class HabitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&datasets_);
    builder.RegisterService(&system_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port_);
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs trainctl with `words` against `address` (the fake by default); stdout in out_, stderr in
  // err_. The process's own stdout is /dev/null meanwhile, so that commands that look at it (job
  // model) see no terminal whoever runs the test.
  int Run(std::vector<std::string> words, std::string address = "") {
    words.insert(words.begin(), {"trainctl", "--addr", address.empty() ? address_ : address});
    absl::StatusOr<Invocation> invocation = ParseCommandLine(words, std::nullopt);
    EXPECT_TRUE(invocation.ok()) << invocation.status();
    if (!invocation.ok()) return -1;
    CapturedRun run = RunCaptured(*invocation);
    out_ = std::move(run.out);
    err_ = std::move(run.err);
    return run.code;
  }

  FakeJobs jobs_;
  FakeDatasets datasets_;
  FakeSystem system_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::string out_;
  std::string err_;
};

TEST_F(HabitsTest, JobWaitExitsByHowTheJobEnded) {
  jobs_.ends = {{"job-ok", v1::JOB_STATE_SUCCEEDED},
                {"job-bad", v1::JOB_STATE_FAILED},
                {"job-stopped", v1::JOB_STATE_CANCELLED}};
  EXPECT_EQ(Run({"job", "wait", "job-ok"}), kExitOk) << err_;
  EXPECT_THAT(out_, StartsWith("job job-ok SUCCEEDED"));
  EXPECT_EQ(Run({"job", "wait", "job-bad"}), kExitJobFailed);
  EXPECT_THAT(out_, HasSubstr("FAILED: loss became NaN at epoch 2"));
  EXPECT_EQ(Run({"job", "wait", "job-stopped"}), kExitJobCancelled);
  // --for: the end awaited gives 0; any other gives its own code; ended takes any end.
  EXPECT_EQ(Run({"job", "wait", "job-bad", "--for", "failed"}), kExitOk);
  EXPECT_EQ(Run({"job", "wait", "job-stopped", "--for", "ended"}), kExitOk);
  EXPECT_EQ(Run({"job", "wait", "job-stopped", "--for", "failed"}), kExitJobCancelled);
  EXPECT_EQ(Run({"job", "wait", "job-ok", "--for", "cancelled"}), kExitFailure);
  EXPECT_EQ(err_, "trainctl: job 'job-ok' succeeded; waited for it to be cancelled\n");
  EXPECT_EQ(Run({"job", "wait", "job-ok", "--for", "done"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("--for: 'done' is not a job end"));
}

TEST_F(HabitsTest, JobWaitPrintsTheIdOrTheJobAsAsked) {
  jobs_.ends = {{"job-ok", v1::JOB_STATE_SUCCEEDED}, {"job-bad", v1::JOB_STATE_FAILED}};
  EXPECT_EQ(Run({"job", "wait", "job-ok", "-o", "name"}), kExitOk);
  EXPECT_EQ(out_, "job-ok\n");
  EXPECT_EQ(Run({"job", "wait", "job-bad", "-o", "name"}), kExitJobFailed);
  EXPECT_THAT(out_, IsEmpty());  // not met: no id for a script to go on with
  EXPECT_EQ(Run({"job", "wait", "job-ok", "-o", "json"}), kExitOk);
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_, &job).ok()) << out_;
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Run({"job", "wait", "job-ok", "-o", "yaml"}), kExitOk);
  EXPECT_THAT(out_, StartsWith("id: job-ok\nspec:\n  dataset: \"\"\n"));
  EXPECT_THAT(out_, HasSubstr("\nstate: JOB_STATE_SUCCEEDED\n"));
  EXPECT_THAT(out_, HasSubstr("\nfinal_loss: 0.5\n"));
}

TEST_F(HabitsTest, JobWaitTimesOutWithExitOneAndAnUnknownJobIsTheDaemonsError) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(Run({"job", "wait", "job-forever", "--timeout", "0.3"}), kExitFailure);
  EXPECT_EQ(err_, "trainctl: timed out after 300ms waiting for job 'job-forever' to end\n");
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(Run({"job", "wait", "job-missing"}), kExitFailure);
  EXPECT_THAT(err_, HasSubstr("job 'job-missing' not found"));
}

TEST_F(HabitsTest, JobWatchExitsThreeForAFailedJobAndFourForACancelledOne) {
  jobs_.ends = {{"job-bad", v1::JOB_STATE_FAILED}, {"job-stopped", v1::JOB_STATE_CANCELLED}};
  EXPECT_EQ(Run({"job", "watch", "job-bad"}), kExitJobFailed);
  EXPECT_THAT(out_, HasSubstr("epoch 2/2"));
  EXPECT_EQ(Run({"job", "watch", "job-stopped"}), kExitJobCancelled);
  // -o yaml: a document per event.
  EXPECT_EQ(Run({"job", "watch", "job-stopped", "-o", "yaml"}), kExitJobCancelled);
  EXPECT_THAT(out_, StartsWith("---\nepoch:\n  epoch: 1\n"));
  EXPECT_THAT(out_, HasSubstr("---\njob:\n  id: job-stopped\n"));
}

TEST_F(HabitsTest, VersionShowsBothSidesAndClientWorksOffline) {
  EXPECT_EQ(Run({"version"}), kExitOk) << err_;
  EXPECT_EQ(out_, absl::StrCat("trainctl:  ", TrainerdVersion(),
                               "\ntrainerd:  9.8.7\nlibtorch:  2.11.0\ncuda:      13.0\n"
                               "driver:    580.65.06\n"));
  EXPECT_EQ(Run({"version", "-o", "json"}), kExitOk);
  EXPECT_THAT(out_, HasSubstr("\"server\": {"));
  EXPECT_THAT(out_, HasSubstr("\"trainerd_version\": \"9.8.7\""));
  // Nothing listens on port 1: --client never asks.
  EXPECT_EQ(Run({"version", "--client"}, "127.0.0.1:1"), kExitOk);
  EXPECT_EQ(out_, absl::StrCat("trainctl  ", TrainerdVersion(), "\n"));
  EXPECT_EQ(Run({"version", "--client", "-o", "yaml"}, "127.0.0.1:1"), kExitOk);
  EXPECT_EQ(out_, absl::StrCat("client_version: ", TrainerdVersion(), "\n"));
  // Without --client an unreachable daemon is exit 1, after the client's line.
  EXPECT_EQ(Run({"version", "--timeout", "2"}, "127.0.0.1:1"), kExitFailure);
  EXPECT_THAT(out_, StartsWith("trainctl  "));
  EXPECT_THAT(err_, HasSubstr("127.0.0.1:1"));
}

TEST_F(HabitsTest, OutputFormatsAreRefusedWhereTheyCannotApply) {
  EXPECT_EQ(Run({"top", "-o", "name"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("'top' has no names to print"));
  EXPECT_EQ(Run({"job", "model", "job-ok", "-o", "json"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("-o describes a file written with --file FILE"));
}

TEST_F(HabitsTest, ListsPrintNamesAndTablesWithoutHeaders) {
  EXPECT_EQ(Run({"dataset", "list", "-o", "name"}), kExitOk) << err_;
  EXPECT_EQ(out_, "iris\nmnist\n");
  EXPECT_EQ(Run({"dataset", "ls", "--no-headers"}), kExitOk) << err_;
  EXPECT_EQ(out_,
            "iris   150    4         scalar int64  3.5 KiB    cpu     -\n"
            "mnist  60000  784       scalar int64  179.9 MiB  cpu     -\n");
  EXPECT_EQ(Run({"dataset", "list", "-o", "yaml"}), kExitOk) << err_;
  EXPECT_THAT(out_, StartsWith("datasets:\n  - name: iris\n"));
}

TEST_F(HabitsTest, HostileValuesOfTheNewFlagsAreRefusedLocally) {
  EXPECT_EQ(Run({"job", "model", "job-ok", "-f", ""}), kExitUsage);
  EXPECT_EQ(err_, "trainctl: --file needs a FILE\n");
  EXPECT_EQ(Run({"job", "wait", "job-ok", "--for", ""}), kExitUsage);
  EXPECT_EQ(Run({"job", "wait", "job-ok", "--for", "SUCCEEDED;rm -rf /"}), kExitUsage);
  EXPECT_THAT(err_, HasSubstr("is not a job end"));
  for (const char* timeout : {"-1", "0", "nan", "inf", "1e400", "99999999999999999999h", "soon"}) {
    std::vector<std::string> words = {"trainctl", "job", "wait", "job-ok", "--timeout", timeout};
    EXPECT_FALSE(ParseCommandLine(words, std::nullopt).ok()) << timeout;
  }
  EXPECT_EQ(Run({"completion", "$(reboot)"}), kExitUsage);
  EXPECT_THAT(out_, IsEmpty());  // no script for a shell it does not know
  // The helper's argument is not trusted either: an unknown kind prints nothing, asks nothing.
  EXPECT_EQ(Run({"__complete", "../../etc/passwd"}), kExitOk);
  EXPECT_THAT(out_, IsEmpty());
}

TEST_F(HabitsTest, CompletionHelperPrintsNamesAndNothingWhenTheDaemonIsAway) {
  EXPECT_EQ(Run({"__complete", "datasets"}), kExitOk);
  EXPECT_EQ(out_, "iris\nmnist\n");
  EXPECT_EQ(Run({"__complete", "jobs"}), kExitOk);
  EXPECT_EQ(out_, "job-aaaaaaaaaaaa\njob-bbbbbbbbbbbb\n");
  EXPECT_EQ(Run({"__complete", "jobs"}, "127.0.0.1:1"), kExitOk);
  EXPECT_THAT(out_, IsEmpty());
  EXPECT_THAT(err_, IsEmpty());
}

// The script as bash runs it on a Tab press: COMP_WORDS and COMP_CWORD in, COMPREPLY out. The
// first word is `false`, so that the names it would ask a daemon for are none.
std::string Complete(const std::string& shell, const std::string& line) {
  absl::StatusOr<std::string> script = CompletionScript(shell);
  if (!script.ok()) return "error: " + std::string(script.status().message());
  const std::string dir = ::testing::TempDir();
  const std::string path = absl::StrCat(dir, "/trainctl-completion-", ::getpid(), ".sh");
  std::ofstream(path) << *script << "\nCOMP_WORDS=(false " << line
                      << ")\nCOMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n_trainctl\n"
                         "echo \"${COMPREPLY[*]}\"\n";
  std::FILE* pipe = ::popen(absl::StrCat("bash ", path, " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  ::pclose(pipe);
  std::remove(path.c_str());
  return out;
}

TEST(CompletionScriptTest, BashCompletesCommandsFlagsAndTheirValues) {
  EXPECT_EQ(Complete("bash", "''"),
            "dataset submit sweep job devices config top diagnose health version completion "
            "help\n");
  EXPECT_EQ(Complete("bash", "job ''"), "list get watch wait cancel rm model checkpoint\n");
  EXPECT_EQ(Complete("bash", "submit --model-from ''"), "best last\n");
  EXPECT_EQ(Complete("bash", "--addr h:1 -o json job w"), "watch wait\n");
  EXPECT_EQ(Complete("bash", "submit --loss ''"),
            "mse l1 huber bce_with_logits cross_entropy nll\n");
  EXPECT_EQ(Complete("bash", "submit --dataset x --optimizer ''"),
            "sgd adam adamw rmsprop nadam radam adagrad\n");
  EXPECT_EQ(Complete("bash", "job list -o ''"), "table wide json yaml name\n");
  EXPECT_EQ(Complete("bash", "job wait x --f"), "--for\n");
  const std::string model_flags = Complete("bash", "job model x -");
  EXPECT_THAT(model_flags, HasSubstr("--file"));
  EXPECT_THAT(model_flags, HasSubstr("--no-headers"));  // and the global ones
  EXPECT_EQ(Complete("bash", "job model x -f ''").find("error"), std::string::npos);
  EXPECT_THAT(model_flags, HasSubstr("--format"));
  EXPECT_EQ(Complete("bash", "job model x --format ''"), "torchscript safetensors\n");
}

TEST(CompletionScriptTest, OtherShellsAreRefusedAndZshLoadsBashcompinit) {
  EXPECT_EQ(CompletionScript("fish").status().message(),
            "no completion for shell 'fish' (expected bash or zsh)");
  absl::StatusOr<std::string> zsh = CompletionScript("zsh");
  ASSERT_TRUE(zsh.ok());
  EXPECT_THAT(*zsh, HasSubstr("bashcompinit"));
  EXPECT_THAT(*zsh, HasSubstr("complete -o default -F _trainctl trainctl\n"));
}

}  // namespace
}  // namespace trainerd::client
