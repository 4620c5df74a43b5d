// A shared node, through a real server and real channels with bearer tokens: each caller a
// tenant (datasets and jobs apart, shared datasets, admins), one authorization header per call,
// revocation by the token file, the health service's exact methods and unknown methods under one
// metrics label, page tokens that cannot be forged or carried to another filter, the canonical
// model spec, and watches that deliver every epoch of a long job page by page.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::service::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

constexpr char kAlice[] = "a11ce0000000000000000000000000a1";
constexpr char kBob[] = "b0b0000000000000000000000000b0b0";
constexpr char kOps[] = "0b5000000000000000000000000000b5";

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path + ".tmp", std::ios::trunc);
  out << text;
  out.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

class TenancyTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    token_file_ = data_dir_ + "-tokens";
    WriteFile(token_file_,
              absl::StrCat("alice:", kAlice, "\nbob:", kBob, "\nops:", kOps, " admin\n"));
    ServerOptions options = Options();
    options.auth_token_file = token_file_;
    StartServer(options);
  }
  void TearDown() override {
    ServiceTest::TearDown();
    std::remove(token_file_.c_str());
  }

  // A context with a deadline and, unless `token` is empty, "authorization: Bearer <token>".
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return context;
  }

  grpc::Status UploadAs(const std::string& token, const std::string& name) {
    return UploadSeedAs(datasets_.get(), name, token);
  }
  // Uploads `table` as `name` (as the header gives it: "NAME" or "OWNER/NAME") as `token`'s
  // caller; `for_peer_jobs` marks it a copy for peer jobs.
  grpc::Status UploadTableAs(const std::string& token, const std::string& name, const Table& table,
                             v1::Dataset* dataset = nullptr, bool for_peer_jobs = false) {
    v1::DatasetHeader header = HeaderFor(name, table);
    header.set_for_peer_jobs(for_peer_jobs);
    v1::Dataset ignored;
    auto context = As(token);
    auto writer = datasets_->UploadDataset(context.get(), dataset ? dataset : &ignored);
    for (const v1::UploadDatasetRequest& message : UploadMessages(header, EncodePayload(table))) {
      if (!writer->Write(message)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  // The names of the datasets on the CPU that ListDevices shows `token`'s caller.
  std::vector<std::string> DeviceDatasetsAs(const std::string& token) {
    auto system = v1::SystemService::NewStub(channel_);
    v1::ListDevicesResponse response;
    EXPECT_TRUE(system->ListDevices(As(token).get(), {}, &response).ok());
    for (const v1::DeviceStatus& device : response.devices()) {
      if (device.device() == "cpu") return {device.datasets().begin(), device.datasets().end()};
    }
    return {};
  }
  void RestartServer() {
    ServerOptions options = Options();
    options.auth_token_file = token_file_;
    StopServer();
    StartServer(options);
  }
  grpc::Status GetDatasetAs(const std::string& token, const std::string& name,
                            v1::Dataset* dataset = nullptr) {
    v1::GetDatasetRequest request;
    request.set_name(name);
    v1::Dataset ignored;
    return datasets_->GetDataset(As(token).get(), request, dataset ? dataset : &ignored);
  }
  std::vector<std::string> DatasetNamesAs(const std::string& token) {
    v1::ListDatasetsResponse response;
    EXPECT_TRUE(datasets_->ListDatasets(As(token).get(), {}, &response).ok());
    std::vector<std::string> names;
    for (const v1::Dataset& d : response.datasets()) names.push_back(d.name());
    return names;
  }
  grpc::Status DeleteDatasetAs(const std::string& token, const std::string& name) {
    v1::DeleteDatasetRequest request;
    request.set_name(name);
    v1::DeleteDatasetResponse response;
    return datasets_->DeleteDataset(As(token).get(), request, &response);
  }
  grpc::Status ShareAs(const std::string& token, const std::string& name, bool shared,
                       v1::Dataset* dataset = nullptr) {
    v1::ShareDatasetRequest request;
    request.set_name(name);
    request.set_shared(shared);
    v1::Dataset ignored;
    return datasets_->ShareDataset(As(token).get(), request, dataset ? dataset : &ignored);
  }
  grpc::Status SubmitAs(const std::string& token, const v1::JobSpec& spec, v1::Job* job) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    return jobs_->SubmitJob(As(token).get(), request, job);
  }
  grpc::Status GetJobAs(const std::string& token, const std::string& id, v1::Job* job = nullptr) {
    v1::GetJobRequest request;
    request.set_id(id);
    v1::Job ignored;
    return jobs_->GetJob(As(token).get(), request, job ? job : &ignored);
  }
  grpc::Status ListJobsAs(const std::string& token, v1::ListJobsResponse* response,
                          const std::string& page_token = "", int page_size = 0,
                          const std::string& dataset = "") {
    v1::ListJobsRequest request;
    request.set_page_token(page_token);
    request.set_page_size(page_size);
    request.set_dataset(dataset);
    return jobs_->ListJobs(As(token).get(), request, response);
  }
  // Waits for the job to end, as `token`'s caller.
  v1::Job WaitAs(const std::string& token, const std::string& id) {
    return WaitForJobEnd(jobs_.get(), id, token);
  }

  std::string token_file_;
};

TEST_F(TenancyTest, ATenantSeesAndManagesOnlyItsOwnDatasets) {
  ASSERT_TRUE(UploadAs(kAlice, "alice-data").ok());
  ASSERT_TRUE(UploadAs(kBob, "bob-data").ok());
  EXPECT_THAT(DatasetNamesAs(kAlice), ElementsAre("alice-data"));
  EXPECT_THAT(DatasetNamesAs(kBob), ElementsAre("bob-data"));
  // An admin sees both, named with their owners.
  EXPECT_THAT(DatasetNamesAs(kOps), ElementsAre("alice/alice-data", "bob/bob-data"));

  // To bob, alice's dataset is not there at all: the same NOT_FOUND an unknown name gets.
  const grpc::Status get = GetDatasetAs(kBob, "alice-data");
  EXPECT_EQ(get.error_code(), grpc::StatusCode::NOT_FOUND);
  // It names the datasets bob may use, and only those: nothing of alice's.
  EXPECT_EQ(get.error_message(),
            "dataset 'alice-data' not found (the datasets you can use: bob-data)");
  EXPECT_EQ(GetDatasetAs(kBob, "no-such-data").error_message(),
            "dataset 'no-such-data' not found (the datasets you can use: bob-data)");
  EXPECT_EQ(DeleteDatasetAs(kBob, "alice-data").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ShareAs(kBob, "alice-data", true).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::Job job;
  const grpc::Status submit = SubmitAs(kBob, LinearSpec("alice-data", 1), &job);
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::NOT_FOUND) << submit.error_message();
  EXPECT_THAT(submit.error_message(), HasSubstr("dataset 'alice-data' not found"));
  v1::JobSpec validated = LinearSpec("bob-data", 1);
  validated.set_validation_dataset("alice-data");
  EXPECT_EQ(SubmitAs(kBob, validated, &job).error_code(), grpc::StatusCode::NOT_FOUND);

  // Alice's data is intact, and hers to use.
  v1::Dataset dataset;
  ASSERT_TRUE(GetDatasetAs(kAlice, "alice-data", &dataset).ok());
  EXPECT_EQ(dataset.owner(), "alice");
  EXPECT_FALSE(dataset.shared());
  ASSERT_TRUE(SubmitAs(kAlice, LinearSpec("alice-data", 1), &job).ok());
  EXPECT_EQ(WaitAs(kAlice, job.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

// A NOT_FOUND for a dataset names the datasets the caller may use, as ListDatasets names them to
// it (at most ten, then how many more), through GetDataset and SubmitJob alike (trainctl and the
// Python client show the daemon's sentence); another tenant's appear only once shared.
TEST_F(TenancyTest, ANotFoundDatasetNamesTheDatasetsTheCallerMayUse) {
  v1::Job job;
  EXPECT_EQ(GetDatasetAs(kBob, "digits").error_message(),
            "dataset 'digits' not found (there is no dataset you can use: upload one first)");
  for (int i = 11; i >= 0; --i) {
    ASSERT_TRUE(UploadAs(kAlice, absl::StrFormat("d%02d", i)).ok());
  }
  const std::string alices =
      "d00, d01, d02, d03, d04, d05, d06, d07, d08, d09 and 2 more";
  EXPECT_EQ(GetDatasetAs(kAlice, "digits").error_message(),
            absl::StrCat("dataset 'digits' not found (the datasets you can use: ", alices, ")"));
  const grpc::Status submit = SubmitAs(kAlice, LinearSpec("digits", 1), &job);
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(submit.error_message(),
            absl::StrCat("dataset 'digits' not found (the datasets you can use: ", alices, ")"));
  // Bob sees none of alice's until she shares one; then that one, named with its owner.
  EXPECT_EQ(GetDatasetAs(kBob, "d00").error_message(),
            "dataset 'd00' not found (there is no dataset you can use: upload one first)");
  ASSERT_TRUE(ShareAs(kAlice, "d05", true).ok());
  ASSERT_TRUE(UploadAs(kBob, "mine").ok());
  EXPECT_EQ(SubmitAs(kBob, LinearSpec("d00", 1), &job).error_message(),
            "dataset 'd00' not found (the datasets you can use: alice/d05, mine)");
  v1::JobSpec validated = LinearSpec("mine", 1);
  validated.set_validation_dataset("alice/d06");
  EXPECT_EQ(SubmitAs(kBob, validated, &job).error_message(),
            "validation dataset 'alice/d06' not found (the datasets you can use: alice/d05, "
            "mine)");
  // An admin may use every dataset, each named with its owner.
  EXPECT_EQ(GetDatasetAs(kOps, "alice/zz").error_message(),
            "dataset 'alice/zz' not found (the datasets you can use: alice/d00, alice/d01, "
            "alice/d02, alice/d03, alice/d04, alice/d05, alice/d06, alice/d07, alice/d08, "
            "alice/d09 and 3 more)");
}

TEST_F(TenancyTest, ASharedDatasetTrainsOtherTenantsJobsButStaysItsOwners) {
  ASSERT_TRUE(UploadAs(kAlice, "digits").ok());
  v1::Dataset shared;
  ASSERT_TRUE(ShareAs(kAlice, "digits", true, &shared).ok());
  EXPECT_TRUE(shared.shared());
  EXPECT_EQ(shared.name(), "digits");  // as its owner names it
  EXPECT_THAT(DatasetNamesAs(kBob), ElementsAre("alice/digits"));
  v1::Job job;
  ASSERT_TRUE(SubmitAs(kBob, LinearSpec("alice/digits", 2), &job).ok());
  EXPECT_EQ(job.owner(), "bob");
  EXPECT_EQ(WaitAs(kBob, job.id()).state(), v1::JOB_STATE_SUCCEEDED);

  // Bob may use it, not change it: told whose it is.
  const grpc::Status deleted = DeleteDatasetAs(kBob, "alice/digits");
  EXPECT_EQ(deleted.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(deleted.error_message(), HasSubstr("belongs to alice"));
  EXPECT_EQ(ShareAs(kBob, "alice/digits", false).error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // Sharing outlives a restart (it is kept in the dataset's file).
  ServerOptions options = Options();
  options.auth_token_file = token_file_;
  StopServer();
  StartServer(options);
  v1::Dataset after;
  ASSERT_TRUE(GetDatasetAs(kBob, "alice/digits", &after).ok());
  EXPECT_TRUE(after.shared());
  EXPECT_EQ(after.owner(), "alice");

  // Unshared, it is gone for bob again; an admin may unshare and delete it too.
  ASSERT_TRUE(ShareAs(kAlice, "digits", false).ok());
  EXPECT_EQ(GetDatasetAs(kBob, "alice/digits").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(SubmitAs(kBob, LinearSpec("alice/digits", 1), &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(DeleteDatasetAs(kOps, "alice/digits").ok());
  EXPECT_EQ(GetDatasetAs(kAlice, "digits").error_code(), grpc::StatusCode::NOT_FOUND);
}

// Dataset names are per tenant: alice and bob each upload "digits" and each trains on their own;
// bob names alice's "alice/digits", NOT_FOUND (as an unknown name) until she shares it; every
// answer names datasets as its caller does (listings, jobs, devices), an admin naming both with
// their owners; a restart keeps it all.
TEST_F(TenancyTest, EachTenantHasItsOwnDatasetNamesAndOthersAreQualified) {
  v1::Dataset alices;
  v1::Dataset bobs;
  ASSERT_TRUE(UploadTableAs(kAlice, "digits", SeedTable(), &alices).ok());
  ASSERT_TRUE(UploadTableAs(kBob, "digits", ClassTable(60), &bobs).ok());
  EXPECT_EQ(alices.name(), "digits");
  EXPECT_EQ(bobs.name(), "digits");
  EXPECT_NE(alices.sha256(), bobs.sha256());
  EXPECT_EQ(UploadAs(kBob, "digits").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(DatasetNamesAs(kAlice), ElementsAre("digits"));
  EXPECT_THAT(DatasetNamesAs(kBob), ElementsAre("digits"));

  // Each trains on its own: a class loss fits only bob's, a regression only alice's.
  v1::JobSpec regression = LinearSpec("digits", 2);
  v1::JobSpec classes = LinearSpec("digits", 2);
  classes.set_model("linear:2");
  classes.set_loss(v1::LOSS_CROSS_ENTROPY);
  v1::Job alice_job;
  v1::Job bob_job;
  ASSERT_TRUE(SubmitAs(kAlice, regression, &alice_job).ok());
  ASSERT_TRUE(SubmitAs(kBob, classes, &bob_job).ok());
  EXPECT_EQ(alice_job.spec().dataset(), "digits");
  EXPECT_EQ(bob_job.spec().dataset(), "digits");
  v1::Job refused;
  EXPECT_EQ(SubmitAs(kAlice, classes, &refused).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(WaitAs(kAlice, alice_job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WaitAs(kBob, bob_job.id()).state(), v1::JOB_STATE_SUCCEEDED);

  // Alice's is nothing to bob until shared: the NOT_FOUND of a name nobody has.
  const grpc::Status hidden = GetDatasetAs(kBob, "alice/digits");
  EXPECT_EQ(hidden.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(hidden.error_message(), StartsWith("dataset 'alice/digits' not found ("));
  EXPECT_THAT(hidden.error_message(), Not(HasSubstr("alice/digits)")));
  EXPECT_THAT(GetDatasetAs(kBob, "carol/digits").error_message(),
              StartsWith("dataset 'carol/digits' not found ("));
  const grpc::Status submit = SubmitAs(kBob, LinearSpec("alice/digits", 1), &refused);
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(submit.error_message(), HasSubstr("dataset 'alice/digits' not found"));
  EXPECT_THAT(DeviceDatasetsAs(kBob), ElementsAre("digits"));
  // Nor can he upload in her name: an upload is into the caller's own names (only a leader's
  // copy for peer jobs, an admin's upload, names its owner).
  const grpc::Status in_her_name = UploadTableAs(kBob, "alice/other", SeedTable());
  EXPECT_EQ(in_her_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(in_her_name.error_message(), HasSubstr("uploaded under a bare name"));
  EXPECT_EQ(UploadTableAs(kBob, "alice/other", SeedTable(), nullptr, /*for_peer_jobs=*/true)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(UploadTableAs(kOps, "alice/other", SeedTable()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(ShareAs(kAlice, "digits", true).ok());
  v1::Job shared_job;
  for (int start = 0; start < 2; ++start) {
    SCOPED_TRACE(start == 0 ? "before a restart" : "after a restart");
    EXPECT_THAT(DatasetNamesAs(kBob), ElementsAre("alice/digits", "digits"));
    EXPECT_THAT(DatasetNamesAs(kAlice), ElementsAre("digits"));  // bob's is not shared
    EXPECT_THAT(DatasetNamesAs(kOps), ElementsAre("alice/digits", "bob/digits"));
    v1::Dataset theirs;
    ASSERT_TRUE(GetDatasetAs(kBob, "alice/digits", &theirs).ok());
    EXPECT_EQ(theirs.name(), "alice/digits");
    EXPECT_EQ(theirs.sha256(), alices.sha256());
    ASSERT_TRUE(SubmitAs(kBob, LinearSpec("alice/digits", 2), &shared_job).ok());
    EXPECT_EQ(shared_job.spec().dataset(), "alice/digits");
    EXPECT_EQ(WaitAs(kBob, shared_job.id()).state(), v1::JOB_STATE_SUCCEEDED);
    // Jobs name their datasets as their viewer does: an admin with the owners.
    v1::Job seen;
    ASSERT_TRUE(GetJobAs(kBob, shared_job.id(), &seen).ok());
    EXPECT_EQ(seen.spec().dataset(), "alice/digits");
    ASSERT_TRUE(GetJobAs(kOps, shared_job.id(), &seen).ok());
    EXPECT_EQ(seen.spec().dataset(), "alice/digits");
    ASSERT_TRUE(GetJobAs(kOps, bob_job.id(), &seen).ok());
    EXPECT_EQ(seen.spec().dataset(), "bob/digits");
    ASSERT_TRUE(GetJobAs(kAlice, alice_job.id(), &seen).ok());
    EXPECT_EQ(seen.spec().dataset(), "digits");
    // A listing's dataset filter takes the caller's names too.
    v1::ListJobsResponse on_hers;
    ASSERT_TRUE(ListJobsAs(kBob, &on_hers, "", 0, "alice/digits").ok());
    ASSERT_GE(on_hers.jobs_size(), 1);
    for (const v1::Job& job : on_hers.jobs()) EXPECT_EQ(job.spec().dataset(), "alice/digits");
    v1::ListJobsResponse on_his;
    ASSERT_TRUE(ListJobsAs(kBob, &on_his, "", 0, "digits").ok());
    ASSERT_EQ(on_his.jobs_size(), 1);
    EXPECT_EQ(on_his.jobs(0).id(), bob_job.id());
    v1::ListJobsResponse all_on_bobs;
    ASSERT_TRUE(ListJobsAs(kOps, &all_on_bobs, "", 0, "bob/digits").ok());
    ASSERT_EQ(all_on_bobs.jobs_size(), 1);
    EXPECT_EQ(all_on_bobs.jobs(0).spec().dataset(), "bob/digits");
    if (start == 0) {
      // A sweep names it as a job does, each member too.
      v1::SubmitSweepRequest sweep;
      *sweep.mutable_spec() = LinearSpec("alice/digits", 1);
      sweep.add_learning_rates(0.1);
      sweep.add_learning_rates(0.05);
      v1::SubmitSweepResponse members;
      ASSERT_TRUE(jobs_->SubmitSweep(As(kBob).get(), sweep, &members).ok());
      ASSERT_EQ(members.members_size(), 2);
      for (const v1::Job& member : members.members()) {
        EXPECT_EQ(member.spec().dataset(), "alice/digits");
        EXPECT_EQ(WaitAs(kBob, member.id()).state(), v1::JOB_STATE_SUCCEEDED);
      }
    }
    if (start > 0) break;
    // The devices name them so too (both are resident: jobs trained on them; after a restart
    // each loads when a job needs it).
    EXPECT_THAT(DeviceDatasetsAs(kBob), UnorderedElementsAre("alice/digits", "digits"));
    EXPECT_THAT(DeviceDatasetsAs(kAlice), ElementsAre("digits"));
    EXPECT_THAT(DeviceDatasetsAs(kOps), UnorderedElementsAre("alice/digits", "bob/digits"));
    RestartServer();
  }
  // A copy for peer jobs in a tenant's name (an admin's upload, as a leader makes it) is hers.
  v1::Dataset for_alice;
  ASSERT_TRUE(
      UploadTableAs(kOps, "alice/copied", SeedTable(), &for_alice, /*for_peer_jobs=*/true).ok());
  EXPECT_EQ(for_alice.name(), "alice/copied");
  EXPECT_EQ(for_alice.owner(), "alice");
  EXPECT_THAT(DatasetNamesAs(kAlice), ElementsAre("copied", "digits"));
}

// A copy for peer jobs uploaded in a tenant's name (as a leader does, with an admin's
// credentials) is hers: it counts against her quotas and says what it is.
TEST_F(TenancyTest, ACopyForPeerJobsInATenantsNameCountsAgainstHerQuotas) {
  ServerOptions options = Options();
  options.auth_token_file = token_file_;
  options.engine.max_datasets_per_caller = 1;
  StopServer();
  StartServer(options);
  v1::Dataset copy;
  ASSERT_TRUE(UploadTableAs(kOps, "bob/copied", SeedTable(), &copy, /*for_peer_jobs=*/true).ok());
  EXPECT_TRUE(copy.peer_copy());
  EXPECT_EQ(copy.owner(), "bob");
  v1::Dataset seen;
  ASSERT_TRUE(GetDatasetAs(kBob, "copied", &seen).ok());
  EXPECT_TRUE(seen.peer_copy());
  const grpc::Status second = UploadTableAs(kOps, "bob/more", SeedTable(), nullptr, true);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(), HasSubstr("caller 'bob' owns 1 datasets"));
  EXPECT_EQ(UploadAs(kBob, "mine").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(DeleteDatasetAs(kBob, "copied").ok());  // hers to delete
  EXPECT_TRUE(UploadAs(kBob, "mine").ok());
  EXPECT_TRUE(UploadTableAs(kOps, "ops/any", SeedTable()).ok());  // an admin's own: no quota
}

TEST_F(TenancyTest, ATenantsJobsAreNotFoundToOthersAndAnAdminManagesThemAll) {
  ASSERT_TRUE(UploadAs(kAlice, "alice-data").ok());
  v1::Job done;
  v1::JobSpec with_checkpoints = LinearSpec("alice-data", 2);
  with_checkpoints.set_checkpoint_every(1);
  ASSERT_TRUE(SubmitAs(kAlice, with_checkpoints, &done).ok());
  ASSERT_EQ(WaitAs(kAlice, done.id()).state(), v1::JOB_STATE_SUCCEEDED);
  v1::Job running;
  ASSERT_TRUE(SubmitAs(kAlice, LinearSpec("alice-data", kLongJobEpochs), &running).ok());

  const std::string not_found = absl::StrCat("job '", done.id(), "' not found");
  const grpc::Status get = GetJobAs(kBob, done.id());
  EXPECT_EQ(get.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(get.error_message(), not_found);
  v1::ListJobsResponse bobs;
  ASSERT_TRUE(ListJobsAs(kBob, &bobs).ok());
  EXPECT_THAT(bobs.jobs(), IsEmpty());
  {
    v1::CancelJobRequest request;
    request.set_id(running.id());
    v1::Job job;
    EXPECT_EQ(jobs_->CancelJob(As(kBob).get(), request, &job).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::DeleteJobRequest request;
    request.set_id(done.id());
    v1::DeleteJobResponse response;
    EXPECT_EQ(jobs_->DeleteJob(As(kBob).get(), request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::DownloadModelRequest request;
    request.set_id(done.id());
    auto context = As(kBob);
    auto reader = jobs_->DownloadModel(context.get(), request);
    v1::ModelChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Alice's checkpoints are hers: Bob is told the job does not exist, epoch or not.
  for (int32_t epoch : {0, 1}) {
    v1::DownloadCheckpointRequest request;
    request.set_id(done.id());
    request.set_epoch(epoch);
    auto context = As(kBob);
    auto reader = jobs_->DownloadCheckpoint(context.get(), request);
    v1::ModelChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(status.error_message(), not_found);
  }
  {
    v1::DownloadCheckpointRequest request;
    request.set_id(done.id());
    auto context = As(kAlice);
    auto reader = jobs_->DownloadCheckpoint(context.get(), request);
    v1::ModelChunk chunk;
    std::string bytes;
    while (reader->Read(&chunk)) bytes += chunk.data();
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(bytes.substr(0, 2), "PK");
  }
  {
    v1::WatchJobRequest request;
    request.set_id(running.id());
    auto context = As(kBob);
    auto reader = jobs_->WatchJob(context.get(), request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Alice's jobs are untouched: both there, the running one still running.
  v1::ListJobsResponse alices;
  ASSERT_TRUE(ListJobsAs(kAlice, &alices).ok());
  ASSERT_EQ(alices.jobs_size(), 2);
  v1::Job still;
  ASSERT_TRUE(GetJobAs(kAlice, running.id(), &still).ok());
  EXPECT_NE(still.state(), v1::JOB_STATE_CANCELLED);

  // The admin sees both and cancels and deletes them.
  v1::ListJobsResponse all;
  ASSERT_TRUE(ListJobsAs(kOps, &all).ok());
  EXPECT_EQ(all.jobs_size(), 2);
  v1::CancelJobRequest cancel;
  cancel.set_id(running.id());
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(As(kOps).get(), cancel, &cancelled).ok());
  EXPECT_EQ(WaitAs(kOps, running.id()).state(), v1::JOB_STATE_CANCELLED);
  v1::DeleteJobRequest remove;
  remove.set_id(done.id());
  v1::DeleteJobResponse removed;
  EXPECT_TRUE(jobs_->DeleteJob(As(kOps).get(), remove, &removed).ok());
  EXPECT_EQ(GetJobAs(kAlice, done.id()).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A sweep is found again by its id (ListJobsRequest.sweep_id): its members in their order, to
// its owner and to an admin; to another tenant it is nothing. A sweep id of another form is
// INVALID_ARGUMENT.
TEST_F(TenancyTest, ASweepIsListedByItsIdToItsOwnerAndAnAdminOnly) {
  ASSERT_TRUE(UploadAs(kAlice, "alice-data").ok());
  v1::SubmitSweepRequest request;
  *request.mutable_spec() = LinearSpec("alice-data", 2);
  for (double lr : {0.1, 0.05, 0.02}) request.add_learning_rates(lr);
  v1::SubmitSweepResponse sweep;
  ASSERT_TRUE(jobs_->SubmitSweep(As(kAlice).get(), request, &sweep).ok());
  v1::Job alone;
  ASSERT_TRUE(SubmitAs(kAlice, LinearSpec("alice-data", 2), &alone).ok());
  auto list = [&](const std::string& token, const std::string& sweep_id, int page_size,
                  v1::ListJobsResponse* response) {
    v1::ListJobsRequest listing;
    listing.set_sweep_id(sweep_id);
    listing.set_page_size(page_size);
    return jobs_->ListJobs(As(token).get(), listing, response);
  };
  for (const char* token : {kAlice, kOps}) {
    v1::ListJobsResponse members;
    ASSERT_TRUE(list(token, sweep.sweep_id(), 0, &members).ok());
    ASSERT_EQ(members.jobs_size(), 3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(members.jobs(i).id(), sweep.members(i).id());
      EXPECT_EQ(members.jobs(i).sweep_member(), i + 1);
    }
  }
  v1::ListJobsResponse bobs;
  ASSERT_TRUE(list(kBob, sweep.sweep_id(), 0, &bobs).ok());
  EXPECT_THAT(bobs.jobs(), IsEmpty());
  v1::ListJobsResponse none;
  ASSERT_TRUE(list(kAlice, "sweep-000000000000", 0, &none).ok());
  EXPECT_THAT(none.jobs(), IsEmpty());
  for (const std::string& bad :
       {std::string("sweep 1"), std::string("sweep-1;drop"), std::string(65, 'a'),
        std::string("sw\xc3\xa9"
                    "ep")}) {
    v1::ListJobsResponse refused;
    const grpc::Status status = list(kAlice, bad, 0, &refused);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_THAT(status.error_message(), HasSubstr("sweep_id must be")) << bad;
  }
  for (const v1::Job& member : sweep.members()) WaitAs(kAlice, member.id());
  WaitAs(kAlice, alone.id());
}

TEST_F(TenancyTest, OneAuthorizationHeaderPerCall) {
  auto context = As("");
  context->AddMetadata("authorization", "Bearer junk-junk-junk-junk-junk");
  context->AddMetadata("authorization", absl::StrCat("Bearer ", kAlice));
  v1::ListDatasetsResponse response;
  const grpc::Status status = datasets_->ListDatasets(context.get(), {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("2 authorization headers"));
  // Nothing can be created with an owner of '' that way.
  auto upload = As("");
  upload->AddMetadata("authorization", "Bearer junk-junk-junk-junk-junk");
  upload->AddMetadata("authorization", absl::StrCat("Bearer ", kAlice));
  v1::Dataset dataset;
  auto writer = datasets_->UploadDataset(upload.get(), &dataset);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(server_->engine()->ListDatasets().empty());
}

// The file is checked at most once a second: polls until `token`'s call gives `code`.
bool EventuallyGives(const std::function<grpc::Status()>& call, grpc::StatusCode code) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    if (call().error_code() == code) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST_F(TenancyTest, TheTokenFileRevokesEmptyMissingOrLineByLine) {
  auto list = [this](const char* token) {
    return [this, token] {
      v1::ListDatasetsResponse response;
      return datasets_->ListDatasets(As(token).get(), {}, &response);
    };
  };
  // A bad line is skipped (and logged); the others still load.
  WriteFile(token_file_, absl::StrCat("alice:short\nbob:", kBob, "\nops:", kOps, " root\n"));
  EXPECT_TRUE(EventuallyGives(list(kAlice), grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_TRUE(list(kBob)().ok());
  EXPECT_EQ(list(kOps)().error_code(), grpc::StatusCode::UNAUTHENTICATED);  // unknown role
  EXPECT_THAT(server_->metrics()->Render(), HasSubstr("\ntrainerd_auth_tokens 1\n"));

  // Empty: every token is revoked, and the health check still answers.
  WriteFile(token_file_, "");
  EXPECT_TRUE(EventuallyGives(list(kBob), grpc::StatusCode::UNAUTHENTICATED));
  const grpc::Status revoked = list(kBob)();
  EXPECT_THAT(revoked.error_message(), HasSubstr("no valid token"));
  int64_t serving = 0;
  ASSERT_TRUE(CheckHealth(channel_, "", &serving).ok());
  EXPECT_EQ(serving, 1);
  EXPECT_THAT(server_->metrics()->Render(), HasSubstr("\ntrainerd_auth_tokens 0\n"));

  // Back, then deleted: revoked again.
  WriteFile(token_file_, absl::StrCat("alice:", kAlice, "\n"));
  EXPECT_TRUE(EventuallyGives(list(kAlice), grpc::StatusCode::OK));
  std::remove(token_file_.c_str());
  EXPECT_TRUE(EventuallyGives(list(kAlice), grpc::StatusCode::UNAUTHENTICATED));
}

// A call to `method` with an empty message, through the generic stub, with `token` unless empty.
grpc::Status CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& token = "") {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);  // an empty message, as a valid buffer
  grpc::ByteBuffer response;
  grpc::Status status;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return status;
}

TEST_F(TenancyTest, OnlyTheHealthMethodsAreOpenAndJunkPathsShareOneLabel) {
  // Paths under the health service's prefix that it does not serve need a caller like any other.
  for (const char* junk : {"/grpc.health.v1.Health/Junk", "/grpc.health.v1.Health/Check/x",
                           "/grpc.health.v1.HealthX/Check"}) {
    EXPECT_EQ(CallRaw(channel_, junk).error_code(), grpc::StatusCode::UNAUTHENTICATED) << junk;
  }
  // Refused before any handler or interceptor: nothing of them reaches the metrics but the count.
  const std::string before = server_->metrics()->Render();
  EXPECT_THAT(before, HasSubstr("trainerd_auth_rejected_total 3\n"));
  // A caller with a token reaches the server's unknown-method handler (UNIMPLEMENTED): the first
  // junk path adds the "other" series once; 400 more add nothing.
  auto series = [](const std::string& text) {
    int n = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, "trainerd_grpc_")) ++n;
    }
    return n;
  };
  EXPECT_EQ(CallRaw(channel_, "/grpc.health.v1.Health/junk", kAlice).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  const std::string once = server_->metrics()->Render();
  EXPECT_THAT(once, HasSubstr("method=\"other\""));
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(
        CallRaw(channel_, absl::StrCat("/grpc.health.v1.Health/junk-", i), kAlice).error_code(),
        grpc::StatusCode::UNIMPLEMENTED);
    CallRaw(channel_, absl::StrCat("/evil.Service/", i), kAlice).IgnoreError();
  }
  const std::string after = server_->metrics()->Render();
  EXPECT_EQ(series(after), series(once));
  EXPECT_THAT(after, Not(HasSubstr("junk-")));
  EXPECT_THAT(after, Not(HasSubstr("evil")));
  EXPECT_THAT(
      after,
      HasSubstr("trainerd_grpc_requests_total{code=\"UNIMPLEMENTED\",method=\"other\"} 401"));
  EXPECT_LT(after.size(), once.size() + 256);
}

TEST_F(TenancyTest, PageTokensAreBoundToTheirListingAndCannotBeForged) {
  ASSERT_TRUE(UploadAs(kAlice, "a").ok());
  ASSERT_TRUE(UploadAs(kAlice, "b").ok());
  std::vector<std::string> ids;
  for (const char* dataset : {"a", "b", "a", "b", "a"}) {
    v1::Job job;
    ASSERT_TRUE(SubmitAs(kAlice, LinearSpec(dataset, 1), &job).ok());
    ids.push_back(job.id());
  }
  for (const std::string& id : ids) WaitAs(kAlice, id);
  // Paging through alice's jobs two at a time gives each once.
  std::vector<std::string> paged;
  std::string token;
  do {
    v1::ListJobsResponse page;
    ASSERT_TRUE(ListJobsAs(kAlice, &page, token, 2).ok());
    for (const v1::Job& job : page.jobs()) paged.push_back(job.id());
    token = page.next_page_token();
  } while (!token.empty());
  EXPECT_EQ(paged, ids);

  v1::ListJobsResponse first;
  ASSERT_TRUE(ListJobsAs(kAlice, &first, "", 2).ok());
  ASSERT_FALSE(first.next_page_token().empty());
  v1::ListJobsResponse response;
  for (const std::string& forged :
       {std::string("seq-0"), std::string("seq-+3"), std::string("mem-1"),
        std::string("p1.0.0000000000000000"),
        first.next_page_token().substr(0, first.next_page_token().size() - 1) + "x"}) {
    const grpc::Status status = ListJobsAs(kAlice, &response, forged, 2);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << forged;
  }
  // From another filter, or another tenant's listing.
  EXPECT_EQ(ListJobsAs(kAlice, &response, first.next_page_token(), 2, "a").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ListJobsAs(kOps, &response, first.next_page_token(), 2).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(TenancyTest, AModelSpecIsStoredCanonicalAndBoundedInLength) {
  ASSERT_TRUE(UploadAs(kAlice, "seed").ok());
  v1::JobSpec padded = LinearSpec("seed", 1);
  padded.set_model(absl::StrCat("  LINEAR : 1", std::string(3000, ' ')));
  v1::Job job;
  ASSERT_TRUE(SubmitAs(kAlice, padded, &job).ok());
  EXPECT_EQ(job.spec().model(), "linear:1");
  v1::Job stored;
  ASSERT_TRUE(GetJobAs(kAlice, job.id(), &stored).ok());
  EXPECT_EQ(stored.spec().model(), "linear:1");
  // Past the limit it is refused before it is parsed, copied or echoed.
  padded.set_model(absl::StrCat("linear:1", std::string(2 << 20, ' ')));
  const grpc::Status refused = SubmitAs(kAlice, padded, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(refused.error_message().size(), 200u);
  // So are long names and ids, without echoing them.
  const std::string long_name(1 << 20, 'x');
  const grpc::Status name = GetDatasetAs(kAlice, long_name);
  EXPECT_EQ(name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(name.error_message().size(), 400u);
  const grpc::Status id = GetJobAs(kAlice, long_name);
  EXPECT_EQ(id.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(id.error_message().size(), 200u);
}

TEST_F(TenancyTest, AWatchDeliversEveryEpochOfALongJobPageByPageAndTheStateWithoutThem) {
  ASSERT_TRUE(UploadAs(kAlice, "seed").ok());
  v1::JobSpec spec = LinearSpec("seed", 1500);
  spec.set_batch_size(800);  // one step an epoch: 1,500 quick epochs
  v1::Job job;
  ASSERT_TRUE(SubmitAs(kAlice, spec, &job).ok());
  // One watcher from the start, reading slowly at first; one after the job ended.
  v1::WatchJobRequest request;
  request.set_id(job.id());
  auto live_context = As(kAlice);
  live_context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto live = jobs_->WatchJob(live_context.get(), request);
  std::vector<v1::JobEvent> live_events;
  v1::JobEvent event;
  while (live->Read(&event)) {
    if (live_events.size() < 5) absl::SleepFor(absl::Milliseconds(200));
    live_events.push_back(event);
  }
  ASSERT_TRUE(live->Finish().ok());
  auto late_context = As(kAlice);
  auto late = jobs_->WatchJob(late_context.get(), request);
  std::vector<v1::JobEvent> late_events;
  while (late->Read(&event)) late_events.push_back(event);
  ASSERT_TRUE(late->Finish().ok());
  for (const auto* events : {&live_events, &late_events}) {
    std::vector<int> epochs;
    for (const v1::JobEvent& e : *events) {
      EXPECT_FALSE(e.has_skipped());
      if (e.has_epoch()) epochs.push_back(e.epoch().epoch());
      if (e.has_job()) {
        EXPECT_EQ(e.job().epochs_size(), 0);  // the events carry them
      }
    }
    ASSERT_EQ(epochs.size(), 1500u);
    for (int i = 0; i < 1500; ++i) ASSERT_EQ(epochs[i], i + 1);
    ASSERT_TRUE(events->back().has_job());
    EXPECT_EQ(events->back().job().state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(events->back().job().epochs_completed(), 1500);
  }
}

// What one caller may hold open is bounded per caller: a third upload or watch of alice's is
// refused naming the flag while bob's still start; a trickle is ended by its rate, not only by
// silence.
TEST_F(TenancyTest, EachCallerIsBoundedInUploadsAndWatchesAndATrickleIsEnded) {
  ServerOptions options = Options();
  options.auth_token_file = token_file_;
  options.max_uploads_per_caller = 2;
  options.max_watches_per_caller = 2;
  options.upload_idle_timeout = absl::Seconds(1);
  options.min_upload_bytes_per_second = 1 << 20;
  StopServer();
  StartServer(options);
  const Table table = SeedTable();
  // Opens an upload as `token` and sends its header: the stream stays open.
  struct OpenUpload {
    std::unique_ptr<grpc::ClientContext> context;
    v1::Dataset dataset;
    std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer;
  };
  auto open_upload = [&](const char* token, const std::string& name) {
    auto upload = std::make_unique<OpenUpload>();
    upload->context = As(token);
    upload->writer = datasets_->UploadDataset(upload->context.get(), &upload->dataset);
    upload->writer->Write(UploadMessages(HeaderFor(name, table), "")[0]);
    return upload;
  };
  // Three of alice's at once: whichever reaches the daemon last is refused at once (the order in
  // which the streams arrive is the transport's); the other two stay until the watchdog ends them.
  std::vector<std::unique_ptr<OpenUpload>> alices;
  for (const char* name : {"a1", "a2", "a3"}) alices.push_back(open_upload(kAlice, name));
  // Another tenant is not held up by alice's.
  auto bobs = open_upload(kBob, "b1");
  // A trickle: a byte every 200 ms is never silent for 1 s, and still far under 1 MiB/s.
  const std::string payload = EncodePayload(table);
  grpc::Status trickled;
  for (int i = 0; i < 40; ++i) {
    v1::UploadDatasetRequest byte;
    byte.set_chunk(payload.substr(i, 1));
    if (!bobs->writer->Write(byte)) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  trickled = bobs->writer->Finish();
  EXPECT_EQ(trickled.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(trickled.error_message(), HasSubstr("--min_upload_bytes_per_second"));
  // Of alice's, one was refused naming the limit; the two admitted idle ones were ended, and her
  // slots are free again.
  int refused = 0;
  int ended = 0;
  for (auto& upload : alices) {
    const grpc::Status status = upload->writer->Finish();
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_THAT(status.error_message(), HasSubstr("--max_uploads_per_caller=2"));
    }
    ended += status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? 1 : 0;
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(ended, 2);
  // The ended calls give their slots back as they end on the daemon's side, which can come just
  // after their clients saw the status: a refusal meanwhile names the limit, then the slot is free.
  grpc::Status again = UploadAs(kAlice, "seed");
  for (int i = 0; i < 100 && again.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    again = UploadAs(kAlice, "seed");
  }
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(server_->engine()->GetDataset("alice/a1").status().code() ==
              absl::StatusCode::kNotFound);

  // Watches: two of alice's stay open on a long job; the third is refused.
  v1::Job job;
  ASSERT_TRUE(SubmitAs(kAlice, LinearSpec("seed", kLongJobEpochs), &job).ok());
  v1::WatchJobRequest request;
  request.set_id(job.id());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::JobEvent>>> readers;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(As(kAlice));
    readers.push_back(jobs_->WatchJob(contexts.back().get(), request));
  }
  // Whichever reaches the daemon last is refused at once; the others get the job's state.
  v1::JobEvent event;
  std::vector<size_t> admitted;
  int refused_watches = 0;
  for (size_t i = 0; i < readers.size(); ++i) {
    if (readers[i]->Read(&event)) {
      admitted.push_back(i);
      continue;
    }
    const grpc::Status watch = readers[i]->Finish();
    EXPECT_EQ(watch.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(watch.error_message(), HasSubstr("--max_watches_per_caller=2"));
    ++refused_watches;
  }
  EXPECT_EQ(refused_watches, 1);
  v1::CancelJobRequest cancel;
  cancel.set_id(job.id());
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(As(kAlice).get(), cancel, &cancelled).ok());
  for (size_t i : admitted) {
    while (readers[i]->Read(&event)) {
    }
    EXPECT_TRUE(readers[i]->Finish().ok());
  }
}

// Optional quotas bound tenants, not admins: bob's third queued job and a dataset past his bytes
// are refused naming the quota; alice and the admin are not held up by bob's.
TEST_F(TenancyTest, QuotasBoundEachTenantsJobsAndDatasetBytes) {
  ServerOptions options = Options();
  options.auth_token_file = token_file_;
  options.engine.max_jobs_per_caller = 2;
  options.engine.max_dataset_bytes_per_caller = 10000;  // one seed table (6,400 bytes), not two
  StopServer();
  StartServer(options);
  ASSERT_TRUE(UploadAs(kBob, "bob-1").ok());
  const grpc::Status too_big = UploadAs(kBob, "bob-2");
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(too_big.error_message(), HasSubstr("--max_dataset_bytes_per_caller"));
  ASSERT_TRUE(UploadAs(kAlice, "alice-1").ok());
  ASSERT_TRUE(UploadAs(kOps, "ops-1").ok());
  ASSERT_TRUE(UploadAs(kOps, "ops-2").ok());  // admins have no quota

  v1::Job job;
  std::vector<std::string> bobs;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(SubmitAs(kBob, LinearSpec("bob-1", kLongJobEpochs), &job).ok());
    bobs.push_back(job.id());
  }
  const grpc::Status third = SubmitAs(kBob, LinearSpec("bob-1", 1), &job);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("its quota is 2 (--max_jobs_per_caller)"));
  v1::SubmitSweepRequest sweep;
  *sweep.mutable_spec() = LinearSpec("alice-1", 1);
  sweep.add_seeds(1);
  sweep.add_seeds(2);
  sweep.add_seeds(3);
  v1::SubmitSweepResponse members;
  EXPECT_EQ(jobs_->SubmitSweep(As(kAlice).get(), sweep, &members).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);  // three members count as three jobs
  ASSERT_TRUE(SubmitAs(kAlice, LinearSpec("alice-1", 1), &job).ok());
  // Once one of bob's ends, he may submit again.
  v1::CancelJobRequest cancel;
  cancel.set_id(bobs[0]);
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(As(kBob).get(), cancel, &cancelled).ok());
  WaitAs(kBob, bobs[0]);
  EXPECT_TRUE(SubmitAs(kBob, LinearSpec("bob-1", 1), &job).ok());
  cancel.set_id(bobs[1]);
  ASSERT_TRUE(jobs_->CancelJob(As(kBob).get(), cancel, &cancelled).ok());
}

// The number of datasets is bounded for everyone (--max_datasets: each resident CPU dataset holds
// two descriptors) and optionally per tenant, and deleting one makes room. The refusals come
// before a byte is stored and name the flag.
TEST_F(TenancyTest, TheNumberOfDatasetsIsBoundedForTheDaemonAndPerTenant) {
  ServerOptions options = Options();
  options.auth_token_file = token_file_;
  options.engine.max_datasets = 4;
  options.engine.max_datasets_per_caller = 2;
  StopServer();
  StartServer(options);
  ASSERT_TRUE(UploadAs(kBob, "bob-1").ok());
  ASSERT_TRUE(UploadAs(kBob, "bob-2").ok());
  const grpc::Status third = UploadAs(kBob, "bob-3");
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("owns 2 datasets; its quota is 2"));
  EXPECT_THAT(third.error_message(), HasSubstr("--max_datasets_per_caller"));
  EXPECT_EQ(UploadAs(kBob, "bob-2").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  ASSERT_TRUE(UploadAs(kAlice, "alice-1").ok());
  ASSERT_TRUE(UploadAs(kOps, "ops-1").ok());  // admins: no per-caller quota, but the daemon's
  const grpc::Status full = UploadAs(kOps, "ops-2");
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("keeps 4 datasets and at most 4 (--max_datasets)"));
  EXPECT_THAT(DatasetNamesAs(kOps),
              UnorderedElementsAre("alice/alice-1", "bob/bob-1", "bob/bob-2", "ops-1"));
  ASSERT_TRUE(DeleteDatasetAs(kBob, "bob-1").ok());
  EXPECT_TRUE(UploadAs(kOps, "ops-2").ok());
}

// The disk quota bounds what a tenant holds under the data folder: bob's second dataset does not
// fit; his job's checkpoints stop at the quota (the job goes on, succeeds with its model and says
// why), and then his new work is refused naming the quota while alice and the admin go on. Deleting
// the job gives the room back.
TEST_F(TenancyTest, TheDiskQuotaBoundsATenantsFilesAndCheckpointsStopAtIt) {
  ServerOptions options = Options();
  options.auth_token_file = token_file_;
  options.engine.max_disk_bytes_per_caller = 12000;  // one seed table (6,400 bytes), not two
  StopServer();
  StartServer(options);
  ASSERT_TRUE(UploadAs(kBob, "bob-1").ok());
  const grpc::Status too_big = UploadAs(kBob, "bob-2");
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(too_big.error_message(), HasSubstr("--max_disk_bytes_per_caller"));
  EXPECT_THAT(too_big.error_message(), HasSubstr("this upload needs 6400"));
  ASSERT_TRUE(UploadAs(kAlice, "alice-1").ok());
  ASSERT_TRUE(UploadAs(kOps, "ops-1").ok());
  ASSERT_TRUE(UploadAs(kOps, "ops-2").ok());  // admins have no quota

  constexpr int kEpochs = 30;
  v1::JobSpec spec = LinearSpec("bob-1", kEpochs);
  spec.set_checkpoint_every(1);
  v1::Job job;
  ASSERT_TRUE(SubmitAs(kBob, spec, &job).ok());
  const v1::Job ended = WaitAs(kBob, job.id());
  EXPECT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.error();
  EXPECT_EQ(ended.epochs_completed(), kEpochs);
  // Some checkpoints were written, not all, and the job says why the rest were not.
  ASSERT_GE(ended.checkpoints_size(), 1);
  EXPECT_LT(ended.checkpoints_size(), kEpochs);
  int64_t written = 0;
  for (const v1::Checkpoint& checkpoint : ended.checkpoints()) written += checkpoint.size_bytes();
  EXPECT_LE(6400 + written, 12000 + ended.checkpoints(0).size_bytes());  // past it by one at most
  EXPECT_THAT(ended.checkpoint_error(), HasSubstr("was not written"));
  EXPECT_THAT(ended.checkpoint_error(), HasSubstr("--max_disk_bytes_per_caller"));
  const std::filesystem::path folder = data_dir_ + "/checkpoints/" + job.id();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(folder),
                          std::filesystem::directory_iterator()),
            ended.checkpoints_size());
  // Bob is at his quota: new jobs and uploads are refused; alice and the admin are not held up.
  const grpc::Status refused = SubmitAs(kBob, LinearSpec("bob-1", 1), &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("its quota is 12000 bytes"));
  v1::Job other;
  ASSERT_TRUE(SubmitAs(kAlice, LinearSpec("alice-1", 1), &other).ok());
  EXPECT_EQ(WaitAs(kAlice, other.id()).state(), v1::JOB_STATE_SUCCEEDED);
  v1::JobSpec admins = LinearSpec("ops-1", kEpochs);
  admins.set_checkpoint_every(1);
  ASSERT_TRUE(SubmitAs(kOps, admins, &other).ok());
  const v1::Job admin_job = WaitAs(kOps, other.id());
  EXPECT_EQ(admin_job.checkpoints_size(), kEpochs);
  EXPECT_EQ(admin_job.checkpoint_error(), "");
  // Deleting his job gives bob his room back.
  v1::DeleteJobRequest remove;
  remove.set_id(ended.id());
  v1::DeleteJobResponse removed;
  ASSERT_TRUE(jobs_->DeleteJob(As(kBob).get(), remove, &removed).ok());
  EXPECT_TRUE(SubmitAs(kBob, LinearSpec("bob-1", 1), &job).ok());
  EXPECT_EQ(WaitAs(kBob, job.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace trainerd::service::testing
