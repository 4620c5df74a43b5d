// Hostile input through raw gRPC clients (the generated stubs, no trainctl checks in front): every
// RPC and every field of its messages, malformed on purpose. Each attack gets its specific status
// code, and afterwards the daemon is SERVING with its data intact: a canary dataset uploaded and
// a canary job trained before the attack are unchanged, nothing half-made is listed, and no
// upload is left open or staged.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "tests/support/exported_archive.h"

namespace trainerd::service::testing {
namespace {

using ::testing::HasSubstr;

// A dataset header of `rows` rows of `features` float32 features and one float32 target.
v1::DatasetHeader Header(const std::string& name, std::vector<int64_t> features, int64_t rows) {
  v1::DatasetHeader header;
  header.set_name(name);
  for (int64_t d : features) header.add_feature_shape(d);
  header.add_target_shape(1);
  header.set_target_dtype(v1::DTYPE_FLOAT32);
  header.set_row_count(rows);
  return header;
}

v1::UploadDatasetRequest HeaderMessage(const v1::DatasetHeader& header) {
  v1::UploadDatasetRequest request;
  *request.mutable_header() = header;
  return request;
}

v1::UploadDatasetRequest Chunk(std::string bytes) {
  v1::UploadDatasetRequest request;
  request.set_chunk(std::move(bytes));
  return request;
}

std::string Floats(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// A server with a canary dataset and a canary job, and raw calls for attacks to make; TearDown
// checks that the attack left the daemon serving with its data intact.
class HostileFixture : public ServiceTest {
 public:
  using ServiceTest::CancelJob;
  using ServiceTest::DeleteDataset;
  using ServiceTest::GetDataset;
  using ServiceTest::GetJob;
  v1::JobService::Stub* jobs() { return jobs_.get(); }

  // Uploads the messages as they are; the status the daemon finished with.
  grpc::Status RawUpload(const std::vector<v1::UploadDatasetRequest>& messages) {
    v1::Dataset dataset;
    return Upload(messages, &dataset);
  }

  grpc::Status Submit(const v1::JobSpec& spec, const std::string& module = "") {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    request.set_torchscript_module(module);
    v1::Job job;
    return jobs_->SubmitJob(&context, request, &job);
  }

  grpc::Status SubmitExported(const std::string& archive) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec();
    request.mutable_spec()->clear_model();
    request.set_exported_program(archive);
    v1::Job job;
    return jobs_->SubmitJob(&context, request, &job);
  }

  // The canary job's spec: a valid job on the canary dataset, for attacks to spoil.
  v1::JobSpec Spec() const { return LinearSpec("canary", 2); }

  grpc::Status ReadStream(
      const std::function<
          std::unique_ptr<grpc::ClientReaderInterface<v1::JobEvent>>(grpc::ClientContext*)>& open) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    auto reader = open(&context);
    v1::JobEvent event;
    while (reader->Read(&event)) {
    }
    return reader->Finish();
  }

  grpc::Status Download(const std::string& id, int format = 0) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::DownloadModelRequest request;
    request.set_id(id);
    request.set_format(static_cast<v1::ModelFormat>(format));
    auto reader = jobs_->DownloadModel(&context, request);
    v1::ModelChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }

  std::string canary_job_;

 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    v1::Dataset dataset;
    ASSERT_TRUE(UploadTable("canary", SeedTable(), &dataset).ok());
    canary_sha256_ = dataset.sha256();
    TrainCanaryJob();
  }

  // The canary job: trained to the end, so that its model can be downloaded. (Job records do
  // not outlive a server, so a test that restarts the server trains it again.)
  void TrainCanaryJob() {
    v1::Job job;
    ASSERT_TRUE(SubmitJob(LinearSpec("canary", 2), &job).ok());
    canary_job_ = job.id();
    std::unique_ptr<JobWatch> watch = Watch(canary_job_);
    ASSERT_TRUE(watch->Finish().ok());
  }

  void TearDown() override {
    if (server_ != nullptr) {
      int64_t serving = 0;
      EXPECT_TRUE(CheckHealth(channel_, "", &serving).ok());
      EXPECT_EQ(serving, 1) << "the daemon is not SERVING after the attack";
      v1::Dataset canary;
      EXPECT_TRUE(GetDataset("canary", &canary).ok());
      EXPECT_EQ(canary.sha256(), canary_sha256_);
      EXPECT_EQ(ListedNames(), std::vector<std::string>{"canary"});
      v1::Job job;
      EXPECT_TRUE(GetJob(canary_job_, &job).ok());
      EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
      EXPECT_TRUE(Download(canary_job_).ok());
      // Nothing half-made stays behind: no open upload, no staged bytes.
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (server_->dataset_service()->open_uploads() > 0 && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_EQ(server_->dataset_service()->open_uploads(), 0u);
      EXPECT_EQ(server_->engine()->staged_upload_bytes(), 0);
    }
    ServiceTest::TearDown();
  }

 private:
  std::string canary_sha256_;
};

// One attack: what it sends, the code it must get, and a part of the message.
struct Attack {
  std::string name;
  std::function<grpc::Status(HostileFixture*)> run;
  grpc::StatusCode code;
  std::string message_part;
};

void PrintTo(const Attack& attack, std::ostream* os) { *os << attack.name; }

class HostileInputTest : public HostileFixture, public ::testing::WithParamInterface<Attack> {};

TEST_P(HostileInputTest, GetsItsCodeAndLeavesTheDaemonServingWithItsData) {
  const Attack& attack = GetParam();
  const grpc::Status status = attack.run(this);
  EXPECT_EQ(status.error_code(), attack.code) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(attack.message_part));
}

// A TorchScript module whose forward reads /etc/hostname through torch.from_file, written by the
// e2e tests' fixture program (this test never links LibTorch).
std::string ModuleThatReadsFiles() {
  const std::string path = absl::StrCat(::testing::TempDir(), "/reads-file-", ::getpid(), ".pt");
  const std::string command =
      absl::StrCat("'", MAKE_TORCHSCRIPT_FIXTURE_BIN, "' '", path, "' 1 1 reads-file");
  if (std::system(command.c_str()) != 0) return "";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  return bytes;
}

std::vector<Attack> Attacks() {
  using H = HostileFixture;
  const auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  std::vector<Attack> attacks;
  // ---- UploadDataset: the header's fields ----
  for (const std::string& name :
       {std::string("../evil"), std::string("a/b"), std::string(".."), std::string(""),
        std::string(200, 'n'), std::string("tab\there"), std::string("nul\0x", 5)}) {
    attacks.push_back(
        {absl::StrCat("UploadName", attacks.size()),
         [name](H* t) {
           return t->RawUpload({HeaderMessage(Header(name, {1}, 1)), Chunk(Floats({1, 2}))});
         },
         kInvalid, "is invalid"});
  }
  attacks.push_back({"UploadNoFeatureShape",
                     [](H* t) { return t->RawUpload({HeaderMessage(Header("x", {}, 1))}); },
                     kInvalid, "needs at least one dimension"});
  attacks.push_back({"UploadZeroDimension",
                     [](H* t) {
                       return t->RawUpload({HeaderMessage(Header("x", {4, 0}, 1))});
                     },
                     kInvalid, "every dimension must be between 1 and"});
  attacks.push_back({"UploadNegativeDimension",
                     [](H* t) { return t->RawUpload({HeaderMessage(Header("x", {-4}, 1))}); },
                     kInvalid, "every dimension must be between 1 and"});
  attacks.push_back({"UploadRankNine",
                     [](H* t) {
                       return t->RawUpload(
                           {HeaderMessage(Header("x", std::vector<int64_t>(9, 1), 1))});
                     },
                     kInvalid, "at most 8"});
  attacks.push_back({"UploadOverflowingShape",
                     [](H* t) {
                       const int64_t d = int64_t{1} << 31;
                       return t->RawUpload({HeaderMessage(Header("x", {d, d, d}, 1))});
                     },
                     kInvalid, "overflow"});
  attacks.push_back({"UploadOverflowingRows",
                     [](H* t) {
                       return t->RawUpload({HeaderMessage(
                           Header("x", {1024}, std::numeric_limits<int64_t>::max()))});
                     },
                     kInvalid, "overflow"});
  attacks.push_back({"UploadHugeDeclaredSize",
                     [](H* t) {
                       // 4 TiB declared, under no overflow: refused before a byte is staged.
                       return t->RawUpload({HeaderMessage(Header("x", {1024}, int64_t{1} << 30)),
                                            Chunk(Floats({1, 2}))});
                     },
                     grpc::StatusCode::RESOURCE_EXHAUSTED, "this daemon accepts at most"});
  attacks.push_back({"UploadZeroRows",
                     [](H* t) { return t->RawUpload({HeaderMessage(Header("x", {1}, 0))}); },
                     kInvalid, "at least one row"});
  attacks.push_back({"UploadNegativeRows",
                     [](H* t) { return t->RawUpload({HeaderMessage(Header("x", {1}, -5))}); },
                     kInvalid, "at least one row"});
  attacks.push_back({"UploadUnknownDtype",
                     [](H* t) {
                       v1::DatasetHeader header = Header("x", {1}, 1);
                       header.set_target_dtype(static_cast<v1::DType>(77));
                       return t->RawUpload({HeaderMessage(header), Chunk(Floats({1, 2}))});
                     },
                     kInvalid, "target_dtype"});
  attacks.push_back({"UploadMalformedSha256",
                     [](H* t) {
                       v1::DatasetHeader header = Header("x", {1}, 1);
                       header.set_sha256("../../etc/passwd");
                       return t->RawUpload({HeaderMessage(header), Chunk(Floats({1, 2}))});
                     },
                     kInvalid, "sha256 must be 64 lower-case hex digits"});
  attacks.push_back({"UploadWrongSha256",
                     [](H* t) {
                       v1::DatasetHeader header = Header("x", {1}, 1);
                       header.set_sha256(Sha256Hex("something else"));
                       return t->RawUpload({HeaderMessage(header), Chunk(Floats({1, 2}))});
                     },
                     grpc::StatusCode::DATA_LOSS, "sha256"});
  attacks.push_back(
      {"UploadExistingName",
       [](H* t) {
         return t->RawUpload({HeaderMessage(Header("canary", {1}, 1)), Chunk(Floats({1, 2}))});
       },
       grpc::StatusCode::ALREADY_EXISTS, "already exists"});
  // ---- UploadDataset: the stream ----
  attacks.push_back(
      {"UploadChunkBeforeHeader",
       [](H* t) {
         return t->RawUpload({Chunk(Floats({1, 2})), HeaderMessage(Header("x", {1}, 1))});
       },
       kInvalid, "must be the header"});
  attacks.push_back({"UploadHeaderTwice",
                     [](H* t) {
                       return t->RawUpload({HeaderMessage(Header("x", {1}, 1)),
                                            HeaderMessage(Header("x", {1}, 1))});
                     },
                     kInvalid, "sent once"});
  attacks.push_back(
      {"UploadEmptyStream", [](H* t) { return t->RawUpload({}); }, kInvalid, "no header"});
  attacks.push_back(
      {"UploadTruncated",
       [](H* t) {
         return t->RawUpload({HeaderMessage(Header("x", {1}, 4)), Chunk(Floats({1, 2, 3}))});
       },
       kInvalid, "ended after 12 of the 32 payload bytes"});
  attacks.push_back({"UploadOverLong",
                     [](H* t) {
                       return t->RawUpload({HeaderMessage(Header("x", {1}, 1)),
                                            Chunk(Floats({1, 2})), Chunk(Floats({3}))});
                     },
                     kInvalid, "larger than the header declares"});
  attacks.push_back({"UploadWrongDtypeForItsBytes",
                     [](H* t) {
                       // int64 targets declared, float32 targets sent: 4 bytes short.
                       v1::DatasetHeader header = Header("x", {1}, 1);
                       header.set_target_dtype(v1::DTYPE_INT64);
                       return t->RawUpload({HeaderMessage(header), Chunk(Floats({1, 2}))});
                     },
                     kInvalid, "ended after 8 of the 12 payload bytes"});
  attacks.push_back({"UploadNanFeature",
                     [](H* t) {
                       return t->RawUpload({HeaderMessage(Header("x", {1}, 2)),
                                            Chunk(Floats({1, std::nanf(""), 3, 4}))});
                     },
                     kInvalid, "row 2 has a non-finite feature"});
  attacks.push_back({"UploadInfiniteTarget",
                     [](H* t) {
                       return t->RawUpload(
                           {HeaderMessage(Header("x", {1}, 2)),
                            Chunk(Floats({1, 2, 3, std::numeric_limits<float>::infinity()}))});
                     },
                     kInvalid, "row 2 has a non-finite target"});
  attacks.push_back({"UploadOversizedChunk",
                     [](H* t) {
                       return t->RawUpload({HeaderMessage(Header("x", {1024}, 1024)),
                                            Chunk(std::string((1 << 20) + 1, '\0'))});
                     },
                     kInvalid, "over the limit of 1048576 bytes"});
  // ---- The other dataset calls ----
  // "OWNER/NAME" names another owner's dataset: an owner is never a path (OwnerFolder escapes
  // it), so a traversal is only an owner nobody is.
  attacks.push_back({"GetDatasetTraversal",
                     [](H* t) {
                       v1::Dataset dataset;
                       return t->GetDataset("../datasets/canary", &dataset);
                     },
                     grpc::StatusCode::NOT_FOUND, "dataset '../datasets/canary' not found"});
  attacks.push_back({"GetDatasetTraversalInTheName",
                     [](H* t) {
                       v1::Dataset dataset;
                       return t->GetDataset("alice/..", &dataset);
                     },
                     kInvalid, "is invalid"});
  attacks.push_back({"GetDatasetHugeName",
                     [](H* t) {
                       v1::Dataset dataset;
                       return t->GetDataset(std::string(1 << 20, 'a'), &dataset);
                     },
                     kInvalid, "(1048576 characters) is invalid"});
  attacks.push_back({"DeleteDatasetTraversal", [](H* t) { return t->DeleteDataset("../models/x"); },
                     grpc::StatusCode::NOT_FOUND, "dataset '../models/x' not found"});
  attacks.push_back({"DeleteDatasetEmptyName", [](H* t) { return t->DeleteDataset(""); }, kInvalid,
                     "is invalid"});
  // ---- SubmitJob: every field ----
  const auto spoil = [](std::function<void(v1::JobSpec*)> mutate) {
    return [mutate](H* t) {
      v1::JobSpec spec = t->Spec();
      mutate(&spec);
      return t->Submit(spec);
    };
  };
  for (const double seconds : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity()}) {
    attacks.push_back({absl::StrCat("SubmitMaxJobSeconds", attacks.size()),
                       spoil([seconds](v1::JobSpec* s) { s->set_max_job_seconds(seconds); }),
                       kInvalid, "max_job_seconds must be a finite number of seconds >= 0"});
  }
  // Loss weights: a list past any model's width is refused before it is copied; one longer than
  // this model's output, on its length.
  attacks.push_back({"SubmitMillionsOfClassWeights", spoil([](v1::JobSpec* s) {
                       s->mutable_class_weights()->Resize((1 << 20) + 1, 1.0);
                     }),
                     kInvalid, "class_weights and pos_weight hold at most 1048576 values"});
  attacks.push_back({"SubmitPosWeightLongerThanTheOutput", spoil([](v1::JobSpec* s) {
                       s->set_loss(v1::LOSS_BCE_WITH_LOGITS);
                       s->mutable_pos_weight()->Resize(100000, 1.0);
                     }),
                     kInvalid, "got 100000 values"});
  // Data-parallel fields: negative, huge, nodes without replicas, more nodes than ranks, a node
  // that is no peer (the daemon under test has none), a huge node name.
  attacks.push_back({"SubmitNegativeReplicas", spoil([](v1::JobSpec* s) { s->set_replicas(-3); }),
                     kInvalid, "replicas must be >= 1"});
  attacks.push_back({"SubmitHugeReplicas",
                     spoil([](v1::JobSpec* s) { s->set_replicas(2147483647); }), kInvalid,
                     "a job has at most 4096 replicas"});
  attacks.push_back({"SubmitReplicasPastTheDaemons",
                     spoil([](v1::JobSpec* s) { s->set_replicas(9); }), kInvalid,
                     "--max_replicas"});
  attacks.push_back({"SubmitNodesWithoutReplicas",
                     spoil([](v1::JobSpec* s) { s->add_nodes("127.0.0.1:1"); }), kInvalid,
                     "give replicas"});
  attacks.push_back({"SubmitMoreNodesThanRanks", spoil([](v1::JobSpec* s) {
                       s->set_replicas(2);
                       for (int i = 0; i < 3; ++i) s->add_nodes("127.0.0.1:1");
                     }),
                     kInvalid, "at most 1 nodes"});
  attacks.push_back({"SubmitThousandsOfNodes", spoil([](v1::JobSpec* s) {
                       s->set_replicas(4096);
                       for (int i = 0; i < 4000; ++i) s->add_nodes("127.0.0.1:1");
                     }),
                     kInvalid, "256 nodes"});
  attacks.push_back({"SubmitHugeNodeName", spoil([](v1::JobSpec* s) {
                       s->set_replicas(2);
                       s->add_nodes(std::string(1 << 16, 'a'));
                     }),
                     kInvalid, "each of nodes is a peer's host:port"});
  attacks.push_back({"SubmitNodeWithoutPeers", spoil([](v1::JobSpec* s) {
                       s->set_replicas(2);
                       s->add_nodes("10.9.9.9:50051");
                     }),
                     grpc::StatusCode::FAILED_PRECONDITION, "has no peers (--peers"});
  attacks.push_back({"SubmitEveryPeerBesideAPeer", spoil([](v1::JobSpec* s) {
                       s->set_replicas(3);
                       s->add_nodes("*");
                       s->add_nodes("10.9.9.9:50051");
                     }),
                     kInvalid, "nodes '*' stands for every peer: give it alone"});
  attacks.push_back({"SubmitUnknownDataset", spoil([](v1::JobSpec* s) { s->set_dataset("nope"); }),
                     grpc::StatusCode::NOT_FOUND, "dataset 'nope' not found"});
  // ("OWNER/NAME": an owner nobody is, not a path.)
  attacks.push_back({"SubmitDatasetTraversal",
                     spoil([](v1::JobSpec* s) { s->set_dataset("../canary"); }),
                     grpc::StatusCode::NOT_FOUND, "dataset '../canary' not found"});
  attacks.push_back({"SubmitDatasetTraversalInTheName",
                     spoil([](v1::JobSpec* s) { s->set_dataset("canary/.."); }), kInvalid,
                     "is invalid"});
  attacks.push_back({"SubmitModelDoesNotParse",
                     spoil([](v1::JobSpec* s) { s->set_model("linear:abc"); }), kInvalid,
                     "layer 1"});
  attacks.push_back(
      {"SubmitModelEmpty", spoil([](v1::JobSpec* s) { s->set_model(""); }), kInvalid, "empty"});
  attacks.push_back({"SubmitModelTooManyLayers", spoil([](v1::JobSpec* s) {
                       std::string model = "linear:1";
                       for (int i = 0; i < 100; ++i) model += ",relu";
                       s->set_model(model);
                     }),
                     kInvalid, "at most 64"});
  attacks.push_back({"SubmitModelDoesNotFit",
                     spoil([](v1::JobSpec* s) { s->set_model("conv2d:4:3,flatten,linear:1"); }),
                     kInvalid, "CxHxW"});
  attacks.push_back({"SubmitModelTooLarge", spoil([](v1::JobSpec* s) {
                       s->set_model("linear:1048576,linear:1048576,linear:1");
                     }),
                     grpc::StatusCode::RESOURCE_EXHAUSTED, "at most 2147483648 are allowed"});
  attacks.push_back({"SubmitUnknownLoss",
                     spoil([](v1::JobSpec* s) { s->set_loss(static_cast<v1::Loss>(99)); }),
                     kInvalid, "loss"});
  attacks.push_back({"SubmitUnknownOptimizer", spoil([](v1::JobSpec* s) {
                       s->mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(99));
                     }),
                     kInvalid, "optimizer"});
  attacks.push_back({"SubmitNanLearningRate", spoil([](v1::JobSpec* s) {
                       s->mutable_optimizer()->set_learning_rate(std::nan(""));
                     }),
                     kInvalid, "learning rate"});
  attacks.push_back({"SubmitNegativeLearningRate",
                     spoil([](v1::JobSpec* s) { s->mutable_optimizer()->set_learning_rate(-1); }),
                     kInvalid, "learning rate"});
  attacks.push_back({"SubmitInfiniteMomentum", spoil([](v1::JobSpec* s) {
                       s->mutable_optimizer()->set_momentum(
                           std::numeric_limits<double>::infinity());
                     }),
                     kInvalid, "momentum"});
  attacks.push_back({"SubmitNegativeBatch", spoil([](v1::JobSpec* s) { s->set_batch_size(-8); }),
                     kInvalid, "batch size"});
  attacks.push_back({"SubmitNegativeEpochs", spoil([](v1::JobSpec* s) { s->set_epochs(-3); }),
                     kInvalid, "epochs must be between 1 and 1000000"});
  attacks.push_back({"SubmitTooManyEpochs",
                     spoil([](v1::JobSpec* s) { s->set_epochs(2000000000); }), kInvalid,
                     "epochs must be between 1 and 1000000"});
  attacks.push_back({"SubmitTooManyCheckpoints", spoil([](v1::JobSpec* s) {
                       s->set_epochs(100000);
                       s->set_checkpoint_every(1);
                     }),
                     kInvalid, "at most 1000 are allowed"});
  attacks.push_back({"SubmitNegativeCheckpointEvery",
                     spoil([](v1::JobSpec* s) { s->set_checkpoint_every(-1); }), kInvalid,
                     "checkpoint every"});
  attacks.push_back({"SubmitUnknownDevice", spoil([](v1::JobSpec* s) { s->set_device("tpu:0"); }),
                     kInvalid, "tpu"});
  attacks.push_back({"SubmitNanValidationFraction",
                     spoil([](v1::JobSpec* s) { s->set_validation_fraction(std::nan("")); }),
                     kInvalid, "validation fraction"});
  attacks.push_back({"SubmitUnknownValidationDataset",
                     spoil([](v1::JobSpec* s) { s->set_validation_dataset("no-such-x"); }),
                     grpc::StatusCode::NOT_FOUND, "validation dataset"});
  attacks.push_back({"SubmitValidationDatasetTraversal",
                     spoil([](v1::JobSpec* s) { s->set_validation_dataset("../x"); }),
                     grpc::StatusCode::NOT_FOUND, "validation dataset '../x' not found"});
  attacks.push_back({"SubmitUnknownPrecision", spoil([](v1::JobSpec* s) {
                       s->set_precision(static_cast<v1::Precision>(42));
                     }),
                     kInvalid, "precision"});
  attacks.push_back({"SubmitUnknownScheduleKind", spoil([](v1::JobSpec* s) {
                       s->mutable_schedule()->set_kind(static_cast<v1::Schedule::Kind>(-3));
                     }),
                     kInvalid, "schedule"});
  attacks.push_back({"SubmitModuleThatIsNoArchive",
                     [](H* t) {
                       v1::JobSpec spec = t->Spec();
                       spec.set_model("");
                       return t->Submit(spec, "PK\x03\x04 not really a zip");
                     },
                     kInvalid, "cannot be loaded"});
  attacks.push_back({"SubmitModuleThatReadsFiles",
                     [](H* t) {
                       v1::JobSpec spec = t->Spec();
                       spec.set_model("");
                       return t->Submit(spec, ModuleThatReadsFiles());
                     },
                     grpc::StatusCode::PERMISSION_DENIED, "operator 'aten::from_file'"});
  // ---- SubmitJob: exported programs (tests/support/exported_archive.h) ----
  using trainerd::testing::ExportedProgramArchive;
  using Knobs = trainerd::testing::ExportedProgramKnobs;
  auto exported = [](std::function<void(Knobs&)> spoil_it) {
    return [spoil_it](H* t) {
      Knobs knobs;
      spoil_it(knobs);
      return t->SubmitExported(ExportedProgramArchive(knobs));
    };
  };
  attacks.push_back({"SubmitExportedForgedGraph", exported([](Knobs& k) { k.forged_graph = true; }), kInvalid,
                     "uses 'nowhere' before it is defined"});
  attacks.push_back({"SubmitExportedWeightPastItsStorage", exported([](Knobs& k) { k.weight_rows = 1000; }),
                     kInvalid, "lies past its storage"});
  attacks.push_back({"SubmitExportedOperatorOffTheList",
                     exported([](Knobs& k) { k.target = "torch.ops.aten.from_file.default"; }),
                     grpc::StatusCode::PERMISSION_DENIED,
                     "aten.from_file.default, which is not on trainerd's list of operators"});
  attacks.push_back({"SubmitExportedHigherOrderOperator",
                     exported([](Knobs& k) { k.target = "torch.ops.higher_order.cond"; }),
                     grpc::StatusCode::PERMISSION_DENIED, "not on trainerd's list of operators"});
  attacks.push_back({"SubmitExportedPickledWeight", exported([](Knobs& k) { k.pickled_weight = true; }),
                     grpc::StatusCode::PERMISSION_DENIED, "is pickled"});
  attacks.push_back({"SubmitExportedDecompressionBomb",
                     exported([](Knobs& k) { k.bomb_bytes = 0xF0000000u; }), kInvalid,
                     "would expand to more than"});
  attacks.push_back({"SubmitExportedProgramAsTorchScript",
                     [](H* t) {
                       v1::JobSpec spec = t->Spec();
                       spec.set_model("");
                       return t->Submit(spec, ExportedProgramArchive());
                     },
                     kInvalid, "send it as exported_program"});
  attacks.push_back({"SubmitExportedProgramThatIsNoArchive",
                     [](H* t) { return t->SubmitExported("PK\x03\x04 not really a zip"); },
                     kInvalid, "not an archive written by torch.export.save"});
  attacks.push_back({"SubmitModuleAndModelText",
                     [](H* t) { return t->Submit(t->Spec(), "whatever"); }, kInvalid, "not both"});
  // ---- The job calls ----
  attacks.push_back({"GetJobUnknown",
                     [](H* t) {
                       v1::Job job;
                       return t->GetJob("job-000000000000", &job);
                     },
                     grpc::StatusCode::NOT_FOUND, "not found"});
  attacks.push_back({"CancelJobTraversal",
                     [](H* t) {
                       v1::Job job;
                       return t->CancelJob("../../etc/passwd", &job);
                     },
                     grpc::StatusCode::NOT_FOUND, "not found"});
  attacks.push_back({"CancelJobThatEnded",
                     [](H* t) {
                       v1::Job job;
                       return t->CancelJob(t->canary_job_, &job);
                     },
                     grpc::StatusCode::FAILED_PRECONDITION, "already ended"});
  attacks.push_back({"WatchJobUnknown",
                     [](H* t) {
                       return t->ReadStream([t](grpc::ClientContext* context) {
                         v1::WatchJobRequest request;
                         request.set_id(std::string(100000, 'j'));
                         return t->jobs()->WatchJob(context, request);
                       });
                     },
                     kInvalid, "a job id has at most 64 characters"});
  attacks.push_back({"DownloadModelTraversal",
                     [](H* t) { return t->Download("../models/job-000000000000"); },
                     grpc::StatusCode::NOT_FOUND, "not found"});
  attacks.push_back({"DownloadModelUnknownFormat",
                     [](H* t) { return t->Download(t->canary_job_, -5); },
                     kInvalid, "format must be MODEL_FORMAT_TORCHSCRIPT (1), "});
  return attacks;
}

INSTANTIATE_TEST_SUITE_P(Attacks, HostileInputTest, ::testing::ValuesIn(Attacks()),
                         [](const ::testing::TestParamInfo<Attack>& info) {
                           return info.param.name;
                         });

// ---- Streams cut short by their client ------------------------------------------------------

using HostileStreamTest = HostileFixture;

// A client that cancels an upload halfway: nothing is registered and the name is free.
TEST_F(HostileStreamTest, AnUploadCancelledMidStreamIsDiscardedAndItsNameIsFree) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  v1::Dataset dataset;
  auto writer = datasets_->UploadDataset(&context, &dataset);
  ASSERT_TRUE(writer->Write(HeaderMessage(Header("cut", {1024}, 4096))));
  ASSERT_TRUE(writer->Write(Chunk(std::string(1 << 20, 'a'))));
  // The daemon has staged what arrived.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server_->engine()->staged_upload_bytes() == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GT(server_->engine()->staged_upload_bytes(), 0);
  EXPECT_THAT(server_->metrics()->Render(),
              HasSubstr(absl::StrCat("\ntrainerd_upload_staged_bytes ",
                                     server_->engine()->staged_upload_bytes(), "\n")));
  context.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  while (server_->dataset_service()->open_uploads() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(server_->engine()->staged_upload_bytes(), 0);
  v1::Dataset again;
  EXPECT_TRUE(UploadTable("cut", SeedTable(), &again).ok());
  ASSERT_TRUE(DeleteDataset("cut").ok());
}

// A client that stops sending: the watchdog ends the stream and discards the upload.
TEST_F(HostileStreamTest, AnIdleUploadIsEndedAndDiscarded) {
  StopServer();
  ServerOptions options = Options();
  options.upload_idle_timeout = absl::Milliseconds(300);
  // The idle timeout alone: with the minimum rate on, the watchdog may see the 8 bytes as a slow
  // upload over the same window (TenancyTest tests the rate), and which sentence comes is a race.
  options.min_upload_bytes_per_second = 0;
  StartServer(options);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  v1::Dataset dataset;
  auto writer = datasets_->UploadDataset(&context, &dataset);
  ASSERT_TRUE(writer->Write(HeaderMessage(Header("idle", {1}, 1000))));
  ASSERT_TRUE(writer->Write(Chunk(Floats({1, 2}))));
  const grpc::Status status = writer->Finish();  // waits for the daemon's verdict
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("sent nothing for 0.3 s"));
  EXPECT_EQ(ListedNames(), std::vector<std::string>{"canary"});
  v1::Dataset again;
  EXPECT_TRUE(UploadTable("idle", SeedTable(), &again).ok());
  ASSERT_TRUE(DeleteDataset("idle").ok());
  TrainCanaryJob();  // the canary dataset came back from disk; its job did not
}

// A watcher that goes away mid-stream costs nothing: its job goes on and other watchers see it.
TEST_F(HostileStreamTest, AWatchCancelledMidStreamLeavesTheJobRunning) {
  v1::Job job;
  ASSERT_TRUE(SubmitJob(LinearSpec("canary", kLongJobEpochs), &job).ok());
  {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_id(job.id());
    auto reader = jobs_->WatchJob(&context, request);
    v1::JobEvent event;
    ASSERT_TRUE(reader->Read(&event));
    context.TryCancel();
    while (reader->Read(&event)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  std::unique_ptr<JobWatch> watch = Watch(job.id());
  EXPECT_TRUE(watch->NextEpoch());
  v1::Job cancelled;
  ASSERT_TRUE(CancelJob(job.id(), &cancelled).ok());
  EXPECT_TRUE(watch->Finish().ok());
}

// A watcher that never reads: the daemon keeps at most a page of its events (it fetches the
// rest as the watcher's writes complete), and once it reads it still gets every epoch, in order.
TEST_F(HostileStreamTest, ASlowWatcherGetsEveryEpochPagedAndCostsABoundedQueue) {
  v1::Job job;
  // One step per epoch (a batch of all 800 rows): about 80 KB of events, far more than the
  // transport takes for a reader that does not read (the watcher's channel announces a 16 KiB
  // stream window and no more: no BDP probing).
  constexpr int kEpochs = 2000;
  v1::JobSpec spec = LinearSpec("canary", kEpochs);
  spec.set_batch_size(1000);
  ASSERT_TRUE(SubmitJob(spec, &job).ok());
  grpc::ChannelArguments arguments;
  arguments.SetInt("grpc.http2.bdp_probe", 0);
  arguments.SetInt("grpc.http2.lookahead_bytes", 16 * 1024);
  auto slow = v1::JobService::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(), arguments));
  grpc::ClientContext context;
  // The job takes seconds, longer on a loaded machine: a deadline well past the wait below.
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(150)));
  v1::WatchJobRequest request;
  request.set_id(job.id());
  auto reader = slow->WatchJob(&context, request);
  // Read nothing until the job has ended, then everything.
  v1::Job ended;
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (absl::Now() < give_up) {
    ASSERT_TRUE(GetJob(job.id(), &ended).ok());
    if (ended.state() == v1::JOB_STATE_SUCCEEDED) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED);
  std::vector<v1::JobEvent> events;
  v1::JobEvent event;
  while (reader->Read(&event)) events.push_back(event);
  EXPECT_TRUE(reader->Finish().ok());
  ExpectEpochsThenTerminal(events, kEpochs, v1::JOB_STATE_SUCCEEDED);
  size_t largest = 0;
  for (const v1::JobEvent& e : events) largest = std::max(largest, e.ByteSizeLong());
  EXPECT_LT(largest, 4096u) << "an event carried a history";

  // A late watcher of a long job gets the same, page by page.
  std::unique_ptr<JobWatch> late = Watch(job.id());
  ASSERT_TRUE(late->Finish().ok());
  ExpectEpochsThenTerminal(late->events(), kEpochs, v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace trainerd::service::testing
