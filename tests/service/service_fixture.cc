#include "tests/service/service_fixture.h"

#include <ftw.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "google/protobuf/unknown_field_set.h"

namespace trainerd::service::testing {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr char kReflectionMethod[] =
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
}

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// A ServerReflectionInfo call that sends one request, half-closes and collects every reply.
class ReflectionCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ReflectionCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& request,
                 const std::string& token)
      : stub_(channel), request_(ToByteBuffer(request)) {
    SetDeadline(&context_);
    if (!token.empty()) context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    stub_.PrepareBidiStreamingCall(&context_, kReflectionMethod, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    replies_.push_back(ToString(response_));
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override { done_.set_value(status); }

  // Waits for the call to end; the replies are complete afterwards.
  grpc::Status Await() { return done_future_.get(); }
  const std::vector<std::string>& replies() const { return replies_; }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::vector<std::string> replies_;
  std::promise<grpc::Status> done_;
  std::future<grpc::Status> done_future_ = done_.get_future();
};

// A fresh folder under the test temp dir. POSIX rather than std::filesystem: libtorch.so (linked
// through the engine) exports its own std::filesystem symbols, and its remove_all crashes.
std::string NewDataDir() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = test == nullptr ? "fixture" : test->name();
  for (char& c : name) {
    if (c == '/') c = '_';  // parameterised test names
  }
  std::string pattern =
      absl::StrCat(::testing::TempDir(), "trainerd-service-test-", name, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "cannot create a folder like " << pattern << ": " << std::strerror(errno);
  }
  return pattern;
}

void RemoveTree(const std::string& dir) {
  ::nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); },
      /*nopenfd=*/16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace

Table SeedTable() {
  constexpr int64_t kRows = 800;
  std::mt19937 rng(/*seed=*/20240601);
  std::uniform_real_distribution<float> x_dist(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  Table table;
  table.feature_shape = {1};
  table.target_shape = {1};
  table.target_dtype = TargetDType::kFloat32;
  table.rows = kRows;
  for (int64_t i = 0; i < kRows; ++i) {
    const float x = x_dist(rng);
    table.features.push_back(x);
    table.targets_f32.push_back(1.0f + 2.0f * x + 0.1f * noise(rng));
  }
  return table;
}

Table ClassTable(int64_t rows) {
  Table table;
  table.feature_shape = {1};
  table.target_dtype = TargetDType::kInt64;
  table.rows = rows;
  for (int64_t i = 0; i < rows; ++i) {
    table.features.push_back(static_cast<float>(i % 2));
    table.targets_i64.push_back(i % 2);
  }
  return table;
}

v1::DatasetHeader HeaderFor(const std::string& name, const Table& table) {
  v1::DatasetHeader header;
  header.set_name(name);
  for (int64_t d : table.feature_shape) header.add_feature_shape(d);
  for (int64_t d : table.target_shape) header.add_target_shape(d);
  header.set_target_dtype(table.target_dtype == TargetDType::kInt64 ? v1::DTYPE_INT64
                                                                    : v1::DTYPE_FLOAT32);
  header.set_row_count(table.rows);
  return header;
}

std::vector<v1::UploadDatasetRequest> UploadMessages(const v1::DatasetHeader& header,
                                                     const std::string& payload,
                                                     size_t chunk_bytes) {
  std::vector<v1::UploadDatasetRequest> messages(1);
  *messages[0].mutable_header() = header;
  for (size_t offset = 0; offset < payload.size(); offset += chunk_bytes) {
    messages.emplace_back().set_chunk(payload.substr(offset, chunk_bytes));
  }
  return messages;
}

v1::JobSpec LinearSpec(const std::string& dataset, int32_t epochs) {
  v1::JobSpec spec;
  spec.set_dataset(dataset);
  spec.set_model("linear:1");
  spec.set_loss(v1::LOSS_MSE);
  spec.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.1);
  spec.set_batch_size(16);
  spec.set_epochs(epochs);
  spec.set_seed(42);
  return spec;
}

grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         int64_t* serving_status) {
  google::protobuf::UnknownFieldSet request_fields;
  // proto3 leaves a field at its default value off the wire: "" is the empty message.
  if (!service.empty()) request_fields.AddLengthDelimited(/*number=*/1, service);
  std::string request_bytes;
  request_fields.SerializeToString(&request_bytes);
  grpc::ByteBuffer request = ToByteBuffer(request_bytes);
  grpc::ByteBuffer response;

  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::GenericStub stub(channel);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, kHealthCheckMethod, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return status;

  const std::string response_bytes = ToString(response);
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromArray(response_bytes.data(), static_cast<int>(response_bytes.size()))) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the health reply is not a protobuf message");
  }
  *serving_status = 0;  // UNKNOWN, also what an empty reply means
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& field = fields.field(i);
    if (field.number() == 1 && field.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      *serving_status = static_cast<int64_t>(field.varint());
    }
  }
  return grpc::Status::OK;
}

grpc::Status ListReflectedServices(const std::shared_ptr<grpc::Channel>& channel,
                                   std::vector<std::string>* services, const std::string& token) {
  // ServerReflectionRequest { list_services = 7 (string, in a oneof: sent even when empty) }.
  google::protobuf::UnknownFieldSet request_fields;
  request_fields.AddLengthDelimited(/*number=*/7, "");
  std::string request;
  request_fields.SerializeToString(&request);

  ReflectionCall call(channel, request, token);
  grpc::Status status = call.Await();
  if (!status.ok()) return status;
  // ServerReflectionResponse { list_services_response = 6 { repeated service = 1 { name = 1 } } }.
  auto parse = [](const std::string& bytes, google::protobuf::UnknownFieldSet* fields) {
    return fields->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  };
  for (const std::string& reply : call.replies()) {
    google::protobuf::UnknownFieldSet top;
    if (!parse(reply, &top)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "a reflection reply does not parse");
    }
    for (int i = 0; i < top.field_count(); ++i) {
      const google::protobuf::UnknownField& list = top.field(i);
      if (list.number() == 7) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "the reflection service sent an error");
      }
      if (list.number() != 6 ||
          list.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        continue;
      }
      google::protobuf::UnknownFieldSet list_fields;
      if (!parse(list.length_delimited(), &list_fields)) continue;
      for (int j = 0; j < list_fields.field_count(); ++j) {
        const google::protobuf::UnknownField& entry = list_fields.field(j);
        if (entry.number() != 1 ||
            entry.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
          continue;
        }
        google::protobuf::UnknownFieldSet entry_fields;
        if (!parse(entry.length_delimited(), &entry_fields)) continue;
        for (int k = 0; k < entry_fields.field_count(); ++k) {
          if (entry_fields.field(k).number() == 1 &&
              entry_fields.field(k).type() ==
                  google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
            services->push_back(entry_fields.field(k).length_delimited());
          }
        }
      }
    }
  }
  return grpc::Status::OK;
}

JobWatch::JobWatch(v1::JobService::Stub* stub, const std::string& id) {
  SetDeadline(&context_);
  v1::WatchJobRequest request;
  request.set_id(id);
  reader_ = stub->WatchJob(&context_, request);
}

bool JobWatch::Next(v1::JobEvent* event) {
  if (ended_) return false;
  if (!reader_->Read(event)) {
    ended_ = true;
    return false;
  }
  events_.push_back(*event);
  return true;
}

bool JobWatch::NextEpoch() {
  v1::JobEvent event;
  while (Next(&event)) {
    if (event.has_epoch()) return true;
  }
  return false;
}

grpc::Status JobWatch::Finish() {
  v1::JobEvent event;
  while (Next(&event)) {
  }
  return reader_->Finish();
}

std::vector<v1::EpochResult> JobWatch::epochs() const {
  std::vector<v1::EpochResult> out;
  for (const v1::JobEvent& event : events_) {
    if (event.has_epoch()) out.push_back(event.epoch());
  }
  return out;
}

void ExpectEpochsThenTerminal(const std::vector<v1::JobEvent>& events, int epoch_count,
                              v1::JobState terminal) {
  ASSERT_FALSE(events.empty());
  std::vector<int> received;
  std::vector<int> expected;
  for (int epoch = 1; epoch <= epoch_count; ++epoch) expected.push_back(epoch);
  for (size_t i = 0; i < events.size(); ++i) {
    const v1::JobEvent& event = events[i];
    if (event.has_epoch()) received.push_back(event.epoch().epoch());
    if (event.has_job() && i + 1 < events.size()) {
      const v1::JobState state = event.job().state();
      EXPECT_TRUE(state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_RUNNING)
          << "event " << i << " of " << events.size() << " is a job in state "
          << v1::JobState_Name(state) << " before the end of the stream";
    }
  }
  EXPECT_EQ(received, expected);
  const v1::JobEvent& last = events.back();
  ASSERT_TRUE(last.has_job()) << "the last event is not a job: " << last.ShortDebugString();
  EXPECT_EQ(v1::JobState_Name(last.job().state()), v1::JobState_Name(terminal));
  // The epoch events carry the epochs; the job states carry how many there were.
  EXPECT_EQ(last.job().epochs_size(), 0);
  EXPECT_EQ(last.job().epochs_completed(), epoch_count);
}

void ServiceTest::SetUp() {
  data_dir_ = NewDataDir();
  StartServer();
}

void ServiceTest::TearDown() {
  StopServer();
  RemoveTree(data_dir_);
}

ServerOptions ServiceTest::Options() const {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.engine.data_dir = data_dir_;
  options.engine.device = "cpu";
  options.engine.module_checker.program = TRAINERD_MODULE_CHECKER;
  options.engine.jobs.worker.program = TRAINERD_WORKER;
  // One CPU job at a time (the default is a job per core), so that what queues behind what does
  // not depend on this machine's cores.
  options.engine.jobs.max_concurrent_jobs = 1;
  return options;
}

void ServiceTest::StartServer() { StartServer(Options()); }

void ServiceTest::StartServer(const ServerOptions& options) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::BuildAndStart(options);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  ASSERT_GT(server_->port(), 0);
  channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                 grpc::InsecureChannelCredentials());
  datasets_ = v1::DatasetService::NewStub(channel_);
  jobs_ = v1::JobService::NewStub(channel_);
}

void ServiceTest::StopServer() {
  datasets_.reset();
  jobs_.reset();
  channel_.reset();
  if (server_ != nullptr) server_->Shutdown(absl::Seconds(5));
  server_.reset();
}

grpc::Status ServiceTest::Upload(const std::vector<v1::UploadDatasetRequest>& messages,
                                 v1::Dataset* dataset) {
  grpc::ClientContext context;
  SetDeadline(&context);
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
      datasets_->UploadDataset(&context, dataset);
  for (const v1::UploadDatasetRequest& message : messages) {
    if (!writer->Write(message)) break;  // the server has already finished the call
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status ServiceTest::UploadTable(const std::string& name, const Table& table,
                                      v1::Dataset* dataset) {
  const std::string payload = EncodePayload(table);
  v1::DatasetHeader header = HeaderFor(name, table);
  header.set_sha256(Sha256Hex(payload));
  return Upload(UploadMessages(header, payload), dataset);
}

grpc::Status ServiceTest::ListDatasets(v1::ListDatasetsResponse* response) {
  grpc::ClientContext context;
  SetDeadline(&context);
  return datasets_->ListDatasets(&context, v1::ListDatasetsRequest(), response);
}

grpc::Status ServiceTest::GetDataset(const std::string& name, v1::Dataset* dataset) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetDatasetRequest request;
  request.set_name(name);
  return datasets_->GetDataset(&context, request, dataset);
}

grpc::Status ServiceTest::DeleteDataset(const std::string& name) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::DeleteDatasetRequest request;
  request.set_name(name);
  v1::DeleteDatasetResponse response;
  return datasets_->DeleteDataset(&context, request, &response);
}

std::vector<std::string> ServiceTest::ListedNames() {
  v1::ListDatasetsResponse response;
  grpc::Status status = ListDatasets(&response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> names;
  for (const v1::Dataset& dataset : response.datasets()) names.push_back(dataset.name());
  return names;
}

grpc::Status ServiceTest::SubmitJob(const v1::JobSpec& spec, v1::Job* job) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  return jobs_->SubmitJob(&context, request, job);
}

grpc::Status ServiceTest::GetJob(const std::string& id, v1::Job* job) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetJobRequest request;
  request.set_id(id);
  return jobs_->GetJob(&context, request, job);
}

grpc::Status ServiceTest::CancelJob(const std::string& id, v1::Job* job) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::CancelJobRequest request;
  request.set_id(id);
  return jobs_->CancelJob(&context, request, job);
}

grpc::Status UploadSeedAs(v1::DatasetService::Stub* datasets, const std::string& name,
                          const std::string& token) {
  const Table table = SeedTable();
  const std::string payload = EncodePayload(table);
  v1::DatasetHeader header = HeaderFor(name, table);
  header.set_sha256(Sha256Hex(payload));
  grpc::ClientContext context;
  SetDeadline(&context);
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  v1::Dataset dataset;
  auto writer = datasets->UploadDataset(&context, &dataset);
  for (const v1::UploadDatasetRequest& message : UploadMessages(header, payload)) {
    if (!writer->Write(message)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::Job WaitForJobEnd(v1::JobService::Stub* jobs, const std::string& id, const std::string& token) {
  v1::Job job;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    grpc::ClientContext context;
    SetDeadline(&context);
    if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::GetJobRequest request;
    request.set_id(id);
    EXPECT_TRUE(jobs->GetJob(&context, request, &job).ok());
    if (job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
        job.state() == v1::JOB_STATE_CANCELLED) {
      return job;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "job " << id << " did not end";
  return job;
}

std::unique_ptr<JobWatch> ServiceTest::Watch(const std::string& id) {
  return std::make_unique<JobWatch>(jobs_.get(), id);
}

void ServiceTest::UploadSeed() {
  v1::Dataset dataset;
  grpc::Status status = UploadTable("seed", SeedTable(), &dataset);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
}

}  // namespace trainerd::service::testing
