#include "server/service/peer_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_limits.h"
#include "common/status_macros.h"
#include "proto/message_paths.h"
#include "server/convert/convert.h"
#include "server/engine/engine.h"
#include "server/engine/log.h"
#include "server/service/dataset_copy.h"
#include "server/service/member_watch.h"
#include "server/service/peer_credentials.h"
#include "trainerd/v1/datasets.grpc.pb.h"
#include "trainerd/v1/jobs.grpc.pb.h"
#include "trainerd/v1/peers.grpc.pb.h"
#include "trainerd/v1/system.grpc.pb.h"

namespace trainerd::service {

using convert::FromProto;
using convert::ToProto;
namespace {

// How long Submit waits for a peer to say whether it holds a dataset.
constexpr auto kCheckDeadline = std::chrono::seconds(5);
// A unary call to a peer about a sweep's member (submit, get, cancel, delete).
constexpr auto kCallDeadline = std::chrono::seconds(30);
// How long a stopping member's peer has to say it cancelled the member.
constexpr auto kStopDeadline = std::chrono::seconds(5);
// The largest message a peer may send (a Job with all its epochs).
constexpr int kMaxPeerMessageBytes = 256 * 1024 * 1024;
// The largest model a peer may hand back for a member (trainerd's models are far smaller).
constexpr size_t kMaxPeerModelBytes = size_t{1} << 30;
// How often --peers' DNS names are looked up again.
constexpr auto kResolveInterval = std::chrono::seconds(5);
// The checks Submit makes of a peer only read, so gRPC may send them again when the connection
// they went out on turned out dead (UNAVAILABLE): a peer that was stopped (SIGSTOP) or cut off a
// while leaves this daemon's channel on a connection the peer has reset, and the first call on it
// fails although the peer is back. Within each call's own deadline; nothing that starts work
// there (a rank, an upload) is retried.
constexpr char kPeerServiceConfig[] = R"json({"methodConfig": [{
  "name": [{"service": "trainerd.v1.SystemService", "method": "GetVersion"},
           {"service": "trainerd.v1.PeerService", "method": "CheckCredentials"},
           {"service": "trainerd.v1.DatasetService", "method": "GetDataset"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})json";

bool HostPort(const std::string& entry) {
  const size_t colon = entry.rfind(':');
  int port = 0;
  return colon != std::string::npos && colon > 0 &&
         absl::SimpleAtoi(entry.substr(colon + 1), &port) && port > 0 && port <= 65535;
}

// A status from a peer, in a sentence that names it and says what the operator can do.
absl::Status PeerError(const std::string& peer, const grpc::Status& status,
                       const std::string& what) {
  const std::string message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::FailedPreconditionError(absl::StrCat(
          "peer ", peer,
          " refused this daemon's credentials (--peer_token_file, --peer_tls_*): ", message));
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::UnavailableError(
          absl::StrCat("peer ", peer, " cannot be reached ", what, ": ", message));
    default:
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("peer ", peer, ": ", message));
  }
}

// What a peer answers for a member's job there is kept in the member's record and shown: an id
// as this daemon's own are (at most kMaxJobIdLength of [A-Za-z0-9_-]) and a device name of at
// most 64 such characters (and ':'), or the member fails naming the peer.
absl::Status CheckPeerAnswer(const std::string& peer, const std::string& id,
                             const std::string& device) {
  auto plain = [](const std::string& text, size_t most, bool colon) {
    return text.size() <= most && std::all_of(text.begin(), text.end(), [colon](char c) {
             return absl::ascii_isalnum(c) || c == '-' || c == '_' || (colon && c == ':');
           });
  };
  if (id.empty() || !plain(id, kMaxJobIdLength, false) || !plain(device, 64, true)) {
    return absl::InternalError(
        absl::StrCat("peer ", peer, " answered with a job id or device this daemon cannot keep (",
                     id.size(), " and ", device.size(), " characters; at most ", kMaxJobIdLength,
                     " and 64 letters, digits, '-' and '_')"));
  }
  return absl::OkStatus();
}

// A job's spec as a peer is sent it: its datasets by their names there (JobSpec::node_dataset:
// the job's owner's there), or for a job recorded before those names, by its keys qualified
// ("/NAME" for one without an owner), which the leader's admin credentials resolve there.
engine::JobSpec SpecForPeer(engine::JobSpec spec) {
  auto qualified = [](const std::string& key) {
    return key.find('/') == std::string::npos ? "/" + key : key;
  };
  spec.dataset = spec.node_dataset.empty() ? qualified(spec.dataset) : spec.node_dataset;
  if (!spec.validation_dataset.empty()) {
    spec.validation_dataset = spec.node_validation_dataset.empty()
                                  ? qualified(spec.validation_dataset)
                                  : spec.node_validation_dataset;
  }
  spec.node_dataset.clear();
  spec.node_validation_dataset.clear();
  return spec;
}

// The name part of a dataset's name on a peer ("OWNER/NAME"), as its owner calls it.
std::string BareName(const std::string& name_there) {
  const size_t slash = name_there.rfind('/');
  return slash == std::string::npos ? name_there : name_there.substr(slash + 1);
}

class GrpcPeers final : public engine::Peers {
 public:
  GrpcPeers(PeerClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)), credentials_(std::move(credentials)) {}

  std::vector<std::string> peers() const override {
    std::lock_guard<std::mutex> lock(peers_mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!resolved_once_ || now - resolved_at_ > kResolveInterval) {
      absl::StatusOr<std::vector<std::string>> peers = ResolvePeers(options_.peers, options_.self);
      if (peers.ok()) resolved_ = *std::move(peers);  // a failed lookup keeps the last answer
      resolved_once_ = true;
      resolved_at_ = now;
    }
    if (!options_.discovered) return resolved_;
    std::vector<std::string> out = resolved_;
    for (std::string& peer : options_.discovered()) {
      if (peer != options_.self && std::find(out.begin(), out.end(), peer) == out.end()) {
        out.push_back(std::move(peer));
      }
    }
    return out;
  }

  absl::Status CheckVersion(const std::string& peer) override {
    // Asked first of every peer a job names: without credentials the peers would refuse the
    // rank anyway, so it is refused here with what to do.
    if (!options_.missing_token_file.empty() && options_.tls_cert_file.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this daemon has no peer token: --peer_token_file '", options_.missing_token_file,
          "' does not exist (on Kubernetes: the Secret's peer-token key, docs/DEPLOY.md); put "
          "an admin token of the peers there and restart the daemon"));
    }
    auto stub = v1::SystemService::NewStub(Channel(peer));
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + kCheckDeadline);
    v1::VersionInfo there;
    const grpc::Status status = stub->GetVersion(&context, v1::GetVersionRequest(), &there);
    if (!status.ok()) return PeerError(peer, status, "to ask its version");
    if (there.trainerd_version() != options_.trainerd_version ||
        there.libtorch_version() != options_.libtorch_version) {
      // Quoted as sent, cut short: the peer's words are shown to the caller.
      auto shown = [](const std::string& text) {
        return absl::CHexEscape(text.substr(0, std::min<size_t>(text.size(), 64)));
      };
      return absl::FailedPreconditionError(absl::StrCat(
          "peer ", peer, " runs trainerd ", shown(there.trainerd_version()), " on LibTorch ",
          shown(there.libtorch_version()), ", this daemon trainerd ", options_.trainerd_version,
          " on LibTorch ", options_.libtorch_version,
          ": ranks and members train only on daemons of one version (upgrade them together)"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckAdmin(const std::string& peer) override {
    auto stub = v1::PeerService::NewStub(Channel(peer));
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + kCheckDeadline);
    v1::CheckCredentialsResponse answer;
    const grpc::Status status =
        stub->CheckCredentials(&context, v1::CheckCredentialsRequest(), &answer);
    if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "peer ", peer, " does not take this daemon's peer credentials as an admin's (",
          status.error_message(),
          "): --peer_token_file must hold a token marked admin there (or, with --peer_tls_cert, "
          "the certificate's subject must be in its --admin); nothing was sent there"));
    }
    if (!status.ok()) return PeerError(peer, status, "to check this daemon's credentials");
    return absl::OkStatus();
  }

  absl::Status CheckDataset(const std::string& peer, const std::string& name_there,
                            const std::string& sha256) override {
    auto stub = v1::DatasetService::NewStub(Channel(peer));
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + kCheckDeadline);
    v1::GetDatasetRequest request;
    request.set_name(name_there);
    v1::Dataset dataset;
    const grpc::Status status = stub->GetDataset(&context, request, &dataset);
    const std::string name = BareName(name_there);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::NotFoundError(absl::StrCat("dataset '", name, "' is not on peer ", peer));
    }
    if (!status.ok()) return PeerError(peer, status, "to check the dataset");
    if (dataset.sha256() != sha256) {
      // Only the job's owner's own datasets there are asked for: what she uploaded there under
      // that name is another dataset. Its SHA-256 is not shown all the same.
      return absl::FailedPreconditionError(absl::StrCat(
          "dataset '", name, "' on peer ", peer, " is not this daemon's (another SHA-256 than ",
          sha256,
          "): the peer keeps the one uploaded there under that name, so give this one another "
          "name, or delete that one there"));
    }
    return absl::OkStatus();
  }

  absl::Status CopyDataset(const std::string& peer, const std::string& name_there,
                           const engine::DatasetMeta& meta, const std::string& path,
                           int64_t payload_offset) override {
    auto stub = v1::DatasetService::NewStub(Channel(peer));
    // Bounded, as every call to a peer: half a minute, and a second per 8 MiB (a link slower
    // than 64 Mbit/s gives up).
    const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30) +
                          std::chrono::seconds(meta.size_bytes >> 23);
    const absl::Status sent = SendDataset(
        stub.get(), name_there, meta, path, payload_offset,
        [&](grpc::ClientContext* context) {
          Authorize(context);
          context->set_deadline(deadline);
        },
        [&](const grpc::Status& status) {
          return PeerError(peer, status, absl::StrCat("to receive dataset '", meta.name, "'"));
        });
    if (!sent.ok()) return sent;
    engine::LogInfo(absl::StrCat("dataset '", engine::DatasetKeyOf(meta), "' (", meta.size_bytes,
                                 " bytes) sent to peer ", peer, " as '", name_there,
                                 "', which it lacked"));
    return absl::OkStatus();
  }

  std::unique_ptr<Call> StartRank(const std::string& peer, const engine::RemoteRankRequest& rank,
                                  std::function<void(engine::RemoteRankResult)> done) override {
    // What the call needs lives as long as the call: shared by the handle and the callback.
    struct State {
      grpc::ClientContext context;
      v1::RunRankRequest request;
      v1::RunRankResponse response;
      std::unique_ptr<v1::PeerService::Stub> stub;
    };
    auto state = std::make_shared<State>();
    state->stub = v1::PeerService::NewStub(Channel(peer));
    Authorize(&state->context);
    v1::RunRankRequest& request = state->request;
    *request.mutable_spec() = ToProto(SpecForPeer(rank.spec));
    request.set_job_id(rank.job_id);
    request.set_rank(rank.rank);
    request.set_world_size(rank.world_size);
    request.set_store_host(rank.store_host);
    request.set_store_port(rank.store_port);
    request.set_prefix(rank.prefix);
    request.set_timeout_seconds(rank.timeout_seconds);
    request.set_dataset_sha256(rank.dataset_sha256);
    request.set_store_secret(rank.store_secret);
    request.set_resume_bytes(rank.resume_bytes);
    request.set_resume_sha256(rank.resume_sha256);
    state->stub->async()->RunRank(
        &state->context, &state->request, &state->response,
        [state, peer, done = std::move(done)](grpc::Status status) {
          engine::RemoteRankResult result;
          if (!status.ok()) {
            result.status = PeerError(peer, status, "for its rank");
          } else {
            absl::StatusOr<engine::JobState> state_of = FromProto(state->response.state());
            result.state = state_of.ok() ? *state_of : engine::JobState::kFailed;
            if (state->response.state() == v1::JOB_STATE_RUNNING) {
              result.state = engine::JobState::kRunning;  // stopped there, not over
            }
            result.error = state->response.error();
            result.steps = state->response.steps();
            result.collective_seconds = state->response.collective_seconds();
            result.node = state->response.node();
          }
          done(std::move(result));
        });
    class Handle final : public Call {
     public:
      explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
      void Cancel() override { state_->context.TryCancel(); }

     private:
      std::shared_ptr<State> state_;
    };
    return std::make_unique<Handle>(state);
  }

  engine::RemoteJobResult RunJob(
      const std::string& peer, const engine::RemoteJobRequest& job,
      const std::function<void(const std::string&, const std::string&)>& on_queued,
      const std::function<void(const engine::EpochResult&)>& on_epoch,
      const std::function<engine::RemoteStop()>& stop) override {
    engine::RemoteJobResult result;
    auto stub = v1::JobService::NewStub(Channel(peer));
    std::string id;
    std::string device;
    if (!job.resume_id.empty()) {
      // Taken up again where it stands there, unless the peer lost it (a restart there without
      // its records, its retention) or it was cancelled there: then it trains anew.
      grpc::ClientContext context;
      Authorize(&context);
      context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
      v1::GetJobRequest request;
      request.set_id(job.resume_id);
      v1::Job found;
      const grpc::Status status = stub->GetJob(&context, request, &found);
      if (status.ok() && found.state() != v1::JOB_STATE_CANCELLED) {
        id = job.resume_id;
        device = found.device();
      } else if (status.ok()) {
        DeleteThere(stub.get(), job.resume_id);
      } else if (status.error_code() != grpc::StatusCode::NOT_FOUND) {
        result.status = PeerError(peer, status, "to take a sweep's member up again");
        return result;
      }
    }
    if (id.empty() && !job.share_request_id.empty()) {
      // Sent before as one of a sweep there, and its id there not recorded: found by that
      // sweep's request id and its place in it (Job.sweep_member). One cancelled there trains
      // anew, alone.
      absl::StatusOr<std::optional<v1::Job>> found = FindShareMember(stub.get(), peer, job);
      if (!found.ok()) {
        result.status = found.status();
        return result;
      }
      if (found->has_value() && (*found)->state() == v1::JOB_STATE_CANCELLED) {
        DeleteThere(stub.get(), (*found)->id());
      } else if (found->has_value()) {
        id = (*found)->id();
        device = (*found)->device();
      }
    }
    if (id.empty() && stop() == engine::RemoteStop::kCancel) {
      // Cancelled here before its id there was known: a submit that reached the peer before this
      // daemon was killed is found by its request id, and followed until the cancel ends it.
      if (!job.request_id.empty()) {
        grpc::ClientContext context;
        Authorize(&context);
        context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
        v1::ListJobsRequest request;
        request.set_request_id(job.request_id);
        v1::ListJobsResponse found;
        const grpc::Status status = stub->ListJobs(&context, request, &found);
        if (!status.ok()) {
          result.status = PeerError(peer, status, "to find a cancelled sweep's member");
          return result;
        }
        if (found.jobs_size() > 0) {
          id = found.jobs(0).id();
          device = found.jobs(0).device();
        }
      }
      if (id.empty()) {
        result.stopped = true;  // cancelled here, and nothing of it there to cancel
        result.job.state = engine::JobState::kCancelled;
        return result;
      }
    }
    // Submitted as a job of the peer's own: its queue, admission and limits decide. With the
    // member's request id, a submit that a killed daemon made before gets that job back. One
    // found cancelled there (its delete lost) is deleted and submitted again, once.
    bool taken = !id.empty();
    for (int attempt = 0; !taken && attempt < 2; ++attempt) {
      grpc::ClientContext context;
      Authorize(&context);
      context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
      v1::SubmitJobRequest request;
      *request.mutable_spec() = ToProto(SpecForPeer(job.spec));
      request.set_request_id(job.request_id);
      v1::Job submitted;
      const grpc::Status status = stub->SubmitJob(&context, request, &submitted);
      if (!status.ok()) {
        result.status = PeerError(peer, status, "to train a sweep's member");
        return result;
      }
      if (submitted.state() == v1::JOB_STATE_CANCELLED) {
        if (absl::Status checked = CheckPeerAnswer(peer, submitted.id(), submitted.device());
            !checked.ok()) {
          result.status = std::move(checked);
          return result;
        }
        DeleteThere(stub.get(), submitted.id());
        continue;
      }
      id = submitted.id();
      device = submitted.device();
      taken = true;
    }
    if (!taken) {
      result.status = absl::UnavailableError(
          absl::StrCat("peer ", peer, " keeps answering the member's request id '", job.request_id,
                       "' with a cancelled job that it does not delete"));
      return result;
    }
    if (absl::Status checked = CheckPeerAnswer(peer, id, device); !checked.ok()) {
      result.status = std::move(checked);
      return result;
    }
    on_queued(id, device);
    return Follow(stub.get(), peer, id, on_epoch, stop);
  }

  std::vector<engine::RemoteJobResult> RunSweep(
      const std::string& peer, const engine::RemoteSweepRequest& sweep,
      const std::vector<engine::RemoteMemberCalls>& calls) override {
    const size_t n = sweep.members.size();
    std::vector<engine::RemoteJobResult> results(n);
    auto fail_all = [&](const absl::Status& status) {
      for (engine::RemoteJobResult& result : results) result.status = status;
      return results;
    };
    if (n == 0 || calls.size() != n) {
      return fail_all(absl::InternalError("a sweep for a peer needs one set of calls per member"));
    }
    // One sweep there: the first member's spec, every member a point, with its own spec and
    // the fields it differs in when it differs in more than the four a point carries (a model,
    // a batch size...), under the request id each member recorded before this call.
    v1::SubmitSweepRequest request;
    engine::JobSpec base = sweep.members.front();
    base.nodes.clear();
    *request.mutable_spec() = ToProto(SpecForPeer(base));
    for (const engine::JobSpec& member : sweep.members) {
      v1::SweepPoint* point = request.add_points();
      point->set_learning_rate(member.learning_rate);
      point->set_momentum(member.momentum);
      if (member.weight_decay.has_value()) point->set_weight_decay(*member.weight_decay);
      if (member.seed.has_value()) point->set_seed(*member.seed);
      engine::JobSpec own = member;
      own.nodes.clear();
      v1::JobSpec own_proto = ToProto(SpecForPeer(own));
      const std::vector<std::string> paths =
          proto::DifferingPaths(own_proto, request.spec(), proto::SweptPaths());
      if (paths.empty()) continue;
      *point->mutable_spec() = std::move(own_proto);
      for (const std::string& path : paths) point->mutable_fields()->add_paths(path);
    }
    request.set_request_id(sweep.request_id);
    auto stub = v1::JobService::NewStub(Channel(peer));
    v1::SubmitSweepResponse response;
    {
      grpc::ClientContext context;
      Authorize(&context);
      context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
      const grpc::Status status = stub->SubmitSweep(&context, request, &response);
      if (!status.ok()) return fail_all(PeerError(peer, status, "to train a sweep's members"));
    }
    if (static_cast<size_t>(response.members_size()) != n) {
      return fail_all(
          absl::InternalError(absl::StrCat("peer ", peer, " answered a sweep of ", n,
                                           " members with ", response.members_size(), " of them")));
    }
    for (const v1::Job& member : response.members()) {
      if (absl::Status checked = CheckPeerAnswer(peer, member.id(), member.device());
          !checked.ok()) {
        return fail_all(checked);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      calls[i].on_queued(response.members(i).id(), response.members(i).device());
    }
    // Every member followed at once (they train together there), each stream a reactor whose
    // events come back to this thread: no thread per member. Each is read and deleted there as
    // it ends, while the others go on.
    std::vector<WatchedMember> watched;
    watched.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      watched.push_back({response.members(i).id(), calls[i].on_epoch, calls[i].stop});
    }
    WatchMembers(stub.get(), watched, WatchOptionsHere(), [&](size_t i, const WatchEnd& end) {
      results[i] = Finish(stub.get(), peer, response.members(i).id(), end);
    });
    return results;
  }

 private:
  // A member of a sweep sent there before (RemoteJobRequest::share_request_id), by its place in
  // it; nullopt when the peer no longer has it (or what it has there is another member's).
  absl::StatusOr<std::optional<v1::Job>> FindShareMember(v1::JobService::Stub* stub,
                                                         const std::string& peer,
                                                         const engine::RemoteJobRequest& job) {
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    v1::ListJobsRequest request;
    request.set_request_id(job.share_request_id);
    request.set_page_size(static_cast<int32_t>(engine::kMaxSweepMembers));
    v1::ListJobsResponse found;
    const grpc::Status status = stub->ListJobs(&context, request, &found);
    if (!status.ok()) return PeerError(peer, status, "to find a sweep's member");
    // By its place (the members before it may be read and deleted there already), and only with
    // its own values.
    for (const v1::Job& there : found.jobs()) {
      if (there.sweep_member() != job.share_member) continue;
      absl::StatusOr<engine::JobSpec> spec = FromProto(there.spec());
      if (!spec.ok() || spec->learning_rate != job.spec.learning_rate ||
          spec->momentum != job.spec.momentum || spec->seed != job.spec.seed) {
        return std::nullopt;
      }
      if (absl::Status checked = CheckPeerAnswer(peer, there.id(), there.device()); !checked.ok()) {
        return checked;
      }
      return there;
    }
    return std::nullopt;
  }

  // Follows the member's job `id` there to its end (WatchMembers), then reads its end and model
  // (Finish).
  engine::RemoteJobResult Follow(v1::JobService::Stub* stub, const std::string& peer,
                                 const std::string& id,
                                 const std::function<void(const engine::EpochResult&)>& on_epoch,
                                 const std::function<engine::RemoteStop()>& stop) {
    engine::RemoteJobResult result;
    WatchMembers(stub, {WatchedMember{id, on_epoch, stop}}, WatchOptionsHere(),
                 [&](size_t, const WatchEnd& end) { result = Finish(stub, peer, id, end); });
    return result;
  }

  WatchOptions WatchOptionsHere() const {
    WatchOptions options;
    options.authorize = [this](grpc::ClientContext* context) { Authorize(context); };
    options.stop_deadline = kStopDeadline;
    return options;
  }

  // A member whose stream there ended: a stop answered (cancelled there, or left training there
  // by a detach), or its end and model read, and then the job deleted there.
  engine::RemoteJobResult Finish(v1::JobService::Stub* stub, const std::string& peer,
                                 const std::string& id, const WatchEnd& end) {
    engine::RemoteJobResult result;
    const grpc::Status& watched = end.status;
    result.stopped = end.stopped;
    if (end.detached && !watched.ok()) {
      result.detached = true;  // left training there; its id is the member's record
      return result;
    }
    if (result.stopped && !watched.ok()) {
      // Cancelled there (or it could not be told); nothing more to read.
      result.job.state = engine::JobState::kCancelled;
      return result;
    }
    if (!watched.ok()) {
      result.status = PeerError(peer, watched, "while it trained a sweep's member");
      return result;
    }
    v1::Job ended;
    {
      grpc::ClientContext context;
      Authorize(&context);
      context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
      v1::GetJobRequest request;
      request.set_id(id);
      const grpc::Status status = stub->GetJob(&context, request, &ended);
      if (!status.ok()) {
        result.status = PeerError(peer, status, "to read a sweep's member");
        return result;
      }
    }
    absl::StatusOr<engine::JobSnapshot> snapshot = FromProto(ended);
    if (!snapshot.ok()) {
      result.status = absl::InternalError(absl::StrCat(
          "peer ", peer,
          " answered with a job this daemon cannot read: ", snapshot.status().message()));
      return result;
    }
    result.job = *std::move(snapshot);
    if (ended.state() == v1::JOB_STATE_SUCCEEDED) {
      absl::Status fetched =
          Download(stub, peer, id, v1::MODEL_FORMAT_TORCHSCRIPT, &result.model_archive);
      if (!fetched.ok()) {
        result.status = std::move(fetched);
        return result;
      }
      // The state_dict too; a peer that kept none (an older build, which also sends its archive
      // for a format it does not know) leaves the member without one, which is checked when it
      // is kept.
      std::string state_dict;
      if (Download(stub, peer, id, v1::MODEL_FORMAT_SAFETENSORS, &state_dict).ok()) {
        result.state_dict = std::move(state_dict);
      }
    }
    // The member's home is this daemon: nothing of it stays there.
    DeleteThere(stub, id);
    return result;
  }

  // A member's model from its peer, in `format`, into *out (at most kMaxPeerModelBytes).
  absl::Status Download(v1::JobService::Stub* stub, const std::string& peer,
                        const std::string& id, v1::ModelFormat format, std::string* out) const {
    grpc::ClientContext context;
    Authorize(&context);
    v1::DownloadModelRequest request;
    request.set_id(id);
    request.set_format(format);
    std::unique_ptr<grpc::ClientReader<v1::ModelChunk>> reader =
        stub->DownloadModel(&context, request);
    v1::ModelChunk chunk;
    bool too_big = false;
    while (reader->Read(&chunk)) {
      if (out->size() + chunk.data().size() > kMaxPeerModelBytes) {
        too_big = true;
        context.TryCancel();
        break;
      }
      *out += chunk.data();
    }
    const grpc::Status status = reader->Finish();
    if (too_big) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "peer ", peer, "'s model of the member is larger than ", kMaxPeerModelBytes, " bytes"));
    }
    if (!status.ok()) return PeerError(peer, status, "to give the member's model");
    return absl::OkStatus();
  }

  void DeleteThere(v1::JobService::Stub* stub, const std::string& id) const {
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    v1::DeleteJobRequest request;
    request.set_id(id);
    v1::DeleteJobResponse deleted;
    (void)stub->DeleteJob(&context, request, &deleted);
  }

  void Authorize(grpc::ClientContext* context) const {
    if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(peer);
    if (it != channels_.end()) return it->second;
    // No keepalive pings: a rank's call is silent for the job's length, and a server's default
    // policy answers frequent pings on a silent connection by closing it. A peer cut off is
    // noticed by the ranks' collectives instead (Gloo's closed connection, or the collective
    // timeout), which end the rank, and with it the call.
    // A member's Job carries its every epoch (up to a million of them): past gRPC's default
    // 4 MiB, as trainctl allows.
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(kMaxPeerMessageBytes);
    arguments.SetServiceConfigJSON(kPeerServiceConfig);
    auto channel = grpc::CreateCustomChannel(peer, credentials_, arguments);
    channels_.emplace(peer, channel);
    return channel;
  }

  const PeerClientOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable std::mutex peers_mu_;
  mutable std::vector<std::string> resolved_;  // guarded by peers_mu_
  mutable bool resolved_once_ = false;
  mutable std::chrono::steady_clock::time_point resolved_at_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::shared_ptr<engine::Peers>> MakePeerClient(PeerClientOptions options) {
  // The form now (a name that does not resolve yet is not an error: its daemons may come later).
  for (absl::string_view raw : absl::StrSplit(options.peers, ',', absl::SkipWhitespace())) {
    std::string entry(absl::StripAsciiWhitespace(raw));
    if (absl::StartsWith(entry, "dns:")) entry = entry.substr(4);
    if (!HostPort(entry)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", entry, "' is not host:port (or dns:NAME:PORT)"));
    }
  }
  TRAINERD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                            PeerCredentials(options));
  return std::make_shared<GrpcPeers>(std::move(options), std::move(credentials));
}

absl::StatusOr<std::vector<std::string>> ResolvePeers(const std::string& flag,
                                                      const std::string& self) {
  std::vector<std::string> peers;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    std::string entry(absl::StripAsciiWhitespace(raw));
    if (absl::StartsWith(entry, "dns:")) {
      const std::string name_port = entry.substr(4);
      if (!HostPort(name_port)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--peers: '", entry, "' is not dns:NAME:PORT"));
      }
      const size_t colon = name_port.rfind(':');
      const std::string name = name_port.substr(0, colon);
      const std::string port = name_port.substr(colon + 1);
      addrinfo hints{};
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      if (getaddrinfo(name.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
        continue;  // none of its daemons is up yet
      }
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        char text[INET_ADDRSTRLEN] = {};
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
        if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
        const std::string peer = absl::StrCat(text, ":", port);
        if (peer != self && seen.insert(peer).second) peers.push_back(peer);
      }
      freeaddrinfo(found);
      continue;
    }
    if (!HostPort(entry)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", entry, "' is not host:port (or dns:NAME:PORT)"));
    }
    if (seen.insert(entry).second) peers.push_back(entry);
  }
  return peers;
}

}  // namespace trainerd::service
