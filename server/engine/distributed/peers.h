// The transport to other trainerd daemons (this daemon's peers), as the engine sees it: four
// interfaces, one per purpose, that the service layer implements over gRPC
// (server/service/peer_client.h, PeerService on the other side), so that the engine never
// includes gRPC.
//   PeerMembership  who the peers are now, and whether one is fit to take this daemon's work
//   PeerDatasets    whether a peer holds a job's dataset, and sending it there
//   PeerRankCalls   a rank of a data-parallel job run on a peer (its side: Engine::RunRankForPeer)
//   PeerJobCalls    a sweep's members trained whole on a peer, as jobs of that peer's
// Each user takes the one it needs: admission the first two (engine_peers.cc), the ranks' run the
// third (data_parallel.h), the job manager the last two (jobs/job_ranks.cc, job_remote.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// One rank the leader asks a peer to run (proto RunRankRequest).
struct RemoteRankRequest {
  // As the leader accepted it (seed filled in); its datasets are sent by their names on the peer
  // (JobSpec::node_dataset).
  JobSpec spec;
  std::string job_id;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string store_host;  // the leader's rendezvous store
  int32_t store_port = 0;
  // What a connection to the store must say first (64 hex digits): it lives as long as the store.
  std::string store_secret;
  std::string prefix;  // "<job id>/<attempt>"
  double timeout_seconds = 60.0;
  std::string dataset_sha256;
  // A job taken up from a checkpoint: its size and SHA-256, whose bytes rank 0 sends the rank
  // through the group before the first step (GroupResume). 0: from the first epoch.
  int64_t resume_bytes = 0;
  std::string resume_sha256;
};

// How a rank ended on its daemon (proto RunRankResponse), or why it could not run there.
struct RemoteRankResult {
  // Not OK: the peer refused the rank or could not be reached (the call's status); the fields
  // below are then unset.
  absl::Status status;
  JobState state = JobState::kFailed;
  std::string error;
  int64_t steps = 0;
  double collective_seconds = 0.0;
  std::string node;  // the peer's node name
};

// A whole job a peer trains on this daemon's behalf: a sweep's member dealt to it
// (JobSpec::peer).
struct RemoteJobRequest {
  JobSpec spec;        // as the leader accepted it (seed set), without its nodes
  std::string job_id;  // the leader's id, for the peer's log
  // The peer's id of the job from an earlier run of this member (the leader stopped or was killed
  // while it trained there): taken up again where it stands there rather than trained anew,
  // unless the peer no longer has it or it was cancelled there. Empty: a new job there.
  std::string resume_id;
  // The request id it is submitted there with (SubmitJobRequest.request_id), recorded here before
  // the call: a daemon killed before it learned the id there submits again with it and gets the
  // job that call queued, rather than a second one (or, cancelled meanwhile, finds it to cancel).
  std::string request_id;
  // A member sent before as one of a sweep there (RunSweep) whose id there was not recorded: that
  // sweep's request id and the member's place in it (1-based), by which it is found there.
  std::string share_request_id;
  int32_t share_member = 0;
};

// Members of one sweep a peer trains together, as one sweep of its own (packed there).
struct RemoteSweepRequest {
  // Each member's spec as the leader accepted it, without its nodes: they differ only in their
  // learning rate, momentum, weight decay and seed.
  std::vector<JobSpec> members;
  std::vector<std::string> job_ids;  // the leader's ids, for the peer's log
  std::string request_id;            // recorded on each member before the call
};

// What RunJob's `stop` asks for.
enum class RemoteStop {
  kNone,    // go on
  kCancel,  // the member was cancelled here: cancel it there
  kDetach,  // this daemon is stopping: stop watching, leave it training there (resume_id)
};

// How a member on a peer is told of its job there, and asked whether to go on (RunJob, RunSweep).
struct RemoteMemberCalls {
  std::function<void(const std::string& id, const std::string& device)> on_queued;
  std::function<void(const EpochResult&)> on_epoch;
  std::function<RemoteStop()> stop;
};

// How that job ended on the peer.
struct RemoteJobResult {
  // Not OK: the peer refused the job, could not be reached, or the call broke off; `job` is then
  // unset. The sentence names the peer.
  absl::Status status;
  // The peer's job as it ended (its own id, state, error, epochs, steps, parameters, report).
  JobSnapshot job;
  // kSucceeded: the trained model's TorchScript archive, as the peer kept it.
  std::string model_archive;
  // kSucceeded: its state_dict as safetensors, as the peer kept it; empty when the peer kept
  // none (an older build).
  std::string state_dict;
  // Ended because `stop` said so: the peer's job was cancelled there (kCancel), or is left
  // training there (kDetach: `detached`, and `job` is unset).
  bool stopped = false;
  bool detached = false;
};

// Who the peers are, and whether one is fit to take this daemon's work.
class PeerMembership {
 public:
  virtual ~PeerMembership() = default;

  // The peers this daemon may place ranks and members on, as "host:port": its --peers (DNS names
  // resolved again every few seconds) and the daemons of the group a cluster manager started it in.
  virtual std::vector<std::string> peers() const = 0;

  // Whether `peer` runs this daemon's trainerd and LibTorch versions, asked within a few seconds:
  // OK, or FAILED_PRECONDITION naming the peer and both versions (or why it could not be asked).
  // A peer of another version could read a spec's newer fields as unset, or its ranks differ in
  // their collectives and numerics, as torchrun too wants one torch on every node.
  virtual absl::Status CheckVersion(const std::string& peer) = 0;

  // Whether `peer` takes this daemon's peer credentials as an admin's, asked within a few seconds
  // (PeerService.CheckCredentials): OK, or FAILED_PRECONDITION naming the peer and the flag to
  // fix (--peer_token_file, or the peer's --admin for a certificate). Asked before anything of a
  // tenant's is sent there.
  virtual absl::Status CheckAdmin(const std::string& peer) = 0;
};

// A job's datasets on a peer.
class PeerDatasets {
 public:
  virtual ~PeerDatasets() = default;

  // Whether `peer` holds dataset `name_there` (qualified, "OWNER/NAME": the job's owner's there)
  // with this SHA-256, asked within a few seconds: OK; NOT_FOUND when it has no dataset of that
  // name (CopyDataset can send it); else the reason in a sentence that names the peer
  // (unreachable, refused the credentials, holds another dataset of that name, which is the
  // job's owner's own there).
  virtual absl::Status CheckDataset(const std::string& peer, const std::string& name_there,
                                    const std::string& sha256) = 0;

  // Sends dataset `meta` to `peer`, which lacks it, as `name_there` ("OWNER/NAME"): its payload,
  // read from this daemon's file `path` from `payload_offset` on, as an upload there with the
  // peer credentials, marked as a copy for peer jobs (the peer checks the bytes against the
  // SHA-256, counts the dataset against OWNER's quotas there, and removes it once no job has used
  // it for its --peer_copy_retention). OK once the peer holds it with the same SHA-256; else the
  // reason naming the peer. Blocking for the transfer.
  virtual absl::Status CopyDataset(const std::string& peer, const std::string& name_there,
                                   const DatasetMeta& meta, const std::string& path,
                                   int64_t payload_offset) = 0;
};

// Ranks of data-parallel jobs run on peers.
class PeerRankCalls {
 public:
  virtual ~PeerRankCalls() = default;

  // A rank running on a peer; destroying it (or Cancel) cancels the call, which ends the rank
  // there at its next step.
  class Call {
   public:
    virtual ~Call() = default;
    virtual void Cancel() = 0;
  };

  // Starts `request` on `peer` and returns at once; `done` is called once, on another thread,
  // when the rank ended there or the call failed. `done` may be called before StartRank returns.
  virtual std::unique_ptr<Call> StartRank(const std::string& peer, const RemoteRankRequest& request,
                                          std::function<void(RemoteRankResult)> done) = 0;
};

// Sweep members trained whole on peers.
class PeerJobCalls {
 public:
  virtual ~PeerJobCalls() = default;

  // Trains `request` on `peer` as a job of its own there (its queue, its limits) and returns when
  // it ended, calling `on_queued` with the job's id there and the device the peer placed it on
  // once it took the job (or found it again: request.resume_id), and `on_epoch` with each epoch
  // as the peer reports it, from the first (a job found again reports its epochs so far first).
  // `stop` is asked every few tenths of a second: kCancel cancels the job there, kDetach stops
  // watching it at once and leaves it training there. The peer's job and its model are deleted
  // there once its end is read. Blocking: called on the job's worker thread.
  virtual RemoteJobResult RunJob(
      const std::string& peer, const RemoteJobRequest& request,
      const std::function<void(const std::string& id, const std::string& device)>& on_queued,
      const std::function<void(const EpochResult&)>& on_epoch,
      const std::function<RemoteStop()>& stop) = 0;

  // Trains `request`'s members on `peer` as one sweep there (SubmitSweep with the members as
  // points and the request id: packed there as any sweep), then follows each member as RunJob
  // does, all at once: `calls[i]` is member i's. Returns each member's result, in order; a sweep
  // the peer refused fails every member with its reason. Blocking, on the members' worker.
  virtual std::vector<RemoteJobResult> RunSweep(const std::string& peer,
                                                const RemoteSweepRequest& request,
                                                const std::vector<RemoteMemberCalls>& calls) = 0;
};

// All four, as the service layer's peer client gives them (EngineOptions::peers).
class Peers : public PeerMembership,
              public PeerDatasets,
              public PeerRankCalls,
              public PeerJobCalls {};

}  // namespace trainerd::engine
