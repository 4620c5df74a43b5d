// Ranks on peers: the leader's check of a job's nodes before admission (CheckPeers), and a peer's
// side of a rank the leader runs here (RunRankForPeer). The calls between daemons are the service
// layer's (distributed/peers.h); the group is the distributed room's.
#include <algorithm>
#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_size.h"
#include "common/status_macros.h"
#include "server/engine/datasets/dataset_file.h"
#include "server/engine/distributed/data_parallel.h"
#include "server/engine/distributed/node_placement.h"
#include "server/engine/engine_impl.h"

namespace trainerd::engine {
namespace {

// "host" of "host:port" ("[v6]:port" too).
std::string HostOf(const std::string& peer) {
  if (!peer.empty() && peer.front() == '[') {
    const size_t end = peer.find(']');
    return end == std::string::npos ? peer : peer.substr(1, end - 1);
  }
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

bool IsLowerHex(const std::string& text, size_t length) {
  return text.size() == length && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

absl::Status Engine::Impl::CheckPeers(std::vector<std::string>* job_nodes, JobSpec* job,
                                      const CallContext& caller, int64_t most) const {
  std::vector<std::string>& nodes = *job_nodes;
  JobSpec& spec = *job;
  if (nodes.empty()) return absl::OkStatus();
  const bool every_peer = std::find(nodes.begin(), nodes.end(), "*") != nodes.end();
  if (every_peer && nodes.size() > 1) {
    return absl::InvalidArgumentError("nodes '*' stands for every peer: give it alone");
  }
  if (options.peers == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("this daemon has no peers (--peers, or a cluster manager's group): it cannot "
                     "run ranks on ",
                     absl::StrJoin(nodes, ", ")));
  }
  const std::vector<std::string> peers = options.peers->peers();
  if (every_peer) {
    // The peers known now, as many as can be used (`most`); the job keeps this list
    // (a restart or a resume places its ranks as the first attempt did).
    if (peers.empty()) {
      return absl::FailedPreconditionError(
          "this daemon knows no peers yet (a cluster manager's group is found within seconds of "
          "its daemons starting; --peers' DNS names once their daemons are up)");
    }
    nodes.assign(peers.begin(),
                 peers.begin() + std::min<int64_t>(static_cast<int64_t>(peers.size()),
                                                   std::max<int64_t>(1, most)));
  }
  for (const std::string& node : nodes) {
    if (std::find(peers.begin(), peers.end(), node) == peers.end()) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node,
                                                     "' is not one of this daemon's --peers (",
                                                     absl::StrJoin(peers, ", "), ")"));
    }
  }
  // Each node must hold the job's datasets as they are here, as the submitter's there.
  std::vector<std::pair<DatasetMeta, std::string>> needed;  // and the name there
  TRAINERD_ASSIGN_OR_RETURN(DatasetMeta dataset, VisibleDataset(spec.dataset, caller));
  spec.node_dataset = NodeDatasetName(dataset, caller.owner);
  needed.emplace_back(dataset, spec.node_dataset);
  spec.node_validation_dataset.clear();
  if (!spec.validation_dataset.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(DatasetMeta validation,
                              VisibleDataset(spec.validation_dataset, caller));
    spec.node_validation_dataset = NodeDatasetName(validation, caller.owner);
    if (spec.validation_dataset != spec.dataset) {
      needed.emplace_back(validation, spec.node_validation_dataset);
    }
  }
  // Asked of each node once: its version, that this daemon's credentials are an admin's there
  // (before anything of a tenant's is sent: an upload there in another tenant's name needs an
  // admin), then each dataset; a node that lacks one gets it from here, read from this daemon's
  // file and uploaded there (checksummed by the peer) as the submitter's, under her quotas
  // there, before the job is admitted.
  for (const std::string& node : std::set<std::string>(nodes.begin(), nodes.end())) {
    TRAINERD_RETURN_IF_ERROR(options.peers->CheckVersion(node));
    TRAINERD_RETURN_IF_ERROR(options.peers->CheckAdmin(node));
    for (const auto& [meta, there] : needed) {
      absl::Status held = options.peers->CheckDataset(node, there, meta.sha256);
      if (absl::IsNotFound(held)) {
        const std::string path = datasets.PathFor(DatasetKeyOf(meta));
        absl::StatusOr<DatasetFileHeader> file = ReadDatasetFileHeader(path);
        held = file.ok() ? options.peers->CopyDataset(node, there, meta, path, file->payload_offset)
                         : file.status();
        if (!held.ok()) {
          held = absl::Status(
              held.code(),
              absl::StrCat("dataset '", DatasetNameFor(DatasetKeyOf(meta), caller.owner),
                           "' is not on peer ", node,
                           ", and sending it there failed: ", held.message()));
        }
      }
      TRAINERD_RETURN_IF_ERROR(held);
    }
  }
  return absl::OkStatus();
}

RemoteRankResult Engine::RunRankForPeer(const RemoteRankRequest& request, const CallContext& caller,
                                        const std::atomic<bool>* cancel) {
  Impl& impl = *impl_;
  RemoteRankResult result;
  result.node = NodeName(impl.options.jobs.node_name);
  auto refuse = [&](absl::Status status) {
    result.status = std::move(status);
    return result;
  };
  const std::string who = absl::StrCat("rank ", request.rank, " of job '", request.job_id, "'");
  // Training here on another daemon's behalf is an operator's act: the leader presents an
  // admin's credentials of this daemon (its --peer_token_file, or its certificate).
  if (!caller.admin) {
    return refuse(absl::PermissionDeniedError(absl::StrCat(
        who, ": running a rank for another daemon takes an admin's credentials here")));
  }
  if (impl.options.peers == nullptr) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat(who, ": this daemon has no --peers and runs no ranks for other daemons")));
  }
  // The store must be a peer's: this daemon connects to no address a caller chooses.
  const std::vector<std::string> peers = impl.options.peers->peers();
  if (std::none_of(peers.begin(), peers.end(),
                   [&](const std::string& peer) { return HostOf(peer) == request.store_host; })) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        who, ": its rendezvous store on '", request.store_host,
        "' is not on one of this daemon's --peers (", absl::StrJoin(peers, ", "), ")")));
  }
  if (request.world_size < 2 || request.world_size > impl.options.max_replicas ||
      request.rank < 1 || request.rank >= request.world_size || request.store_port <= 0 ||
      request.store_port > 65535 || request.prefix.empty() ||
      !(request.timeout_seconds > 0 && request.timeout_seconds <= 3600)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        who, ": not a rank this daemon runs (rank ", request.rank, " of ", request.world_size,
        ", at most ", impl.options.max_replicas, " ranks, a timeout of at most an hour)")));
  }
  if (!IsLowerHex(request.store_secret, 64)) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat(who, ": its rendezvous store's secret is not 64 hex digits")));
  }
  if (request.resume_bytes < 0 ||
      (request.resume_bytes > 0 && !IsLowerHex(request.resume_sha256, 64))) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        who, ": the checkpoint it resumes from needs a size and a SHA-256 of 64 hex digits")));
  }
  JobSpec spec = request.spec;
  spec.replicas = request.world_size;
  // The leader names its datasets as they are here (qualified: the job's owner's): by key from
  // here on.
  absl::StatusOr<std::string> key = impl.KeyFor(spec.dataset, caller);
  absl::StatusOr<std::string> validation_key = spec.validation_dataset.empty()
                                                   ? absl::StatusOr<std::string>("")
                                                   : impl.KeyFor(spec.validation_dataset, caller);
  if (!key.ok() || !validation_key.ok()) {
    return refuse(!key.ok() ? key.status() : validation_key.status());
  }
  spec.dataset = *key;
  spec.validation_dataset = *validation_key;
  absl::StatusOr<DatasetMeta> dataset = impl.VisibleDataset(spec.dataset, caller);
  if (!dataset.ok()) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        who, ": dataset '", spec.dataset, "' is not on this daemon (upload it here too)")));
  }
  if (dataset->sha256 != request.dataset_sha256) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat(who, ": dataset '", spec.dataset, "' here (sha256 ", dataset->sha256,
                     ") is not the leader's (", request.dataset_sha256, ")")));
  }
  absl::StatusOr<ModelSpec> model = CheckJobSpec(spec, *dataset);
  if (!model.ok()) {
    return refuse(
        absl::Status(model.status().code(), absl::StrCat(who, ": ", model.status().message())));
  }
  const std::string why = DataParallelSpecUnsupported(spec, *model, false, torch::kCPU);
  if (!why.empty()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(who, ": ", why)));
  }
  // The rank's datasets resident here and its working set reserved, as a job's; waits while
  // running jobs hold the memory, at most the group's timeout (JobManager::RunPeerRank).
  const int64_t rows = dataset->rows - HeldOutRows(spec.validation_fraction, dataset->rows);
  const int64_t batch = std::max<int64_t>(1, std::min(spec.batch_size, rows));
  absl::StatusOr<MemoryEstimate> estimate =
      EstimateTrainingMemory(*model, dataset->feature_shape, batch, OptimizerSlots(spec));
  if (!estimate.ok()) return refuse(estimate.status());
  // A job taken up again: the checkpoint rank 0 sends comes within what a checkpoint of this
  // model can be, checked before anything is reserved or received, and is held beside the
  // rank's working set while the rank reads it.
  int64_t reserve = estimate->total_bytes;
  if (request.resume_bytes > 0) {
    absl::StatusOr<int64_t> most = MostCheckpointBytes(*estimate, model->layers.size());
    if (!most.ok()) return refuse(most.status());
    if (request.resume_bytes > *most) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat(who, ": its checkpoint of ", request.resume_bytes,
                       " bytes is more than a checkpoint of this model can be (", *most, ")")));
    }
    absl::StatusOr<int64_t> with = CheckedAdd(reserve, request.resume_bytes, "the rank's memory");
    if (!with.ok()) return refuse(with.status());
    reserve = *with;
  }
  JobManager::PeerRank admission;
  admission.holder = absl::StrCat(request.job_id, "/rank-", request.rank);
  admission.leader = request.store_host;
  admission.dataset = spec.dataset;
  admission.validation_dataset = spec.validation_dataset;
  admission.reserve_bytes = reserve;
  admission.wait_until = absl::Now() + absl::Seconds(request.timeout_seconds);
  admission.cancel = cancel;
  bool stopping = false;  // ended by this daemon's Drain or Shutdown
  auto train = [&](const JobDatasets& held, const std::atomic<bool>& stop) {
    TrainingRun run;
    run.spec = spec;
    run.model = *model;
    run.dataset = held.dataset;
    run.validation_dataset = held.validation_dataset;
    run.device = torch::kCPU;
    run.cancel = cancel;
    run.interrupt = &stop;
    run.intra_op_threads = 1;
    run.flush_denormal = impl.options.jobs.flush_denormal;
    run.cpu_nice = impl.options.jobs.cpu_training_nice;
    const JoinedGroup joined = JoinedGroupOf(request, impl.options.jobs.advertise_host);
    LogInfo(absl::StrCat(
        who, " (of ", request.world_size, ") starts here for the daemon at ", request.store_host,
        request.resume_bytes > 0 ? absl::StrCat(", from its checkpoint (", request.resume_bytes,
                                                " bytes, sent by rank 0)")
                                 : std::string()));
    if (request.resume_bytes > 0) {
      run.resume_from = absl::StrCat("the leader's checkpoint of job '", request.job_id, "'");
    }
    TrainingOutcome outcome = RunJoinedRank(run, joined.group, joined.resume);
    stopping = outcome.interrupted && stop.load();
    return outcome;
  };
  // Admitted by the job manager as its own jobs are (its memory and a CPU thread), never queued
  // behind them (JobManager::RunPeerRank).
  absl::StatusOr<TrainingOutcome> ran = impl.jobs.RunPeerRank(admission, train);
  if (!ran.ok()) {
    return refuse(
        absl::Status(ran.status().code(), absl::StrCat(who, ": ", ran.status().message())));
  }
  const TrainingOutcome& outcome = *ran;
  LogInfo(absl::StrCat(who, " ended ", JobStateName(outcome.state),
                       outcome.error.empty() ? "" : ": ", outcome.error));
  result.state = outcome.state;
  result.error = outcome.error;
  if (outcome.interrupted && stopping) result.error = "the daemon there is stopping";
  result.steps = outcome.steps;
  result.collective_seconds = outcome.collective_seconds;
  return result;
}

}  // namespace trainerd::engine
