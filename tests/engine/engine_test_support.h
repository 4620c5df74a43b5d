// Helpers shared by the engine tests: scratch data folders, synthetic datasets (the seed
// question's y = 1 + 2x + noise among them), uploads through the Engine, and an event recorder
// that lets a test wait on a job's events instead of sleeping.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/table.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/types.h"

namespace trainerd::engine::test_support {

// How long a test waits for an engine event before it gives up. A safety net for a hung engine,
// never a stand-in for synchronisation: every wait ends as soon as the event arrives.
inline constexpr absl::Duration kWaitTimeout = absl::Seconds(60);

// A fresh, empty folder under ::testing::TempDir(), named after the running test; removed (with
// everything in it) when destroyed. Not thread-safe.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Records every event of the jobs it is subscribed to and lets a test wait for them. Push only
// appends under a mutex and notifies, so it never blocks the engine for long. Thread-safe.
class EventRecorder final : public JobEventSink {
 public:
  void Push(const JobEvent& event) override;

  // Waits until a terminal state event arrives and returns the job it carries; nullopt after
  // `timeout`.
  std::optional<JobSnapshot> WaitForTerminal(absl::Duration timeout = kWaitTimeout);
  // Waits until at least `count` epoch events arrived; false after `timeout`.
  bool WaitForEpochs(size_t count, absl::Duration timeout = kWaitTimeout);

  std::vector<JobEvent> events() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<JobEvent> events_;  // guarded by mu_
};

// The seed question's data: 800 rows of x uniform in [0, 1) and y = 1 + 2x + 0.1 * N(0, 1), from
// a std::mt19937 seeded with `seed`. Features {1}, float32 targets {1}.
Table SeedTable(int64_t rows = 800, uint32_t seed = 42);

// `rows` rows of `features` standard-normal features and one float32 target each.
Table RandomTable(int64_t rows, int64_t features, uint32_t seed = 7);

// Three well separated 2-D clusters (centres (-4, -4), (4, -4), (0, 4), spread 0.5); int64 scalar
// class targets 0, 1, 2 in turn.
Table ClustersTable(int64_t rows = 300, uint32_t seed = 3);

// `rows` rows of 2 features with int64 scalar targets cycling through first..last.
Table ClassTable(int64_t rows, int64_t first, int64_t last);

// The header that describes `table`, with the payload's SHA-256.
DatasetHeader HeaderFor(const std::string& name, const Table& table);

// BeginUpload, Append in `chunk_bytes` pieces, CommitUpload.
absl::StatusOr<DatasetMeta> Upload(Engine& engine, const std::string& name, const Table& table,
                                   size_t chunk_bytes = 1000);

// The seed job: linear:1, mse, sgd lr 0.1, batch 16, 100 epochs, seed 42, on the CPU.
JobSpec SeedSpec(const std::string& dataset);

// A job that would run for a long time (a million epochs of the seed job): it occupies its
// device's worker until cancelled or until the engine shuts down.
JobSpec BlockerSpec(const std::string& dataset);

// A TorchScript archive of "Net": forward is torch.linear(x, w, b) with w [1, 1] and b [1], after
// `training_only` (indented TorchScript lines) in training mode only, which the checker's
// eval-mode trial does not run.
std::string ScriptedLinearModule(const std::string& training_only = "");

// Waits until the job ends and returns it as it ended. DEADLINE_EXCEEDED after kWaitTimeout.
absl::StatusOr<JobSnapshot> WaitForEnd(Engine& engine, const std::string& id);

// Submits and waits until the job ends.
absl::StatusOr<JobSnapshot> RunJob(Engine& engine, const JobSpec& spec);

// A test with an Engine on the CPU over a fresh data folder. The engine is destroyed (shut down)
// before the folder is removed.
class EngineFixture : public ::testing::Test {
 protected:
  void SetUp() override;

  // Options for an engine over this test's folder: device "cpu", the default size limit.
  EngineOptions Options() const;
  // Creates an engine with `options`; fails the test (and returns nullptr) when it cannot.
  std::unique_ptr<Engine> StartEngine(const EngineOptions& options);
  // The dataset file of `name` under this test's folder.
  std::string DatasetPath(const std::string& name) const;

  ScratchDir dir_;
  std::unique_ptr<Engine> engine_;  // started by SetUp with Options()
};

// The per-epoch losses, in order.
std::vector<double> Losses(const JobSnapshot& job);

// The named parameter, or nullptr.
const ParameterValues* FindParameter(const JobSnapshot& job, const std::string& name);

}  // namespace trainerd::engine::test_support
