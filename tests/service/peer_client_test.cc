// The peer client against a real gRPC server on loopback standing in for the peer. What a peer
// says of a sweep's member there is kept in the member's record and shown, so an id or a device
// this daemon's own could not be is refused, naming the peer, before anything of it is kept. A
// member's request id found cancelled there is deleted there and submitted anew. A peer of another
// trainerd or LibTorch version is refused at submit, naming both.
#include "server/service/peer_client.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::service::testing {
namespace {

using ::testing::HasSubstr;

// A peer whose SubmitJob and GetJob answer with the id and device it is given; it never trains.
class HostilePeer final : public v1::JobService::Service {
 public:
  HostilePeer(std::string id, std::string device)
      : id_(std::move(id)), device_(std::move(device)) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::Job* job) override {
    ++submits;
    job->set_id(id_);
    job->set_device(device_);
    job->set_state(v1::JOB_STATE_QUEUED);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* job) override {
    if (request->id() != "job-earlier") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no");
    job->set_id(request->id());
    job->set_device(device_);
    job->set_state(v1::JOB_STATE_RUNNING);
    return grpc::Status::OK;
  }

  int submits = 0;

 private:
  std::string id_;
  std::string device_;
};

// A real server on a free loopback port with `service` (the stand-in peer); its address.
std::unique_ptr<grpc::Server> ServePeer(grpc::Service* service, std::string* address) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = "127.0.0.1:" + std::to_string(port);
  return server;
}

struct Outcome {
  engine::RemoteJobResult result;
  std::vector<std::string> queued;  // the ids on_queued was told
};

Outcome RunAgainst(HostilePeer* peer, const std::string& resume_id = "") {
  std::string address;
  std::unique_ptr<grpc::Server> server = ServePeer(peer, &address);
  Outcome out;
  PeerClientOptions options;
  options.peers = address;
  absl::StatusOr<std::shared_ptr<engine::Peers>> client = MakePeerClient(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return out;
  engine::RemoteJobRequest request;
  request.spec.dataset = "d";
  request.spec.model = "linear:1";
  request.job_id = "job-here";
  request.resume_id = resume_id;
  out.result = (*client)->RunJob(
      address, request,
      [&](const std::string& id, const std::string&) { out.queued.push_back(id); },
      [](const engine::EpochResult&) {}, [] { return engine::RemoteStop::kNone; });
  server->Shutdown();
  return out;
}

TEST(PeerClientTest, AnIdOrDeviceNoDaemonWouldGiveFailsTheMemberNamingThePeer) {
  const std::vector<std::pair<std::string, std::string>> answers = {
      {std::string(1 << 20, 'a'), "cpu"},  // a megabyte of id
      {"", "cpu"},                         // no id
      {"job-1\n../../etc", "cpu"},         // not an id's characters
      {"job-1", std::string(65, 'c')},     // a device name past 64
      {"job-1", "cuda:0\x1b[2J"},          // a terminal escape in the device
  };
  for (const auto& [id, device] : answers) {
    HostilePeer peer(id, device);
    const Outcome out = RunAgainst(&peer);
    EXPECT_EQ(peer.submits, 1);
    EXPECT_EQ(out.result.status.code(), absl::StatusCode::kInternal) << id.size() << device;
    EXPECT_THAT(std::string(out.result.status.message()),
                HasSubstr("answered with a job id or device this daemon cannot keep"));
    EXPECT_THAT(std::string(out.result.status.message()), HasSubstr("peer 127.0.0.1:"));
    EXPECT_TRUE(out.queued.empty()) << "kept before it was checked";
  }
}

TEST(PeerClientTest, AMemberFoundAgainThereIsNotSubmittedTwiceAndItsDeviceIsCheckedToo) {
  // Found again by its id there: no new job; a device no daemon would give fails it as above.
  HostilePeer peer("job-new", std::string(1000, 'x'));
  const Outcome out = RunAgainst(&peer, "job-earlier");
  EXPECT_EQ(peer.submits, 0);
  EXPECT_EQ(out.result.status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(out.queued.empty());
  // Not there any more: submitted anew (whose answer is checked in turn).
  HostilePeer other("job-new", std::string(1000, 'x'));
  const Outcome again = RunAgainst(&other, "job-lost");
  EXPECT_EQ(other.submits, 1);
  EXPECT_EQ(again.result.status.code(), absl::StatusCode::kInternal);
}

// A peer whose SubmitJob first answers with a job cancelled there (a member's request id whose
// job there a lost delete left behind), then with a new one; it records what it was asked.
class CancelledThenNewPeer final : public v1::JobService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::Job* job) override {
    request_ids.push_back(request->request_id());
    const bool first = request_ids.size() == 1 && !deleted_old;
    job->set_id(first ? "job-old" : "job-new");
    job->set_device("cpu");
    job->set_state(first ? v1::JOB_STATE_CANCELLED : v1::JOB_STATE_QUEUED);
    return grpc::Status::OK;
  }
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse*) override {
    if (request->id() == "job-old") deleted_old = true;
    return grpc::Status::OK;
  }

  std::vector<std::string> request_ids;
  bool deleted_old = false;
};

TEST(PeerClientTest, ARequestIdAnsweredWithACancelledJobThereIsDeletedAndSubmittedAgain) {
  CancelledThenNewPeer peer;
  std::string address;
  std::unique_ptr<grpc::Server> server = ServePeer(&peer, &address);
  PeerClientOptions options;
  options.peers = address;
  absl::StatusOr<std::shared_ptr<engine::Peers>> client = MakePeerClient(options);
  ASSERT_TRUE(client.ok()) << client.status();
  engine::RemoteJobRequest request;
  request.spec.dataset = "d";
  request.spec.model = "linear:1";
  request.job_id = "job-here";
  request.request_id = "job-here.0123456789abcdef";
  std::vector<std::string> queued;
  const engine::RemoteJobResult result = (*client)->RunJob(
      address, request, [&](const std::string& id, const std::string&) { queued.push_back(id); },
      [](const engine::EpochResult&) {}, [] { return engine::RemoteStop::kNone; });
  server->Shutdown();
  EXPECT_TRUE(peer.deleted_old);
  EXPECT_THAT(peer.request_ids,
              ::testing::ElementsAre("job-here.0123456789abcdef", "job-here.0123456789abcdef"));
  EXPECT_THAT(queued, ::testing::ElementsAre("job-new"));
  // This stand-in cannot be watched: the member fails, naming the peer, after it was followed.
  EXPECT_FALSE(result.status.ok());
  EXPECT_THAT(std::string(result.status.message()), HasSubstr(address));
}

// A peer that answers GetVersion with the versions it is given.
class VersionedPeer final : public v1::SystemService::Service {
 public:
  VersionedPeer(std::string trainerd, std::string libtorch) {
    info_.set_trainerd_version(std::move(trainerd));
    info_.set_libtorch_version(std::move(libtorch));
  }
  grpc::Status GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*,
                          v1::VersionInfo* info) override {
    *info = info_;
    return grpc::Status::OK;
  }

 private:
  v1::VersionInfo info_;
};

absl::Status CheckVersionOf(VersionedPeer* peer) {
  PeerClientOptions options;
  std::unique_ptr<grpc::Server> server = ServePeer(peer, &options.peers);
  options.trainerd_version = "1.2.0";
  options.libtorch_version = "2.11.0";
  absl::StatusOr<std::shared_ptr<engine::Peers>> client = MakePeerClient(options);
  if (!client.ok()) return client.status();
  absl::Status checked = (*client)->CheckVersion(options.peers);
  server->Shutdown();
  return checked;
}

TEST(PeerClientTest, APeerOfAnotherTrainerdOrLibTorchVersionIsRefusedNamingBoth) {
  VersionedPeer same("1.2.0", "2.11.0");
  EXPECT_TRUE(CheckVersionOf(&same).ok()) << CheckVersionOf(&same);
  VersionedPeer older("1.1.0", "2.11.0");
  absl::Status refused = CheckVersionOf(&older);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("runs trainerd 1.1.0 on LibTorch 2.11.0, this daemon trainerd 1.2.0 on "
                        "LibTorch 2.11.0: ranks and members train only on daemons of one "
                        "version"));
  VersionedPeer other_torch("1.2.0", "2.10.0");
  EXPECT_THAT(std::string(CheckVersionOf(&other_torch).message()), HasSubstr("on LibTorch 2.10.0"));
  // What it says is shown quoted and cut short, never as it came.
  VersionedPeer hostile("\x1b[2J" + std::string(1 << 20, 'v'), "2.11.0");
  absl::Status quoted = CheckVersionOf(&hostile);
  EXPECT_EQ(quoted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(quoted.message().size(), 600u);
  EXPECT_EQ(std::string(quoted.message()).find('\x1b'), std::string::npos);
}

// A peer's upload end that keeps what it receives and answers with a SHA-256 of its choosing.
class ReceivingPeer final : public v1::DatasetService::Service {
 public:
  explicit ReceivingPeer(std::string answer) : answer_(std::move(answer)) {}
  grpc::Status UploadDataset(grpc::ServerContext*,
                             grpc::ServerReader<v1::UploadDatasetRequest>* reader,
                             v1::Dataset* dataset) override {
    v1::UploadDatasetRequest message;
    while (reader->Read(&message)) {
      if (message.has_header()) header = message.header();
      if (message.data_case() == v1::UploadDatasetRequest::kChunk) {
        ++chunks;
        payload += message.chunk();
      }
    }
    dataset->set_name(header.name());
    dataset->set_sha256(answer_);
    return grpc::Status::OK;
  }
  v1::DatasetHeader header;
  std::string payload;
  int chunks = 0;

 private:
  std::string answer_;
};

// CopyDataset sends the file's payload (from its offset, in chunks of at most 1 MiB) with the
// header's values and SHA-256, under the name it is given there, marked a copy for peer jobs; a
// peer that answers with another SHA-256 is DATA_LOSS naming both, and a file shorter than its
// header says is INTERNAL, sent no further.
TEST(PeerClientTest, ADatasetIsSentFromItsFileAndItsChecksumIsHeldAgainstThePeers) {
  const std::string path = ::testing::TempDir() + "peer_client_test_dataset.trds";
  const int64_t offset = 4096;
  std::string payload(int64_t{2} << 20 | 12345, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 % 251);
  std::ofstream(path, std::ios::binary) << std::string(offset, 'h') << payload;
  engine::DatasetMeta meta;
  meta.name = "waves";
  meta.feature_shape = {4};
  meta.rows = 1000;
  meta.size_bytes = static_cast<int64_t>(payload.size());
  meta.sha256 = std::string(64, 'a');
  auto copy = [&](ReceivingPeer* peer, const engine::DatasetMeta& sent) {
    PeerClientOptions options;
    std::unique_ptr<grpc::Server> server = ServePeer(peer, &options.peers);
    absl::StatusOr<std::shared_ptr<engine::Peers>> client = MakePeerClient(options);
    EXPECT_TRUE(client.ok()) << client.status();
    absl::Status copied = (*client)->CopyDataset(options.peers, "user/waves", sent, path, offset);
    server->Shutdown();
    return copied;
  };
  ReceivingPeer honest(meta.sha256);
  EXPECT_TRUE(copy(&honest, meta).ok());
  EXPECT_EQ(honest.payload, payload);
  EXPECT_EQ(honest.chunks, 3);
  EXPECT_EQ(honest.header.name(), "user/waves");  // the submitter's there
  EXPECT_TRUE(honest.header.for_peer_jobs());
  EXPECT_EQ(honest.header.row_count(), 1000);
  EXPECT_EQ(honest.header.sha256(), meta.sha256);
  ASSERT_EQ(honest.header.feature_shape_size(), 1);

  ReceivingPeer liar(std::string(64, 'b'));
  const absl::Status lied = copy(&liar, meta);
  EXPECT_EQ(lied.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(lied.message()), HasSubstr("with sha256 bbbb"));

  engine::DatasetMeta longer = meta;
  longer.size_bytes += int64_t{3} << 20;
  ReceivingPeer short_file(meta.sha256);
  const absl::Status cut = copy(&short_file, longer);
  EXPECT_EQ(cut.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(cut.message()), HasSubstr("shorter than its header says"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace trainerd::service::testing
