// Request ids (SubmitJobRequest.request_id, SubmitSweepRequest.request_id) through a real server
// with bearer tokens: a retry gets what its first call queued, also after the job ended and the
// daemon restarted, and until the job is deleted; another request under the same id is refused;
// ids are each caller's own; racing retries queue one job. Then the peer client against a real
// daemon: a sweep's member submitted there by a leader killed before it learned the job's id is
// found again by its request id, to be followed or cancelled, never trained twice; a share of a
// sweep sent there as one sweep is packed there, and each member found again by its place.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/peer_client.h"
#include "tests/service/service_fixture.h"

namespace trainerd::service::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kAlice[] = "a11ce0000000000000000000000000a1";
constexpr char kBob[] = "b0b0000000000000000000000000b0b0";
constexpr char kOps[] = "0b5000000000000000000000000000b5";

class RequestIdTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    token_file_ = data_dir_ + "-tokens";
    std::ofstream(token_file_) << "alice:" << kAlice << "\nbob:" << kBob << "\nops:" << kOps
                               << " admin\n";
    StartServer(WithTokens());
    for (const char* token : {kAlice, kBob, kOps}) ASSERT_TRUE(UploadAs(token).ok());
  }
  void TearDown() override {
    ServiceTest::TearDown();
    std::remove(token_file_.c_str());
  }

  ServerOptions WithTokens() const {
    ServerOptions options = Options();
    options.auth_token_file = token_file_;
    return options;
  }

  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return context;
  }
  // The seed table as the caller's own dataset "seed-<first four characters of its token>".
  static std::string DatasetOf(const std::string& token) {
    return absl::StrCat("seed-", token.substr(0, 4));
  }
  grpc::Status UploadAs(const std::string& token) {
    return UploadSeedAs(datasets_.get(), DatasetOf(token), token);
  }
  grpc::Status SubmitAs(const std::string& token, const std::string& request_id, int32_t epochs,
                        v1::Job* job) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = LinearSpec(DatasetOf(token), epochs);
    request.set_request_id(request_id);
    return jobs_->SubmitJob(As(token).get(), request, job);
  }
  grpc::Status SweepAs(const std::string& token, const std::string& request_id,
                       v1::SubmitSweepResponse* sweep) {
    v1::SubmitSweepRequest request;
    *request.mutable_spec() = LinearSpec(DatasetOf(token), 2);
    request.add_learning_rates(0.1);
    request.add_learning_rates(0.01);
    request.set_request_id(request_id);
    return jobs_->SubmitSweep(As(token).get(), request, sweep);
  }
  // The ids of the caller's jobs submitted with `request_id`.
  std::vector<std::string> ListedAs(const std::string& token, const std::string& request_id) {
    v1::ListJobsRequest request;
    request.set_request_id(request_id);
    v1::ListJobsResponse response;
    const grpc::Status status = jobs_->ListJobs(As(token).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> ids;
    for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
    return ids;
  }
  v1::Job WaitAs(const std::string& token, const std::string& id) {
    return WaitForJobEnd(jobs_.get(), id, token);
  }

  std::string token_file_;
};

TEST_F(RequestIdTest, ARetriedSubmitGetsTheJobItsFirstCallQueued) {
  v1::Job first;
  ASSERT_TRUE(SubmitAs(kAlice, "retry-1", kLongJobEpochs, &first).ok());
  EXPECT_EQ(first.request_id(), "retry-1");
  v1::Job again;
  ASSERT_TRUE(SubmitAs(kAlice, "retry-1", kLongJobEpochs, &again).ok());
  EXPECT_EQ(again.id(), first.id());
  EXPECT_EQ(again.request_id(), "retry-1");
  EXPECT_EQ(again.spec().seed(), first.spec().seed());
  EXPECT_THAT(ListedAs(kAlice, "retry-1"), ElementsAre(first.id()));
  EXPECT_THAT(ListedAs(kAlice, "retry-2"), IsEmpty());
  // Without an id, every call is a job of its own.
  v1::Job plain1;
  v1::Job plain2;
  ASSERT_TRUE(SubmitAs(kAlice, "", 1, &plain1).ok());
  ASSERT_TRUE(SubmitAs(kAlice, "", 1, &plain2).ok());
  EXPECT_NE(plain1.id(), plain2.id());
  EXPECT_EQ(plain1.request_id(), "");
  v1::Job cancelled;
  v1::CancelJobRequest cancel;
  cancel.set_id(first.id());
  ASSERT_TRUE(jobs_->CancelJob(As(kAlice).get(), cancel, &cancelled).ok());
}

TEST_F(RequestIdTest, TheSameIdWithAnotherRequestIsRefusedNamingWhatItQueued) {
  v1::Job first;
  ASSERT_TRUE(SubmitAs(kAlice, "ci-run-7", 2, &first).ok());
  v1::Job other;
  const grpc::Status status = SubmitAs(kAlice, "ci-run-7", 3, &other);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("request id 'ci-run-7'"));
  EXPECT_THAT(status.error_message(), HasSubstr(first.id()));
  EXPECT_THAT(ListedAs(kAlice, "ci-run-7"), ElementsAre(first.id()));

  // A sweep's id names the sweep, and a job may not take it (another call).
  v1::SubmitSweepResponse sweep;
  ASSERT_TRUE(SweepAs(kAlice, "sweep-run-1", &sweep).ok());
  v1::SubmitSweepResponse again;
  ASSERT_TRUE(SweepAs(kAlice, "sweep-run-1", &again).ok());
  EXPECT_EQ(again.sweep_id(), sweep.sweep_id());
  ASSERT_EQ(again.members_size(), 2);
  EXPECT_EQ(again.members(0).id(), sweep.members(0).id());
  EXPECT_EQ(again.members(1).id(), sweep.members(1).id());
  EXPECT_EQ(again.members(1).request_id(), "sweep-run-1");
  EXPECT_THAT(ListedAs(kAlice, "sweep-run-1"),
              ElementsAre(sweep.members(0).id(), sweep.members(1).id()));
  const grpc::Status job = SubmitAs(kAlice, "sweep-run-1", 2, &other);
  EXPECT_EQ(job.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(job.error_message(), HasSubstr(sweep.sweep_id()));
}

TEST_F(RequestIdTest, AnIdIsItsCallersOwnAnAdminsToo) {
  v1::Job alices;
  ASSERT_TRUE(SubmitAs(kAlice, "shared-name", 1, &alices).ok());
  v1::Job bobs;
  ASSERT_TRUE(SubmitAs(kBob, "shared-name", 1, &bobs).ok());
  EXPECT_NE(bobs.id(), alices.id());
  EXPECT_EQ(bobs.owner(), "bob");
  EXPECT_THAT(ListedAs(kAlice, "shared-name"), ElementsAre(alices.id()));
  EXPECT_THAT(ListedAs(kBob, "shared-name"), ElementsAre(bobs.id()));
  // An admin sees every job, but a request id names only the admin's own submits.
  EXPECT_THAT(ListedAs(kOps, "shared-name"), IsEmpty());
  v1::Job ops;
  ASSERT_TRUE(SubmitAs(kOps, "shared-name", 1, &ops).ok());
  EXPECT_THAT(ListedAs(kOps, "shared-name"), ElementsAre(ops.id()));
}

TEST_F(RequestIdTest, AnIdOfAnotherFormIsInvalidArgumentOnEveryCall) {
  for (const std::string& id :
       {std::string("has space"), std::string(129, 'x'), std::string("caf\xc3\xa9"),
        std::string("a/b"), std::string("line\nbreak")}) {
    v1::Job job;
    EXPECT_EQ(SubmitAs(kAlice, id, 1, &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    v1::SubmitSweepResponse sweep;
    EXPECT_EQ(SweepAs(kAlice, id, &sweep).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    v1::ListJobsRequest request;
    request.set_request_id(id);
    v1::ListJobsResponse response;
    const grpc::Status listed = jobs_->ListJobs(As(kAlice).get(), request, &response);
    EXPECT_EQ(listed.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(listed.error_message(), HasSubstr("1 to 128 characters"));
  }
  v1::Job longest;
  EXPECT_TRUE(SubmitAs(kAlice, std::string(128, 'x'), 1, &longest).ok());
  v1::Job uuid;
  EXPECT_TRUE(SubmitAs(kAlice, "0f8fad5b-d9cb-469f-a165-70867728950e", 1, &uuid).ok());
}

TEST_F(RequestIdTest, TheIdOutlivesTheJobsEndAndARestartButNotItsDeletion) {
  v1::Job first;
  ASSERT_TRUE(SubmitAs(kAlice, "nightly", 2, &first).ok());
  ASSERT_EQ(WaitAs(kAlice, first.id()).state(), v1::JOB_STATE_SUCCEEDED);
  StopServer();
  StartServer(WithTokens());
  v1::Job again;
  ASSERT_TRUE(SubmitAs(kAlice, "nightly", 2, &again).ok());
  EXPECT_EQ(again.id(), first.id());
  EXPECT_EQ(again.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(again.epochs_completed(), 2);
  // Still compared after the restart: the digest is kept with the record.
  EXPECT_EQ(SubmitAs(kAlice, "nightly", 5, &again).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  v1::DeleteJobRequest remove;
  remove.set_id(first.id());
  v1::DeleteJobResponse removed;
  ASSERT_TRUE(jobs_->DeleteJob(As(kAlice).get(), remove, &removed).ok());
  v1::Job anew;
  ASSERT_TRUE(SubmitAs(kAlice, "nightly", 2, &anew).ok());
  EXPECT_NE(anew.id(), first.id());
  EXPECT_EQ(anew.state(), v1::JOB_STATE_QUEUED);
}

TEST_F(RequestIdTest, RetriesRacingWithOneIdQueueOneJob) {
  constexpr int kCallers = 8;
  std::vector<std::string> ids(kCallers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kCallers; ++i) {
    threads.emplace_back([&, i] {
      v1::Job job;
      const grpc::Status status = SubmitAs(kAlice, "race", 1, &job);
      EXPECT_TRUE(status.ok()) << status.error_message();
      ids[i] = job.id();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
  EXPECT_THAT(ListedAs(kAlice, "race"), ElementsAre(ids.front()));
}

// The peer client (a leader's side of a sweep's member on a peer) against this real daemon.
class MemberOnAPeerTest : public RequestIdTest {
 protected:
  std::shared_ptr<engine::Peers> Leader() {
    PeerClientOptions options;
    options.peers = server_->address();
    options.token = kOps;
    absl::StatusOr<std::shared_ptr<engine::Peers>> client = MakePeerClient(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *client : nullptr;
  }
  static engine::RemoteJobRequest Member(int32_t epochs) {
    engine::RemoteJobRequest request;
    // As a leader names it: by its key, here the dataset of "ops", whose token it presents.
    request.spec.dataset = absl::StrCat("ops/", DatasetOf(kOps));
    request.spec.model = "linear:1";
    request.spec.learning_rate = 0.1;
    request.spec.batch_size = 16;
    request.spec.epochs = epochs;
    request.spec.seed = 42;
    request.job_id = "job-leader00001";
    request.request_id = "job-leader00001.00000000000000aa";
    return request;
  }
  // Runs the member there until the peer took it, then stops watching, as a leader killed at
  // that moment would (its record then holds the request id but no job id): the job's id there.
  std::string SubmitAndLeave(engine::Peers* leader, const engine::RemoteJobRequest& member) {
    std::string id;
    const engine::RemoteJobResult left = leader->RunJob(
        server_->address(), member,
        [&](const std::string& there, const std::string&) { id = there; },
        [](const engine::EpochResult&) {},
        [&] { return id.empty() ? engine::RemoteStop::kNone : engine::RemoteStop::kDetach; });
    EXPECT_TRUE(left.status.ok()) << left.status;
    EXPECT_TRUE(left.detached);
    return id;
  }
};

TEST_F(MemberOnAPeerTest, AMemberSubmittedByALeaderThatDiedIsFoundByItsRequestIdNotTrainedTwice) {
  std::shared_ptr<engine::Peers> leader = Leader();
  ASSERT_NE(leader, nullptr);
  const engine::RemoteJobRequest member = Member(/*epochs=*/40);
  const std::string there = SubmitAndLeave(leader.get(), member);
  ASSERT_FALSE(there.empty());
  EXPECT_THAT(ListedAs(kOps, member.request_id), ElementsAre(there));

  // The restarted leader knows only the request id: the same job is followed to its end.
  std::vector<std::string> queued;
  int epochs = 0;
  const engine::RemoteJobResult result = leader->RunJob(
      server_->address(), member,
      [&](const std::string& id, const std::string&) { queued.push_back(id); },
      [&](const engine::EpochResult&) { ++epochs; }, [] { return engine::RemoteStop::kNone; });
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_THAT(queued, ElementsAre(there));
  EXPECT_EQ(result.job.id, there);
  EXPECT_EQ(result.job.state, engine::JobState::kSucceeded);
  EXPECT_EQ(epochs, 40);
  EXPECT_FALSE(result.model_archive.empty());
  // Read, then deleted there: nothing of it stays on the peer.
  EXPECT_THAT(ListedAs(kOps, member.request_id), IsEmpty());
}

TEST_F(MemberOnAPeerTest, ACancelBeforeItsIdWasKnownFindsTheJobThereAndCancelsIt) {
  std::shared_ptr<engine::Peers> leader = Leader();
  ASSERT_NE(leader, nullptr);
  const engine::RemoteJobRequest member = Member(kLongJobEpochs);
  const std::string there = SubmitAndLeave(leader.get(), member);
  ASSERT_FALSE(there.empty());

  // Cancelled here while the leader was down, before it recorded the id there.
  std::vector<std::string> queued;
  const engine::RemoteJobResult result = leader->RunJob(
      server_->address(), member,
      [&](const std::string& id, const std::string&) { queued.push_back(id); },
      [](const engine::EpochResult&) {}, [] { return engine::RemoteStop::kCancel; });
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.job.state, engine::JobState::kCancelled);
  EXPECT_THAT(queued, ElementsAre(there));
  EXPECT_THAT(ListedAs(kOps, member.request_id), IsEmpty());

  // A member cancelled before it was ever submitted finds nothing there and submits nothing.
  engine::RemoteJobRequest never = Member(2);
  never.request_id = "job-leader00002.00000000000000bb";
  const engine::RemoteJobResult nothing = leader->RunJob(
      server_->address(), never,
      [&](const std::string& id, const std::string&) { queued.push_back(id); },
      [](const engine::EpochResult&) {}, [] { return engine::RemoteStop::kCancel; });
  EXPECT_TRUE(nothing.status.ok()) << nothing.status;
  EXPECT_TRUE(nothing.stopped);
  EXPECT_EQ(queued.size(), 1u);
  EXPECT_THAT(ListedAs(kOps, never.request_id), IsEmpty());
}

// A sweep's share for one peer goes there as one sweep (packed there). A leader killed before it
// recorded the members' ids there finds each again by the sweep's request id and its place.
TEST_F(MemberOnAPeerTest, AShareSentAsOneSweepIsPackedThereAndEachMemberIsFoundByItsPlace) {
  std::shared_ptr<engine::Peers> leader = Leader();
  ASSERT_NE(leader, nullptr);
  engine::RemoteSweepRequest share;
  share.request_id = "sweep-leader001.00000000000000cc";
  for (int i = 0; i < 3; ++i) {
    engine::RemoteJobRequest member = Member(/*epochs=*/30);
    member.spec.learning_rate = 0.1 / (i + 1);
    member.spec.seed = 7 + i;
    share.members.push_back(member.spec);
    share.job_ids.push_back(absl::StrCat("job-leader0000", i));
  }
  std::vector<std::string> ids(3);
  std::atomic<int> queued{0};
  std::vector<engine::RemoteMemberCalls> calls(3);
  for (int i = 0; i < 3; ++i) {
    calls[i].on_queued = [&, i](const std::string& id, const std::string&) {
      ids[i] = id;
      ++queued;
    };
    calls[i].on_epoch = [](const engine::EpochResult&) {};
    // The leader dies as soon as the peer took them: nothing of their ids is kept.
    calls[i].stop = [&] {
      return queued.load() == 3 ? engine::RemoteStop::kDetach : engine::RemoteStop::kNone;
    };
  }
  const std::vector<engine::RemoteJobResult> left =
      leader->RunSweep(server_->address(), share, calls);
  ASSERT_EQ(left.size(), 3u);
  for (const engine::RemoteJobResult& result : left) {
    EXPECT_TRUE(result.status.ok()) << result.status;
    EXPECT_TRUE(result.detached);
  }
  EXPECT_THAT(ListedAs(kOps, share.request_id), ElementsAre(ids[0], ids[1], ids[2]));

  // Restarted, each member knows only the sweep's request id and its place there.
  for (int i = 0; i < 3; ++i) {
    engine::RemoteJobRequest member = Member(30);
    member.spec = share.members[i];
    member.share_request_id = share.request_id;
    member.share_member = i + 1;
    member.request_id = absl::StrCat(share.request_id, ":", i + 1);
    std::vector<std::string> found;
    int epochs = 0;
    const engine::RemoteJobResult result = leader->RunJob(
        server_->address(), member,
        [&](const std::string& id, const std::string&) { found.push_back(id); },
        [&](const engine::EpochResult&) { ++epochs; }, [] { return engine::RemoteStop::kNone; });
    ASSERT_TRUE(result.status.ok()) << result.status;
    EXPECT_THAT(found, ElementsAre(ids[i])) << "member " << i + 1;
    EXPECT_EQ(result.job.state, engine::JobState::kSucceeded);
    EXPECT_EQ(result.job.spec.seed, share.members[i].seed);
    EXPECT_EQ(result.job.report.packed_members, 3);
    EXPECT_EQ(epochs, 30);
    EXPECT_THAT(ListedAs(kOps, member.request_id), IsEmpty());  // never submitted alone
  }
  EXPECT_THAT(ListedAs(kOps, share.request_id), IsEmpty());
}

// The threads of this process now.
int ThreadCount() {
  int count = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) count = std::stoi(line.substr(8));
  }
  return count;
}

// A share of 8 members is followed to the end from the calling thread: each member's epochs in
// order, from the first; a cancel of one ends it there alone, while the others go on; and no
// thread per member (before, a stream's and a watchdog's: 16 more).
TEST_F(MemberOnAPeerTest, AShareIsFollowedWithoutAThreadPerMemberAndACancelEndsOneAlone) {
  std::shared_ptr<engine::Peers> leader = Leader();
  ASSERT_NE(leader, nullptr);
  constexpr int kMembers = 8;
  // Long enough that the cancel, sent once member 3's third epoch is heard, lands while the pack
  // trains: a pack's epochs are heard up to 50 ms after they end (kPackEpochsHeldFor).
  constexpr int kEpochs = 3000;
  engine::RemoteSweepRequest share;
  share.request_id = "sweep-leader002.00000000000000dd";
  for (int i = 0; i < kMembers; ++i) {
    engine::RemoteJobRequest member = Member(kEpochs);
    member.spec.learning_rate = 0.01 * (i + 1);
    member.spec.seed = 11 + i;
    share.members.push_back(member.spec);
    share.job_ids.push_back(absl::StrCat("job-leader0010", i));
  }
  std::vector<std::vector<int32_t>> epochs(kMembers);  // written on the calling thread only
  std::atomic<int> most_threads{0};
  std::vector<engine::RemoteMemberCalls> calls(kMembers);
  for (int i = 0; i < kMembers; ++i) {
    calls[i].on_queued = [](const std::string&, const std::string&) {};
    calls[i].on_epoch = [&, i](const engine::EpochResult& epoch) {
      epochs[i].push_back(epoch.epoch);
      most_threads = std::max(most_threads.load(), ThreadCount());
    };
    // Member 3 is cancelled here after its third epoch.
    calls[i].stop = [&, i] {
      return i == 2 && epochs[i].size() >= 3 ? engine::RemoteStop::kCancel
                                             : engine::RemoteStop::kNone;
    };
  }
  const int before = ThreadCount();
  const std::vector<engine::RemoteJobResult> ended =
      leader->RunSweep(server_->address(), share, calls);
  ASSERT_EQ(ended.size(), static_cast<size_t>(kMembers));
  for (int i = 0; i < kMembers; ++i) {
    const engine::RemoteJobResult& result = ended[i];
    ASSERT_TRUE(result.status.ok()) << "member " << i + 1 << ": " << result.status;
    ASSERT_FALSE(epochs[i].empty()) << "member " << i + 1;
    for (size_t e = 0; e < epochs[i].size(); ++e) {
      EXPECT_EQ(epochs[i][e], static_cast<int32_t>(e + 1)) << "member " << i + 1;
    }
    if (i == 2) {
      EXPECT_TRUE(result.stopped);
      EXPECT_EQ(result.job.state, engine::JobState::kCancelled);
      EXPECT_LT(epochs[i].size(), static_cast<size_t>(kEpochs));
      continue;
    }
    EXPECT_FALSE(result.stopped) << "member " << i + 1;
    EXPECT_EQ(result.job.state, engine::JobState::kSucceeded) << result.job.error;
    EXPECT_EQ(epochs[i].size(), static_cast<size_t>(kEpochs));
    EXPECT_EQ(result.job.report.packed_members, kMembers);
    EXPECT_EQ(result.job.spec.seed, share.members[i].seed);
    EXPECT_FALSE(result.model_archive.empty());
  }
  // The peer (in this process) trains the pack on one worker, and gRPC keeps a few threads of
  // its own; following adds fewer threads than members.
  EXPECT_LT(most_threads.load() - before, kMembers)
      << "threads before " << before << ", at most " << most_threads.load();
  EXPECT_THAT(ListedAs(kOps, share.request_id), IsEmpty());  // each read and deleted there
}

}  // namespace
}  // namespace trainerd::service::testing
