#include "tests/engine/engine_test_support.h"

#include <ftw.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <sstream>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "gtest/gtest.h"

namespace trainerd::engine::test_support {
namespace {

// Removes `path` and everything under it. Not std::filesystem::remove_all: the torch wheel's
// libtorch.so exports its own copy of libstdc++'s filesystem operations, which the dynamic linker
// binds ahead of Debian's libstdc++, and its remove_all calls a libstdc++ 13 internal
// (recursive_directory_iterator::__erase) that Debian 12's libstdc++ lacks: a call through null.
void RemoveTree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) { return ::remove(entry); },
      /*nopenfd=*/16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace

ScratchDir::ScratchDir() {
  static std::atomic<int> counter{0};
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test =
      info != nullptr ? absl::StrCat(info->test_suite_name(), ".", info->name()) : "no-test";
  path_ =
      absl::StrCat(::testing::TempDir(), "trainerd-engine-", test, "-", ::getpid(), "-", counter++);
  RemoveTree(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() { RemoveTree(path_); }

void EventRecorder::Push(const JobEvent& event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
  }
  cv_.notify_all();
}

std::optional<JobSnapshot> EventRecorder::WaitForTerminal(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<JobSnapshot> terminal;
  cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
    for (const JobEvent& event : events_) {
      if (event.kind == JobEvent::Kind::kState && IsTerminal(event.job.state)) {
        terminal = event.job;
        return true;
      }
    }
    return false;
  });
  return terminal;
}

bool EventRecorder::WaitForEpochs(size_t count, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
    return static_cast<size_t>(std::count_if(events_.begin(), events_.end(), [](const auto& e) {
             return e.kind == JobEvent::Kind::kEpoch;
           })) >= count;
  });
}

std::vector<JobEvent> EventRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

Table SeedTable(int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Table table;
  table.feature_shape = {1};
  table.target_shape = {1};
  table.target_dtype = TargetDType::kFloat32;
  table.rows = rows;
  for (int64_t i = 0; i < rows; ++i) {
    const float x = uniform(gen);
    const float noise = normal(gen);
    table.features.push_back(x);
    table.targets_f32.push_back(1.0f + 2.0f * x + 0.1f * noise);
  }
  return table;
}

Table RandomTable(int64_t rows, int64_t features, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Table table;
  table.feature_shape = {features};
  table.target_shape = {1};
  table.target_dtype = TargetDType::kFloat32;
  table.rows = rows;
  for (int64_t i = 0; i < rows * features; ++i) table.features.push_back(normal(gen));
  for (int64_t i = 0; i < rows; ++i) table.targets_f32.push_back(normal(gen));
  return table;
}

Table ClustersTable(int64_t rows, uint32_t seed) {
  constexpr float kCentres[3][2] = {{-4.0f, -4.0f}, {4.0f, -4.0f}, {0.0f, 4.0f}};
  std::mt19937 gen(seed);
  std::normal_distribution<float> spread(0.0f, 0.5f);
  Table table;
  table.feature_shape = {2};
  table.target_shape = {};
  table.target_dtype = TargetDType::kInt64;
  table.rows = rows;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t label = i % 3;
    table.features.push_back(kCentres[label][0] + spread(gen));
    table.features.push_back(kCentres[label][1] + spread(gen));
    table.targets_i64.push_back(label);
  }
  return table;
}

Table ClassTable(int64_t rows, int64_t first, int64_t last) {
  Table table;
  table.feature_shape = {2};
  table.target_shape = {};
  table.target_dtype = TargetDType::kInt64;
  table.rows = rows;
  for (int64_t i = 0; i < rows; ++i) {
    table.features.push_back(static_cast<float>(i));
    table.features.push_back(static_cast<float>(-i));
    table.targets_i64.push_back(first + i % (last - first + 1));
  }
  return table;
}

DatasetHeader HeaderFor(const std::string& name, const Table& table) {
  DatasetHeader header = HeaderForTable(name, table);
  header.sha256 = Sha256Hex(EncodePayload(table));
  return header;
}

absl::StatusOr<DatasetMeta> Upload(Engine& engine, const std::string& name, const Table& table,
                                   size_t chunk_bytes) {
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      engine.BeginUpload(HeaderFor(name, table));
  if (!session.ok()) return session.status();
  const std::string payload = EncodePayload(table);
  for (size_t offset = 0; offset < payload.size(); offset += chunk_bytes) {
    const absl::Status appended =
        (*session)->Append(std::string_view(payload).substr(offset, chunk_bytes));
    if (!appended.ok()) return appended;
  }
  return engine.CommitUpload(*std::move(session));
}

JobSpec SeedSpec(const std::string& dataset) {
  JobSpec spec;
  spec.dataset = dataset;
  spec.model = "linear:1";
  spec.loss = LossKind::kMse;
  spec.optimizer = OptimizerKind::kSgd;
  spec.learning_rate = 0.1;
  spec.batch_size = 16;
  spec.epochs = 100;
  spec.seed = 42;
  spec.device = "cpu";
  return spec;
}

std::string ScriptedLinearModule(const std::string& training_only) {
  torch::manual_seed(5);
  torch::jit::Module m("Net");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::randn({1, 1}), /*is_buffer=*/false);
  m.register_parameter("b", torch::zeros({1}), /*is_buffer=*/false);
  m.define(absl::StrCat("def forward(self, x):\n", "  if self.training:\n",
                        training_only.empty() ? "    pass\n" : training_only,
                        "  return torch.linear(x, self.w, self.b)\n"));
  std::ostringstream out;
  m.save(out);
  return out.str();
}

JobSpec BlockerSpec(const std::string& dataset) {
  JobSpec spec = SeedSpec(dataset);
  spec.epochs = 1000000;
  return spec;
}

absl::StatusOr<JobSnapshot> WaitForEnd(Engine& engine, const std::string& id) {
  auto recorder = std::make_shared<EventRecorder>();
  absl::StatusOr<JobSnapshot> now = engine.SubscribeJob(id, recorder);
  if (!now.ok()) return now.status();
  if (IsTerminal(now->state)) return now;
  std::optional<JobSnapshot> ended = recorder->WaitForTerminal();
  if (!ended.has_value()) {
    engine.UnsubscribeJob(id, recorder.get());
    return absl::DeadlineExceededError(absl::StrCat("job '", id, "' did not end in time"));
  }
  return *ended;
}

absl::StatusOr<JobSnapshot> RunJob(Engine& engine, const JobSpec& spec) {
  absl::StatusOr<JobSnapshot> queued = engine.SubmitJob(spec);
  if (!queued.ok()) return queued.status();
  return WaitForEnd(engine, queued->id);
}

void EngineFixture::SetUp() {
  engine_ = StartEngine(Options());
  ASSERT_NE(engine_, nullptr);
}

EngineOptions EngineFixture::Options() const {
  EngineOptions options;
  options.data_dir = dir_.path();
  options.device = "cpu";
  options.module_checker.program = TRAINERD_MODULE_CHECKER;
  options.jobs.worker.program = TRAINERD_WORKER;
  // Two cores whatever this machine has (as CI's), and one CPU job at a time, so that what a test
  // sees (threads, what queues behind what, a sweep's packs whole) does not depend on where it
  // runs; tests of the CPU's jobs at once set max_concurrent_jobs back to 0 (a job per core).
  options.jobs.cpu_cores = 2;
  options.jobs.max_concurrent_jobs = 1;
  return options;
}

std::unique_ptr<Engine> EngineFixture::StartEngine(const EngineOptions& options) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

std::string EngineFixture::DatasetPath(const std::string& name) const {
  return absl::StrCat(dir_.path(), "/datasets/", name, ".trds");
}

std::vector<double> Losses(const JobSnapshot& job) {
  std::vector<double> losses;
  for (const EpochResult& epoch : job.epochs) losses.push_back(epoch.loss);
  return losses;
}

const ParameterValues* FindParameter(const JobSnapshot& job, const std::string& name) {
  for (const ParameterValues& p : job.parameters) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace trainerd::engine::test_support
