// A data-parallel job's ranks as one group on PyTorch's own distributed engine (c10d): a
// rendezvous store the leader hosts (trainerd's own, rendezvous_store.h, seen through c10d's Store
// interface), every key under a prefix that names the job and its attempt (c10d::PrefixStore), and
// the group's collectives (c10d::ProcessGroupGloo on the CPU). The gradients and the checkpoint a
// rank resumes from travel only through Gloo.
//
// Tested with ranks in one process on loopback (tests/engine/collectives_test.cc); a job with
// replicas builds on it (docs/ARCHITECTURE.md, "The cluster layer").
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainerd::engine {

// The leader's rendezvous store (StoreServer, rendezvous_store.h) listening on `host` only, on
// the first free port of [port_min, port_max] (0, 0: one the kernel picks), for a group of
// `world_size` ranks, with a secret of its own that every rank's connection must say. The store
// serves until this object is destroyed.
class RendezvousHost {
 public:
  static absl::StatusOr<std::unique_ptr<RendezvousHost>> Start(const std::string& host,
                                                               int port_min, int port_max,
                                                               int world_size,
                                                               absl::Duration timeout);
  ~RendezvousHost();
  RendezvousHost(const RendezvousHost&) = delete;
  RendezvousHost& operator=(const RendezvousHost&) = delete;

  int port() const { return port_; }
  // What GroupOptions::store_secret must be (the leader hands it to its peers' ranks).
  const std::string& secret() const;
  // The address the store listens on, as bound ("10.0.0.1:29500"), and what it holds now.
  std::string address() const;
  int64_t stored_bytes() const;

  // Gives up the meeting of the group under `prefix`: its ranks waiting in CpuGroup::Join (and
  // those that come later) return ABORTED with `reason` at once, instead of waiting for a rank
  // that will not come until the timeout. For a rank on a peer that could not start.
  void Abort(const std::string& prefix, const std::string& reason);

  struct Server;

 private:
  RendezvousHost() = default;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

// Where and how a rank joins its group.
struct GroupOptions {
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  // The store's secret (RendezvousHost::secret): a connection that does not say it is closed.
  std::string store_secret;
  // Every key of the group lives under it: "<job id>/<attempt>", so that a job's second attempt
  // (or another job on the same store) never reads the first's keys.
  std::string prefix;
  int rank = 0;
  int world_size = 1;
  // Bounds the rendezvous (all ranks joined) and every collective: a rank that never comes, or
  // leaves, ends the others' calls with an error within about this long, never a hang.
  absl::Duration timeout = absl::Seconds(60);
  // The address this rank's Gloo transport binds and tells its peers ("127.0.0.1" on loopback).
  std::string interface_host = "127.0.0.1";
};

// One rank's membership of its group (CPU tensors, through Gloo). Not thread-safe: one thread
// per rank makes the calls, in the same order on every rank.
class CpuGroup {
 public:
  // Joins: connects to the store and meets the other ranks. DEADLINE_EXCEEDED naming how many
  // ranks came when the others did not come within the timeout; UNAVAILABLE when the store
  // cannot be reached.
  static absl::StatusOr<std::unique_ptr<CpuGroup>> Join(const GroupOptions& options);
  ~CpuGroup();
  CpuGroup(const CpuGroup&) = delete;
  CpuGroup& operator=(const CpuGroup&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Sums `tensor` (contiguous, float32 or float64, CPU) over the ranks, in place: every rank ends
  // with the same sum. An error naming the group when a rank left or the timeout passed.
  absl::Status AllReduceSum(torch::Tensor& tensor);

  // The ranks' mean of each tensor of `tensors` (a model's gradients), in one all-reduce: the
  // tensors are copied into one flat bucket, summed, divided by the world size and copied back.
  // Same shapes and order on every rank. One collective per step rather than one per parameter:
  // the launch and latency cost of a collective is paid once.
  absl::Status AllReduceMean(const std::vector<torch::Tensor>& tensors);

  // The rows-weighted mean over the ranks of each tensor of `tensors`, the rank's being a mean over
  // its `rows` rows (its slice of a global batch): in one all-reduce of the tensors times `rows`
  // and `rows` itself, divided by the total. With unequal slices (a global batch's short last
  // part) this is still the global batch's mean, which a plain mean of means is not.
  // With `extra`, its values ride in the same all-reduce and come back summed over the ranks (a
  // step's stop votes: one collective a step, not two).
  absl::Status AllReduceRowWeightedMean(const std::vector<torch::Tensor>& tensors, int64_t rows,
                                        std::vector<double>* extra = nullptr);

  // Returns once every rank called it (or an error, as AllReduceSum).
  absl::Status Barrier();

  // Sends `bytes` (a contiguous uint8 CPU tensor) to rank `to`, which calls Receive for it; and
  // receives into `bytes`, whose size the receiver knows already, from rank `from`. Each waits at
  // most the group's timeout. Point to point: the ranks not involved take no part.
  absl::Status Send(const torch::Tensor& bytes, int to);
  absl::Status Receive(torch::Tensor& bytes, int from);

  struct Impl;

 private:
  CpuGroup() = default;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int world_size_ = 1;
  std::string prefix_;
  std::chrono::milliseconds timeout_{60000};
};

}  // namespace trainerd::engine
