// Tests for server/metrics: the job counters and per-job series driven by engine events (fed
// here by hand, as the engine's observer would), their expiry, the RPC labels, and the HTTP
// endpoint over a real loopback socket.
#include "server/metrics/metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/http_endpoint.h"

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
  EXPECT_THAT(text, HasSubstr("trainerd_job_duration_seconds_bucket{state=\"succeeded\",le=\"5\"} 1"));
  EXPECT_THAT(text, HasSubstr("trainerd_job_duration_seconds_bucket{state=\"succeeded\",le=\"1\"} 0"));
  // The per-job series stay for the TTL after the end.
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_epoch{job_id=\"job-000000000001\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_epochs_planned{job_id=\"job-000000000001\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_loss{job_id=\"job-000000000001\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_job_samples_per_second{job_id=\"job-000000000001\"} 1234.5\n"));
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

TEST(MetricsTest, PerJobSeriesAreRemovedOnceTheTtlHasPassed) {
  MetricsOptions options;
  options.job_series_ttl = absl::ZeroDuration();
  Metrics metrics(options);
  RunOneJob(metrics, "job-000000000002");
  const std::string text = metrics.Render();
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"job-000000000002\"")));
  EXPECT_THAT(text, HasSubstr("\ntrainerd_epochs_total 2\n"));  // totals stay
}

TEST(MetricsTest, RpcsAreCountedByMethodAndCodeAndForeignMethodsBecomeOther) {
  Metrics metrics;
  metrics.ObserveRpc("/trainerd.v1.JobService/GetJob", "NOT_FOUND", 0.002);
  metrics.ObserveRpc("/trainerd.v1.JobService/GetJob", "NOT_FOUND", 0.003);
  metrics.ObserveRpc("/evil.Service/Anything", "UNIMPLEMENTED", 0.001);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("trainerd_grpc_requests_total{code=\"NOT_FOUND\",method=\"/trainerd."
                              "v1.JobService/GetJob\"} 2"));
  EXPECT_THAT(text, HasSubstr("trainerd_grpc_requests_total{code=\"UNIMPLEMENTED\",method=\"other\"} 1"));
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
  EXPECT_THAT(text, HasSubstr("trainerd_build_info{cuda_version=\"13.0\",libtorch_version=\"2.11.0\","
                              "version=\"0.1.0\"} 1"));
  EXPECT_THAT(text, HasSubstr("\n# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, HasSubstr("\nprocess_resident_memory_bytes "));
  EXPECT_THAT(text, Not(HasSubstr("trainerd_gpu_")));
}

// One HTTP request over loopback; returns the whole response.
std::string HttpRequest(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

TEST(HttpEndpointTest, ServesTheBodyOnItsPathAndRefusesTheRest) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> endpoint =
      HttpEndpoint::Start("127.0.0.1:0", "/metrics", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);

  const std::string ok = HttpRequest(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, ::testing::StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Length: 5\r\n"));
  EXPECT_THAT(ok, ::testing::EndsWith("\r\n\r\nup 1\n"));
  EXPECT_THAT(HttpRequest(port, "GET /other HTTP/1.1\r\n\r\n"),
              ::testing::StartsWith("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(HttpRequest(port, "POST /metrics HTTP/1.1\r\n\r\n"),
              ::testing::StartsWith("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(HttpRequest(port, "nonsense\r\n\r\n"), ::testing::StartsWith("HTTP/1.1 400"));
}

TEST(HttpEndpointTest, AnAddressInUseOrMalformedIsAnError) {
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> first =
      HttpEndpoint::Start("127.0.0.1:0", "/metrics", [] { return std::string(); });
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> second = HttpEndpoint::Start(
      absl::StrCat("127.0.0.1:", (*first)->port()), "/metrics", [] { return std::string(); });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(HttpEndpoint::Start("no-port", "/metrics", [] { return std::string(); }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainerd::metrics
