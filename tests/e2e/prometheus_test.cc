// End to end with Prometheus: the real trainerd's /metrics endpoint (docs/METRICS.md) checked by
// `promtool check metrics`, then scraped by a real Prometheus server while a job runs through the
// real trainctl, and deploy/grafana's dashboard checked against what the endpoint exports and what
// that Prometheus answers. Prometheus and promtool come from Debian's `prometheus` package
// (deploy/install-deps.sh); the tests skip when they are missing.
#include <arpa/inet.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/free_port.h"
#include "tests/e2e/subprocess.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::e2e {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using google::protobuf::Value;

constexpr int kEpochs = 20;

// --- small helpers -------------------------------------------------------------------------------

// An executable named `name` on $PATH (or in /usr/bin, /usr/local/bin), or "".
std::string FindExecutable(const std::string& name) {
  std::string path = std::getenv("PATH") == nullptr ? "" : std::getenv("PATH");
  path += ":/usr/bin:/usr/local/bin";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using trainerd::testing::FreePort;  // tests/support/free_port.h

struct HttpResponse {
  int status = 0;  // 0: no connection or no valid response
  std::string headers;
  std::string body;
};

// GET http://<hostport><target> with HTTP/1.0 (so no keep-alive and, from Go's and civetweb's
// servers, no chunked encoding; chunked bodies are decoded anyway). Every read and write times
// out after `timeout_s`.
HttpResponse HttpGet(const std::string& hostport, const std::string& target, int timeout_s = 10) {
  HttpResponse response;
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return response;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(hostport.c_str() + colon + 1)));
  if (::inet_pton(AF_INET, hostport.substr(0, colon).c_str(), &addr.sin_addr) != 1) return response;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return response;
  }
  const std::string request =
      "GET " + target + " HTTP/1.0\r\nHost: " + hostport + "\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return response;
  }
  std::string raw;
  char buf[16384];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (raw.compare(0, 5, "HTTP/") != 0 || end == std::string::npos) return response;
  response.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  response.headers = raw.substr(0, end);
  response.body = raw.substr(end + 4);
  std::string lower = response.headers;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("transfer-encoding: chunked") != std::string::npos) {
    std::string decoded;
    size_t at = 0;
    while (at < response.body.size()) {
      const size_t eol = response.body.find("\r\n", at);
      if (eol == std::string::npos) break;
      const size_t size = std::strtoul(response.body.substr(at, eol - at).c_str(), nullptr, 16);
      if (size == 0) break;
      decoded += response.body.substr(eol + 2, size);
      at = eol + 2 + size + 2;
    }
    response.body = decoded;
  }
  return response;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  char hex[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

bool ParseJson(const std::string& json, Value* value) {
  return google::protobuf::util::JsonStringToMessage(json, value).ok();
}

// value["key"], or a null Value.
const Value& Field(const Value& value, const std::string& key) {
  static const Value* const kNull = new Value();
  if (value.kind_case() != Value::kStructValue) return *kNull;
  const auto& fields = value.struct_value().fields();
  auto it = fields.find(key);
  return it == fields.end() ? *kNull : it->second;
}

// Every string value stored under `key`, anywhere in `value`.
void CollectStrings(const Value& value, const std::string& key, std::vector<std::string>* out) {
  if (value.kind_case() == Value::kStructValue) {
    for (const auto& [k, v] : value.struct_value().fields()) {
      if (k == key && v.kind_case() == Value::kStringValue) out->push_back(v.string_value());
      CollectStrings(v, key, out);
    }
  } else if (value.kind_case() == Value::kListValue) {
    for (const Value& v : value.list_value().values()) CollectStrings(v, key, out);
  }
}

// Reads one stdout line of `daemon`, giving up (and killing the child, so that the blocked read
// ends) after `timeout`.
bool ReadLineWithin(Daemon* daemon, std::string* line, std::chrono::seconds timeout) {
  auto reader = std::async(std::launch::async, [daemon, line] { return daemon->ReadLine(line); });
  if (reader.wait_for(timeout) == std::future_status::timeout) {
    ::kill(daemon->pid(), SIGKILL);
    reader.wait();
    return false;
  }
  return reader.get();
}

// The seed question's data: y = 1 + 2x + 0.1 * noise, 800 rows (as in e2e_test.cc).
std::string SeedCsv() {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::string csv = "x,y\n";
  for (int i = 0; i < 800; ++i) {
    const double x = uniform(rng);
    char line[64];
    std::snprintf(line, sizeof(line), "%.9g,%.9g\n", x, 1 + 2 * x + 0.1 * noise(rng));
    csv += line;
  }
  return csv;
}

// Metric names in the text exposition format: those with a `# TYPE` line and those with samples
// (histogram samples under their family's name).
std::set<std::string> ExposedNames(const std::string& exposition) {
  std::set<std::string> names;
  std::stringstream lines(exposition);
  std::string line;
  const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) )");
  const std::regex sample_line(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ])");
  std::smatch m;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, m, type_line) || std::regex_search(line, m, sample_line)) {
      names.insert(m[1]);
    }
  }
  return names;
}

std::string StripHistogramSuffix(const std::string& name) {
  for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return name.substr(0, name.size() - suffix.size());
    }
  }
  return name;
}

// --- fixture -------------------------------------------------------------------------------------

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    promtool_ = FindExecutable("promtool");
    prometheus_bin_ = FindExecutable("prometheus");
    if (promtool_.empty() || prometheus_bin_.empty()) {
      GTEST_SKIP() << "prometheus and promtool are not installed (Debian package `prometheus`): "
                      "run deploy/install-deps.sh";
    }
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainerd-prom-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    StartDaemon();
  }

  void TearDown() override {
    if (prometheus_ != nullptr) prometheus_->Stop(SIGKILL);
    prometheus_.reset();
    daemon_.reset();  // SIGKILL if still running
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void StartDaemon() {
    daemon_ = std::make_unique<Daemon>(std::vector<std::string>{
        TRAINERD_BIN, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
        "--data_dir=" + (dir_ / "data").string(), "--device=cpu",
        // Two canned GPUs (tests/monitor/fake_nvml.cc): the GPU series exist on every machine.
        std::string("--nvml_library=") + FAKE_NVML_PATH});
    // "trainerd listening on HOST:PORT (device X)", then "trainerd metrics on http://H:P/metrics".
    std::string line;
    for (int i = 0; i < 20 && metrics_addr_.empty(); ++i) {
      ASSERT_TRUE(ReadLineWithin(daemon_.get(), &line, std::chrono::seconds(60)))
          << "trainerd exited or printed no metrics line; stderr: " << daemon_->Stderr();
      const std::string listening = "trainerd listening on ";
      const std::string metrics = "trainerd metrics on http://";
      if (line.rfind(listening, 0) == 0) {
        const size_t from = listening.size();
        addr_ = line.substr(from, line.find(' ', from) - from);
      } else if (line.rfind(metrics, 0) == 0) {
        const size_t from = metrics.size();
        const size_t slash = line.find('/', from);
        ASSERT_NE(slash, std::string::npos) << line;
        metrics_addr_ = line.substr(from, slash - from);
        metrics_path_ = line.substr(slash);
      }
    }
    ASSERT_FALSE(addr_.empty());
    ASSERT_FALSE(metrics_addr_.empty());
    ASSERT_EQ(metrics_path_, "/metrics");
    ASSERT_EQ(metrics_addr_.rfind("127.0.0.1:", 0), 0u) << metrics_addr_;
    ASSERT_NE(metrics_addr_, "127.0.0.1:0") << "the metrics line must name the bound port";
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

  std::string ScrapeMetrics() {
    HttpResponse r = HttpGet(metrics_addr_, metrics_path_);
    EXPECT_EQ(r.status, 200) << r.headers;
    EXPECT_THAT(r.headers, HasSubstr("text/plain")) << "Prometheus text exposition format";
    return r.body;
  }

  // `promtool check metrics` on `exposition`. Lint problems count as failures: the endpoint is
  // new and its names are ours to get right (docs/METRICS.md follows Prometheus's rules).
  void ExpectPromtoolClean(const std::string& exposition, const std::string& what) {
    const std::string file = WriteFile("metrics-" + what + ".txt", exposition);
    RunResult r =
        e2e::Run({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool_, file});
    EXPECT_EQ(r.exit_code, 0) << "promtool check metrics (" << what << "):\n"
                              << r.out << r.err << "\n--- exposition ---\n"
                              << exposition;
  }

  // Starts Prometheus with deploy/prometheus/prometheus.yml, pointed at this test's trainerd and
  // scraping every second, on a free loopback port (retrying when that port was taken).
  void StartPrometheus() {
    const std::string repo_config =
        std::string(TRAINERD_SOURCE_DIR) + "/deploy/prometheus/prometheus.yml";
    RunResult check = e2e::Run({promtool_, "check", "config", repo_config});
    ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
    std::string config = ReadFile(repo_config);
    auto replace_all = [&config](const std::string& from, const std::string& to) {
      size_t count = 0;
      for (size_t at = config.find(from); at != std::string::npos; at = config.find(from, at)) {
        config.replace(at, from.size(), to);
        at += to.size();
        ++count;
      }
      return count;
    };
    ASSERT_GE(replace_all("\"127.0.0.1:9400\"", "\"" + metrics_addr_ + "\""), 1u);
    ASSERT_GE(replace_all("scrape_interval: 5s", "scrape_interval: 1s"), 1u);
    replace_all("scrape_timeout: 4s", "scrape_timeout: 1s");
    replace_all("evaluation_interval: 5s", "evaluation_interval: 1s");
    // The rules it names travel with it (rule_files is relative to the config's folder).
    WriteFile("alerts.yml",
              ReadFile(std::string(TRAINERD_SOURCE_DIR) + "/deploy/prometheus/alerts.yml"));
    const std::string config_path = WriteFile("prometheus.yml", config);
    check = e2e::Run({promtool_, "check", "config", config_path});
    ASSERT_EQ(check.exit_code, 0) << check.out << check.err << "\n" << config;

    for (int attempt = 0; attempt < 5; ++attempt) {
      const int port = FreePort();
      ASSERT_GT(port, 0);
      prom_addr_ = "127.0.0.1:" + std::to_string(port);
      const std::string tsdb = (dir_ / ("tsdb-" + std::to_string(attempt))).string();
      prometheus_ = std::make_unique<Daemon>(std::vector<std::string>{
          prometheus_bin_, "--config.file=" + config_path, "--storage.tsdb.path=" + tsdb,
          "--web.listen-address=" + prom_addr_, "--log.level=warn"});
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (Clock::now() < deadline) {
        if (HttpGet(prom_addr_, "/-/ready", 2).status == 200) return;
        if (prometheus_->Stderr().find("address already in use") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      const std::string err = prometheus_->Stderr();
      prometheus_->Stop(SIGKILL);
      prometheus_.reset();
      ASSERT_THAT(err, HasSubstr("address already in use")) << "prometheus did not become ready";
    }
    FAIL() << "no free port for prometheus after 5 attempts";
  }

  // GET /api/v1/query; the `data.result` list (empty on any error, which is recorded).
  std::vector<Value> Query(const std::string& promql, std::string* error = nullptr) {
    HttpResponse r = HttpGet(prom_addr_, "/api/v1/query?query=" + UrlEncode(promql));
    Value v;
    if (r.status != 200 || !ParseJson(r.body, &v) ||
        Field(v, "status").string_value() != "success") {
      if (error != nullptr) *error = std::to_string(r.status) + " " + r.body;
      return {};
    }
    if (error != nullptr) error->clear();
    const auto& list = Field(Field(v, "data"), "result").list_value().values();
    return std::vector<Value>(list.begin(), list.end());
  }

  static std::string Label(const Value& sample, const std::string& name) {
    return Field(Field(sample, "metric"), name).string_value();
  }
  // An instant vector sample's value, as Prometheus writes it ("1", "0.25", "NaN").
  static std::string SampleValue(const Value& sample) {
    const auto& pair = Field(sample, "value").list_value().values();
    return pair.size() == 2 ? pair[1].string_value() : "";
  }

  // Polls `promql` until `ok` accepts its result; false once `deadline` has passed (after one
  // query at least).
  bool WaitFor(const std::string& promql, const std::function<bool(const std::vector<Value>&)>& ok,
               Clock::time_point deadline, std::string* last) {
    while (true) {
      std::string error;
      std::vector<Value> result = Query(promql, &error);
      if (ok(result)) return true;
      *last = error;
      for (const Value& s : result) {
        std::string json;
        (void)google::protobuf::util::MessageToJsonString(s, &json);
        *last += json + " ";
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }

  // WaitFor a result of exactly one series whose value `ok` accepts.
  bool WaitForOne(const std::string& promql, const std::function<bool(const std::string&)>& ok,
                  Clock::time_point deadline, std::string* last) {
    return WaitFor(
        promql,
        [&ok](const std::vector<Value>& r) { return r.size() == 1 && ok(SampleValue(r[0])); },
        deadline, last);
  }

  std::string promtool_, prometheus_bin_;
  std::filesystem::path dir_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Daemon> prometheus_;
  std::string addr_, metrics_addr_, metrics_path_, prom_addr_;
};

// --- tests ---------------------------------------------------------------------------------------

TEST_F(PrometheusTest, FreshDaemonMetricsPassPromtool) {
  const std::string exposition = ScrapeMetrics();
  ASSERT_FALSE(exposition.empty());
  ExpectPromtoolClean(exposition, "fresh");
  const std::set<std::string> names = ExposedNames(exposition);
  for (const char* name :
       {"trainerd_build_info", "trainerd_jobs_submitted_total", "trainerd_jobs_queued",
        "trainerd_jobs_running", "trainerd_epochs_total", "process_cpu_seconds_total",
        "process_resident_memory_bytes", "process_open_fds", "process_max_fds",
        // (SM activity is a rate between two GPM samples: not in the first.)
        "trainerd_gpu_utilization_ratio", "trainerd_gpu_memory_used_bytes",
        "trainerd_gpu_memory_total_bytes", "trainerd_gpu_power_watts",
        "trainerd_gpu_temperature_celsius"}) {
    EXPECT_TRUE(names.count(name)) << name << " missing from a fresh daemon's /metrics";
  }
  // Unknown paths are not the metrics page.
  EXPECT_NE(HttpGet(metrics_addr_, "/nope").status, 200);
  // The sandbox of submitted code, measured at the start (a checker started and left waiting):
  // one series per part, and whether TorchScript jobs are refused.
  std::string sandboxed;
  for (int i = 0; i < 300 && sandboxed.find("trainerd_worker_sandbox_refused") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    sandboxed = ScrapeMetrics();
  }
  ExpectPromtoolClean(sandboxed, "with the sandbox");
  EXPECT_THAT(sandboxed,
              ::testing::HasSubstr(
                  "trainerd_worker_sandbox{program=\"trainerd-module-check\",part=\"seccomp\"} "
                  "1"));
  EXPECT_THAT(sandboxed, ::testing::HasSubstr(
                             "trainerd_worker_sandbox_refused{program=\"trainerd-module-check\"}"));
}

TEST_F(PrometheusTest, PrometheusScrapesAJobAndTheDashboardMatches) {
  const auto t0 = Clock::now();
  ASSERT_NO_FATAL_FAILURE(StartPrometheus());
  const auto t_prom = Clock::now();
  std::string last;
  auto in = [](int seconds) { return Clock::now() + std::chrono::seconds(seconds); };
  ASSERT_TRUE(WaitForOne(
      "up", [](const std::string& v) { return v == "1"; }, in(30), &last))
      << "target never up: " << last;
  ASSERT_TRUE(WaitFor(
      "trainerd_build_info",
      [this](const std::vector<Value>& r) {
        return r.size() == 1 && Label(r[0], "instance") == metrics_addr_ &&
               Label(r[0], "job") == "trainerd" && !Label(r[0], "version").empty();
      },
      in(30), &last))
      << last;

  // A short job through the real client.
  ASSERT_EQ(Ctl({"dataset", "upload", "seed", WriteFile("seed.csv", SeedCsv())}).exit_code, 0);
  const auto t_job = Clock::now();
  RunResult run = Ctl({"submit", "--dataset", "seed", "--model", "linear:1", "--loss", "mse",
                       "--optimizer", "sgd", "--lr", "0.1", "--batch-size", "16", "--epochs",
                       std::to_string(kEpochs), "--seed", "7", "--watch"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_THAT(run.out, HasSubstr("SUCCEEDED"));
  const std::string id = run.out.substr(0, run.out.find('\n'));
  ASSERT_THAT(id, ::testing::StartsWith("job-"));
  const auto t_done = Clock::now();
  RunResult get = Ctl({"-o", "json", "job", "get", id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  Value job;
  ASSERT_TRUE(ParseJson(get.out, &job)) << get.out;
  // int64 fields are JSON strings; field names lowerCamel or as in the .proto.
  const std::string steps = Field(job, "steps").string_value();
  std::string host_syncs = Field(job, "hostSyncs").string_value();
  if (host_syncs.empty()) host_syncs = Field(job, "host_syncs").string_value();
  EXPECT_EQ(steps, std::to_string(kEpochs * 50));  // 800 rows in batches of 16
  EXPECT_FALSE(host_syncs.empty());

  // ListDevices shows the fake NVML's GPUs, which this CPU-only LibTorch cannot use: marked, with
  // their readings and the reason.
  RunResult devices = Ctl({"-o", "json", "devices"});
  ASSERT_EQ(devices.exit_code, 0) << devices.err;
  v1::ListDevicesResponse listed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(devices.out, &listed).ok())
      << devices.out;
  ASSERT_EQ(listed.devices_size(), 3) << devices.out;
  EXPECT_EQ(listed.devices(0).device(), "cpu");
  EXPECT_EQ(listed.devices(0).unusable_reason(), "");
  for (int i = 1; i <= 2; ++i) {
    const v1::DeviceStatus& gpu = listed.devices(i);
    EXPECT_EQ(gpu.device(), absl::StrCat("cuda:", i - 1));
    EXPECT_EQ(gpu.name(), absl::StrCat("Fake GPU ", i - 1));
    EXPECT_THAT(gpu.unusable_reason(), HasSubstr("LibTorch sees no CUDA device"));
    EXPECT_EQ(gpu.memory_total_bytes(), int64_t{80} << 30);
    EXPECT_EQ(gpu.memory_used_bytes(), int64_t{1} << 30);
    ASSERT_TRUE(gpu.has_utilization());
    EXPECT_DOUBLE_EQ(gpu.utilization(), i == 1 ? 0.37 : 0.80);
  }
  RunResult table = Ctl({"devices"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("cuda:0 (unusable)"));
  EXPECT_THAT(table.out, HasSubstr("Fake GPU 1"));
  RunResult wide = Ctl({"devices", "-o", "wide", "--no-headers"});
  ASSERT_EQ(wide.exit_code, 0) << wide.err;
  EXPECT_THAT(wide.out, HasSubstr("LibTorch sees no CUDA device"));
  EXPECT_EQ(wide.out.find("DATASETS  RUNNING"), std::string::npos);  // no header line
  // trainctl version shows the driver that NVML reports.
  RunResult version = Ctl({"version"});
  ASSERT_EQ(version.exit_code, 0) << version.err;
  EXPECT_THAT(version.out, HasSubstr("\ndriver:    999.99.99\n"));

  // What Prometheus scraped: everything within one minute of the job's end.
  const auto one = in(60);
  EXPECT_TRUE(WaitFor(
      "trainerd_jobs_finished_total",
      [](const std::vector<Value>& r) {
        for (const Value& s : r) {
          if (Label(s, "state") == "succeeded") return SampleValue(s) == "1";
        }
        return false;
      },
      one, &last))
      << "trainerd_jobs_finished_total{state=\"succeeded\"} never 1: " << last;
  const std::string loss = "trainerd_job_loss{job_id=\"" + id + "\"}";
  EXPECT_TRUE(WaitForOne(
      loss, [](const std::string& v) { return std::strtod(v.c_str(), nullptr) > 0; }, one, &last))
      << "no " << loss << " series: " << last;
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"trainerd_epochs_total", std::to_string(kEpochs)},
      {"trainerd_job_epoch{job_id=\"" + id + "\"} / trainerd_job_epochs_planned", "1"},
      {"trainerd_jobs_submitted_total", "1"},
      {"trainerd_jobs_running + trainerd_jobs_queued", "0"},
      {"trainerd_job_duration_seconds_count{state=\"succeeded\"}", "1"},
      {"trainerd_steps_total", steps},            // as Job.steps
      {"trainerd_host_syncs_total", host_syncs},  // as Job.host_syncs
  };
  for (const auto& [promql, expected_value] : expected) {
    const std::string value = expected_value;  // (C++17 lambdas cannot capture bindings)
    EXPECT_TRUE(WaitForOne(
        promql, [&value](const std::string& v) { return v == value; }, one, &last))
        << promql << " never " << value << ": " << last;
  }
  // The client's RPCs, by full method name and status code name.
  const std::string submit_rpc =
      "trainerd_grpc_requests_total{method=\"/trainerd.v1.JobService/SubmitJob\",code=\"OK\"}";
  EXPECT_TRUE(WaitForOne(
      submit_rpc, [](const std::string& v) { return v == "1"; }, one, &last))
      << submit_rpc << " never 1: " << last;
  const std::string watch_latency =
      "trainerd_grpc_request_duration_seconds_count{method=\"/trainerd.v1.JobService/WatchJob\"}";
  EXPECT_TRUE(WaitForOne(
      watch_latency, [](const std::string& v) { return v == "1"; }, one, &last))
      << watch_latency << " never 1: " << last;
  // The GPU series, from the fake NVML's two devices (37% and 80% busy, 1 of 80 GiB used,
  // 123.456 W, 55 C; GPM SM activity 42.5% on the first only), as Prometheus stored them.
  const std::vector<std::pair<std::string, std::string>> gpu = {
      {"sum(trainerd_gpu_utilization_ratio)", "1.17"},
      {"count(trainerd_gpu_utilization_ratio)", "2"},
      {"count(trainerd_gpu_sm_activity_ratio)", "1"},
      {"max(trainerd_gpu_sm_activity_ratio)", "0.425"},
      {"max(trainerd_gpu_memory_total_bytes)", std::to_string(int64_t{80} << 30)},
      {"max(trainerd_gpu_memory_used_bytes)", std::to_string(int64_t{1} << 30)},
      {"max(trainerd_gpu_power_watts)", "123.456"},
      {"max(trainerd_gpu_temperature_celsius)", "55"},
  };
  for (const auto& [promql, expected_value] : gpu) {
    const std::string value = expected_value;
    EXPECT_TRUE(WaitForOne(
        promql,
        [&value](const std::string& v) {
          return std::fabs(std::strtod(v.c_str(), nullptr) - std::strtod(value.c_str(), nullptr)) <
                 1e-9 * std::max(1.0, std::strtod(value.c_str(), nullptr));
        },
        one, &last))
        << promql << " never " << value << ": " << last;
  }
  const auto t_scraped = Clock::now();

  // The endpoint after a job (per-job series, histograms with samples) still passes promtool.
  const std::string exposition = ScrapeMetrics();
  ExpectPromtoolClean(exposition, "after-job");
  const std::set<std::string> exposed = ExposedNames(exposition);

  // The Grafana dashboard: valid JSON, and every metric name it uses is documented and exported.
  const std::string dashboard_path =
      std::string(TRAINERD_SOURCE_DIR) + "/deploy/grafana/dashboards/trainerd.json";
  const std::string dashboard_text = ReadFile(dashboard_path);
  Value dashboard;
  ASSERT_TRUE(ParseJson(dashboard_text, &dashboard)) << dashboard_path << " is not valid JSON";
  EXPECT_GE(Field(dashboard, "schemaVersion").number_value(), 36);
  const std::string doc = ReadFile(std::string(TRAINERD_SOURCE_DIR) + "/docs/METRICS.md");
  const bool has_gpu = std::any_of(exposed.begin(), exposed.end(), [](const std::string& n) {
    return n.rfind("trainerd_gpu_", 0) == 0;
  });
  const std::regex name_re(R"(\b((?:trainerd|process)_[a-z_]+))");
  std::set<std::string> used;
  for (auto it = std::sregex_iterator(dashboard_text.begin(), dashboard_text.end(), name_re);
       it != std::sregex_iterator(); ++it) {
    used.insert(StripHistogramSuffix((*it)[1]));
  }
  EXPECT_GE(used.size(), 20u);
  for (const std::string& name : used) {
    EXPECT_THAT(doc, HasSubstr("`" + name + "`")) << name << " is not in docs/METRICS.md";
    // "GPM SM activity (Hopper and later) ... unset elsewhere".
    if (name == "trainerd_gpu_sm_activity_ratio" && !exposed.count(name)) continue;
    EXPECT_TRUE(exposed.count(name))
        << "the dashboard uses " << name << ", which trainerd's /metrics does not export";
  }
  EXPECT_TRUE(has_gpu) << "the fake NVML's devices gave no trainerd_gpu_* series";

  // Every query of the dashboard runs on this Prometheus (Grafana's variables filled in), and the
  // job-progress panel's vector match finds the job.
  std::vector<std::string> exprs;
  CollectStrings(dashboard, "expr", &exprs);
  CollectStrings(Field(dashboard, "templating"), "definition", &exprs);
  EXPECT_GE(exprs.size(), 20u);
  const std::vector<std::pair<std::string, std::string>> variables = {
      {"$__rate_interval", "1m"}, {"$__range", "5m"}, {"$window", "1h"}, {"$instance", ".+"}};
  bool progress_checked = false;
  for (std::string expr : exprs) {
    const std::string original = expr;
    for (const auto& [var, value] : variables) {
      for (size_t at = expr.find(var); at != std::string::npos; at = expr.find(var, at)) {
        expr.replace(at, var.size(), value);
      }
    }
    if (expr.rfind("label_values(", 0) == 0) {  // a Grafana variable query, not PromQL
      const std::string metric = expr.substr(13, expr.find(',') - 13);
      EXPECT_FALSE(Query(metric).empty()) << original;
      continue;
    }
    EXPECT_EQ(expr.find('$'), std::string::npos) << "unknown Grafana variable in " << original;
    std::string error;
    std::vector<Value> result = Query(expr, &error);
    EXPECT_TRUE(error.empty()) << "dashboard query fails: " << original << "\n" << error;
    if (expr.find("trainerd_job_epoch{") != std::string::npos &&
        expr.find("trainerd_job_epochs_planned") != std::string::npos) {
      progress_checked = true;
      ASSERT_EQ(result.size(), 1u) << original;
      EXPECT_EQ(Label(result[0], "job_id"), id);
      EXPECT_EQ(SampleValue(result[0]), "1");
    }
  }
  EXPECT_TRUE(progress_checked) << "no job-progress panel in the dashboard";

  EXPECT_EQ(prometheus_->Stop(SIGTERM), 0) << prometheus_->Stderr();
  prometheus_.reset();
  const auto ms = [](Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  std::cout << "[ timing ] prometheus ready " << ms(t_prom - t0) << " ms, job "
            << ms(t_done - t_job) << " ms, scraped results " << ms(t_scraped - t_done)
            << " ms after the job, total " << ms(Clock::now() - t0) << " ms\n";
}

}  // namespace
}  // namespace trainerd::e2e
