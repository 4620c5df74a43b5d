// Tests for the device views of client/output.h: the report section of `job get`, `diagnose`,
// `devices` and the screen of `top`, with the number formats they use.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/output.h"
#include "gmock/gmock.h"
#include "google/protobuf/timestamp.pb.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kLaunchVerdict[] =
    "launch-bound: 96% of step time is fixed per-step overhead; this model is too small for "
    "cuda:0 — a batch of 512 or the cpu device will be faster";

// A small model on a big GPU: every field set, the times adding up to 10 s.
v1::DeviceReport LaunchBoundReport() {
  v1::DeviceReport report;
  report.set_queue_seconds(0.02);
  report.set_data_seconds(0.48);
  report.set_compute_seconds(9.0);
  report.set_host_transfer_seconds(0.5);
  report.set_utilization_average(0.34);
  report.set_utilization_peak(0.61);
  report.set_peak_memory_bytes(12 << 20);
  report.set_steps_per_second(1500);
  report.set_host_syncs(12);
  report.set_host_to_device_bytes(0);
  report.set_flops_per_step(2.5e6);
  report.set_achieved_flops_per_second(3.75e9);
  report.set_peak_fraction(0.0061);
  report.set_overhead_fraction(0.96);
  report.set_bound(v1::DeviceReport::LAUNCH_BOUND);
  report.set_verdict(kLaunchVerdict);
  return report;
}

v1::Job JobWithReport() {
  v1::Job job;
  job.set_id("job-0123456789ab");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_spec()->set_epochs(3);
  *job.mutable_report() = LaunchBoundReport();
  return job;
}

// ---- Number formats --------------------------------------------------------------------------

TEST(FormatSiTest, KeepsThreeSignificantDigitsWithADecimalPrefix) {
  EXPECT_EQ(FormatSi(0, "FLOP"), "0 FLOP");
  EXPECT_EQ(FormatSi(512, "FLOP"), "512 FLOP");
  EXPECT_EQ(FormatSi(2.5e6, "FLOP"), "2.50 MFLOP");
  EXPECT_EQ(FormatSi(3.75e9, "FLOP/s"), "3.75 GFLOP/s");
  EXPECT_EQ(FormatSi(45.6e12, "FLOP/s"), "45.6 TFLOP/s");
  EXPECT_EQ(FormatSi(495e12, "FLOP/s"), "495 TFLOP/s");
  EXPECT_EQ(FormatSi(1.5e3, "FLOP"), "1.50 kFLOP");
}

TEST(FormatSiTest, RoundingUpToAThousandMovesToTheNextPrefix) {
  EXPECT_EQ(FormatSi(999.7e9, "FLOP/s"), "1.00 TFLOP/s");
}

TEST(FormatSiTest, NonFiniteIsADash) {
  EXPECT_EQ(FormatSi(std::numeric_limits<double>::quiet_NaN(), "FLOP"), "-");
}

TEST(DisplayWidthTest, CountsCodePointsNotBytes) {
  EXPECT_EQ(DisplayWidth("4.2 µs"), 6u);
  EXPECT_EQ(DisplayWidth("host→device"), 11u);
  EXPECT_EQ(DisplayWidth(""), 0u);
}

TEST(TextTableTest, AlignsCellsWithMultiByteCharacters) {
  TextTable table({"A", "B"});
  table.AddRow({"4.2 µs", "x"});
  table.AddRow({"12.5 s", "y"});
  EXPECT_EQ(table.Render(),
            "A       B\n"
            "4.2 µs  x\n"
            "12.5 s  y\n");
}

// ---- job get: the report section ---------------------------------------------------------------

TEST(DeviceReportTest, LaunchBoundReportShowsEveryFigureAndTheVerdictLast) {
  EXPECT_EQ(DeviceReportSection(LaunchBoundReport()),
            "report:\n"
            "  queue:          0.02 s (0.2%)\n"
            "  data:           0.48 s (4.8%)\n"
            "  compute:        9.00 s (90.0%)\n"
            "  host transfer:  0.50 s (5.0%)\n"
            "  utilization:    average 34.0%, peak 61.0%\n"
            "  peak memory:    12.0 MiB\n"
            "  steps/s:        1500.0\n"
            "  host syncs:     12\n"
            "  host→device:    0 B\n"
            "  FLOPs/step:     2.50 MFLOP\n"
            "  achieved:       3.75 GFLOP/s (0.6% of measured peak)\n"
            "  overhead:       96.0% of step time\n"
            "verdict:  " +
                std::string(kLaunchVerdict) + "\n");
}

TEST(DeviceReportTest, JobDetailsEndWithTheReport) {
  const std::string text = JobDetails(JobWithReport());
  EXPECT_THAT(text, HasSubstr("\nended:       -\nparameters:  -\nreport:\n  queue:  "));
  EXPECT_THAT(text, EndsWith(std::string("\nverdict:  ") + kLaunchVerdict + "\n"));
}

TEST(DeviceReportTest, JobWithoutReportHasNoReportSection) {
  v1::Job job = JobWithReport();
  job.clear_report();
  EXPECT_THAT(JobDetails(job), Not(HasSubstr("report:")));
  EXPECT_THAT(JobDetails(job), Not(HasSubstr("verdict:")));
  // A report message with nothing set (a queued job) is no report either.
  job.mutable_report();
  EXPECT_THAT(JobDetails(job), Not(HasSubstr("report:")));
}

TEST(DeviceReportTest, UnsetOptionalFiguresAreLeftOut) {
  v1::DeviceReport report;
  report.set_queue_seconds(1);
  report.set_compute_seconds(3);
  report.set_steps_per_second(20);
  report.set_bound(v1::DeviceReport::BOUND_UNSPECIFIED);
  const std::string text = DeviceReportSection(report);
  EXPECT_THAT(text, HasSubstr("\n  queue:          1.00 s (25.0%)\n"));
  EXPECT_THAT(text, HasSubstr("\n  data:           0.00 s (0.0%)\n"));
  EXPECT_THAT(text, HasSubstr("\n  peak memory:    -\n"));
  EXPECT_THAT(text, HasSubstr("\n  FLOPs/step:     - (unknown for this model)\n"));
  EXPECT_THAT(text, Not(HasSubstr("utilization")));
  EXPECT_THAT(text, Not(HasSubstr("achieved")));
  EXPECT_THAT(text, Not(HasSubstr("overhead")));
  EXPECT_THAT(text, Not(HasSubstr("verdict")));
}

TEST(DeviceReportTest, OnlyThePeakUtilizationAndNoPeakFraction) {
  v1::DeviceReport report;
  report.set_compute_seconds(1);
  report.set_utilization_peak(0.5);
  report.set_flops_per_step(1e9);
  report.set_achieved_flops_per_second(2e12);
  const std::string text = DeviceReportSection(report);
  EXPECT_THAT(text, HasSubstr("\n  utilization:    peak 50.0%\n"));
  EXPECT_THAT(text, HasSubstr("\n  achieved:       2.00 TFLOP/s\n"));
}

TEST(DeviceReportTest, BoundWithoutVerdictTextIsNamed) {
  v1::DeviceReport report;
  report.set_compute_seconds(1);
  report.set_bound(v1::DeviceReport::COMPUTE_BOUND);
  EXPECT_THAT(DeviceReportSection(report), EndsWith("\nverdict:  compute-bound\n"));
}

TEST(BoundNameTest, NamesEveryBound) {
  EXPECT_EQ(BoundName(v1::DeviceReport::LAUNCH_BOUND), "launch-bound");
  EXPECT_EQ(BoundName(v1::DeviceReport::COMPUTE_BOUND), "compute-bound");
  EXPECT_EQ(BoundName(v1::DeviceReport::TRANSFER_BOUND), "transfer-bound");
  EXPECT_EQ(BoundName(v1::DeviceReport::DATA_BOUND), "data-bound");
  EXPECT_EQ(BoundName(v1::DeviceReport::BALANCED), "balanced");
  EXPECT_EQ(BoundName(v1::DeviceReport::BOUND_UNSPECIFIED), "-");
}

// ---- diagnose ----------------------------------------------------------------------------------

v1::DiagnoseResponse GpuAndCpuDiagnosis() {
  v1::DiagnoseResponse response;
  response.set_libtorch_version("2.11.0");
  response.set_cuda_version("13.0");
  response.set_driver_version("13.0");
  v1::DeviceDiagnosis* gpu = response.add_devices();
  gpu->set_device("cuda:0");
  gpu->set_name("NVIDIA H200");
  gpu->set_memory_total_bytes(int64_t{150754820096});
  gpu->set_matmul_size(8192);
  gpu->set_matmul_flops_per_second(495e12);
  gpu->set_host_to_device_bytes_per_second(52e9);
  gpu->set_launch_seconds(4.2e-6);
  gpu->set_sync_seconds(6.8e-6);
  gpu->set_utilization_during_matmul(1.0);
  gpu->set_sm_activity_during_matmul(0.87);
  // The CPU: no sync, no utilization or SM activity samples.
  v1::DeviceDiagnosis* cpu = response.add_devices();
  cpu->set_device("cpu");
  cpu->set_name("AMD EPYC 7763 64-Core Processor");
  cpu->set_memory_total_bytes(int64_t{512} << 30);
  cpu->set_matmul_size(2048);
  cpu->set_matmul_flops_per_second(2.1e12);
  cpu->set_host_to_device_bytes_per_second(12e9);
  cpu->set_launch_seconds(3.1e-6);
  return response;
}

TEST(DiagnoseTableTest, GpuAndCpuRowsWithDashesForUnsetFigures) {
  const std::string text = DiagnoseTable(GpuAndCpuDiagnosis());
  EXPECT_THAT(text, StartsWith("libtorch:  2.11.0 (built with CUDA 13.0)\n"
                               "driver:    CUDA 13.0\n"
                               "measured:  -\n"
                               "\n"
                               "DEVICE  MEMORY     MATMUL               H2D        LAUNCH  SYNC    "
                               "UTIL  SM   NAME\n"
                               "cuda:0  140.4 GiB  495 TFLOP/s n=8192   52.0 GB/s  4.2 µs  6.8 µs  "
                               "100%  87%  NVIDIA H200\n"
                               "cpu     512.0 GiB  2.10 TFLOP/s n=2048  12.0 GB/s  3.1 µs  -       "
                               "-     -    AMD EPYC 7763 64-Co...\n"
                               "\n"));
  EXPECT_THAT(text, Not(HasSubstr("cached")));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    EXPECT_LE(DisplayWidth(line), 100u) << line;
  }
}

TEST(DiagnoseTableTest, CachedResultsSayHowToMeasureAgain) {
  v1::DiagnoseResponse response = GpuAndCpuDiagnosis();
  response.set_cached(true);
  response.mutable_measure_time()->set_seconds(1714566896);
  const std::string text = DiagnoseTable(response);
  EXPECT_THAT(text, ContainsRegex("\nmeasured:  [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} "
                                  "\\(cached; --refresh measures again\\)\n"));
}

TEST(DiagnoseTableTest, CpuOnlyBuildWithoutDriverHasNoDriverLine) {
  v1::DiagnoseResponse response;
  response.set_libtorch_version("2.11.0");
  v1::DeviceDiagnosis* cpu = response.add_devices();
  cpu->set_device("cpu");
  const std::string text = DiagnoseTable(response);
  EXPECT_THAT(text, StartsWith("libtorch:  2.11.0 (CPU-only build)\nmeasured:  -\n"));
  EXPECT_THAT(text, Not(HasSubstr("driver")));
  EXPECT_THAT(text, HasSubstr("\ncpu     -       -       -    -       -     -     -   -\n"));
}

// ---- devices and top ---------------------------------------------------------------------------

v1::ListDevicesResponse TwoDevices() {
  v1::ListDevicesResponse response;
  v1::DeviceStatus* gpu = response.add_devices();
  gpu->set_device("cuda:0");
  gpu->set_name("NVIDIA H200");
  gpu->set_utilization(0.42);
  gpu->set_memory_used_bytes(int64_t{3} << 30);
  gpu->set_memory_total_bytes(int64_t{140} << 30);
  gpu->add_datasets("iris");
  gpu->add_datasets("mnist");
  gpu->set_dataset_bytes(int64_t{180} << 20);
  gpu->add_running_jobs("job-0123456789ab");
  gpu->set_queued_jobs(2);
  gpu->set_is_default(true);
  v1::DeviceStatus* cpu = response.add_devices();
  cpu->set_device("cpu");
  cpu->set_name("AMD EPYC 7763 64-Core Processor");
  cpu->set_memory_used_bytes(int64_t{1} << 30);
  cpu->set_memory_total_bytes(int64_t{512} << 30);
  return response;
}

TEST(DeviceListTableTest, MarksTheDefaultAndDashesWhatIsMissing) {
  EXPECT_EQ(DeviceListTable(TwoDevices()),
            "DEVICE   NAME                      UTIL  MEMORY             DATASETS"
            "                   RUNNING           QUEUED\n"
            "cuda:0*  NVIDIA H200               42%   3.0 GiB/140.0 GiB  2, 180.0 MiB "
            "(iris,mnist)  job-0123456789ab  2\n"
            "cpu      AMD EPYC 7763 64-Core...  -     1.0 GiB/512.0 GiB  -"
            "                          -                 0\n");
}

TEST(DeviceListTableTest, AGpuTheDaemonCannotUseIsMarked) {
  v1::ListDevicesResponse response;
  v1::DeviceStatus* cpu = response.add_devices();
  cpu->set_device("cpu");
  cpu->set_is_default(true);
  v1::DeviceStatus* gpu = response.add_devices();
  gpu->set_device("cuda:0");
  gpu->set_name("NVIDIA H200");
  gpu->set_utilization(0.0);
  gpu->set_unusable_reason("NVML sees this GPU but LibTorch sees no CUDA device");
  const std::string table = DeviceListTable(response);
  EXPECT_THAT(table, HasSubstr("\ncpu*  "));
  EXPECT_THAT(table, HasSubstr("\ncuda:0 (unusable)  NVIDIA H200"));
}

TEST(DeviceListTableTest, LongDatasetNameListsShowOnlyCountAndBytes) {
  v1::ListDevicesResponse response;
  v1::DeviceStatus* gpu = response.add_devices();
  gpu->set_device("cuda:1");
  for (const char* name : {"imagenet-train-shard-0", "imagenet-train-shard-1"}) {
    gpu->add_datasets(name);
  }
  gpu->set_dataset_bytes(int64_t{5} << 30);
  EXPECT_THAT(DeviceListTable(response), HasSubstr("  2, 5.0 GiB  "));
  EXPECT_THAT(DeviceListTable(response), Not(HasSubstr("imagenet")));
}

v1::ListJobsResponse OneRunningAmongOthers() {
  v1::ListJobsResponse response;
  v1::Job* done = response.add_jobs();
  done->set_id("job-000000000001");
  done->set_state(v1::JOB_STATE_SUCCEEDED);
  v1::Job* running = response.add_jobs();
  running->set_id("job-0123456789ab");
  running->set_state(v1::JOB_STATE_RUNNING);
  running->set_device("cuda:0");
  running->mutable_spec()->set_epochs(10);
  for (int i = 1; i <= 3; ++i) {
    v1::EpochResult* epoch = running->add_epochs();
    epoch->set_epoch(i);
    epoch->set_loss(1.0 / i);
  }
  running->set_samples_per_second(12345.67);
  v1::Job* queued = response.add_jobs();
  queued->set_id("job-000000000003");
  queued->set_state(v1::JOB_STATE_QUEUED);
  return response;
}

TEST(TopScreenTest, DevicesThenTheRunningJobsWithAnEpochBar) {
  EXPECT_EQ(TopScreen(TwoDevices(), OneRunningAmongOthers()),
            DeviceListTable(TwoDevices()) +
                "\n"
                "JOB               DEVICE  EPOCH  LOSS      SAMPLES/S  PROGRESS\n"
                "job-0123456789ab  cuda:0  3/10   0.333333  12345.7    [######              ]  "
                "30%\n");
}

TEST(TopScreenTest, NoRunningJobsIsSaid) {
  v1::ListJobsResponse jobs = OneRunningAmongOthers();
  jobs.mutable_jobs(1)->set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(TopScreen(TwoDevices(), jobs), DeviceListTable(TwoDevices()) + "\nno running jobs\n");
}

TEST(TopScreenTest, RunningJobBeforeItsFirstEpoch) {
  v1::ListJobsResponse jobs;
  v1::Job* job = jobs.add_jobs();
  job->set_id("job-0123456789ab");
  job->set_state(v1::JOB_STATE_RUNNING);
  job->mutable_spec()->set_device("cpu");
  job->mutable_spec()->set_epochs(5);
  EXPECT_THAT(TopScreen(v1::ListDevicesResponse(), jobs),
              HasSubstr("\njob-0123456789ab  cpu     0/5    -     0.0        [                    ]"
                        "   0%\n"));
}

TEST(RunningJobsTest, KeepsOnlyRunningJobsInOrder) {
  const v1::ListJobsResponse running = RunningJobs(OneRunningAmongOthers());
  ASSERT_EQ(running.jobs_size(), 1);
  EXPECT_EQ(running.jobs(0).id(), "job-0123456789ab");
}

// ---- The sandbox of submitted code ----------------------------------------------------------

v1::WorkerSandbox Sandbox(bool complete) {
  v1::WorkerSandbox s;
  s.set_program("trainerd-module-check");
  s.set_landlock_abi(complete ? 7 : 0);
  s.set_landlock(complete);
  s.set_landlock_error(complete ? "" : "EPERM");
  s.set_seccomp(true);
  s.set_no_new_privileges(true);
  s.set_not_dumpable(true);
  s.set_network_namespace(false);
  s.set_network_error("EPERM");
  s.set_uid(61234);
  if (!complete) {
    s.add_missing("landlock");
    s.set_refusal("submitted code is not run here: the sandbox of trainerd-module-check lacks "
                  "landlock: ...");
  }
  return s;
}

TEST(SandboxViewsTest, DiagnoseSaysPerProgramWhetherSubmittedCodeRuns) {
  v1::DiagnoseResponse response;
  *response.add_worker_sandboxes() = Sandbox(true);
  v1::WorkerSandbox worker = Sandbox(false);
  worker.set_program("trainerd-worker");
  *response.add_worker_sandboxes() = worker;
  const std::string text = DiagnoseTable(response);
  EXPECT_THAT(text, HasSubstr("sandbox of submitted code:\n  trainerd-module-check: complete\n"
                              "    Landlock ABI 7, seccomp, no new privileges, not dumpable, no "
                              "network namespace (EPERM), user 61234 (the daemon's)\n"));
  EXPECT_THAT(text, HasSubstr("  trainerd-worker: REFUSED, lacks landlock\n"
                              "    no Landlock (EPERM), seccomp"));
  EXPECT_THAT(text, HasSubstr("    submitted code is not run here"));
  // Without sandboxes (TorchScript off, an older daemon) nothing is added.
  EXPECT_THAT(DiagnoseTable(v1::DiagnoseResponse()), Not(HasSubstr("sandbox")));
}

TEST(SandboxViewsTest, DevicesSayOnlyWhenModulesAreRefused) {
  v1::ListDevicesResponse response;
  response.add_devices()->set_device("cpu");
  *response.add_worker_sandboxes() = Sandbox(true);
  EXPECT_THAT(DeviceListTable(response), Not(HasSubstr("refused")));
  *response.mutable_worker_sandboxes(0) = Sandbox(false);
  EXPECT_THAT(DeviceListTable(response),
              HasSubstr("TorchScript jobs are refused: trainerd-module-check's sandbox lacks "
                        "landlock (trainctl diagnose says why)\n"));
}

TEST(SandboxViewsTest, AJobsReportSaysWhatItsWorkerHad) {
  v1::DeviceReport report = LaunchBoundReport();
  v1::WorkerSandbox s = Sandbox(true);
  s.set_program("trainerd-worker");
  s.set_other_user(true);
  s.set_uid(65534);
  *report.mutable_worker_sandbox() = s;
  EXPECT_THAT(DeviceReportSection(report),
              ContainsRegex("sandbox: +Landlock ABI 7, seccomp, no new privileges, not "
                            "dumpable, no network namespace \\(EPERM\\), user 65534 \\(not "
                            "the daemon's\\)"));
}

// Whatever a daemon sends, a table or a view shows it as text.
TEST(TerminalSafetyTest, CellsAndValuesShowControlsEscaped) {
  TextTable table({"ID", "ERROR"});
  table.AddRow({"job-1", "\x1b]0;owned\x07\x1b[2J\rjob-2  SUCCEEDED\n"});
  const std::string rendered = table.Render();
  EXPECT_EQ(rendered.find('\x1b'), std::string::npos);
  EXPECT_EQ(rendered.find('\r'), std::string::npos);
  EXPECT_THAT(rendered, HasSubstr("\\x1b]0;owned\\x07\\x1b[2J\\x0djob-2  SUCCEEDED\\x0a"));
  EXPECT_EQ(std::count(rendered.begin(), rendered.end(), '\n'), 2);
  const std::string lines = KeyValueLines({{"error", "a\nstate: SUCCEEDED\x1b[K"}});
  EXPECT_EQ(lines, "error:  a\\x0astate: SUCCEEDED\\x1b[K\n");
}

}  // namespace
}  // namespace trainerd::client
