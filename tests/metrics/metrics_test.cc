// Tests for server/metrics: the job counters and per-job series driven by engine events (fed
// here by hand, as the engine's observer would), their expiry, and the RPC labels. The HTTP
// endpoint has its own tests (tests/http).
#include "server/metrics/metrics.h"

#include <string>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

engine::JobEvent State(const std::string& id, engine::JobState state, int32_t epochs = 3) {
  engine::JobEvent event;
  event.kind = engine::JobEvent::Kind::kState;
  event.job_id = id;
  event.job.id = id;
  event.job.state = state;
  event.job.spec.epochs = epochs;
  return event;
}

engine::JobEvent Epoch(const std::string& id, int32_t epoch, double loss, int64_t steps,
                       int64_t syncs) {
  engine::JobEvent event;
  event.kind = engine::JobEvent::Kind::kEpoch;
  event.job_id = id;
  event.epoch.epoch = epoch;
  event.epoch.loss = loss;
  event.steps = steps;
  event.host_syncs = syncs;
  event.rows_per_epoch = 800;
  event.samples_per_second = 1234.5;
  return event;
}

// A job's whole life: QUEUED, RUNNING, two epochs of 50 steps, SUCCEEDED with one more sync.
void RunOneJob(Metrics& metrics, const std::string& id) {
  auto observer = metrics.job_observer();
  observer->Push(State(id, engine::JobState::kQueued));
  engine::JobEvent running = State(id, engine::JobState::kRunning);
  running.job.start_time = absl::Now();
  observer->Push(running);
  observer->Push(Epoch(id, 1, 0.5, 50, 1));
  observer->Push(Epoch(id, 2, 0.25, 100, 2));
  engine::JobEvent done = State(id, engine::JobState::kSucceeded);
  done.job.start_time = running.job.start_time;
  done.job.wall_seconds = 2.5;
  done.job.host_syncs = 3;
  observer->Push(done);
}

TEST(MetricsTest, JobLifeDrivesCountersGaugesAndTheDurationHistogram) {
  Metrics metrics;
  RunOneJob(metrics, "job-000000000001");
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_submitted_total 1\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_finished_total{state=\"succeeded\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_finished_total{state=\"failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_queued 0\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_running 0\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_epochs_total 2\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_steps_total 100\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_samples_total 1600\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_host_syncs_total 3\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_duration_seconds_count{state=\"succeeded\"} 1\n"));
  EXPECT_THAT(text,
              HasSubstr("trainerd_job_duration_seconds_bucket{state=\"succeeded\",le=\"5\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("trainerd_job_duration_seconds_bucket{state=\"succeeded\",le=\"1\"} 0"));
  // The per-job series stay for the TTL after the end.
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_epoch{job_id=\"job-000000000001\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_epochs_planned{job_id=\"job-000000000001\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_loss{job_id=\"job-000000000001\"} 0.25\n"));
  EXPECT_THAT(text,
              HasSubstr("\ntrainerd_job_samples_per_second{job_id=\"job-000000000001\"} 1234.5\n"));
}

TEST(MetricsTest, RunningJobIsCountedAndQueuedJobCancelledLeavesNoSeries) {
  Metrics metrics;
  auto observer = metrics.job_observer();
  observer->Push(State("job-a", engine::JobState::kQueued));
  observer->Push(State("job-b", engine::JobState::kQueued));
  observer->Push(State("job-a", engine::JobState::kRunning));
  std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_queued 1\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_running 1\n"));
  observer->Push(State("job-b", engine::JobState::kCancelled));
  text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_queued 0\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_finished_total{state=\"cancelled\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"job-b\"")));
  // A job that never started has no duration.
  EXPECT_THAT(text, Not(HasSubstr("trainerd_job_duration_seconds_count{state=\"cancelled\"}")));
}

TEST(MetricsTest, JobTakenUpAgainAtARestartIsQueuedButNotSubmittedAgain) {
  Metrics metrics;
  auto observer = metrics.job_observer();
  engine::JobEvent recovered = State("job-r", engine::JobState::kQueued);
  recovered.job.restarts.push_back(engine::JobRestart{absl::Now(), 4, engine::JobState::kRunning});
  observer->Push(recovered);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_submitted_total 0\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_jobs_queued 1\n"));
}

// A data-parallel job: a series per rank while it runs (where each rank is), and its ranks'
// collective time once it ended; all of them leave with the job's other series.
TEST(MetricsTest, DataParallelJobHasASeriesPerRankAndItsCollectiveTime) {
  for (const bool expire : {false, true}) {
    MetricsOptions options;
    if (expire) options.job_series_ttl = absl::ZeroDuration();
    Metrics metrics(options);
    auto observer = metrics.job_observer();
    const std::string id = "job-0000000000dp";
    observer->Push(State(id, engine::JobState::kQueued));
    engine::JobEvent running = State(id, engine::JobState::kRunning);
    running.job.spec.replicas = 2;
    running.job.ranks = {{0, "cpu", "node-a"}, {1, "cpu", "node-a"}};
    running.job.start_time = absl::Now();
    observer->Push(running);
    std::string text = metrics.Render();
    EXPECT_THAT(text, HasSubstr("\ntrainerd_job_rank_info{device=\"cpu\",job_id=\"" + id +
                                "\",node=\"node-a\",rank=\"0\"} 1\n"));
    EXPECT_THAT(text, HasSubstr("rank=\"1\"} 1\n"));
    engine::JobEvent done = running;
    done.job.state = engine::JobState::kSucceeded;
    done.job.report.collective_seconds = 1.5;
    observer->Push(done);
    text = metrics.Render();
    EXPECT_THAT(text, HasSubstr("\ntrainerd_collective_seconds_total 1.5\n"));
    if (expire) {
      EXPECT_THAT(text, Not(HasSubstr("job_id=\"" + id + "\"")));
    } else {
      EXPECT_THAT(text,
                  HasSubstr("\ntrainerd_job_collective_seconds{job_id=\"" + id + "\"} 1.5\n"));
      EXPECT_THAT(text, HasSubstr("rank=\"1\"} 1\n"));
    }
  }
}

TEST(MetricsTest, PerJobSeriesAreRemovedOnceTheTtlHasPassed) {
  MetricsOptions options;
  options.job_series_ttl = absl::ZeroDuration();
  Metrics metrics(options);
  RunOneJob(metrics, "job-000000000002");
  const std::string text = metrics.Render();
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"job-000000000002\"")));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_epochs_total 2\n"));  // totals stay
}

// Many short jobs and nobody scraping: only the last 1,000 ended jobs keep their series, and the
// expiry happens as jobs end (Render is called only at the end).
TEST(MetricsTest, OnlyTheLastThousandEndedJobsKeepTheirSeries) {
  Metrics metrics;  // the default TTL of 5 minutes: age alone expires nothing here
  for (int i = 0; i < 1200; ++i) {
    RunOneJob(metrics, absl::StrFormat("job-%012d", i));
  }
  const std::string text = metrics.Render();
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"job-000000000199\"")));
  EXPECT_THAT(text, HasSubstr("trainerd_job_loss{job_id=\"job-000000000200\"}"));
  EXPECT_THAT(text, HasSubstr("trainerd_job_loss{job_id=\"job-000000001199\"}"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_epochs_total 2400\n"));  // totals stay
}

TEST(MetricsTest, RpcsAreCountedByMethodAndCodeAndForeignMethodsBecomeOther) {
  Metrics metrics;
  metrics.ObserveRpc("/trainerd.v1.JobService/GetJob", "NOT_FOUND", 0.002);
  metrics.ObserveRpc("/trainerd.v1.JobService/GetJob", "NOT_FOUND", 0.003);
  metrics.ObserveRpc("/evil.Service/Anything", "UNIMPLEMENTED", 0.001);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("trainerd_grpc_requests_total{code=\"NOT_FOUND\",method=\"/trainerd."
                              "v1.JobService/GetJob\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("trainerd_grpc_requests_total{code=\"UNIMPLEMENTED\",method=\"other\"} 1"));
  EXPECT_THAT(text, HasSubstr("trainerd_grpc_request_duration_seconds_count{method=\"/trainerd.v1."
                              "JobService/GetJob\"} 2"));
  EXPECT_EQ(RpcMethodLabel("/grpc.health.v1.Health/Check"), "/grpc.health.v1.Health/Check");
}

TEST(MetricsTest, BuildInfoAndProcessSeriesArePresentWithoutEngineOrSampler) {
  MetricsOptions options;
  options.version = "0.1.0";
  options.libtorch_version = "2.11.0";
  options.cuda_version = "13.0";
  Metrics metrics(options);
  const std::string text = metrics.Render();
  EXPECT_THAT(text,
              HasSubstr("trainerd_build_info{cuda_version=\"13.0\",libtorch_version=\"2.11.0\","
                        "version=\"0.1.0\"} 1"));
  EXPECT_THAT(text, HasSubstr("\n# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, HasSubstr("\nprocess_resident_memory_bytes "));
  EXPECT_THAT(text, HasSubstr("\n# TYPE process_open_fds gauge\n"));
  EXPECT_THAT(text, HasSubstr("\nprocess_max_fds "));
  EXPECT_THAT(text, Not(HasSubstr("trainerd_gpu_")));
}

}  // namespace
}  // namespace trainerd::metrics
