#include "server/metrics/metrics.h"

#include <deque>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/engine/engine.h"
#include "server/monitor/process_stats.h"
#include "server/monitor/sampler.h"

namespace trainerd::metrics {
namespace {

// Ended jobs whose per-job series are kept at most (besides their TTL): many short jobs must not
// grow the label set, or the daemon's memory, without bound.
constexpr size_t kMaxEndedJobSeries = 1000;

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Running times of jobs: from a second (a small job on a GPU) to a day.
const prometheus::Histogram::BucketBoundaries kJobDurationBuckets = {
    1, 5, 15, 30, 60, 300, 900, 1800, 3600, 7200, 21600, 86400};
// RPC latencies: unary calls take a millisecond or less on loopback; uploads, downloads, Watch
// and Diagnose streams live for seconds to hours.
const prometheus::Histogram::BucketBoundaries kRpcDurationBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

const char* StateLabel(engine::JobState state) {
  switch (state) {
    case engine::JobState::kQueued:
      return "queued";
    case engine::JobState::kRunning:
      return "running";
    case engine::JobState::kSucceeded:
      return "succeeded";
    case engine::JobState::kFailed:
      return "failed";
    case engine::JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

ClientMetric Value(double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  m.counter.value = value;
  return m;
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

}  // namespace

std::string RpcMethodLabel(absl::string_view method) {
  // The interceptor already named every path the server does not serve "other"; this guard
  // keeps foreign services out of the labels whoever calls.
  for (absl::string_view service :
       {"/trainerd.v1.", "/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
        "/grpc.reflection.v1.ServerReflection/"}) {
    if (absl::StartsWith(method, service)) return std::string(method);
  }
  return "other";
}

// Counters and per-job gauges driven by the engine's job events. Every job passes through
// QUEUED (Enqueue), maybe RUNNING and epochs, and one terminal state, in that order per job.
class Metrics::JobObserver final : public engine::JobEventSink {
 public:
  JobObserver(prometheus::Registry& registry, absl::Duration ttl)
      : ttl_(ttl),
        submitted_(prometheus::BuildCounter()
                       .Name("trainerd_jobs_submitted_total")
                       .Help("Jobs accepted by Submit.")
                       .Register(registry)
                       .Add({})),
        finished_(prometheus::BuildCounter()
                      .Name("trainerd_jobs_finished_total")
                      .Help("Jobs that reached a terminal state, by state.")
                      .Register(registry)),
        queued_(prometheus::BuildGauge()
                    .Name("trainerd_jobs_queued")
                    .Help("Jobs waiting for their device's worker.")
                    .Register(registry)
                    .Add({})),
        running_(prometheus::BuildGauge()
                     .Name("trainerd_jobs_running")
                     .Help("Jobs training now.")
                     .Register(registry)
                     .Add({})),
        duration_(prometheus::BuildHistogram()
                      .Name("trainerd_job_duration_seconds")
                      .Help("Running time (start to end) of finished jobs, by final state.")
                      .Register(registry)),
        epochs_(prometheus::BuildCounter()
                    .Name("trainerd_epochs_total")
                    .Help("Epochs finished, all jobs.")
                    .Register(registry)
                    .Add({})),
        steps_(prometheus::BuildCounter()
                   .Name("trainerd_steps_total")
                   .Help("Optimizer steps taken, all jobs.")
                   .Register(registry)
                   .Add({})),
        samples_(prometheus::BuildCounter()
                     .Name("trainerd_samples_total")
                     .Help("Training rows processed, all jobs.")
                     .Register(registry)
                     .Add({})),
        host_syncs_(prometheus::BuildCounter()
                        .Name("trainerd_host_syncs_total")
                        .Help("Device-to-host copies made by jobs (Job.host_syncs summed).")
                        .Register(registry)
                        .Add({})),
        job_epoch_(prometheus::BuildGauge()
                       .Name("trainerd_job_epoch")
                       .Help("Epochs finished by a running (or recently ended) job.")
                       .Register(registry)),
        job_planned_(prometheus::BuildGauge()
                         .Name("trainerd_job_epochs_planned")
                         .Help("Epochs a running (or recently ended) job plans (JobSpec.epochs).")
                         .Register(registry)),
        job_loss_(prometheus::BuildGauge()
                      .Name("trainerd_job_loss")
                      .Help("Last epoch's mean training loss of a running (or recently ended) "
                            "job.")
                      .Register(registry)),
        job_rate_(prometheus::BuildGauge()
                      .Name("trainerd_job_samples_per_second")
                      .Help("Training rows per second so far of a running (or recently ended) "
                            "job.")
                      .Register(registry)),
        job_rank_(prometheus::BuildGauge()
                      .Name("trainerd_job_rank_info")
                      .Help("1 for each rank of a running (or recently ended) data-parallel job, "
                            "labelled with the device and the daemon (node) it runs on.")
                      .Register(registry)),
        job_collective_(prometheus::BuildGauge()
                            .Name("trainerd_job_collective_seconds")
                            .Help("Seconds rank 0 of an ended data-parallel job spent in "
                                  "collectives (DeviceReport.collective_seconds).")
                            .Register(registry)),
        collective_seconds_(prometheus::BuildCounter()
                                .Name("trainerd_collective_seconds_total")
                                .Help("Seconds the ranks 0 of data-parallel jobs spent in "
                                      "collectives, all ended jobs.")
                                .Register(registry)
                                .Add({})) {
    // Every final state is present from the start, so that rate() sees the first job.
    for (const char* state : {"succeeded", "failed", "cancelled"})
      finished_.Add({{"state", state}});
  }

  void Push(const engine::JobEvent& event) override {
    absl::MutexLock lock(&mu_);
    if (event.kind == engine::JobEvent::Kind::kEpoch) {
      OnEpoch(event);
    } else {
      OnState(event.job);
    }
  }

  // Removes the per-job series of jobs that ended more than the TTL ago.
  void Expire(absl::Time now) {
    absl::MutexLock lock(&mu_);
    ExpireLocked(now);
  }

 private:
  struct Job {
    engine::JobState state = engine::JobState::kQueued;
    int64_t steps = 0;
    int64_t host_syncs = 0;
    std::optional<absl::Time> ended;
    prometheus::Gauge* epoch = nullptr;  // the per-job series; null until the job starts
    prometheus::Gauge* planned = nullptr;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* rate = nullptr;
    std::vector<prometheus::Gauge*> ranks;  // a data-parallel job's trainerd_job_rank_info
    prometheus::Gauge* collective = nullptr;
  };

  void OnState(const engine::JobSnapshot& snap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, inserted] = jobs_.try_emplace(snap.id);
    Job& job = it->second;
    if (inserted) {
      // A job taken up again at a restart was submitted before it.
      if (snap.restarts.empty()) submitted_.Increment();
      queued_.Increment();
      job.state = engine::JobState::kQueued;
      if (snap.state == engine::JobState::kQueued) return;
    }
    if (job.ended.has_value()) return;  // terminal states never change
    const engine::JobState previous = job.state;
    job.state = snap.state;
    if (snap.state == engine::JobState::kRunning && previous == engine::JobState::kQueued) {
      queued_.Decrement();
      running_.Increment();
      const prometheus::Labels labels = {{"job_id", snap.id}};
      job.epoch = &job_epoch_.Add(labels);
      job.planned = &job_planned_.Add(labels);
      job.planned->Set(snap.spec.epochs);
      for (const engine::RankPlacement& rank : snap.ranks) {
        job.ranks.push_back(&job_rank_.Add({{"job_id", snap.id},
                                            {"rank", std::to_string(rank.rank)},
                                            {"device", rank.device},
                                            {"node", rank.node}}));
        job.ranks.back()->Set(1);
      }
      return;
    }
    if (!engine::IsTerminal(snap.state)) return;
    if (previous == engine::JobState::kQueued) queued_.Decrement();
    if (previous == engine::JobState::kRunning) running_.Decrement();
    finished_.Add({{"state", StateLabel(snap.state)}}).Increment();
    if (snap.start_time != absl::InfinitePast()) {
      duration_.Add({{"state", StateLabel(snap.state)}}, kJobDurationBuckets)
          .Observe(snap.wall_seconds);
    }
    // The syncs after the last epoch (the parameter read-back at the end).
    if (snap.host_syncs > job.host_syncs) {
      host_syncs_.Increment(static_cast<double>(snap.host_syncs - job.host_syncs));
      job.host_syncs = snap.host_syncs;
    }
    if (snap.report.collective_seconds > 0) {
      collective_seconds_.Increment(snap.report.collective_seconds);
      if (job.epoch != nullptr) {
        job.collective = &job_collective_.Add({{"job_id", snap.id}});
        job.collective->Set(snap.report.collective_seconds);
      }
    }
    const absl::Time now = absl::Now();
    job.ended = now;
    if (job.epoch == nullptr) {
      jobs_.erase(it);  // never ran: no series to keep (`job` is gone with it)
    } else {
      ended_.push_back(snap.id);
    }
    // Also here, not only at scrape time: a daemon nobody scrapes must not keep every job's
    // series.
    ExpireLocked(now);
  }

  // Removes the series of jobs that ended ttl_ ago or more, and of the oldest ended jobs beyond
  // kMaxEndedJobSeries. ended_ is in end order, so this stops at the first job to keep.
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!ended_.empty()) {
      auto it = jobs_.find(ended_.front());
      const bool expired = it == jobs_.end() || now - *it->second.ended >= ttl_ ||
                           ended_.size() > kMaxEndedJobSeries;
      if (!expired) break;
      if (it != jobs_.end()) {
        RemoveSeries(it->second);
        jobs_.erase(it);
      }
      ended_.pop_front();
    }
  }

  void OnEpoch(const engine::JobEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(event.job_id);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    epochs_.Increment();
    if (event.steps > job.steps) steps_.Increment(static_cast<double>(event.steps - job.steps));
    job.steps = event.steps;
    samples_.Increment(static_cast<double>(event.rows_per_epoch));
    if (event.host_syncs > job.host_syncs) {
      host_syncs_.Increment(static_cast<double>(event.host_syncs - job.host_syncs));
    }
    job.host_syncs = event.host_syncs;
    if (job.epoch == nullptr) return;
    const prometheus::Labels labels = {{"job_id", event.job_id}};
    job.epoch->Set(event.epoch.epoch);
    if (job.loss == nullptr) job.loss = &job_loss_.Add(labels);
    if (job.rate == nullptr) job.rate = &job_rate_.Add(labels);
    job.loss->Set(event.epoch.loss);
    job.rate->Set(event.samples_per_second);
  }

  void RemoveSeries(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job.epoch != nullptr) job_epoch_.Remove(job.epoch);
    if (job.planned != nullptr) job_planned_.Remove(job.planned);
    if (job.loss != nullptr) job_loss_.Remove(job.loss);
    if (job.rate != nullptr) job_rate_.Remove(job.rate);
    for (prometheus::Gauge* rank : job.ranks) job_rank_.Remove(rank);
    job.ranks.clear();
    if (job.collective != nullptr) job_collective_.Remove(job.collective);
    job.epoch = job.planned = job.loss = job.rate = job.collective = nullptr;
  }

  const absl::Duration ttl_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);  // not yet ended, or series kept
  std::deque<std::string> ended_ ABSL_GUARDED_BY(mu_);    // ended jobs with series, oldest first
  prometheus::Counter& submitted_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Gauge& queued_;
  prometheus::Gauge& running_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Counter& epochs_;
  prometheus::Counter& steps_;
  prometheus::Counter& samples_;
  prometheus::Counter& host_syncs_;
  prometheus::Family<prometheus::Gauge>& job_epoch_;
  prometheus::Family<prometheus::Gauge>& job_planned_;
  prometheus::Family<prometheus::Gauge>& job_loss_;
  prometheus::Family<prometheus::Gauge>& job_rate_;
  prometheus::Family<prometheus::Gauge>& job_rank_;
  prometheus::Family<prometheus::Gauge>& job_collective_;
  prometheus::Counter& collective_seconds_;
};

// Series computed at scrape time from the engine, the sampler and /proc. Also expires the
// per-job series, since a scrape is when their absence matters.
class Metrics::ScrapeCollector final : public prometheus::Collectable {
 public:
  ScrapeCollector(MetricsOptions options, std::shared_ptr<JobObserver> observer)
      : options_(std::move(options)), observer_(std::move(observer)) {}

  void SetEngine(const engine::Engine* engine) {
    absl::MutexLock lock(&mu_);
    engine_ = engine;
  }
  void SetSampler(const monitor::DeviceSampler* sampler) {
    absl::MutexLock lock(&mu_);
    sampler_ = sampler;
  }
  void SetAuthRejections(std::function<int64_t()> read) {
    absl::MutexLock lock(&mu_);
    auth_rejections_ = std::move(read);
  }
  void SetAuthTokens(std::function<int64_t()> read) {
    absl::MutexLock lock(&mu_);
    auth_tokens_ = std::move(read);
  }

  std::vector<MetricFamily> Collect() const override {
    observer_->Expire(absl::Now());
    std::vector<MetricFamily> out;
    MetricFamily build =
        Family("trainerd_build_info", "What is running; the value is 1.", MetricType::Gauge);
    build.metric.push_back(Value(1, {{"cuda_version", options_.cuda_version},
                                     {"libtorch_version", options_.libtorch_version},
                                     {"version", options_.version}}));
    out.push_back(std::move(build));

    absl::MutexLock lock(&mu_);
    if (engine_ != nullptr) CollectEngine(out);
    if (sampler_ != nullptr) CollectDevices(out);
    if (auth_rejections_) {
      MetricFamily rejected =
          Family("trainerd_auth_rejected_total",
                 "Calls refused UNAUTHENTICATED: no valid bearer token or client certificate.",
                 MetricType::Counter);
      rejected.metric.push_back(Value(static_cast<double>(auth_rejections_())));
      out.push_back(std::move(rejected));
    }
    if (auth_tokens_) {
      MetricFamily tokens =
          Family("trainerd_auth_tokens",
                 "Bearer tokens valid now (--auth_token_file); 0 means every token is revoked.",
                 MetricType::Gauge);
      tokens.metric.push_back(Value(static_cast<double>(auth_tokens_())));
      out.push_back(std::move(tokens));
    }
    CollectProcess(out);
    return out;
  }

 private:
  void CollectEngine(std::vector<MetricFamily>& out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<std::string, std::pair<int64_t, int64_t>> by_device;  // count, bytes
    for (const std::string& device : engine_->devices()) by_device[device] = {0, 0};
    for (const engine::DatasetMeta& meta : engine_->ListDatasets()) {
      if (meta.location != engine::DatasetLocation::kDevice) continue;  // on disk only
      auto& [count, bytes] = by_device[meta.device];
      ++count;
      bytes += meta.size_bytes;
    }
    MetricFamily datasets = Family("trainerd_datasets", "Resident datasets.", MetricType::Gauge);
    MetricFamily bytes =
        Family("trainerd_dataset_resident_bytes", "Bytes of resident datasets.", MetricType::Gauge);
    const engine::Engine::MemoryAccount memory = engine_->memory_account();
    MetricFamily evictions =
        Family("trainerd_dataset_evictions_total",
               "Datasets dropped from device memory to make room under --device_memory_budget "
               "(they load again when a job needs them).",
               MetricType::Counter);
    for (const auto& [device, figures] : by_device) {
      datasets.metric.push_back(Value(static_cast<double>(figures.first), {{"device", device}}));
      bytes.metric.push_back(Value(static_cast<double>(figures.second), {{"device", device}}));
      evictions.metric.push_back(
          Value(device == memory.device ? static_cast<double>(memory.evictions) : 0.0,
                {{"device", device}}));
    }
    out.push_back(std::move(datasets));
    out.push_back(std::move(bytes));
    out.push_back(std::move(evictions));
    if (memory.budget_bytes > 0) {
      MetricFamily budget = Family("trainerd_device_memory_budget_bytes",
                                   "The device memory that resident datasets and running jobs' "
                                   "working sets may use together (--device_memory_budget).",
                                   MetricType::Gauge);
      budget.metric.push_back(
          Value(static_cast<double>(memory.budget_bytes), {{"device", memory.device}}));
      out.push_back(std::move(budget));
    }
    MetricFamily reserved = Family("trainerd_job_memory_reserved_bytes",
                                   "The estimated working sets of the running jobs on the device, "
                                   "reserved against its memory budget.",
                                   MetricType::Gauge);
    reserved.metric.push_back(
        Value(static_cast<double>(memory.reserved_job_bytes), {{"device", memory.device}}));
    out.push_back(std::move(reserved));
    MetricFamily h2d = Family("trainerd_host_to_device_bytes_total",
                              "Bytes copied from the host to a device (dataset uploads to a GPU, "
                              "jobs on a device other than their dataset's).",
                              MetricType::Counter);
    h2d.metric.push_back(Value(static_cast<double>(engine_->host_to_device_bytes())));
    out.push_back(std::move(h2d));
    MetricFamily staged = Family("trainerd_upload_staged_bytes",
                                 "Host memory staged by the dataset uploads in progress (bounded "
                                 "by --max_upload_bytes_in_flight).",
                                 MetricType::Gauge);
    staged.metric.push_back(Value(static_cast<double>(engine_->staged_upload_bytes())));
    out.push_back(std::move(staged));
    const engine::DiskUsage disk = engine_->disk_usage();
    MetricFamily usage = Family("trainerd_disk_usage_bytes",
                                "Bytes the data folder holds on disk, by kind (measured at most "
                                "every 10 s).",
                                MetricType::Gauge);
    for (const auto& [kind, value] :
         std::vector<std::pair<const char*, int64_t>>{{"datasets", disk.datasets},
                                                      {"models", disk.models},
                                                      {"checkpoints", disk.checkpoints},
                                                      {"modules", disk.modules},
                                                      {"records", disk.records}}) {
      usage.metric.push_back(Value(static_cast<double>(value), {{"kind", kind}}));
    }
    out.push_back(std::move(usage));
    if (disk.free_bytes >= 0) {
      MetricFamily free = Family("trainerd_disk_free_bytes",
                                 "Bytes still free for trainerd on the file system of its data "
                                 "folder (statvfs f_bavail); uploads, checkpoints and models need "
                                 "it (deploy/prometheus/alerts.yml: TrainerdDiskAlmostFull).",
                                 MetricType::Gauge);
      free.metric.push_back(Value(static_cast<double>(disk.free_bytes)));
      out.push_back(std::move(free));
      MetricFamily total = Family("trainerd_disk_total_bytes",
                                  "Size of the file system of the data folder.", MetricType::Gauge);
      total.metric.push_back(Value(static_cast<double>(disk.total_bytes)));
      out.push_back(std::move(total));
    }
    // The sandbox of the processes that run submitted code (sandbox_policy.h): one series per
    // program and part, fixed in number (two programs, six parts).
    const std::vector<engine::WorkerSandboxStatus> sandboxes = engine_->WorkerSandboxes();
    if (!sandboxes.empty()) {
      MetricFamily parts =
          Family("trainerd_worker_sandbox",
                 "1 when the process that runs submitted code (program: trainerd-module-check, "
                 "trainerd-worker) had this part of its sandbox when it last started, else 0. "
                 "Required: landlock, seccomp, no_new_privileges, not_dumpable; shown: "
                 "network_namespace, other_user (docs/SECURITY.md).",
                 MetricType::Gauge);
      MetricFamily refused =
          Family("trainerd_worker_sandbox_refused",
                 "1 when that process lacked a required part that --worker_sandbox_may_lack does "
                 "not accept: TorchScript jobs are refused (deploy/prometheus/alerts.yml: "
                 "TrainerdWorkerSandboxIncomplete).",
                 MetricType::Gauge);
      for (const engine::WorkerSandboxStatus& status : sandboxes) {
        const SandboxReport& r = status.report;
        for (const auto& [part, has] : std::vector<std::pair<absl::string_view, bool>>{
                 {kSandboxLandlock, r.landlock},
                 {kSandboxSeccomp, r.seccomp},
                 {kSandboxNoNewPrivileges, r.no_new_privileges},
                 {kSandboxNotDumpable, r.not_dumpable},
                 {kSandboxNetworkNamespace, r.network_namespace},
                 {kSandboxOtherUser, r.other_user}}) {
          parts.metric.push_back(
              Value(has ? 1 : 0, {{"program", r.program}, {"part", std::string(part)}}));
        }
        refused.metric.push_back(Value(status.missing.empty() ? 0 : 1, {{"program", r.program}}));
      }
      out.push_back(std::move(parts));
      out.push_back(std::move(refused));
    }
    MetricFamily damaged = Family("trainerd_job_records_damaged",
                                  "Unfinished jobs set aside at the start because their records "
                                  "could not be read (each is named in the log).",
                                  MetricType::Gauge);
    damaged.metric.push_back(Value(static_cast<double>(engine_->job_records_set_aside())));
    out.push_back(std::move(damaged));
  }

  void CollectDevices(std::vector<MetricFamily>& out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    MetricFamily util = Family("trainerd_gpu_utilization_ratio",
                               "NVML utilization: fraction of the last sample period in which "
                               "some kernel ran.",
                               MetricType::Gauge);
    MetricFamily sm = Family("trainerd_gpu_sm_activity_ratio",
                             "NVML GPM SM activity (Hopper and later): fraction of SM time busy.",
                             MetricType::Gauge);
    MetricFamily used = Family("trainerd_gpu_memory_used_bytes",
                               "Device memory in use (all processes).", MetricType::Gauge);
    MetricFamily total =
        Family("trainerd_gpu_memory_total_bytes", "Device memory.", MetricType::Gauge);
    MetricFamily power = Family("trainerd_gpu_power_watts", "Board power draw.", MetricType::Gauge);
    MetricFamily temperature =
        Family("trainerd_gpu_temperature_celsius", "GPU core temperature.", MetricType::Gauge);
    for (const monitor::DeviceReading& r : sampler_->Latest()) {
      if (r.device == "cpu") continue;
      const std::vector<ClientMetric::Label> labels = {
          {"device", r.device}, {"name", r.name}, {"uuid", r.uuid}};
      if (r.utilization) util.metric.push_back(Value(*r.utilization, labels));
      if (r.sm_activity) sm.metric.push_back(Value(*r.sm_activity, labels));
      used.metric.push_back(Value(static_cast<double>(r.memory_used_bytes), labels));
      total.metric.push_back(Value(static_cast<double>(r.memory_total_bytes), labels));
      if (r.power_watts) power.metric.push_back(Value(*r.power_watts, labels));
      if (r.temperature_celsius)
        temperature.metric.push_back(Value(*r.temperature_celsius, labels));
    }
    for (MetricFamily* f : {&util, &sm, &used, &total, &power, &temperature}) {
      if (!f->metric.empty()) out.push_back(std::move(*f));
    }
  }

  static void CollectProcess(std::vector<MetricFamily>& out) {
    absl::StatusOr<monitor::ProcessStats> stats = monitor::ReadProcessStats();
    if (!stats.ok()) return;
    MetricFamily cpu =
        Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
               MetricType::Counter);
    cpu.metric.push_back(Value(stats->cpu_seconds));
    MetricFamily rss = Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                              MetricType::Gauge);
    rss.metric.push_back(Value(static_cast<double>(stats->resident_bytes)));
    out.push_back(std::move(cpu));
    out.push_back(std::move(rss));
    // The names every Prometheus client library's process collector uses.
    const monitor::DescriptorStats descriptors = monitor::ReadDescriptorStats();
    if (descriptors.open_fds >= 0) {
      MetricFamily open =
          Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge);
      open.metric.push_back(Value(static_cast<double>(descriptors.open_fds)));
      out.push_back(std::move(open));
    }
    if (descriptors.max_fds >= 0) {
      MetricFamily max =
          Family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge);
      max.metric.push_back(Value(static_cast<double>(descriptors.max_fds)));
      out.push_back(std::move(max));
    }
  }

  const MetricsOptions options_;
  const std::shared_ptr<JobObserver> observer_;
  mutable absl::Mutex mu_;
  const engine::Engine* engine_ ABSL_GUARDED_BY(mu_) = nullptr;
  const monitor::DeviceSampler* sampler_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::function<int64_t()> auth_rejections_ ABSL_GUARDED_BY(mu_);
  std::function<int64_t()> auth_tokens_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics(MetricsOptions options)
    : registry_(std::make_shared<prometheus::Registry>()),
      observer_(std::make_shared<JobObserver>(*registry_, options.job_series_ttl)),
      scrape_(std::make_shared<ScrapeCollector>(options, observer_)),
      grpc_requests_(&prometheus::BuildCounter()
                          .Name("trainerd_grpc_requests_total")
                          .Help("Finished RPCs by full method name and gRPC status code.")
                          .Register(*registry_)),
      grpc_duration_(&prometheus::BuildHistogram()
                          .Name("trainerd_grpc_request_duration_seconds")
                          .Help("RPC latency, first byte in to status out (streams: their whole "
                                "life), by full method name.")
                          .Register(*registry_)) {}

Metrics::~Metrics() = default;

std::shared_ptr<engine::JobEventSink> Metrics::job_observer() { return observer_; }

void Metrics::ObserveRpc(absl::string_view method, absl::string_view code, double seconds) {
  const std::string label = RpcMethodLabel(method);
  grpc_requests_->Add({{"method", label}, {"code", std::string(code)}}).Increment();
  grpc_duration_->Add({{"method", label}}, kRpcDurationBuckets).Observe(seconds);
}

void Metrics::SetEngine(const engine::Engine* engine) { scrape_->SetEngine(engine); }

void Metrics::SetSampler(const monitor::DeviceSampler* sampler) { scrape_->SetSampler(sampler); }

void Metrics::SetAuthRejections(std::function<int64_t()> read) {
  scrape_->SetAuthRejections(std::move(read));
}

void Metrics::SetAuthTokens(std::function<int64_t()> read) {
  scrape_->SetAuthTokens(std::move(read));
}

absl::StatusOr<int> Metrics::Serve(const std::string& address, http::HttpEndpointOptions options) {
  options.path = "/metrics";
  absl::StatusOr<std::unique_ptr<http::HttpEndpoint>> endpoint =
      http::HttpEndpoint::Start(address, std::move(options), [this] { return Render(); });
  if (!endpoint.ok()) {
    return absl::Status(endpoint.status().code(),
                        absl::StrCat("cannot serve metrics: ", endpoint.status().message()));
  }
  endpoint_ = *std::move(endpoint);
  return endpoint_->port();
}

std::string Metrics::Render() const {
  // The scrape-time part first: it also expires per-job series, which the registry then omits.
  std::vector<MetricFamily> scraped = scrape_->Collect();
  std::vector<MetricFamily> families = registry_->Collect();
  for (MetricFamily& f : scraped) families.push_back(std::move(f));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace trainerd::metrics
