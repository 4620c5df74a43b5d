// SystemService (ListDevices, Diagnose), the job's device report and the gRPC metrics through a
// real server on loopback.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <future>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "server/engine/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::service::testing {
namespace {

using ::testing::HasSubstr;

class SystemServiceTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    system_ = v1::SystemService::NewStub(channel_);
  }

  grpc::Status Diagnose(bool refresh, v1::DiagnoseResponse* response) {
    grpc::ClientContext context;
    v1::DiagnoseRequest request;
    request.set_refresh(refresh);
    return system_->Diagnose(&context, request, response);
  }

  // A Diagnose call started on the async stub, answered on a gRPC thread.
  struct AsyncDiagnose {
    grpc::ClientContext context;
    v1::DiagnoseResponse response;
    grpc::Status status;
    std::promise<void> done;
    std::future<void> answered = done.get_future();
  };
  // Starts `count` Diagnose calls with refresh, each with a 60 s deadline.
  std::vector<std::unique_ptr<AsyncDiagnose>> StartDiagnoses(int count) {
    std::vector<std::unique_ptr<AsyncDiagnose>> calls;
    v1::DiagnoseRequest request;
    request.set_refresh(true);
    for (int i = 0; i < count; ++i) {
      calls.push_back(std::make_unique<AsyncDiagnose>());
      AsyncDiagnose* call = calls.back().get();
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      system_->async()->Diagnose(&call->context, &request, &call->response,
                                 [call](grpc::Status status) {
                                   call->status = std::move(status);
                                   call->done.set_value();
                                 });
    }
    return calls;
  }

  std::unique_ptr<v1::SystemService::Stub> system_;
};

TEST_F(SystemServiceTest, ListDevicesShowsTheDefaultCpuWithItsResidentDataset) {
  UploadSeed();
  grpc::ClientContext context;
  v1::ListDevicesResponse response;
  ASSERT_TRUE(system_->ListDevices(&context, v1::ListDevicesRequest(), &response).ok());
  ASSERT_GE(response.devices_size(), 1);
  const v1::DeviceStatus& cpu = response.devices(0);
  EXPECT_EQ(cpu.device(), "cpu");
  EXPECT_TRUE(cpu.is_default());
  EXPECT_THAT(cpu.datasets(), ::testing::ElementsAre("seed"));
  EXPECT_EQ(cpu.dataset_bytes(), 800 * 8);
  EXPECT_TRUE(cpu.running_jobs().empty());
  EXPECT_EQ(cpu.queued_jobs(), 0);
  // The sampler reads the process: its resident memory and the machine's total.
  EXPECT_GT(cpu.memory_used_bytes(), 0);
  EXPECT_GT(cpu.memory_total_bytes(), cpu.memory_used_bytes());
}

TEST_F(SystemServiceTest, GetVersionAnswersTheBuildsVersionsAtOnce) {
  grpc::ClientContext context;
  v1::VersionInfo version;
  ASSERT_TRUE(system_->GetVersion(&context, v1::GetVersionRequest(), &version).ok());
  EXPECT_EQ(version.trainerd_version(), TrainerdVersion());
  EXPECT_THAT(version.trainerd_version(), ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
  EXPECT_EQ(version.libtorch_version(), engine::LibTorchVersionString());
  EXPECT_THAT(version.libtorch_version(), ::testing::StartsWith("2."));
  EXPECT_EQ(version.cuda_version(), engine::CudaVersionString());
  // driver_version is NVML's: empty here, the driver's on a GPU node (the fake NVML's in the
  // Prometheus e2e test).
}

TEST_F(SystemServiceTest, DiagnoseMeasuresTheCpuOnceAndThenAnswersFromTheCache) {
  v1::DiagnoseResponse first;
  ASSERT_TRUE(Diagnose(/*refresh=*/false, &first).ok());
  EXPECT_THAT(first.libtorch_version(), ::testing::StartsWith("2.11"));
  EXPECT_FALSE(first.cached());
  ASSERT_GE(first.devices_size(), 1);
  const v1::DeviceDiagnosis& cpu = first.devices(0);
  EXPECT_EQ(cpu.device(), "cpu");
  EXPECT_GT(cpu.matmul_size(), 0);
  EXPECT_GT(cpu.matmul_flops_per_second(), 0);  // measured: how fast is for `make bench`
  EXPECT_GT(cpu.host_to_device_bytes_per_second(), 0);
  EXPECT_GT(cpu.launch_seconds(), 0);
  EXPECT_EQ(cpu.sync_seconds(), 0);

  v1::DiagnoseResponse second;
  ASSERT_TRUE(Diagnose(/*refresh=*/false, &second).ok());
  EXPECT_TRUE(second.cached());
  EXPECT_EQ(second.measure_time().seconds(), first.measure_time().seconds());
  EXPECT_EQ(second.devices(0).matmul_flops_per_second(), cpu.matmul_flops_per_second());
}

// A Diagnose whose deadline passes while the measurement runs is answered at its deadline; the
// measurement goes on and a later call gets it from the cache.
TEST_F(SystemServiceTest, DiagnoseHonoursTheCallersDeadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
  v1::DiagnoseRequest request;
  request.set_refresh(true);
  v1::DiagnoseResponse response;
  const absl::Time start = absl::Now();
  EXPECT_EQ(system_->Diagnose(&context, request, &response).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  v1::DiagnoseResponse cached;
  ASSERT_TRUE(Diagnose(/*refresh=*/false, &cached).ok());
  EXPECT_EQ(cached.devices(0).device(), "cpu");
}

// Diagnose runs one measurement at a time; a few calls may wait for it and the rest are refused
// at once rather than piling up threads.
TEST_F(SystemServiceTest, TooManyWaitingDiagnosesAreResourceExhausted) {
  // Every call here is one caller's: without the per-caller bound, the queue's is what refuses.
  ServerOptions options = Options();
  options.max_diagnose_per_caller = 0;
  StopServer();
  StartServer(options);
  system_ = v1::SystemService::NewStub(channel_);
  constexpr int kCalls = 2 + static_cast<int>(kMaxWaitingDiagnoses) + 2;
  std::vector<std::unique_ptr<AsyncDiagnose>> calls = StartDiagnoses(kCalls);
  // The refused calls are answered at once, while the others wait for the measurements.
  const int expected_refusals = kCalls - 1 - static_cast<int>(kMaxWaitingDiagnoses);
  int exhausted = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (exhausted < expected_refusals && absl::Now() < give_up) {
    exhausted = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i]->answered.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
          calls[i]->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++exhausted;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Whether the first call had reached the worker decides whether one more was refused.
  EXPECT_GE(exhausted, expected_refusals);
  EXPECT_LE(exhausted, expected_refusals + 1);
  // The waiting calls' clients give up: they are answered at once, and their measurements are
  // skipped rather than run for nobody.
  for (auto& call : calls) call->context.TryCancel();
  for (auto& call : calls) {
    EXPECT_EQ(call->answered.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  }
}

TEST_F(SystemServiceTest, FinishedJobCarriesItsDeviceReportAndAVerdictAfterDiagnose) {
  UploadSeed();
  v1::DiagnoseResponse diagnosis;
  ASSERT_TRUE(Diagnose(/*refresh=*/false, &diagnosis).ok());
  v1::Job job;
  ASSERT_TRUE(SubmitJob(LinearSpec("seed", /*epochs=*/3), &job).ok());
  ASSERT_TRUE(Watch(job.id())->Finish().ok());
  v1::Job ended;
  ASSERT_TRUE(GetJob(job.id(), &ended).ok());
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  const v1::DeviceReport& report = ended.report();
  EXPECT_GE(report.queue_seconds(), 0);
  EXPECT_GT(report.compute_seconds(), 0);
  EXPECT_EQ(report.host_syncs(), 3 + 1);
  EXPECT_EQ(report.host_to_device_bytes(), 0);  // the dataset was resident on the job's device
  EXPECT_GT(report.flops_per_step(), 0);
  EXPECT_NEAR(report.steps_per_second() * report.compute_seconds(),
              static_cast<double>(ended.steps()), 1e-6 * ended.steps());
  ASSERT_TRUE(report.has_peak_fraction());
  EXPECT_NEAR(report.peak_fraction(),
              report.achieved_flops_per_second() / diagnosis.devices(0).matmul_flops_per_second(),
              1e-9);
  EXPECT_NE(report.bound(), v1::DeviceReport::BOUND_UNSPECIFIED);
  EXPECT_FALSE(report.verdict().empty());
}

TEST_F(SystemServiceTest, RpcsAreCountedInTheMetricsByMethodAndCode) {
  v1::Job job;
  EXPECT_EQ(GetJob("job-000000000000", &job).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(GetJob("job-000000000000", &job).error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string text = server_->metrics()->Render();
  EXPECT_THAT(text, HasSubstr("trainerd_grpc_requests_total{code=\"NOT_FOUND\",method=\"/trainerd."
                              "v1.JobService/GetJob\"} 2"));
  EXPECT_THAT(text, HasSubstr("trainerd_grpc_request_duration_seconds_count{method=\"/trainerd.v1."
                              "JobService/GetJob\"} 2"));
}

// Bytes of the regular files under `dir`.
int64_t BytesUnder(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) total += static_cast<int64_t>(it->file_size());
  }
  return total;
}

TEST_F(SystemServiceTest, DiskUsageIsReportedByKind) {
  UploadSeed();
  v1::JobSpec spec = LinearSpec("seed", /*epochs=*/2);
  spec.set_checkpoint_every(1);
  v1::Job job;
  ASSERT_TRUE(SubmitJob(spec, &job).ok());
  ASSERT_TRUE(Watch(job.id())->Finish().ok());
  const std::string text = server_->metrics()->Render();
  for (const char* kind : {"datasets", "models", "checkpoints"}) {
    const int64_t bytes = BytesUnder(absl::StrCat(data_dir_, "/", kind));
    EXPECT_GT(bytes, 0) << kind;
    EXPECT_THAT(text, HasSubstr(absl::StrCat("trainerd_disk_usage_bytes{kind=\"", kind, "\"} ",
                                             bytes, "\n")));
  }
  EXPECT_THAT(text, HasSubstr("trainerd_disk_usage_bytes{kind=\"modules\"} 0\n"));
  EXPECT_THAT(text,
              ::testing::ContainsRegex("trainerd_disk_usage_bytes\\{kind=\"records\"\\} [1-9]"));
}

TEST_F(SystemServiceTest, JobEventsReachTheMetrics) {
  UploadSeed();
  v1::Job job;
  ASSERT_TRUE(SubmitJob(LinearSpec("seed", /*epochs=*/2), &job).ok());
  ASSERT_TRUE(Watch(job.id())->Finish().ok());
  const std::string text = server_->metrics()->Render();
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_submitted_total 1\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_finished_total{state=\"succeeded\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_epochs_total 2\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_host_syncs_total 3\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("trainerd_job_epoch{job_id=\"", job.id(), "\"} 2")));
  EXPECT_THAT(text, HasSubstr("trainerd_datasets{device=\"cpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("trainerd_dataset_resident_bytes{device=\"cpu\"} 6400"));
}

// One caller may have --max_diagnose_per_caller calls waiting or running; the next is refused at
// once, naming the limit, and a refresh right after a measurement returns the figures it made.
TEST_F(SystemServiceTest, OneCallersDiagnoseCallsAreBoundedAndRefreshesAreSpacedOut) {
  std::vector<std::unique_ptr<AsyncDiagnose>> calls = StartDiagnoses(3);
  int ok = 0;
  int refused = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i]->answered.wait();
    if (calls[i]->status.ok()) ++ok;
    if (calls[i]->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_THAT(calls[i]->status.error_message(), HasSubstr("--max_diagnose_per_caller=2"));
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(refused, 1);
  // Within --diagnose_min_interval of that measurement, a refresh returns it, marked cached.
  v1::DiagnoseResponse again;
  ASSERT_TRUE(Diagnose(/*refresh=*/true, &again).ok());
  EXPECT_TRUE(again.cached());
}

}  // namespace
}  // namespace trainerd::service::testing
