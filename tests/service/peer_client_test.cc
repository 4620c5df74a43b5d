// The peer client's answers from a peer that means harm, through a real gRPC server on loopback
// standing in for the peer: what a peer says of a sweep's member there is kept in the member's
// record and shown, so an id or a device this daemon's own could not be is refused, naming the
// peer, before anything of it is kept.
#include "server/service/peer_client.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainerd/v1/jobs.grpc.pb.h"

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

struct Outcome {
  engine::RemoteJobResult result;
  std::vector<std::string> queued;  // the ids on_queued was told
};

Outcome RunAgainst(HostilePeer* peer, const std::string& resume_id = "") {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(peer);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  Outcome out;
  const std::string address = "127.0.0.1:" + std::to_string(port);
  PeerClientOptions options;
  options.peers = address;
  absl::StatusOr<std::shared_ptr<engine::RemoteRanks>> client = MakePeerClient(options);
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

}  // namespace
}  // namespace trainerd::service::testing
