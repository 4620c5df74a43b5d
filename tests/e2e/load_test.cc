// A load test against the real trainerd on loopback: 32 concurrent clients upload, submit, watch,
// cancel, list and download for a bounded time (10 s; $TRAINERD_LOAD_SECONDS overrides it, and
// `make bench` runs it longer). Asserted: no call fails in a way that means the daemon broke
// (INTERNAL, UNKNOWN, UNAVAILABLE, DATA_LOSS), the daemon never exits, every accepted job reaches a
// terminal state and is listed, and once the clients are gone and their datasets deleted the
// daemon's resident memory is back near where it started. Reported, not asserted: p50 and p99
// latency per RPC (a benchmark figure; also written to $TRAINERD_LOAD_REPORT when set).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
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

// $TRAINERD_LOAD_CLIENTS overrides it (for experiments; the issue asks for at least 32).
constexpr int kDefaultClients = 32;
constexpr int kRows = 64;

// The daemon's resident set in bytes, from /proc.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Latencies and codes per RPC, shared by the clients.
class Recorder {
 public:
  void Add(const std::string& rpc, std::chrono::steady_clock::duration took,
           grpc::StatusCode code) {
    std::lock_guard<std::mutex> lock(mu_);
    seconds_[rpc].push_back(std::chrono::duration<double>(took).count());
    ++codes_[rpc][code];
    if (code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
        code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DATA_LOSS) {
      ++broken_;
    }
  }
  int64_t broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  // "RPC  calls  p50 ms  p99 ms  codes" lines.
  std::string Report() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream out;
    out << "rpc                 calls   p50_ms   p99_ms  codes\n";
    for (auto [rpc, values] : seconds_) {
      std::sort(values.begin(), values.end());
      const auto at = [&](double q) {
        return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))] * 1e3;
      };
      char line[160];
      std::snprintf(line, sizeof(line), "%-18s %6zu %8.2f %8.2f ", rpc.c_str(), values.size(),
                    at(0.50), at(0.99));
      out << line;
      for (const auto& [code, n] : codes_.at(rpc)) out << " " << code << ":" << n;
      out << "\n";
    }
    return out.str();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::vector<double>> seconds_;
  std::map<std::string, std::map<int, int64_t>> codes_;
  int64_t broken_ = 0;
};

// One client: its own channel and a loop of random actions on its own datasets and jobs.
class Client {
 public:
  Client(int index, const std::string& address, Recorder* recorder,
         std::set<std::string>* accepted, std::mutex* accepted_mu)
      : index_(index),
        channel_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        datasets_(v1::DatasetService::NewStub(channel_)),
        jobs_(v1::JobService::NewStub(channel_)),
        recorder_(recorder),
        accepted_(accepted),
        accepted_mu_(accepted_mu),
        rng_(index) {}

  void Run(std::chrono::steady_clock::time_point until) {
    while (std::chrono::steady_clock::now() < until) {
      switch (std::uniform_int_distribution<int>(0, 9)(rng_)) {
        case 0:
        case 1:
          Upload();
          break;
        case 2:
        case 3:
          Submit();
          break;
        case 4:
          WatchOne();
          break;
        case 5:
          CancelOne();
          break;
        case 6:
          List();
          break;
        case 7:
          DownloadOne();
          break;
        case 8:
          DeleteOne();
          break;
        default:
          GetOne();
      }
    }
  }

  const std::vector<std::string>& datasets() const { return dataset_names_; }

 private:
  template <typename Call>
  grpc::Status Timed(const std::string& rpc, Call call) {
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = call();
    recorder_->Add(rpc, std::chrono::steady_clock::now() - start, status.error_code());
    return status;
  }

  static void Deadline(grpc::ClientContext* context, int seconds = 30) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }

  void Upload() {
    const std::string name = "c" + std::to_string(index_) + "-" + std::to_string(next_++);
    std::vector<float> payload(kRows * 2);
    for (int r = 0; r < kRows; ++r) {
      payload[r] = static_cast<float>(r) / kRows;
      payload[kRows + r] = 1 + 2 * payload[r];
    }
    const grpc::Status status = Timed("UploadDataset", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::Dataset dataset;
      auto writer = datasets_->UploadDataset(&context, &dataset);
      v1::UploadDatasetRequest header;
      header.mutable_header()->set_name(name);
      header.mutable_header()->add_feature_shape(1);
      header.mutable_header()->add_target_shape(1);
      header.mutable_header()->set_target_dtype(v1::DTYPE_FLOAT32);
      header.mutable_header()->set_row_count(kRows);
      v1::UploadDatasetRequest chunk;
      chunk.set_chunk(std::string(reinterpret_cast<const char*>(payload.data()),
                                  payload.size() * sizeof(float)));
      if (writer->Write(header)) {
        if (writer->Write(chunk)) writer->WritesDone();
      }
      return writer->Finish();
    });
    if (status.ok()) dataset_names_.push_back(name);
  }

  void Submit() {
    if (dataset_names_.empty()) return Upload();
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_dataset(dataset_names_[rng_() % dataset_names_.size()]);
    spec->set_model("linear:8,relu,linear:1");
    spec->set_loss(v1::LOSS_MSE);
    spec->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD);
    spec->mutable_optimizer()->set_learning_rate(0.05);
    spec->set_batch_size(16);
    spec->set_epochs(3 + static_cast<int32_t>(rng_() % 20));
    v1::Job job;
    const grpc::Status status = Timed("SubmitJob", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      return jobs_->SubmitJob(&context, request, &job);
    });
    if (status.ok()) {
      job_ids_.push_back(job.id());
      std::lock_guard<std::mutex> lock(*accepted_mu_);
      accepted_->insert(job.id());
    }
  }

  std::string SomeJob() { return job_ids_.empty() ? "" : job_ids_[rng_() % job_ids_.size()]; }

  void WatchOne() {
    const std::string id = SomeJob();
    if (id.empty()) return Submit();
    Timed("WatchJob", [&] {
      grpc::ClientContext context;
      Deadline(&context, 60);
      v1::WatchJobRequest request;
      request.set_id(id);
      auto reader = jobs_->WatchJob(&context, request);
      v1::JobEvent event;
      int read = 0;
      // Half the watchers go away early, as impatient users do.
      const bool leave_early = rng_() % 2 == 0;
      while (reader->Read(&event)) {
        if (leave_early && ++read == 2) {
          context.TryCancel();
          while (reader->Read(&event)) {
          }
          break;
        }
      }
      grpc::Status status = reader->Finish();
      return status.error_code() == grpc::StatusCode::CANCELLED && leave_early ? grpc::Status::OK
                                                                               : status;
    });
  }

  void CancelOne() {
    const std::string id = SomeJob();
    if (id.empty()) return;
    Timed("CancelJob", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::CancelJobRequest request;
      request.set_id(id);
      v1::Job job;
      return jobs_->CancelJob(&context, request, &job);
    });
  }

  void List() {
    Timed("ListJobs", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::ListJobsResponse response;
      return jobs_->ListJobs(&context, v1::ListJobsRequest(), &response);
    });
    Timed("ListDatasets", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::ListDatasetsResponse response;
      return datasets_->ListDatasets(&context, v1::ListDatasetsRequest(), &response);
    });
  }

  void GetOne() {
    const std::string id = SomeJob();
    if (id.empty()) return List();
    Timed("GetJob", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::GetJobRequest request;
      request.set_id(id);
      v1::Job job;
      return jobs_->GetJob(&context, request, &job);
    });
  }

  void DownloadOne() {
    const std::string id = SomeJob();
    if (id.empty()) return;
    Timed("DownloadModel", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::DownloadModelRequest request;
      request.set_id(id);
      auto reader = jobs_->DownloadModel(&context, request);
      v1::ModelChunk chunk;
      while (reader->Read(&chunk)) {
      }
      return reader->Finish();
    });
  }

  void DeleteOne() {
    if (dataset_names_.size() < 3) return Upload();
    const size_t at = rng_() % dataset_names_.size();
    const grpc::Status status = Timed("DeleteDataset", [&] {
      grpc::ClientContext context;
      Deadline(&context);
      v1::DeleteDatasetRequest request;
      request.set_name(dataset_names_[at]);
      v1::DeleteDatasetResponse response;
      return datasets_->DeleteDataset(&context, request, &response);
    });
    if (status.ok()) dataset_names_.erase(dataset_names_.begin() + static_cast<long>(at));
  }

  const int index_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DatasetService::Stub> datasets_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  Recorder* recorder_;
  std::set<std::string>* accepted_;
  std::mutex* accepted_mu_;
  std::mt19937 rng_;
  int next_ = 0;
  std::vector<std::string> dataset_names_;
  std::vector<std::string> job_ids_;
};

TEST(LoadTest, ThirtyTwoClientsLeaveTheDaemonWholeAndItsMemoryNearItsBaseline) {
  const int kClients = std::getenv("TRAINERD_LOAD_CLIENTS") != nullptr
                           ? std::max(1, std::atoi(std::getenv("TRAINERD_LOAD_CLIENTS")))
                           : kDefaultClients;
  const int seconds = std::getenv("TRAINERD_LOAD_SECONDS") != nullptr
                          ? std::max(1, std::atoi(std::getenv("TRAINERD_LOAD_SECONDS")))
                          : 10;
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("trainerd-load-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Daemon daemon({TRAINERD_BIN, "--listen=127.0.0.1:0", "--data_dir=" + (dir / "data").string(),
                 "--device=cpu", "--metrics_listen=", "--diagnose_at_start=false"});
  std::string line;
  ASSERT_TRUE(daemon.ReadLine(&line)) << daemon.Stderr();
  const std::string address = line.substr(line.find("on ") + 3, line.find(" (") - line.find("on ") - 3);

  Recorder recorder;
  std::set<std::string> accepted;
  std::mutex accepted_mu;
  // Warm-up: one client's cycle brings in what the first job and upload allocate once (LibTorch's
  // kernels, gRPC's buffers), so that the baseline is the daemon at work, not the daemon idle.
  {
    Client warm(1000, address, &recorder, &accepted, &accepted_mu);
    warm.Run(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t baseline = ResidentBytes(daemon.pid());

  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(i, address, &recorder, &accepted, &accepted_mu));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (auto& client : clients) threads.emplace_back([&client, until] { client->Run(until); });
  for (std::thread& t : threads) t.join();
  const int64_t peak = ResidentBytes(daemon.pid());

  // Every accepted job ends and is listed.
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  auto datasets = v1::DatasetService::NewStub(channel);
  std::set<std::string> listed;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool all_ended = false;
  while (!all_ended && std::chrono::steady_clock::now() < give_up) {
    // Every page (the daemon's largest), in the basic view.
    std::vector<v1::Job> all;
    v1::ListJobsRequest request;
    request.set_page_size(1000);
    while (true) {
      grpc::ClientContext context;
      v1::ListJobsResponse response;
      ASSERT_TRUE(jobs->ListJobs(&context, request, &response).ok());
      all.insert(all.end(), response.jobs().begin(), response.jobs().end());
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    all_ended = true;
    listed.clear();
    for (const v1::Job& job : all) {
      listed.insert(job.id());
      const bool ended = job.state() == v1::JOB_STATE_SUCCEEDED ||
                         job.state() == v1::JOB_STATE_FAILED ||
                         job.state() == v1::JOB_STATE_CANCELLED;
      EXPECT_NE(job.state(), v1::JOB_STATE_FAILED) << job.id() << ": " << job.error();
      all_ended = all_ended && ended;
    }
    if (!all_ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(all_ended);
  for (const std::string& id : accepted) EXPECT_EQ(listed.count(id), 1u) << id;

  // The clients' datasets go; memory comes back near the baseline.
  for (const auto& client : clients) {
    for (const std::string& name : client->datasets()) {
      grpc::ClientContext context;
      v1::DeleteDatasetRequest request;
      request.set_name(name);
      v1::DeleteDatasetResponse response;
      datasets->DeleteDataset(&context, request, &response);
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t after = ResidentBytes(daemon.pid());

  const std::string report = recorder.Report();
  std::cout << "load: " << kClients << " clients for " << seconds << " s, " << accepted.size()
            << " jobs accepted; resident memory " << baseline / (1 << 20) << " MiB before, "
            << peak / (1 << 20) << " MiB at the end of the load, " << after / (1 << 20)
            << " MiB after\n"
            << report << std::flush;
  if (const char* path = std::getenv("TRAINERD_LOAD_REPORT"); path != nullptr) {
    std::ofstream(path) << "clients " << kClients << "\nseconds " << seconds << "\njobs "
                        << accepted.size() << "\nrss_before_mib " << baseline / (1 << 20)
                        << "\nrss_peak_mib " << peak / (1 << 20) << "\nrss_after_mib "
                        << after / (1 << 20) << "\n"
                        << report;
  }
  EXPECT_EQ(recorder.broken(), 0) << report;
  EXPECT_GT(accepted.size(), 0u);
  // What stays: the job records (kept in memory until issue 9's SQLite records and retention:
  // about 5 KiB each, measured, plus what the allocator keeps around them, about 19 KiB a job in
  // all over a 60 s run) and 64 MiB for the allocator's own caches. A leak per request (an
  // upload's staging, a watcher, a module) would show as far more.
  const int64_t allowed = (int64_t{64} << 20) + static_cast<int64_t>(accepted.size()) * (24 << 10);
  EXPECT_LT(after - baseline, allowed)
      << "before " << baseline << " bytes, after " << after << ", " << accepted.size() << " jobs";
  EXPECT_EQ(daemon.Stop(SIGTERM), 0) << daemon.Stderr();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainerd::e2e
