// Durable jobs, broken on purpose with the real trainerd: SIGKILL in the middle of a job with
// checkpoints, of one without, with jobs queued behind, and in the middle of an upload; SIGTERM's
// drain; and a crash loop of kills at random moments of a mixed workload, checking after each
// restart that no job was lost or duplicated, no dataset is partial, and every job that succeeded
// has its model. The test talks to the daemon over gRPC with the generated stubs.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/subprocess.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;

constexpr int kSeedRows = 800;

// The seed question's data as float32 features then targets: y = 1 + 2x + noise.
std::string SeedPayload(int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> values(2 * static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    values[r] = uniform(rng);
    values[rows + r] = 1 + 2 * values[r] + 0.1f * noise(rng);
  }
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-durability-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    Start();
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string DataDir() const { return (dir_ / "data").string(); }

  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        TRAINERD_BIN,
        "--listen=127.0.0.1:0",
        "--data_dir=" + DataDir(),
        "--device=cpu",
        "--metrics_listen=",
        "--diagnose_at_start=false",
        "--shutdown_timeout=30s",
        "--max_concurrent_jobs=1"};  // one CPU job at a time, whatever this machine's cores
    argv.insert(argv.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<Daemon>(argv);
    std::string line;
    ASSERT_TRUE(daemon_->ReadLine(&line, 60)) << "trainerd did not start: " << daemon_->Stderr();
    addr_ = ListeningAddress(line);
    ASSERT_FALSE(addr_.empty()) << line;
    auto channel = grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials());
    datasets_ = v1::DatasetService::NewStub(channel);
    jobs_ = v1::JobService::NewStub(channel);
  }

  // SIGKILL: no drain, no flush; whatever the daemon had not made durable is lost.
  void Kill() {
    ASSERT_EQ(::kill(daemon_->pid(), SIGKILL), 0);
    daemon_->Stop(SIGKILL, 30);
    daemon_.reset();
  }

  static void Deadline(grpc::ClientContext* context, int seconds = 30) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }

  grpc::Status Upload(const std::string& name, const std::string& payload, int rows,
                      v1::Dataset* out = nullptr) {
    grpc::ClientContext context;
    Deadline(&context);
    v1::Dataset dataset;
    auto writer = datasets_->UploadDataset(&context, &dataset);
    v1::UploadDatasetRequest header;
    header.mutable_header()->set_name(name);
    header.mutable_header()->add_feature_shape(1);
    header.mutable_header()->add_target_shape(1);
    header.mutable_header()->set_target_dtype(v1::DTYPE_FLOAT32);
    header.mutable_header()->set_row_count(rows);
    if (writer->Write(header)) {
      for (size_t at = 0; at < payload.size(); at += 1 << 20) {
        v1::UploadDatasetRequest chunk;
        chunk.set_chunk(payload.substr(at, 1 << 20));
        if (!writer->Write(chunk)) break;
      }
      writer->WritesDone();
    }
    grpc::Status status = writer->Finish();
    if (out != nullptr) *out = dataset;
    return status;
  }

  static v1::JobSpec Spec(int epochs, int checkpoint_every, uint64_t seed = 7,
                          const std::string& dataset = "seed") {
    v1::JobSpec spec;
    spec.set_dataset(dataset);
    spec.set_model("linear:16,relu,dropout:0.1,linear:1");
    spec.set_loss(v1::LOSS_MSE);
    spec.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAM);
    spec.mutable_optimizer()->set_learning_rate(0.01);
    spec.set_batch_size(16);
    spec.set_epochs(epochs);
    spec.set_seed(seed);
    spec.set_checkpoint_every(checkpoint_every);
    return spec;
  }

  grpc::Status Submit(const v1::JobSpec& spec, v1::Job* job) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    grpc::ClientContext context;
    Deadline(&context);
    return jobs_->SubmitJob(&context, request, job);
  }

  v1::Job Get(const std::string& id) {
    v1::GetJobRequest request;
    request.set_id(id);
    grpc::ClientContext context;
    Deadline(&context);
    v1::Job job;
    const grpc::Status status = jobs_->GetJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << id << ": " << status.error_message();
    return job;
  }

  // Every job, page by page, in the full view.
  std::vector<v1::Job> ListAll() {
    std::vector<v1::Job> all;
    v1::ListJobsRequest request;
    request.set_page_size(7);  // several pages
    request.set_view(v1::JOB_VIEW_FULL);
    while (true) {
      grpc::ClientContext context;
      Deadline(&context);
      v1::ListJobsResponse page;
      const grpc::Status status = jobs_->ListJobs(&context, request, &page);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) return all;
      for (const v1::Job& job : page.jobs()) all.push_back(job);
      if (page.next_page_token().empty()) return all;
      request.set_page_token(page.next_page_token());
    }
  }

  // Polls until the job has finished `epochs` epochs (or ended); the job's own progress, not time.
  v1::Job WaitForEpochs(const std::string& id, int epochs) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      v1::Job job = Get(id);
      if (job.epochs_completed() >= epochs || job.state() == v1::JOB_STATE_SUCCEEDED ||
          job.state() == v1::JOB_STATE_FAILED || job.state() == v1::JOB_STATE_CANCELLED) {
        return job;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "job " << id << " did not reach epoch " << epochs;
    return Get(id);
  }

  v1::Job WaitForEnd(const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (std::chrono::steady_clock::now() < deadline) {
      v1::Job job = Get(id);
      if (job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
          job.state() == v1::JOB_STATE_CANCELLED) {
        return job;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "job " << id << " did not end";
    return Get(id);
  }

  static std::vector<double> Losses(const v1::Job& job) {
    std::vector<double> out;
    for (const v1::EpochResult& epoch : job.epochs()) out.push_back(epoch.loss());
    return out;
  }

  // Epochs numbered 1..n, each once.
  static void ExpectEachEpochOnce(const v1::Job& job) {
    for (int i = 0; i < job.epochs_size(); ++i) {
      EXPECT_EQ(job.epochs(i).epoch(), i + 1) << job.id();
    }
  }

  std::string ModelFile(const std::string& id) const { return DataDir() + "/models/" + id + ".pt"; }

  std::filesystem::path dir_;
  std::unique_ptr<Daemon> daemon_;
  std::string addr_;
  std::unique_ptr<v1::DatasetService::Stub> datasets_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

TEST_F(DurabilityTest, KilledMidJobResumesFromItsCheckpointWithTheSameLosses) {
  ASSERT_TRUE(Upload("seed", SeedPayload(kSeedRows, 42), kSeedRows).ok());
  v1::Job reference;
  ASSERT_TRUE(Submit(Spec(60, 5), &reference).ok());
  reference = WaitForEnd(reference.id());
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.error();

  v1::Job job;
  ASSERT_TRUE(Submit(Spec(60, 5), &job).ok());
  const v1::Job midway = WaitForEpochs(job.id(), 12);
  ASSERT_EQ(midway.state(), v1::JOB_STATE_RUNNING) << "the job ended before the kill";
  Kill();
  Start();
  const v1::Job resumed = WaitForEnd(job.id());
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.error();
  ASSERT_EQ(resumed.restarts_size(), 1);
  EXPECT_EQ(resumed.restarts(0).previous_state(), v1::JOB_STATE_RUNNING);
  EXPECT_GE(resumed.restarts(0).from_epoch(), 10);
  EXPECT_EQ(resumed.restarts(0).from_epoch() % 5, 0);
  ASSERT_EQ(resumed.epochs_size(), 60);
  ExpectEachEpochOnce(resumed);
  EXPECT_EQ(Losses(resumed), Losses(reference));  // bit for bit
  EXPECT_TRUE(FileExists(ModelFile(job.id())));
}

// A data-parallel job (2 ranks, threads of the daemon) taken up after a kill -9 goes on from rank
// 0's last checkpoint, and one drained at SIGTERM from the checkpoint its ranks agreed to write at
// an epoch's end: both end bit for bit as the job run without a stop, with its ranks.
TEST_F(DurabilityTest, DataParallelJobResumesOnItsRanksAfterAKillAndAfterADrain) {
  ASSERT_TRUE(Upload("seed", SeedPayload(kSeedRows, 42), kSeedRows).ok());
  v1::JobSpec spec = Spec(60, 5);
  spec.set_model("linear:16,relu,linear:1");  // no dropout: ranks refuse it
  spec.set_replicas(2);
  v1::Job reference;
  ASSERT_TRUE(Submit(spec, &reference).ok());
  reference = WaitForEnd(reference.id());
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.error();
  ASSERT_EQ(reference.ranks_size(), 2);

  for (const int signal : {SIGKILL, SIGTERM}) {
    SCOPED_TRACE(signal == SIGKILL ? "kill -9" : "SIGTERM");
    v1::Job job;
    ASSERT_TRUE(Submit(spec, &job).ok());
    const v1::Job midway = WaitForEpochs(job.id(), 12);
    ASSERT_EQ(midway.state(), v1::JOB_STATE_RUNNING) << "the job ended before the stop";
    if (signal == SIGKILL) {
      Kill();
    } else {
      ASSERT_EQ(::kill(daemon_->pid(), SIGTERM), 0);
      EXPECT_EQ(daemon_->Stop(SIGTERM, 60), 0) << daemon_->Stderr();  // exits 0 once drained
      daemon_.reset();
    }
    Start();
    const v1::Job resumed = WaitForEnd(job.id());
    ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.error();
    ASSERT_EQ(resumed.restarts_size(), 1);
    EXPECT_GE(resumed.restarts(0).from_epoch(), signal == SIGKILL ? 10 : 12);
    if (signal == SIGKILL) {
      EXPECT_EQ(resumed.restarts(0).from_epoch() % 5, 0);
    }
    ASSERT_EQ(resumed.epochs_size(), 60);
    ExpectEachEpochOnce(resumed);
    EXPECT_EQ(Losses(resumed), Losses(reference));  // bit for bit
    EXPECT_EQ(resumed.ranks_size(), 2);
    EXPECT_TRUE(FileExists(ModelFile(job.id())));
  }
}

TEST_F(DurabilityTest, KilledJobWithoutCheckpointsStartsOverAndQueuedJobsBehindItRun) {
  ASSERT_TRUE(Upload("seed", SeedPayload(kSeedRows, 42), kSeedRows).ok());
  v1::Job first, second, third;
  ASSERT_TRUE(Submit(Spec(200, 0), &first).ok());
  ASSERT_TRUE(Submit(Spec(3, 0, 1), &second).ok());
  ASSERT_TRUE(Submit(Spec(3, 0, 2), &third).ok());
  ASSERT_EQ(WaitForEpochs(first.id(), 5).state(), v1::JOB_STATE_RUNNING);
  Kill();
  Start();
  for (const v1::Job* job : {&first, &second, &third}) {
    const v1::Job ended = WaitForEnd(job->id());
    EXPECT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
    ASSERT_EQ(ended.restarts_size(), 1);
    EXPECT_EQ(ended.restarts(0).from_epoch(), 0);
    ExpectEachEpochOnce(ended);
    EXPECT_EQ(ended.epochs_size(), ended.spec().epochs());
  }
  EXPECT_EQ(Get(first.id()).restarts(0).previous_state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(second.id()).restarts(0).previous_state(), v1::JOB_STATE_QUEUED);
}

TEST_F(DurabilityTest, KilledMidUploadLeavesNoPartialDataset) {
  // Half of a 4 MiB payload, then the daemon dies with the stream open.
  constexpr int kRows = 1 << 19;
  const std::string payload = SeedPayload(kRows, 5);
  {
    grpc::ClientContext context;
    Deadline(&context);
    v1::Dataset dataset;
    auto writer = datasets_->UploadDataset(&context, &dataset);
    v1::UploadDatasetRequest header;
    header.mutable_header()->set_name("big");
    header.mutable_header()->add_feature_shape(1);
    header.mutable_header()->add_target_shape(1);
    header.mutable_header()->set_target_dtype(v1::DTYPE_FLOAT32);
    header.mutable_header()->set_row_count(kRows);
    ASSERT_TRUE(writer->Write(header));
    for (size_t at = 0; at < payload.size() / 2; at += 1 << 20) {
      v1::UploadDatasetRequest chunk;
      chunk.set_chunk(payload.substr(at, 1 << 20));
      ASSERT_TRUE(writer->Write(chunk));
    }
    Kill();
    EXPECT_FALSE(writer->Finish().ok());
  }
  Start();
  grpc::ClientContext context;
  Deadline(&context);
  v1::ListDatasetsResponse list;
  ASSERT_TRUE(datasets_->ListDatasets(&context, v1::ListDatasetsRequest(), &list).ok());
  EXPECT_EQ(list.datasets_size(), 0);
  for (const auto& entry : std::filesystem::directory_iterator(DataDir() + "/datasets")) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
  // The name is free and a whole upload of it works.
  v1::Dataset dataset;
  ASSERT_TRUE(Upload("big", payload, kRows, &dataset).ok());
  EXPECT_EQ(dataset.row_count(), kRows);
}

TEST_F(DurabilityTest, SigtermDrainsRunningJobsWhichResumeAtTheNextStart) {
  // Epochs of a second or so (40,000 rows in batches of 16), so that SIGTERM lands mid-epoch.
  constexpr int kRows = 40000;
  ASSERT_TRUE(Upload("long", SeedPayload(kRows, 9), kRows).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(6, 0, 7, "long"), &job).ok());
  ASSERT_EQ(WaitForEpochs(job.id(), 1).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(::kill(daemon_->pid(), SIGTERM), 0);
  // Meanwhile the daemon says it is going: health NOT_SERVING, new jobs UNAVAILABLE.
  {
    v1::Job refused;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    grpc::Status status;
    do {
      status = Submit(Spec(1, 0, 7, "long"), &refused);  // accepted until the signal lands
    } while (status.ok() && std::chrono::steady_clock::now() < deadline);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }
  EXPECT_EQ(daemon_->Stop(SIGTERM, 60), 0) << daemon_->Stderr();  // exits 0 once drained
  daemon_.reset();

  Start();
  const v1::Job resumed = WaitForEnd(job.id());
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.error();
  ASSERT_EQ(resumed.restarts_size(), 1);
  EXPECT_GE(resumed.restarts(0).from_epoch(), 1);  // the drain's checkpoint
  EXPECT_LT(resumed.restarts(0).from_epoch(), 6);
  ASSERT_EQ(resumed.epochs_size(), 6);
  ExpectEachEpochOnce(resumed);
}

TEST_F(DurabilityTest, CrashLoopKeepsEveryInvariant) {
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::set<std::string> accepted;               // jobs the daemon acknowledged
  std::map<std::string, std::string> uploaded;  // datasets acknowledged: name -> sha256
  ASSERT_TRUE(Upload("seed", SeedPayload(kSeedRows, 42), kSeedRows).ok());
  uploaded["seed"] = "";
  constexpr int kKills = 20;
  for (int round = 0; round < kKills; ++round) {
    // A mixed workload for a random while: jobs with and without checkpoints, and an upload
    // (acknowledged or cut off by the kill).
    const int submits = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < submits; ++i) {
      v1::Job job;
      const int epochs = 5 + static_cast<int>(rng() % 60);
      const int checkpoint_every = rng() % 2 == 0 ? 0 : 1 + static_cast<int>(rng() % 5);
      v1::JobSpec spec = Spec(epochs, std::min(checkpoint_every, epochs), rng());
      if (rng() % 2 == 0) {
        // The fused CPU path (no dropout kernel there), which checkpoints and resumes on its own.
        spec.set_model("linear:16,relu,linear:1");
        spec.set_engine(v1::ENGINE_FUSED);
      }
      if (Submit(spec, &job).ok()) {
        accepted.insert(job.id());
      }
    }
    std::thread uploader;
    const std::string name = "upload-" + std::to_string(round);
    const int rows = 20000 + static_cast<int>(rng() % 50000);
    v1::Dataset uploaded_dataset;
    grpc::Status upload_status;
    if (rng() % 2 == 0) {
      uploader = std::thread(
          [&] { upload_status = Upload(name, SeedPayload(rows, round), rows, &uploaded_dataset); });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 700));
    Kill();
    if (uploader.joinable()) {
      uploader.join();
      if (upload_status.ok()) uploaded[name] = uploaded_dataset.sha256();
    }
    Start();
    if (HasFailure()) return;

    // The invariants, after every restart.
    std::set<std::string> listed;
    for (const v1::Job& job : ListAll()) {
      EXPECT_TRUE(listed.insert(job.id()).second) << "listed twice: " << job.id();
      ExpectEachEpochOnce(job);
      EXPECT_LE(job.epochs_size(), job.spec().epochs()) << job.id();
      EXPECT_NE(job.state(), v1::JOB_STATE_FAILED) << job.id() << ": " << job.error();
      if (job.state() == v1::JOB_STATE_SUCCEEDED) {
        EXPECT_EQ(job.epochs_size(), job.spec().epochs()) << job.id();
        EXPECT_TRUE(FileExists(ModelFile(job.id()))) << "no model for " << job.id();
      }
    }
    for (const std::string& id : accepted) EXPECT_TRUE(listed.count(id)) << "lost: " << id;
    grpc::ClientContext context;
    Deadline(&context);
    v1::ListDatasetsResponse datasets;
    ASSERT_TRUE(datasets_->ListDatasets(&context, v1::ListDatasetsRequest(), &datasets).ok());
    std::set<std::string> present;
    for (const v1::Dataset& dataset : datasets.datasets()) {
      present.insert(dataset.name());
      // Whole or absent: a listed upload has all its rows and the checksum of its payload.
      EXPECT_EQ(dataset.size_bytes(), dataset.row_count() * 8) << dataset.name();
      auto it = uploaded.find(dataset.name());
      if (it != uploaded.end() && !it->second.empty()) {
        EXPECT_EQ(dataset.sha256(), it->second);
      }
    }
    for (const auto& [dataset, sha] : uploaded) {
      EXPECT_TRUE(present.count(dataset)) << "dataset lost: " << dataset;
    }
    if (HasFailure()) return;
  }
  // Left alone, every job finishes, and with the losses of the same spec run once without a kill
  // (resumed from a checkpoint, or started over without one): what a restart changes is when,
  // never what.
  std::vector<v1::Job> ended;
  for (const std::string& id : accepted) {
    const v1::Job job = WaitForEnd(id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << id << ": " << job.error();
    EXPECT_TRUE(FileExists(ModelFile(id))) << id;
    ExpectEachEpochOnce(job);
    ended.push_back(job);
  }
  std::map<std::string, int> resumed_by_engine;
  for (const v1::Job& job : ended) {
    if (job.restarts_size() == 0) continue;
    ++resumed_by_engine[job.report().engine()];
    v1::Job again;
    ASSERT_TRUE(Submit(job.spec(), &again).ok());
    again = WaitForEnd(again.id());
    ASSERT_EQ(again.state(), v1::JOB_STATE_SUCCEEDED) << again.error();
    EXPECT_EQ(Losses(job), Losses(again))
        << job.id() << " (" << job.report().engine() << ", restarts " << job.restarts_size()
        << ", from epoch " << job.restarts(job.restarts_size() - 1).from_epoch() << ")";
  }
  EXPECT_GT(resumed_by_engine["fused"], 0) << "no fused job was taken up again";
  EXPECT_GT(resumed_by_engine["libtorch"], 0) << "no LibTorch job was taken up again";
}

}  // namespace
}  // namespace trainerd::e2e
