// The fixture of the service tests: a real trainerd Server on 127.0.0.1:0 over a fresh data folder,
// reached through a real TCP channel, with helpers for the calls the tests make (every call carries
// a deadline) and for the seed data.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/table.h"
#include "gtest/gtest.h"
#include "server/service/server.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"

namespace trainerd::service::testing {

// Deadline of every unary call, and of every stream (which the tests read to its end).
inline constexpr absl::Duration kCallDeadline = absl::Seconds(20);
// Long enough that a job with this many epochs is still running when a test acts on it; it always
// ends by cancellation.
inline constexpr int32_t kLongJobEpochs = 100000;

// 800 rows of y = 1 + 2x + 0.1 * noise (x uniform in [-1, 1], noise standard normal), generated
// with std::mt19937; feature shape {1}, target shape {1}, float32 targets.
Table SeedTable();
// `rows` rows of one feature with int64 class targets 0, 1, 0, 1, ...
Table ClassTable(int64_t rows);

// The header that describes `table` under `name`, without a sha256.
v1::DatasetHeader HeaderFor(const std::string& name, const Table& table);
// The messages of an upload: the header, then `payload` in chunks of at most `chunk_bytes`.
std::vector<v1::UploadDatasetRequest> UploadMessages(const v1::DatasetHeader& header,
                                                     const std::string& payload,
                                                     size_t chunk_bytes = size_t{1} << 20);

// linear:1 / mse / sgd (learning rate 0.1) / batch 16 / seed 42 on `dataset`.
v1::JobSpec LinearSpec(const std::string& dataset, int32_t epochs);

// Sends Health/Check for `service` with grpc::GenericStub and hand-encoded messages (Debian's
// libgrpc++-dev ships no generated health stubs). On OK, *serving_status holds the reply's
// status field (1 = SERVING, 2 = NOT_SERVING).
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         int64_t* serving_status);

// Lists the services that grpc.reflection.v1alpha.ServerReflection reports, with hand-encoded
// messages on a generic bidi stream (Debian ships no generated reflection stubs).
// With a `token`, the call carries "authorization: Bearer <token>".
grpc::Status ListReflectedServices(const std::shared_ptr<grpc::Channel>& channel,
                                   std::vector<std::string>* services,
                                   const std::string& token = "");

// One WatchJob stream, read on the calling thread. Not thread-safe.
class JobWatch {
 public:
  JobWatch(v1::JobService::Stub* stub, const std::string& id);

  // Reads the next event (and keeps it); false at the end of the stream.
  bool Next(v1::JobEvent* event);
  // Reads until an epoch event arrives; false when the stream ended first.
  bool NextEpoch();
  // Reads the rest of the stream and returns its status.
  grpc::Status Finish();

  const std::vector<v1::JobEvent>& events() const { return events_; }
  // The epoch events, in the order received.
  std::vector<v1::EpochResult> epochs() const;

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader_;
  std::vector<v1::JobEvent> events_;
  bool ended_ = false;
};

// Checks a whole stream: epoch events numbered 1..epoch_count in order, each once, and last a Job
// in `terminal` state (without its epochs, epochs_completed == epoch_count) that nothing follows.
void ExpectEpochsThenTerminal(const std::vector<v1::JobEvent>& events, int epoch_count,
                              v1::JobState terminal);

// Uploads the seed table under `name` (its sha256 in the header) as `token`'s caller ("" without
// credentials).
grpc::Status UploadSeedAs(v1::DatasetService::Stub* datasets, const std::string& name,
                          const std::string& token = "");

// Polls GetJob (as `token`'s caller, "" without credentials) until the job ended, for at most a
// minute; the job as it ended (a test failure, and the job as last read, past the minute).
v1::Job WaitForJobEnd(v1::JobService::Stub* jobs, const std::string& id,
                      const std::string& token = "");

// Starts a fresh server per test (over a fresh data folder) and stops it afterwards. Not
// thread-safe: the helpers are called from the test's thread.
class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // The options StartServer uses: 127.0.0.1:0, data_dir_, the CPU, the test build's module
  // checker.
  ServerOptions Options() const;
  // Starts a server on 127.0.0.1:0 over data_dir_ and connects the stubs to it (plaintext,
  // without credentials).
  void StartServer();
  void StartServer(const ServerOptions& options);
  // Shuts the server down and destroys it.
  void StopServer();

  grpc::Status Upload(const std::vector<v1::UploadDatasetRequest>& messages, v1::Dataset* dataset);
  // Uploads `table` under `name` with its sha256 in the header.
  grpc::Status UploadTable(const std::string& name, const Table& table, v1::Dataset* dataset);
  grpc::Status ListDatasets(v1::ListDatasetsResponse* response);
  grpc::Status GetDataset(const std::string& name, v1::Dataset* dataset);
  grpc::Status DeleteDataset(const std::string& name);
  // The names List returns, in order.
  std::vector<std::string> ListedNames();

  grpc::Status SubmitJob(const v1::JobSpec& spec, v1::Job* job);
  grpc::Status GetJob(const std::string& id, v1::Job* job);
  grpc::Status CancelJob(const std::string& id, v1::Job* job);
  std::unique_ptr<JobWatch> Watch(const std::string& id);

  // Uploads the seed table as "seed"; fails the test on error.
  void UploadSeed();

  std::string data_dir_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DatasetService::Stub> datasets_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

}  // namespace trainerd::service::testing
