// End-to-end tests: the real trainerd and trainctl binaries as separate processes on loopback.
#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/subprocess.h"
#include "tests/support/exported_archive.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// The seed question's data: y = 1 + 2x + 0.1 * noise, 800 rows.
std::string SeedCsv() {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::string csv = "x,y\n";
  for (int i = 0; i < 800; ++i) {
    const double x = uniform(rng);
    const double y = 1 + 2 * x + 0.1 * noise(rng);
    char line[64];
    std::snprintf(line, sizeof(line), "%.9g,%.9g\n", x, y);
    csv += line;
  }
  return csv;
}

// A little-endian .npy (format 1.0) file.
std::string Npy(const std::string& descr, const std::vector<int64_t>& shape, const void* data,
                size_t bytes) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-e2e-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    StartDaemon();
  }

  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartDaemon() {
    std::vector<std::string> argv = {
        TRAINERD_BIN, "--listen=127.0.0.1:0", "--data_dir=" + (dir_ / "data").string(),
        "--device=cpu", "--metrics_listen=127.0.0.1:0",
        // One CPU job at a time (the default is a job per core), so that what queues behind what
        // does not depend on this machine's cores; a later flag overrides it.
        "--max_concurrent_jobs=1",
        std::string("--diagnose_at_start=") + (diagnose_at_start_ ? "true" : "false")};
    argv.insert(argv.end(), extra_flags_.begin(), extra_flags_.end());
    daemon_ = std::make_unique<Daemon>(argv);
    std::string line;
    ASSERT_TRUE(daemon_->ReadLine(&line)) << "trainerd exited: " << daemon_->Stderr();
    addr_ = ListeningAddress(line);
    ASSERT_FALSE(addr_.empty()) << line;
  }

  RunResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_BIN, "--addr", addr_});
    return e2e::Run(args);
  }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

  std::filesystem::path dir_;
  // Off by default: the start-up measurement costs a second of both cores, which the other
  // tests running alongside should not pay for.
  bool diagnose_at_start_ = false;
  std::vector<std::string> extra_flags_;  // for the next StartDaemon
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
};

TEST_F(EndToEndTest, HealthReportsServing) {
  RunResult r = Ctl({"health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
}

TEST_F(EndToEndTest, SeedScenarioLearnsWeightAndBias) {
  const std::string csv = WriteFile("seed.csv", SeedCsv());
  RunResult up = Ctl({"dataset", "upload", "seed", csv});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, HasSubstr("800"));

  RunResult run = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--loss", "mse",
                       "--optimizer", "sgd", "--lr", "0.1", "--batch-size", "16", "--epochs", "100",
                       "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("epoch 1/100"));
  EXPECT_THAT(run.out, HasSubstr("epoch 100/100"));
  EXPECT_THAT(run.out, HasSubstr("SUCCEEDED"));
  const std::string id = run.out.substr(0, run.out.find('\n'));
  ASSERT_THAT(id, ::testing::StartsWith("job-"));

  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.epochs_size(), 100);
  EXPECT_EQ(job.host_syncs(), 101);  // one per epoch plus the parameter read-back
  EXPECT_EQ(job.steps(), 100 * 50);
  ASSERT_EQ(job.parameters_size(), 2);
  EXPECT_EQ(job.parameters(0).name(), "0.weight");
  EXPECT_NEAR(job.parameters(0).values(0), 2.0, 0.05);
  EXPECT_EQ(job.parameters(1).name(), "0.bias");
  EXPECT_NEAR(job.parameters(1).values(0), 1.0, 0.05);
  EXPECT_LT(job.final_loss(), 0.02);
}

TEST_F(EndToEndTest, NpyUploadWithSeparateTargets) {
  const std::vector<float> x = {0, 1, 2, 3, 4, 5};  // 3 rows x 2 features
  const std::vector<int64_t> y = {0, 1, 1};
  const std::string xf = WriteFile("x.npy", Npy("<f4", {3, 2}, x.data(), x.size() * 4));
  const std::string yf = WriteFile("y.npy", Npy("<i8", {3}, y.data(), y.size() * 8));
  RunResult up = Ctl(
      {"-o", "json", "dataset", "upload", "cls", xf, "--targets", yf, "--target-dtype", "int64"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  v1::Dataset ds;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(up.out, &ds).ok()) << up.out;
  EXPECT_EQ(ds.row_count(), 3);
  EXPECT_THAT(ds.feature_shape(), ::testing::ElementsAre(2));
  EXPECT_EQ(ds.target_dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(ds.target_max(), 1);
  EXPECT_EQ(ds.size_bytes(), 3 * 2 * 4 + 3 * 8);
}

// trainctl's habits against the real daemon: an int64 label file uploads int64 targets without
// --target-dtype, `job wait` exits by how the job ended, `job model` writes to standard output,
// -o name and -o yaml, `version`, and the bash completion script asking the daemon for names.
TEST_F(EndToEndTest, TrainctlHabitsWorkAgainstTheRealDaemon) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int i = 0; i < 60; ++i) {
    x.push_back(static_cast<float>(i % 3) * 4 - 4);
    x.push_back(static_cast<float>(i % 3 == 2 ? 4 : -4));
    y.push_back(i % 3);
  }
  const std::string xf = WriteFile("x.npy", Npy("<f4", {60, 2}, x.data(), x.size() * 4));
  const std::string yf = WriteFile("labels.npy", Npy("<i8", {60}, y.data(), y.size() * 8));
  RunResult up = Ctl({"dataset", "upload", "three", xf, "--targets", yf, "-o", "name"});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_EQ(up.out, "three\n");
  RunResult got = Ctl({"dataset", "get", "three", "-o", "yaml"});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_THAT(got.out, HasSubstr("\ntarget_dtype: DTYPE_INT64\n"));
  EXPECT_THAT(got.out, HasSubstr("\ntarget_max: \"2\"\n"));

  RunResult submit = Ctl({"submit", "--dataset", "three", "--model", "linear:3", "--loss",
                          "cross_entropy", "--epochs", "20", "--seed", "3"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  RunResult wait = Ctl({"job", "wait", id, "--timeout", "60"});
  EXPECT_EQ(wait.exit_code, 0) << wait.err;
  EXPECT_THAT(wait.out, HasSubstr("SUCCEEDED"));
  RunResult wait_failed = Ctl({"job", "wait", id, "--for", "failed"});
  EXPECT_EQ(wait_failed.exit_code, 1);
  EXPECT_THAT(wait_failed.err, HasSubstr("succeeded; waited for it to be failed"));
  RunResult names = Ctl({"job", "list", "-o", "name", "--no-headers"});
  EXPECT_EQ(names.out, id + "\n");

  // The model on standard output (a pipe here) is the same archive as with -f.
  RunResult piped = Ctl({"job", "model", id});
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  const std::string file = (dir_ / "m.pt").string();
  ASSERT_EQ(Ctl({"job", "model", id, "-f", file}).exit_code, 0);
  std::ifstream in(file, std::ios::binary);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(written.size(), 100u);
  EXPECT_TRUE(piped.out == written);

  RunResult version = Ctl({"version"});
  ASSERT_EQ(version.exit_code, 0) << version.err;
  EXPECT_THAT(version.out, HasSubstr("trainctl:  0.1.0\ntrainerd:  0.1.0\nlibtorch:  2."));
  RunResult daemon_version = e2e::Run({TRAINERD_BIN, "--version"});
  EXPECT_EQ(daemon_version.exit_code, 0);
  EXPECT_THAT(daemon_version.out, ::testing::StartsWith("trainerd 0.1.0 (LibTorch 2."));

  // The completion script, run by bash as a Tab press would: command words from the table, names
  // from this daemon (through TRAINERD_ADDR, as a user's shell would have it).
  RunResult script = Ctl({"completion", "bash"});
  ASSERT_EQ(script.exit_code, 0) << script.err;
  const std::string script_file = WriteFile("trainctl.bash", script.out);
  const std::string probe = WriteFile(
      "probe.sh", std::string("source ") + script_file +
                      "\ncomp() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); "
                      "_trainctl; echo \"${COMPREPLY[*]}\"; }\n"
                      "comp " TRAINCTL_BIN
                      " job wai\n"
                      "comp " TRAINCTL_BIN
                      " job get ''\n"
                      "comp " TRAINCTL_BIN
                      " submit --dataset th\n"
                      "comp " TRAINCTL_BIN " submit --optimizer ada\n");
  RunResult completed = e2e::Run({"/bin/bash", probe}, {"TRAINERD_ADDR=" + addr_});
  ASSERT_EQ(completed.exit_code, 0) << completed.err;
  EXPECT_EQ(completed.out, "wait\n" + id + "\nthree\nadam adamw adagrad\n");
}

// deploy/trainerd.flags, the example of settings kept in a file, is read by the real daemon: every
// line is a flag it knows (Abseil refuses the file otherwise), and flags after --flagfile win
// (the file's 0.0.0.0 listen address without its token file would not start).
TEST_F(EndToEndTest, ExampleFlagfileParsesAndTheCommandLineAfterItWins) {
  daemon_.reset();
  extra_flags_ = {"--flagfile=" TRAINERD_SOURCE_DIR "/deploy/trainerd.flags",
                  "--listen=127.0.0.1:0",
                  "--auth_token_file=",
                  "--data_dir=" + (dir_ / "flagged").string(),
                  "--device=cpu",
                  "--metrics_listen=127.0.0.1:0"};
  StartDaemon();
  ASSERT_FALSE(addr_.empty());
  EXPECT_EQ(Ctl({"health"}).exit_code, 0);
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "flagged" / "datasets" / "seed.trds"));
}

// A 3 MiB float64 features file and int64 targets, streamed by trainctl (header without a
// checksum, the payload in 1 MiB chunks, its SHA-256 last): the daemon registers the float32
// features and the targets with the SHA-256 of exactly the payload computed here.
TEST_F(EndToEndTest, StreamedNpyUploadKeepsTheShapesAndTheChecksum) {
  const int64_t rows = 65536;
  const int64_t columns = 6;
  std::vector<double> x(rows * columns);
  std::vector<int64_t> y(rows);
  std::string payload;  // float32 features then int64 targets, as the daemon keeps them
  payload.reserve(rows * columns * 4 + rows * 8);
  for (int64_t i = 0; i < rows * columns; ++i) {
    x[i] = 0.25 * static_cast<double>(i % 2001 - 1000);  // exact in float32
    const float value = static_cast<float>(x[i]);
    payload.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  for (int64_t r = 0; r < rows; ++r) {
    y[r] = (r * 7) % 10;
    payload.append(reinterpret_cast<const char*>(&y[r]), sizeof(y[r]));
  }
  const std::string xf =
      WriteFile("big-x.npy", Npy("<f8", {rows, columns}, x.data(), x.size() * 8));
  const std::string yf = WriteFile("big-y.npy", Npy("<i8", {rows}, y.data(), y.size() * 8));
  RunResult up = Ctl({"-o", "json", "dataset", "upload", "streamed", xf, "--targets", yf,
                      "--target-dtype", "int64"});
  ASSERT_EQ(up.exit_code, 0) << up.err;

  RunResult get = Ctl({"-o", "json", "dataset", "get", "streamed"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Dataset ds;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &ds).ok()) << get.out;
  EXPECT_EQ(ds.row_count(), rows);
  EXPECT_THAT(ds.feature_shape(), ::testing::ElementsAre(columns));
  EXPECT_THAT(ds.target_shape(), ::testing::IsEmpty());
  EXPECT_EQ(ds.target_dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(ds.target_min(), 0);
  EXPECT_EQ(ds.target_max(), 9);
  EXPECT_EQ(ds.size_bytes(), static_cast<int64_t>(payload.size()));
  EXPECT_EQ(ds.sha256(), Sha256Hex(payload));
}

TEST_F(EndToEndTest, UnreachableDaemonNamesTheAddress) {
  const std::string addr = addr_;
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  RunResult r = Ctl({"dataset", "list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach trainerd at " + addr));
}

TEST_F(EndToEndTest, MissingDatasetIsNotFound) {
  RunResult r = Ctl({"dataset", "get", "nope"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("dataset 'nope' not found"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
}

TEST_F(EndToEndTest, MalformedCsvNamesTheLine) {
  const std::string csv = WriteFile("bad.csv", "x,y\n1,2\n3,abc\n");
  RunResult r = Ctl({"dataset", "upload", "bad", csv});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("line 3"));
}

TEST_F(EndToEndTest, SpecThatDoesNotFitIsRejectedWithTheReason) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult r = Ctl({"submit", "--dataset", "seed", "--model", "linear:3", "--loss", "mse"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("mse"));
  EXPECT_THAT(r.err, HasSubstr("linear:3"));
}

TEST_F(EndToEndTest, DivergingJobFailsAndWatchExitsThree) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult r = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "1e6",
                     "--epochs", "50", "--batch-size", "16", "--watch"});
  EXPECT_EQ(r.exit_code, 3);  // the watched job FAILED
  EXPECT_THAT(r.out + r.err, HasSubstr("FAILED"));
  EXPECT_THAT(r.out + r.err, HasSubstr("loss became"));
}

// trainctl sweep against the real daemon: the product is submitted as one sweep, watched to the
// end as a table sorted by loss; a diverging member fails alone (and the watch exits 3), the others
// succeed as members of one pack with their own ids, records and models.
TEST_F(EndToEndTest, SweepTrainsItsMembersAsOnePackAndWatchesThemToTheEnd) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult r = Ctl({"sweep", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1,0.03,1e6",
                     "--seed", "1,2", "--epochs", "20", "--batch-size", "16", "--watch"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;  // two members diverged: FAILED
  const std::string sweep = r.out.substr(0, r.out.find('\n'));
  ASSERT_THAT(sweep, ::testing::StartsWith("sweep-")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("4 succeeded, 2 failed, 0 cancelled"));
  // The final table lists the best member first.
  std::vector<std::string> ids;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("job-", 0) == 0) ids.push_back(line.substr(0, line.find(' ')));
  }
  ASSERT_EQ(ids.size(), 6u) << r.out;
  double lowest = 1e300;
  for (const std::string& id : ids) {
    RunResult get = Ctl({"-o", "json", "job", "get", id});
    ASSERT_EQ(get.exit_code, 0) << get.err;
    v1::Job job;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
    EXPECT_EQ(job.sweep_id(), sweep);
    EXPECT_EQ(job.report().packed_members(), 6);
    if (job.spec().optimizer().learning_rate() == 1e6) {
      EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
      EXPECT_THAT(job.error(), HasSubstr("loss became"));
    } else {
      EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
      EXPECT_EQ(job.epochs_size(), 20);
      EXPECT_LT(job.final_loss(), 0.05);
      lowest = std::min(lowest, job.final_loss());
    }
  }
  RunResult best = Ctl({"-o", "json", "job", "get", ids.front()});
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(best.out, &job).ok());
  EXPECT_EQ(job.final_loss(), lowest) << r.out;
  const std::string model = (dir_ / "best.pt").string();
  RunResult fetched = Ctl({"job", "model", ids.front(), "-f", model});
  EXPECT_EQ(fetched.exit_code, 0) << fetched.err;
  EXPECT_GT(std::filesystem::file_size(model), 0u);
}

// trainctl sweep --points against the real daemon: the file's lines are the members, in order,
// each with the values its line gives and the flags' for the cells it leaves empty, trained as
// one pack.
// The daemon's default workers on the CPU: a job per core (--cpu_cores=2 here, whatever this
// machine has), so a sweep's pack is dealt in two packs that train at once, each member still the
// job alone (trainctl submit of member 0's values gives its losses exactly).
TEST_F(EndToEndTest, ByDefaultTheCpuRunsAJobPerCoreAndDealsASweepRoundThem) {
  daemon_.reset();
  extra_flags_ = {"--max_concurrent_jobs=0", "--cpu_cores=2"};
  StartDaemon();
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult r = Ctl({"sweep", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1,0.05,0.03",
                     "--seed", "1,2", "--epochs", "60", "--batch-size", "16", "--watch"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<v1::Job> members;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("job-", 0) != 0) continue;
    RunResult get = Ctl({"-o", "json", "job", "get", line.substr(0, line.find(' '))});
    ASSERT_EQ(get.exit_code, 0) << get.err;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &members.emplace_back()).ok());
  }
  ASSERT_EQ(members.size(), 6u) << r.out;
  for (const v1::Job& job : members) {
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
    EXPECT_EQ(job.report().packed_members(), 3);
    EXPECT_EQ(job.report().intra_op_threads(), 1);
  }
  // The two packs train at the same time: every member's run overlaps every other's.
  auto nanos = [](const google::protobuf::Timestamp& t) {
    return t.seconds() * 1000000000LL + t.nanos();
  };
  for (const v1::Job& a : members) {
    for (const v1::Job& b : members) {
      EXPECT_LT(nanos(a.start_time()), nanos(b.end_time())) << a.id() << " " << b.id();
    }
  }
  // A member equals its job alone.
  const v1::Job& member = members[0];
  RunResult solo =
      Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--lr",
           absl::StrCat(member.spec().optimizer().learning_rate()), "--seed",
           absl::StrCat(member.spec().seed()), "--epochs", "60", "--batch-size", "16", "--watch"});
  ASSERT_EQ(solo.exit_code, 0) << solo.err;
  RunResult got = Ctl({"-o", "json", "job", "get", solo.out.substr(0, solo.out.find('\n'))});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  v1::Job alone;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &alone).ok()) << got.out;
  EXPECT_EQ(alone.final_loss(), member.final_loss());
}

TEST_F(EndToEndTest, SweepPointsAreTheMembersOfTheFileInOrder) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  const std::string points =
      WriteFile("points.csv", "# lr and seed per member\nseed,lr\n1,0.1\n2,\n3,0.03\n");
  RunResult r = Ctl({"-o", "json", "sweep", "--dataset", "seed", "--model", "linear:1", "--points",
                     points, "--lr", "0.05", "--epochs", "6", "--batch-size", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  v1::SubmitSweepResponse response;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &response).ok()) << r.out;
  ASSERT_EQ(response.members_size(), 3);
  const double lrs[] = {0.1, 0.05, 0.03};
  for (int i = 0; i < 3; ++i) {
    const std::string& id = response.members(i).id();
    RunResult wait = Ctl({"job", "wait", id});
    EXPECT_EQ(wait.exit_code, 0) << wait.out << wait.err;
    RunResult get = Ctl({"-o", "json", "job", "get", id});
    v1::Job job;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
    EXPECT_EQ(job.sweep_id(), response.sweep_id());
    EXPECT_EQ(job.sweep_member(), i + 1);
    EXPECT_EQ(job.spec().seed(), static_cast<uint64_t>(i + 1));
    EXPECT_DOUBLE_EQ(job.spec().optimizer().learning_rate(), lrs[i]);
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
    EXPECT_EQ(job.epochs_size(), 6);
    EXPECT_EQ(job.report().packed_members(), 3);
  }
  // A bad line is refused before anything is sent, naming it.
  RunResult bad = Ctl({"sweep", "--dataset", "seed", "--model", "linear:1", "--points",
                       WriteFile("bad.csv", "lr\n0.1\n-1\n")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--points: line 3: --lr must be > 0, got -1"));
}

// A sweep submitted without --watch is found again by its id (`job list --sweep ID`), as a
// notebook or CI step that went away would: listed in order, followed to the end with --watch
// (exit 0, the summary), shown as a table; an unknown id is not found.
TEST_F(EndToEndTest, ASweepIsPickedUpAgainByItsId) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult r = Ctl({"sweep", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1,0.03",
                     "--seed", "1,2", "--epochs", "8", "--batch-size", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string sweep = r.out.substr(0, r.out.find('\n'));
  ASSERT_THAT(sweep, ::testing::StartsWith("sweep-")) << r.out;
  std::vector<std::string> submitted;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("job-", 0) == 0) submitted.push_back(line.substr(0, line.find(' ')));
  }
  ASSERT_EQ(submitted.size(), 4u) << r.out;

  RunResult names = Ctl({"-o", "name", "job", "list", "--sweep", sweep});
  ASSERT_EQ(names.exit_code, 0) << names.err;
  std::string in_order;
  for (const std::string& id : submitted) in_order += id + "\n";
  EXPECT_EQ(names.out, in_order);  // in the sweep's order

  RunResult watched = Ctl({"job", "list", "--sweep", sweep, "--watch"});
  ASSERT_EQ(watched.exit_code, 0) << watched.out << watched.err;
  EXPECT_THAT(watched.out, HasSubstr("4 succeeded, 0 failed, 0 cancelled; best job-"));
  for (const std::string& id : submitted) EXPECT_THAT(watched.out, HasSubstr(id));

  RunResult table = Ctl({"job", "list", "--sweep", sweep});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("8/8"));
  EXPECT_THAT(table.out, HasSubstr("4 succeeded"));
  RunResult json = Ctl({"-o", "json", "job", "list", "--sweep", sweep, "--state", "succeeded"});
  v1::ListJobsResponse listed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &listed).ok()) << json.out;
  ASSERT_EQ(listed.jobs_size(), 4);
  EXPECT_EQ(listed.jobs(3).sweep_member(), 4);

  RunResult unknown = Ctl({"job", "list", "--sweep", "sweep-000000000000"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("sweep 'sweep-000000000000' not found"));
  RunResult bad = Ctl({"job", "list", "--sweep", "sweep 1"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("sweep_id must be"));
  EXPECT_EQ(Ctl({"job", "list", "--watch"}).exit_code, 2);
  EXPECT_EQ(Ctl({"job", "list", "--sweep", sweep, "--limit", "2"}).exit_code, 2);
}

// What a new user hit with scikit-learn's data, against the real daemon: int32 labels upload as
// int64 class indices (said on stderr) in one line; a job without --loss trains with
// cross_entropy on them; a validating sweep names its best member by validation loss.
TEST_F(EndToEndTest, IntLabelsDefaultLossAndValidatingSweepWorkAsANewUserExpects) {
  std::vector<double> x;
  std::vector<int32_t> y;
  for (int i = 0; i < 120; ++i) {
    const int label = i % 3;
    x.push_back(label * 4.0 - 4 + 0.1 * (i % 7));
    x.push_back((label == 2 ? 4.0 : -4.0) - 0.1 * (i % 5));
    y.push_back(label);
  }
  const std::string xf = WriteFile("x.npy", Npy("<f8", {120, 2}, x.data(), x.size() * 8));
  const std::string yf = WriteFile("y.npy", Npy("<i4", {120}, y.data(), y.size() * 4));
  RunResult up = Ctl({"dataset", "upload", "three", xf, "--targets", yf});
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_THAT(up.out, ::testing::MatchesRegex("uploaded dataset 'three': 120 rows, features 2, "
                                              "targets scalar int64 classes 0..2, .* on cpu\n"));
  EXPECT_THAT(up.err, HasSubstr("targets: int32 values sent as int64 class indices"));
  EXPECT_THAT(up.err, HasSubstr("features: float64 values sent as float32"));

  RunResult job = Ctl({"submit", "--dataset", "three", "--model", "linear:3", "--epochs", "5",
                       "--seed", "3", "--watch"});
  ASSERT_EQ(job.exit_code, 0) << job.out << job.err;
  const std::string id = job.out.substr(0, job.out.find('\n'));
  RunResult got = Ctl({"-o", "json", "job", "get", id});
  v1::Job trained;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(got.out, &trained).ok()) << got.out;
  EXPECT_EQ(trained.spec().loss(), v1::LOSS_CROSS_ENTROPY);

  RunResult sweep = Ctl({"sweep", "--dataset", "three", "--model", "linear:8,relu,linear:3",
                         "--optimizer", "adam", "--lr", "0.05,0.01,0.0001", "--epochs", "8",
                         "--validation-fraction", "0.25", "--seed", "5", "--watch"});
  ASSERT_EQ(sweep.exit_code, 0) << sweep.out << sweep.err;
  EXPECT_THAT(sweep.out, HasSubstr("VAL ACC"));
  // The best by validation loss, which the summary names and the table lists first.
  double lowest = 1e300;
  std::string best;
  std::istringstream lines(sweep.out);
  std::vector<std::string> ids;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("job-", 0) == 0) ids.push_back(line.substr(0, line.find(' ')));
  }
  ASSERT_EQ(ids.size(), 3u) << sweep.out;
  for (const std::string& member : ids) {
    RunResult member_json = Ctl({"-o", "json", "job", "get", member});
    v1::Job m;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(member_json.out, &m).ok());
    ASSERT_GT(m.epochs_size(), 0);
    ASSERT_TRUE(m.epochs(m.epochs_size() - 1).has_validation_loss());
    const double v = m.epochs(m.epochs_size() - 1).validation_loss();
    if (v < lowest) {
      lowest = v;
      best = member;
    }
  }
  EXPECT_EQ(ids.front(), best) << sweep.out;
  EXPECT_THAT(sweep.out, HasSubstr("best " + best + " by validation loss")) << sweep.out;
}

TEST_F(EndToEndTest, DatasetSurvivesRestart) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult before = Ctl({"-o", "json", "dataset", "get", "seed"});
  ASSERT_EQ(before.exit_code, 0);
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->Stderr();
  StartDaemon();
  RunResult after = Ctl({"-o", "json", "dataset", "get", "seed"});
  ASSERT_EQ(after.exit_code, 0) << after.err;
  v1::Dataset a, b;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(before.out, &a).ok());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(after.out, &b).ok());
  EXPECT_EQ(a.sha256(), b.sha256());
  EXPECT_EQ(b.row_count(), 800);
}

TEST_F(EndToEndTest, EnvironmentVariablesSetFlagsAndTheCommandLineWins) {
  // As a container passes settings: TRAINERD_DATA_DIR is --data_dir; TRAINERD_LISTEN names a port
  // that is taken (1), and the command line's --listen wins over it.
  daemon_.reset();
  const std::string data = (dir_ / "from-env").string();
  daemon_ = std::make_unique<Daemon>(std::vector<std::string>{
      "/usr/bin/env", "TRAINERD_DATA_DIR=" + data, "TRAINERD_LISTEN=127.0.0.1:1",
      "TRAINERD_DIAGNOSE_AT_START=false", "TRAINERD_METRICS_LISTEN=", TRAINERD_BIN, "--device=cpu",
      "--listen=127.0.0.1:0"});
  std::string line;
  ASSERT_TRUE(daemon_->ReadLine(&line)) << "trainerd exited: " << daemon_->Stderr();
  const std::string marker = "listening on ";
  ASSERT_NE(line.find(marker), std::string::npos) << line;
  addr_ = line.substr(line.find(marker) + marker.size());
  addr_ = addr_.substr(0, addr_.find(' '));
  EXPECT_NE(addr_, "127.0.0.1:1");

  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(data + "/datasets/seed.trds"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "data" / "datasets" / "seed.trds"));

  // A value that does not parse stops the start with the variable's name.
  RunResult bad = e2e::Run({TRAINERD_BIN, "--device=cpu", "--listen=127.0.0.1:0"},
                           {"TRAINERD_MAX_QUEUED_JOBS=lots", "TRAINERD_DATA_DIR=" + data + "2"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("TRAINERD_MAX_QUEUED_JOBS='lots'"));

  // The image's settings (every address, the token from a secret file): without the secret the
  // daemon refuses to start, saying which file it wanted.
  const std::vector<std::string> image_env = {
      "TRAINERD_LISTEN=0.0.0.0:0", "TRAINERD_METRICS_LISTEN=", "TRAINERD_DATA_DIR=" + data + "3",
      "TRAINERD_AUTH_TOKEN_FILE=" + (dir_ / "no-secret" / "trainerd_token").string()};
  RunResult no_secret = e2e::Run({TRAINERD_BIN, "--device=cpu"}, image_env);
  EXPECT_NE(no_secret.exit_code, 0);
  EXPECT_THAT(no_secret.err, HasSubstr("--auth_token_file: cannot open"));
  EXPECT_THAT(no_secret.err, HasSubstr("no-secret/trainerd_token"));
  // Emptied, the daemon still will not serve every address without authentication.
  std::vector<std::string> emptied = image_env;
  emptied.back() = "TRAINERD_AUTH_TOKEN_FILE=";
  RunResult open_bind = e2e::Run({TRAINERD_BIN, "--device=cpu"}, emptied);
  EXPECT_NE(open_bind.exit_code, 0);
  EXPECT_THAT(open_bind.err, HasSubstr("refusing to serve on 0.0.0.0:0"));
}

TEST_F(EndToEndTest, ContextsPickTheNodeAndDevicesAllContextsAsksEveryOne) {
  const std::string config = (dir_ / "trainctl" / "config.yaml").string();
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), TRAINCTL_BIN);
    return e2e::Run(args, {"TRAINCTL_CONFIG=" + config});
  };
  ASSERT_EQ(ctl({"config", "set-context", "here", "--addr", addr_}).exit_code, 0);
  RunResult gone = ctl({"config", "set-context", "gone", "--addr", "127.0.0.1:1"});
  ASSERT_EQ(gone.exit_code, 0) << gone.err;
  EXPECT_EQ(std::filesystem::status(config).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  RunResult list = ctl({"config", "get-contexts"});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr(addr_));
  EXPECT_THAT(list.out, HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(ctl({"config", "current-context"}).out, "here\n");  // the first one made

  // Without --addr, the current context's daemon answers.
  RunResult health = ctl({"health", "--timeout", "5"});
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_THAT(health.out, HasSubstr("SERVING"));
  EXPECT_EQ(ctl({"--context", "gone", "health", "--timeout", "2"}).exit_code, 1);
  RunResult unknown = ctl({"--context", "nowhere", "devices"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("no context 'nowhere'"));

  // Every node at once: the reachable one's devices, the other's reason, and exit 1.
  RunResult all = ctl({"devices", "--all-contexts", "--timeout", "3"});
  EXPECT_EQ(all.exit_code, 1) << all.err;
  EXPECT_THAT(all.out, HasSubstr("context here (" + addr_ + ") *:"));
  EXPECT_THAT(all.out, HasSubstr("cpu"));
  EXPECT_THAT(all.out, HasSubstr("context gone (127.0.0.1:1):\n  unreachable: "));

  ASSERT_EQ(ctl({"config", "use-context", "gone"}).exit_code, 0);
  EXPECT_EQ(ctl({"config", "current-context"}).out, "gone\n");
  ASSERT_EQ(ctl({"config", "delete-context", "gone"}).exit_code, 0);
  EXPECT_EQ(ctl({"config", "current-context"}).exit_code, 1);
  EXPECT_THAT(ctl({"config", "get-contexts"}).out, ::testing::Not(HasSubstr("127.0.0.1:1")));
}

TEST_F(EndToEndTest, SigtermStopsDaemonCleanlyAndCancelsRunningJob) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult submit = Ctl(
      {"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1", "--epochs", "1000000"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
  EXPECT_THAT(daemon_->Stderr(), HasSubstr("shutting down"));
}

TEST_F(EndToEndTest, CancelledJobEndsCancelled) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult submit = Ctl(
      {"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1", "--epochs", "1000000"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  RunResult cancel = Ctl({"job", "cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  RunResult watch = Ctl({"job", "watch", id});  // returns once the job has ended
  EXPECT_EQ(watch.exit_code, 4);                // CANCELLED
  EXPECT_THAT(watch.out, HasSubstr("CANCELLED"));
  RunResult rm = Ctl({"dataset", "rm", "seed"});
  EXPECT_EQ(rm.exit_code, 0) << rm.err;
}

// Job records outlive the daemon: after a restart `job list` (filtered), `job get` and `job model`
// still work, and `job rm` deletes the job with its model. With --request-id the same submit
// after the restart (a CI step run again) prints the same job, and other flags are refused.
TEST_F(EndToEndTest, JobsOutliveARestartAndRmDeletesThem) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  const std::vector<std::string> submit = {
      "submit", "--dataset",    "seed",         "--model", "linear:1",
      "--lr",   "0.1",          "--epochs",     "5",       "--checkpoint-every",
      "1",      "--request-id", "ci-1234.train"};
  std::vector<std::string> watched = submit;
  watched.push_back("--watch");
  RunResult run = Ctl(watched);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));
  EXPECT_EQ(daemon_->Stop(SIGTERM, 60), 0);
  daemon_.reset();
  StartDaemon();
  RunResult again = Ctl(submit);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, id + "\n");
  std::vector<std::string> other = submit;
  other[8] = "6";  // --epochs
  RunResult refused = Ctl(other);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("request id 'ci-1234.train' was already used"));

  RunResult succeeded = Ctl({"job", "list", "--state", "succeeded"});
  EXPECT_EQ(succeeded.exit_code, 0) << succeeded.err;
  EXPECT_THAT(succeeded.out, HasSubstr(id));
  EXPECT_THAT(succeeded.out, HasSubstr("5/5"));
  RunResult running = Ctl({"job", "list", "--state", "running"});
  EXPECT_EQ(running.exit_code, 0) << running.err;
  EXPECT_THAT(running.out, ::testing::Not(HasSubstr(id)));
  RunResult get = Ctl({"job", "get", id});
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(get.out, HasSubstr("ci-1234.train"));
  const std::string model = (dir_ / "model.pt").string();
  EXPECT_EQ(Ctl({"job", "model", id, "-f", model}).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(model));

  RunResult rm = Ctl({"job", "rm", id});
  EXPECT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "data" / "models" / (id + ".pt")));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "data" / "checkpoints" / id));
  RunResult gone = Ctl({"job", "get", id});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THAT(gone.err, HasSubstr("not found"));
}

// The row of `name` in `trainctl dataset list`.
std::string DatasetRow(const std::string& table, const std::string& name) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + " ", 0) == 0) return line;
  }
  return "";
}

TEST_F(EndToEndTest, DeviceMemoryBudgetEvictsIdleDatasetsRefusesWhatCannotFitAndLoadsLazily) {
  // Room for three 6,400-byte datasets (19,200 bytes), not four.
  daemon_.reset();
  extra_flags_ = {"--device_memory_budget=20000"};
  StartDaemon();
  const std::string csv = WriteFile("s.csv", SeedCsv());
  for (const char* name : {"a", "b", "c", "d"}) {
    RunResult up = Ctl({"dataset", "upload", name, csv});
    ASSERT_EQ(up.exit_code, 0) << name << ": " << up.err;
  }
  // "a", the least recently used, made room for "d" and waits on disk.
  RunResult list = Ctl({"dataset", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(DatasetRow(list.out, "a"), HasSubstr("cpu (on disk)")) << list.out;
  for (const char* name : {"b", "c", "d"}) {
    EXPECT_THAT(DatasetRow(list.out, name), ::testing::Not(HasSubstr("on disk"))) << list.out;
  }

  // 4,000 rows (32,000 bytes) can never be resident: refused at the header, with the numbers.
  std::string rows = "x,y\n";
  for (int i = 0; i < 5; ++i) rows += SeedCsv().substr(4);
  RunResult huge = Ctl({"dataset", "upload", "huge", WriteFile("huge.csv", rows)});
  EXPECT_EQ(huge.exit_code, 1);
  EXPECT_THAT(huge.err, HasSubstr("dataset 'huge' needs 32000 bytes on cpu"));
  EXPECT_THAT(huge.err, HasSubstr("the device memory budget is 20000 bytes"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "data" / "datasets" / "huge.trds"));

  // A job on "a" loads it back (evicting the least recently used idle dataset) and trains.
  RunResult run = Ctl({"submit", "--dataset", "a", "--model", "linear:1", "--lr", "0.1", "--epochs",
                       "2", "--watch"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  list = Ctl({"dataset", "list"});
  EXPECT_THAT(DatasetRow(list.out, "a"), ::testing::Not(HasSubstr("on disk"))) << list.out;

  // A model that could never fit is refused at submit, naming its estimate.
  RunResult wide = Ctl({"submit", "--dataset", "a", "--model",
                        "linear:512,relu,linear:512,relu,linear:1", "--epochs", "1"});
  EXPECT_EQ(wide.exit_code, 1);
  EXPECT_THAT(wide.err, HasSubstr("an estimated working set of"));
  EXPECT_THAT(wide.err, HasSubstr("--device_memory_budget"));

  // After a restart every dataset is registered from its header and loads when first used.
  EXPECT_EQ(daemon_->Stop(SIGTERM, 60), 0);
  daemon_.reset();
  StartDaemon();
  list = Ctl({"dataset", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  for (const char* name : {"a", "b", "c", "d"}) {
    EXPECT_THAT(DatasetRow(list.out, name), HasSubstr("(on disk)")) << list.out;
  }
  EXPECT_EQ(Ctl({"submit", "--dataset", "d", "--model", "linear:1", "--epochs", "1", "--watch"})
                .exit_code,
            0);
  list = Ctl({"dataset", "list"});
  EXPECT_THAT(DatasetRow(list.out, "d"), ::testing::Not(HasSubstr("on disk"))) << list.out;
}

// The Python with torch that checks a downloaded model: $TRAINERD_PYTHON at run time, else the
// one CMake was configured with (TRAINERD_PYTHON); "" when neither names an existing file.
std::string TorchPython() {
  const char* env = std::getenv("TRAINERD_PYTHON");
  for (const std::string& candidate :
       {std::string(env == nullptr ? "" : env), std::string(TRAINERD_PYTHON)}) {
    if (!candidate.empty() && std::filesystem::exists(candidate)) return candidate;
  }
  return "";
}

TEST_F(EndToEndTest, MlpClassifierOnTenClassesReaches95PercentValidationAccuracy) {
  // 2,000 rows of 16 features around 10 well-separated centres; the label is the last column.
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> label(0, 9);
  std::vector<std::vector<double>> centres(10, std::vector<double>(16));
  for (auto& c : centres) {
    for (double& v : c) v = 3.0 * normal(rng);
  }
  std::string csv;
  for (int i = 0; i < 2000; ++i) {
    const int k = label(rng);
    for (int j = 0; j < 16; ++j) {
      char field[32];
      std::snprintf(field, sizeof(field), "%.6g,", centres[k][j] + normal(rng));
      csv += field;
    }
    csv += std::to_string(k) + "\n";
  }
  ASSERT_EQ(
      Ctl({"dataset", "upload", "blobs", WriteFile("blobs.csv", csv), "--target-dtype", "int64"})
          .exit_code,
      0);
  RunResult run = Ctl({"submit",
                       "--dataset",
                       "blobs",
                       "--model",
                       "linear:64,relu,linear:10",
                       "--loss",
                       "cross_entropy",
                       "--optimizer",
                       "adam",
                       "--lr",
                       "0.01",
                       "--batch-size",
                       "64",
                       "--epochs",
                       "10",
                       "--seed",
                       "3",
                       "--validation-fraction",
                       "0.2",
                       "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  ASSERT_EQ(job.epochs_size(), 10);
  const v1::EpochResult& last = job.epochs(job.epochs_size() - 1);
  ASSERT_TRUE(last.has_validation_accuracy());
  EXPECT_GE(last.validation_accuracy(), 0.95);
  EXPECT_EQ(job.host_syncs(), 10);  // one per epoch; 1,738 parameters are not read back
}

TEST_F(EndToEndTest, DownloadedModelLoadsInPythonAndMatchesReportedParameters) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult run = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1",
                       "--batch-size", "16", "--epochs", "20", "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));

  const std::string path = (dir_ / "model.pt").string();
  RunResult download = Ctl({"job", "model", id, "-f", path});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  EXPECT_THAT(download.out, HasSubstr("wrote model of " + id + " to " + path));
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 2u);
  EXPECT_EQ(bytes.substr(0, 2), "PK");
  EXPECT_THAT(download.out,
              HasSubstr("(torchscript, " + std::to_string(bytes.size()) + " bytes)"));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid())));

  const std::string python = TorchPython();
  if (python.empty()) {
    GTEST_SKIP() << "no Python with torch (set TRAINERD_PYTHON): the download was checked by "
                    "its bytes only";
  }
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  ASSERT_EQ(job.parameters_size(), 2);
  const double w = job.parameters(0).values(0);
  const double b = job.parameters(1).values(0);

  const std::vector<double> xs = {-1.0, 0.0, 0.5, 2.0};
  RunResult py = e2e::Run({python, "-c",
                           "import sys, torch\n"
                           "m = torch.jit.load(sys.argv[1])\n"
                           "m.eval()\n"
                           "x = torch.tensor([[-1.0], [0.0], [0.5], [2.0]])\n"
                           "with torch.no_grad():\n"
                           "    y = m(x)\n"
                           "print(' '.join(repr(v) for v in y.reshape(-1).tolist()))\n",
                           path});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  std::istringstream values(py.out);
  for (const double x : xs) {
    double y = 0;
    ASSERT_TRUE(values >> y) << py.out;
    EXPECT_NEAR(y, w * x + b, 1e-5) << "x = " << x;
  }
}

// A TorchScript module of torch.linear with w of [outputs, inputs], written by the fixture
// helper (a separate process: it links LibTorch, this test does not).
std::string MakeLinearModule(const std::filesystem::path& dir, int inputs, int outputs) {
  const std::string path =
      (dir / ("net-" + std::to_string(inputs) + "x" + std::to_string(outputs) + ".pt")).string();
  RunResult r = e2e::Run(
      {MAKE_TORCHSCRIPT_FIXTURE_BIN, path, std::to_string(inputs), std::to_string(outputs)});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

TEST_F(EndToEndTest, SubmittedTorchScriptModuleTrainsAndDownloads) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  const std::string module = MakeLinearModule(dir_, /*inputs=*/1, /*outputs=*/1);
  RunResult run = Ctl({"submit", "--dataset", "seed", "--torchscript", module, "--lr", "0.1",
                       "--batch-size", "16", "--epochs", "100", "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("SUCCEEDED"));
  const std::string id = run.out.substr(0, run.out.find('\n'));

  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  EXPECT_THAT(job.spec().model(), HasSubstr("torchscript ("));
  EXPECT_EQ(job.host_syncs(), 101);
  ASSERT_EQ(job.parameters_size(), 2);
  EXPECT_EQ(job.parameters(0).name(), "w");
  EXPECT_NEAR(job.parameters(0).values(0), 2.0, 0.05);
  EXPECT_EQ(job.parameters(1).name(), "b");
  EXPECT_NEAR(job.parameters(1).values(0), 1.0, 0.05);

  const std::string path = (dir_ / "trained.pt").string();
  RunResult download = Ctl({"job", "model", id, "-f", path});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 2u);
  EXPECT_EQ(bytes.substr(0, 2), "PK");
}

// The safetensors file of `path`, parsed; its tensor `name` as float32 values.
std::vector<float> Float32Tensor(const std::string& bytes, const SafetensorsFile& file,
                                 const std::string& name) {
  for (const SafetensorsEntry& e : file.tensors) {
    if (e.name != name) continue;
    EXPECT_EQ(e.dtype, "F32") << name;
    std::vector<float> values(static_cast<size_t>(e.size) / sizeof(float));
    std::memcpy(values.data(), bytes.data() + e.offset, static_cast<size_t>(e.size));
    return values;
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

std::string ReadWhole(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

TEST_F(EndToEndTest, JobModelFormatSafetensorsWritesNnSequentialsStateDict) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult run = Ctl({"submit", "--dataset", "seed", "--model", "linear:3,relu,linear:1", "--lr",
                       "0.05", "--batch-size", "16", "--epochs", "5", "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));

  const std::string path = (dir_ / "model.safetensors").string();
  RunResult download = Ctl({"job", "model", id, "--format", "safetensors", "-f", path});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  const std::string bytes = ReadWhole(path);
  EXPECT_THAT(download.out, HasSubstr("wrote model of " + id + " to " + path + " (safetensors, " +
                                      std::to_string(bytes.size()) + " bytes)"));
  const absl::StatusOr<SafetensorsFile> file = ParseSafetensors(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : file->tensors) names.push_back(e.name);
  EXPECT_THAT(names, ElementsAre("0.weight", "0.bias", "2.weight", "2.bias"));
  EXPECT_THAT(file->metadata, Contains(Pair("trainerd.job", id)));
  EXPECT_THAT(file->metadata, Contains(Pair("trainerd.model", "linear:3,relu,linear:1")));
  EXPECT_THAT(file->metadata, Contains(Pair("trainerd.feature_shape", "[1]")));

  // The values are those the job reports.
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  ASSERT_EQ(job.parameters_size(), 4);
  for (const v1::Parameter& p : job.parameters()) {
    const std::vector<float> values = Float32Tensor(bytes, *file, p.name());
    ASSERT_EQ(static_cast<int>(values.size()), p.values_size()) << p.name();
    for (int i = 0; i < p.values_size(); ++i) {
      EXPECT_FLOAT_EQ(values[static_cast<size_t>(i)], static_cast<float>(p.values(i)))
          << p.name();
    }
  }

  // To standard output as well, byte for byte; a format trainctl does not know is a usage error.
  RunResult piped = Ctl({"job", "model", id, "--format", "SafeTensors"});
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.out, bytes);
  RunResult bad = Ctl({"job", "model", id, "--format", "onnx", "-f", path + ".x"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--format takes torchscript, safetensors or pt2, not 'onnx'"));
  EXPECT_FALSE(std::filesystem::exists(path + ".x"));
  // A spec-built model's .pt2 is made by the daemon from its state_dict: torch.export's archive
  // (a zip whose model.json is the graph, tests/python's test_models_out loads it with torch),
  // the same bytes each time.
  RunResult pt2 = Ctl({"job", "model", id, "--format", "pt2", "-f", path + ".pt2"});
  ASSERT_EQ(pt2.exit_code, 0) << pt2.err;
  const std::string archive = ReadWhole(path + ".pt2");
  EXPECT_EQ(archive.substr(0, 2), "PK");
  EXPECT_NE(archive.find("archive/models/model.json"), std::string::npos);
  EXPECT_NE(archive.find("torch.ops.aten.linear.default"), std::string::npos);
  RunResult again = Ctl({"job", "model", id, "--format", "pt2"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, archive);
}

TEST_F(EndToEndTest, TorchScriptJobsStateDictHasItsModulesNames) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  const std::string module = MakeLinearModule(dir_, /*inputs=*/1, /*outputs=*/1);
  RunResult run = Ctl({"submit", "--dataset", "seed", "--torchscript", module, "--lr", "0.1",
                       "--batch-size", "16", "--epochs", "3", "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));
  const std::string path = (dir_ / "trained.safetensors").string();
  RunResult download = Ctl({"job", "model", id, "--format", "safetensors", "-f", path});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  const std::string bytes = ReadWhole(path);
  const absl::StatusOr<SafetensorsFile> file = ParseSafetensors(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : file->tensors) names.push_back(e.name);
  EXPECT_THAT(names, ElementsAre("w", "b", "calls"));  // the module's own, buffer last
  EXPECT_THAT(file->metadata, Contains(Pair("trainerd.model", "torchscript")));
  // Its .pt2 needs the user's Python class: refused with the way to make it.
  RunResult pt2 = Ctl({"job", "model", id, "--format", "pt2", "-f", path + ".pt2"});
  EXPECT_EQ(pt2.exit_code, 1);
  EXPECT_THAT(pt2.err, HasSubstr("trained a TorchScript module, whose .pt2 is made where its "
                                 "Python class is"));
  EXPECT_FALSE(std::filesystem::exists(path + ".pt2"));
}

// An exported program (the .pt2 layout torch.export.save writes, made by hand here: this test
// links no LibTorch) of fc = nn.Linear(1, 1), sent by trainctl's --torchscript, which tells the
// kinds apart by content.
TEST_F(EndToEndTest, SubmittedExportedProgramTrainsAndDownloadsAsPt2) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  const std::string program = WriteFile("net.pt2", trainerd::testing::ExportedProgramArchive());
  RunResult run = Ctl({"submit", "--dataset", "seed", "--torchscript", program, "--lr", "0.1",
                       "--batch-size", "16", "--epochs", "100", "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("SUCCEEDED"));
  const std::string id = run.out.substr(0, run.out.find('\n'));

  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  EXPECT_THAT(job.spec().model(), HasSubstr("exported ("));
  ASSERT_EQ(job.parameters_size(), 2);
  EXPECT_EQ(job.parameters(0).name(), "fc.weight");
  EXPECT_NEAR(job.parameters(0).values(0), 2.0, 0.05);
  EXPECT_EQ(job.parameters(1).name(), "fc.bias");
  EXPECT_NEAR(job.parameters(1).values(0), 1.0, 0.05);

  // The download is the .pt2 with the trained weights in its weight records.
  const std::string path = (dir_ / "trained.pt2").string();
  RunResult download = Ctl({"job", "model", id, "-f", path});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(0, 2), "PK");
  EXPECT_THAT(bytes, HasSubstr("models/model.json"));
  EXPECT_THAT(bytes, HasSubstr("data/weights/weight_0"));
  const float w = job.parameters(0).values(0);
  EXPECT_NE(bytes.find(std::string(reinterpret_cast<const char*>(&w), 4)), std::string::npos)
      << "the trained weight is not in the download";
  // --format pt2 names what it is: the same archive.
  RunResult pt2 = Ctl({"job", "model", id, "--format", "pt2"});
  ASSERT_EQ(pt2.exit_code, 0) << pt2.err;
  EXPECT_EQ(pt2.out, bytes);
}

TEST_F(EndToEndTest, ExportedProgramWithAnOperatorOffTheListIsRefusedAtSubmit) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  trainerd::testing::ExportedProgramKnobs knobs;
  knobs.target = "torch.ops.aten.from_file.default";
  const std::string program =
      WriteFile("evil.pt2", trainerd::testing::ExportedProgramArchive(knobs));
  RunResult r = Ctl({"submit", "--dataset", "seed", "--torchscript", program});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("aten.from_file.default, which is not on trainerd's list of "
                               "operators"));
}

TEST_F(EndToEndTest, TorchScriptModuleThatDoesNotFitIsRejectedAtSubmit) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  const std::string module = MakeLinearModule(dir_, /*inputs=*/3, /*outputs=*/1);
  RunResult r = Ctl({"submit", "--dataset", "seed", "--torchscript", module});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the TorchScript module's forward does not accept a batch of shape "
                               "[2, 1]"));
}

TEST_F(EndToEndTest, ModelOfRunningJobFailsAndWritesNoFile) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult submit = Ctl(
      {"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1", "--epochs", "1000000"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  const std::string path = (dir_ / "model.pt").string();

  RunResult no_file = Ctl({"job", "model", id});
  RunResult running = Ctl({"job", "model", id, "-f", path});

  // Without -f the model would go to standard output (a pipe here): refused as with a file.
  EXPECT_EQ(no_file.exit_code, 1);
  EXPECT_THAT(no_file.err, HasSubstr("its model is available once it succeeds"));
  EXPECT_THAT(no_file.out, ::testing::IsEmpty());
  EXPECT_EQ(running.exit_code, 1);
  EXPECT_THAT(running.err, HasSubstr("its model is available once it succeeds"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(Ctl({"job", "cancel", id}).exit_code, 0);
}

// Synthetic 1x28x28 images of four classes: class k is a bright bar three pixels high in row band
// k (rows 7k..7k+6, jittered by a row) over a random half of the width, on Gaussian noise (sd 0.8,
// so that the first epoch does not already separate them all). A small CNN learns them in a few
// epochs.
struct BarImages {
  static constexpr int kClasses = 4;
  static constexpr int kSide = 28;
  std::vector<float> pixels;    // rows x 1 x 28 x 28, C order
  std::vector<int64_t> labels;  // rows
};

BarImages MakeBarImages(int rows, std::mt19937& rng) {
  constexpr int kSide = BarImages::kSide;
  std::uniform_int_distribution<int> label(0, BarImages::kClasses - 1);
  std::uniform_int_distribution<int> jitter(-1, 1);
  std::uniform_int_distribution<int> start_column(0, kSide / 2);
  std::normal_distribution<float> noise(0.0f, 0.8f);
  BarImages images;
  images.pixels.resize(static_cast<size_t>(rows) * kSide * kSide);
  for (int i = 0; i < rows; ++i) {
    const int k = label(rng);
    images.labels.push_back(k);
    float* image = images.pixels.data() + static_cast<size_t>(i) * kSide * kSide;
    for (int p = 0; p < kSide * kSide; ++p) image[p] = noise(rng);
    const int top = 7 * k + 2 + jitter(rng);
    const int left = start_column(rng);
    for (int r = top; r < top + 3; ++r) {
      for (int c = left; c < left + kSide / 2; ++c) image[r * kSide + c] += 1.0f;
    }
  }
  return images;
}

TEST_F(EndToEndTest, SmallCnnOnImagesTrainsAndDownloadedModelMatchesDaemon) {
  std::mt19937 rng(2024);
  const BarImages train = MakeBarImages(600, rng);
  BarImages val = MakeBarImages(200, rng);
  // Every 20th validation row is labelled as the next class, so a model that learnt the bars
  // scores 0.95 rather than 1: the accuracies compared below then count real misses, and those
  // rows' confidently wrong logits weigh heavily in the validation loss compared below.
  for (size_t i = 0; i < val.labels.size(); i += 20) {
    val.labels[i] = (val.labels[i] + 1) % BarImages::kClasses;
  }
  auto upload = [&](const std::string& name, const BarImages& images) {
    const int64_t rows = static_cast<int64_t>(images.labels.size());
    const std::string x = WriteFile(
        name + "-x.npy",
        Npy("<f4", {rows, 1, 28, 28}, images.pixels.data(), images.pixels.size() * sizeof(float)));
    const std::string y = WriteFile(
        name + "-y.npy", Npy("<i8", {rows}, images.labels.data(), rows * sizeof(int64_t)));
    return Ctl(
        {"-o", "json", "dataset", "upload", name, x, "--targets", y, "--target-dtype", "int64"});
  };
  RunResult up = upload("bars", train);
  ASSERT_EQ(up.exit_code, 0) << up.err;
  v1::Dataset ds;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(up.out, &ds).ok()) << up.out;
  EXPECT_EQ(ds.row_count(), 600);
  EXPECT_THAT(ds.feature_shape(), ::testing::ElementsAre(1, 28, 28));
  RunResult up_val = upload("bars-val", val);
  ASSERT_EQ(up_val.exit_code, 0) << up_val.err;

  // conv2d:4:3 -> [4, 26, 26], maxpool2d:2 -> [4, 13, 13], flatten -> 676, linear:4: 2,748
  // parameters, a few seconds on two CPU cores.
  const std::string batch_size = "32";
  RunResult run = Ctl({"submit",
                       "--dataset",
                       "bars",
                       "--validation-dataset",
                       "bars-val",
                       "--model",
                       "conv2d:4:3,relu,maxpool2d:2,flatten,linear:4",
                       "--loss",
                       "cross_entropy",
                       "--optimizer",
                       "adam",
                       "--lr",
                       "0.01",
                       "--batch-size",
                       batch_size,
                       "--epochs",
                       "4",
                       "--seed",
                       "5",
                       "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(job.epochs_size(), 4);
  const v1::EpochResult& first = job.epochs(0);
  const v1::EpochResult& last = job.epochs(job.epochs_size() - 1);
  EXPECT_LT(last.loss(), first.loss());
  ASSERT_TRUE(last.has_validation_loss());
  ASSERT_TRUE(last.has_validation_accuracy());
  EXPECT_GE(last.validation_accuracy(), 0.9);

  const std::string model = (dir_ / "model.pt").string();
  RunResult download = Ctl({"job", "model", id, "-f", model});
  ASSERT_EQ(download.exit_code, 0) << download.err;

  // The last epoch's validation loss and accuracy came from the final weights, in eval mode, on
  // bars-val in order in batches of --batch-size: the downloaded model, run the same way, must
  // reproduce them. The archive's forward is TorchScript source the daemon generates, not the
  // module it trained, so this checks the export as well as the weights. The accuracy is a count
  // over 200 rows and must match exactly. The loss is a float64 sum of float32 batch means; on the
  // CPU the two agree bit for bit today, but the exported forward may legitimately order an
  // operation differently (a few float32 ulps, ~1e-7 relative), so 1e-5 relative allows for that
  // and still catches a wrong weight, layer or mode (those move the loss by far more).
  const std::string val_x =
      WriteFile("val-x.f32", std::string(reinterpret_cast<const char*>(val.pixels.data()),
                                         val.pixels.size() * sizeof(float)));
  const std::string val_y =
      WriteFile("val-y.i64", std::string(reinterpret_cast<const char*>(val.labels.data()),
                                         val.labels.size() * sizeof(int64_t)));
  auto expect_matches_daemon = [&](const RunResult& eval, const std::string& who) {
    ASSERT_EQ(eval.exit_code, 0) << who << ": " << eval.err;
    std::istringstream values(eval.out);
    double loss = 0;
    double accuracy = 0;
    ASSERT_TRUE(values >> loss >> accuracy) << who << ": " << eval.out;
    EXPECT_NEAR(loss, last.validation_loss(), 1e-5 * last.validation_loss()) << who;
    EXPECT_EQ(accuracy, last.validation_accuracy()) << who;
  };
  expect_matches_daemon(
      e2e::Run({EVALUATE_TORCHSCRIPT_BIN, model, val_x, val_y, "1x28x28", batch_size}),
      "evaluate_torchscript");

  const std::string python = TorchPython();
  if (python.empty()) {
    GTEST_SKIP() << "no Python with torch (set TRAINERD_PYTHON): the downloaded model was "
                    "checked in C++ only";
  }
  expect_matches_daemon(
      e2e::Run({python, "-c",
                "import sys, torch\n"
                "m = torch.jit.load(sys.argv[1])\n"
                "m.eval()\n"
                "def read(path, dtype):\n"
                "    with open(path, 'rb') as f:\n"
                "        return torch.frombuffer(bytearray(f.read()), dtype=dtype)\n"
                "x = read(sys.argv[2], torch.float32).reshape(-1, 1, 28, 28)\n"
                "y = read(sys.argv[3], torch.int64)\n"
                "batch = int(sys.argv[4])\n"
                "loss, correct = 0.0, 0\n"
                "with torch.no_grad():\n"
                "    for i in range(0, len(y), batch):\n"
                "        out, t = m(x[i:i + batch]), y[i:i + batch]\n"
                "        loss += len(t) * torch.nn.functional.cross_entropy(out, t).item()\n"
                "        correct += int((out.argmax(1) == t).sum())\n"
                "print(repr(loss / len(y)), repr(correct / len(y)))\n",
                model, val_x, val_y, batch_size}),
      "python");
}

// Early stopping hands back the best epoch through the binaries: `submit --model-from best` (here
// the default with --early-stop-patience), the watch's end line and `job get` say which epoch the
// model is from, the downloaded model scores that epoch's recorded validation loss and accuracy on
// the validation dataset, and `job checkpoint` downloads the checkpoints by epoch.
TEST_F(EndToEndTest, EarlyStoppingHandsBackTheBestEpochAndCheckpointsDownload) {
  // Noise: 2 standard-normal features and a random class of 4. A wide model fits the training
  // rows' noise, so the validation loss falls for a few epochs and then climbs.
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> label(0, 3);
  auto make = [&](int64_t rows, std::vector<float>& x, std::vector<int64_t>& y) {
    for (int64_t i = 0; i < rows * 2; ++i) x.push_back(normal(rng));
    for (int64_t i = 0; i < rows; ++i) y.push_back(label(rng));
  };
  std::vector<float> train_x, val_x;
  std::vector<int64_t> train_y, val_y;
  make(120, train_x, train_y);
  make(60, val_x, val_y);
  auto upload = [&](const std::string& name, const std::vector<float>& x,
                    const std::vector<int64_t>& y) {
    const int64_t rows = static_cast<int64_t>(y.size());
    const std::string xs =
        WriteFile(name + "-x.npy", Npy("<f4", {rows, 2}, x.data(), x.size() * sizeof(float)));
    const std::string ys =
        WriteFile(name + "-y.npy", Npy("<i8", {rows}, y.data(), y.size() * sizeof(int64_t)));
    return Ctl({"dataset", "upload", name, xs, "--targets", ys, "--target-dtype", "int64"});
  };
  ASSERT_EQ(upload("noise", train_x, train_y).exit_code, 0);
  ASSERT_EQ(upload("noise-val", val_x, val_y).exit_code, 0);
  const std::string batch_size = "16";
  auto submit = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args = {
        "submit", "--dataset", "noise", "--validation-dataset", "noise-val", "--model",
        "linear:64,relu,linear:64,relu,linear:4", "--loss", "cross_entropy", "--optimizer",
        "adam", "--lr", "0.01", "--batch-size", batch_size, "--epochs", "80", "--seed", "3",
        "--early-stop-patience", "3", "--checkpoint-every", "1", "--watch"};
    args.insert(args.end(), more.begin(), more.end());
    return Ctl(args);
  };
  RunResult run = submit({});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(job.stopped_early()) << "the validation loss never turned up";
  const int32_t best = job.best_epoch();
  EXPECT_EQ(best, job.epochs_completed() - 3);
  EXPECT_EQ(job.model_epoch(), best);
  EXPECT_THAT(run.out, HasSubstr(", model from the best epoch (" + std::to_string(best) + ")"));
  RunResult text = Ctl({"job", "get", id});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("epoch " + std::to_string(best) + " (the best)"));

  const std::string model = (dir_ / "best.pt").string();
  RunResult download = Ctl({"job", "model", id, "-f", model});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  const std::string vx = WriteFile("val-x.f32", std::string(reinterpret_cast<const char*>(
                                                                val_x.data()),
                                                            val_x.size() * sizeof(float)));
  const std::string vy = WriteFile("val-y.i64", std::string(reinterpret_cast<const char*>(
                                                                val_y.data()),
                                                            val_y.size() * sizeof(int64_t)));
  auto evaluate = [&](const std::string& path) {
    RunResult eval = e2e::Run({EVALUATE_TORCHSCRIPT_BIN, path, vx, vy, "2", batch_size});
    EXPECT_EQ(eval.exit_code, 0) << eval.err;
    std::pair<double, double> out{-1, -1};
    std::istringstream(eval.out) >> out.first >> out.second;
    return out;
  };
  const v1::EpochResult& at_best = job.epochs(best - 1);
  const v1::EpochResult& at_last = job.epochs(job.epochs_size() - 1);
  ASSERT_GT(at_last.validation_loss(), at_best.validation_loss() * (1 + 1e-3));
  const auto [loss, accuracy] = evaluate(model);
  EXPECT_NEAR(loss, at_best.validation_loss(), 1e-5 * at_best.validation_loss());
  EXPECT_EQ(accuracy, at_best.validation_accuracy());

  // --model-from last: the same job hands back its last epoch.
  RunResult last_run = submit({"--model-from", "last"});
  ASSERT_EQ(last_run.exit_code, 0) << last_run.out << last_run.err;
  const std::string last_id = last_run.out.substr(0, last_run.out.find('\n'));
  const std::string last_model = (dir_ / "last.pt").string();
  ASSERT_EQ(Ctl({"job", "model", last_id, "-f", last_model}).exit_code, 0);
  const auto [last_loss, last_accuracy] = evaluate(last_model);
  EXPECT_NEAR(last_loss, at_last.validation_loss(), 1e-5 * at_last.validation_loss());
  EXPECT_EQ(last_accuracy, at_last.validation_accuracy());

  // Checkpoints: the newest, one by its epoch, and an epoch without one.
  const std::string newest = (dir_ / "newest.pt").string();
  RunResult checkpoint = Ctl({"job", "checkpoint", id, "-f", newest});
  ASSERT_EQ(checkpoint.exit_code, 0) << checkpoint.err;
  EXPECT_THAT(checkpoint.out, HasSubstr("wrote checkpoint of " + id + " to " + newest));
  const v1::Checkpoint& kept = job.checkpoints(job.checkpoints_size() - 1);
  EXPECT_EQ(kept.epoch(), job.epochs_completed());
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(newest)), kept.size_bytes());
  std::ifstream newest_file(newest, std::ios::binary);
  const std::string newest_bytes((std::istreambuf_iterator<char>(newest_file)),
                                 std::istreambuf_iterator<char>());
  EXPECT_EQ(Sha256Hex(newest_bytes), kept.sha256());
  const std::string second = (dir_ / "second.pt").string();
  ASSERT_EQ(Ctl({"job", "checkpoint", id, "--epoch", "2", "-f", second}).exit_code, 0);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(second)),
            job.checkpoints(1).size_bytes());
  RunResult missing = Ctl({"job", "checkpoint", id, "--epoch", "999", "-f", second + ".x"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.err, HasSubstr("has no checkpoint of epoch 999; it has epochs 1, 2, 3"));
  EXPECT_FALSE(std::filesystem::exists(second + ".x"));
}

// Through the binaries: a daemon that measured its devices at start gives the seed job a
// verdict; diagnose, devices and top print them.
class ObservabilityEndToEndTest : public EndToEndTest {
 protected:
  void SetUp() override {
    diagnose_at_start_ = true;
    EndToEndTest::SetUp();
  }
};

TEST_F(ObservabilityEndToEndTest, SeedJobGetsAReportWithAVerdictAndDiagnoseShowsTheCpu) {
  // Diagnose waits for the start-up measurement, so the verdict below has its figures.
  RunResult diagnose = Ctl({"diagnose"});
  ASSERT_EQ(diagnose.exit_code, 0) << diagnose.err;
  EXPECT_THAT(diagnose.out, HasSubstr("libtorch:  2.11.0"));
  EXPECT_THAT(diagnose.out, HasSubstr("(cached; --refresh measures again)"));
  EXPECT_THAT(diagnose.out,
              ::testing::ContainsRegex("\ncpu +[0-9.]+ [KMGT]iB +[0-9.]+ [kMGTP]?FLOP/s"));

  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  // On the LibTorch path, which dispatches ~25 operators a step.
  RunResult run =
      Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1", "--batch-size",
           "16", "--epochs", "20", "--seed", "7", "--engine", "libtorch", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string id = run.out.substr(0, run.out.find('\n'));
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok()) << get.out;
  const v1::DeviceReport& report = job.report();
  EXPECT_EQ(report.host_syncs(), 21);
  EXPECT_GT(report.compute_seconds(), 0);
  EXPECT_GT(report.steps_per_second(), 0);
  EXPECT_DOUBLE_EQ(report.flops_per_step(), 96);  // 16 rows x 2 FLOPs x (forward + 2 backward)
  ASSERT_TRUE(report.has_peak_fraction());
  EXPECT_LT(report.peak_fraction(), 0.01);
  // Two parameters per step are nothing next to the per-step overhead, on any device.
  EXPECT_EQ(report.bound(), v1::DeviceReport::LAUNCH_BOUND) << report.verdict();
  EXPECT_THAT(report.verdict(), ::testing::StartsWith("launch-bound: "));

  EXPECT_EQ(report.engine(), "libtorch");
  EXPECT_EQ(report.engine_reason(), "");  // asked for

  RunResult table = Ctl({"job", "get", id});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("\nverdict:  launch-bound: "));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n  engine: +libtorch\n"));

  // By default the same job takes the fused path: no per-operator dispatch, so no launch-bound
  // estimate, and the same losses within float32 tolerance.
  RunResult fused = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--lr", "0.1",
                         "--batch-size", "16", "--epochs", "20", "--seed", "7", "--watch"});
  ASSERT_EQ(fused.exit_code, 0) << fused.err;
  const std::string fused_id = fused.out.substr(0, fused.out.find('\n'));
  get = Ctl({"-o", "json", "job", "get", fused_id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job fused_job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &fused_job).ok()) << get.out;
  EXPECT_EQ(fused_job.report().engine(), "fused");
  EXPECT_EQ(fused_job.report().host_syncs(), 21);
  EXPECT_NE(fused_job.report().bound(), v1::DeviceReport::LAUNCH_BOUND);
  EXPECT_THAT(fused_job.report().verdict(), HasSubstr("fused path"));
  EXPECT_NEAR(fused_job.final_loss(), job.final_loss(), 1e-6);
}

TEST_F(ObservabilityEndToEndTest, DevicesAndTopShowTheCpuWithItsDatasets) {
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("s.csv", SeedCsv())}).exit_code, 0);
  RunResult devices = Ctl({"devices"});
  ASSERT_EQ(devices.exit_code, 0) << devices.err;
  EXPECT_THAT(devices.out, ::testing::ContainsRegex("\ncpu\\* .*1, [0-9.]+ KiB \\(seed\\)"));
  RunResult top = Ctl({"top", "--iterations", "2", "--interval", "0.1"});
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_THAT(top.out, HasSubstr("no running jobs"));
}

}  // namespace
}  // namespace trainerd::e2e
