// The one file that includes c10d's Gloo process group: its header pulls in gloo's own headers,
// which the torch wheel does not ship (Debian's libgloo-dev does; the symbols are in
// libtorch_cpu.so). Everything else sees collectives.h.
#include "server/engine/distributed/collectives.h"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/engine/distributed/rendezvous_store.h"

namespace trainerd::engine {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// c10d's exceptions carry a long message with a C++ backtrace: its first line says what happened.
std::string FirstLine(const std::exception& error) {
  std::string text = error.what();
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

// A timeout (the other ranks did not answer in time) or a rank that went away (a closed
// connection, a reset): what the caller can do differs, so the codes do too.
absl::Status CollectiveError(const std::string& what, const std::exception& error) {
  const std::string line = FirstLine(error);
  const bool timed_out = absl::StrContains(line, "imed out") || absl::StrContains(line, "imeout");
  const std::string message = absl::StrCat(what, ": ", line);
  return timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
}

// Every collective's enqueue in this process, one at a time. c10d's flight recorder (a process-wide
// ring of the collectives issued, on by default) inserts a group it has not seen into its map
// before taking its own mutex (FlightRecorder::recordWithResetEnabled, torch 2.11): two groups of
// one process enqueuing at once corrupt the map and crash (seen in collectives_test's ranks as
// threads, as it would be in a daemon running two jobs' ranks). Only the enqueue is serialised,
// not the collective's wait; it costs a lock per step.
std::mutex& EnqueueMutex() {
  static std::mutex* mutex = new std::mutex();
  return *mutex;
}

// The keys of the join count and of the signal that every rank came (under the group's prefix).
constexpr char kJoinedKey[] = "trainerd/joined";
constexpr char kAllJoinedKey[] = "trainerd/all-joined";
// Set (before kAllJoinedKey, which wakes the waiting ranks) when the leader gives the meeting up:
// a rank on a peer could not start, so the others must not wait for it until the timeout.
constexpr char kAbortKey[] = "trainerd/abort";
// The tag of Send and Receive: the only point-to-point messages of a group.
constexpr int kPointToPointTag = 1;

// The leader's own keys, set in its store from this process (through a c10d::PrefixStore, which
// joins the group's prefix as the ranks' do): only set is needed.
class HostSide final : public c10d::Store {
 public:
  explicit HostSide(StoreServer& server) : server_(server) {}
  c10::intrusive_ptr<c10d::Store> clone() override { throw std::runtime_error("not a client"); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    server_.Set(key, std::string(value.begin(), value.end()));
  }
  std::vector<uint8_t> get(const std::string&) override { throw std::runtime_error("set only"); }
  int64_t add(const std::string&, int64_t) override { throw std::runtime_error("set only"); }
  bool deleteKey(const std::string&) override { throw std::runtime_error("set only"); }
  bool check(const std::vector<std::string>&) override { throw std::runtime_error("set only"); }
  int64_t getNumKeys() override { throw std::runtime_error("set only"); }
  void wait(const std::vector<std::string>&) override { throw std::runtime_error("set only"); }
  void wait(const std::vector<std::string>&, const std::chrono::milliseconds&) override {
    throw std::runtime_error("set only");
  }

 private:
  StoreServer& server_;
};

}  // namespace

struct RendezvousHost::Server {
  std::unique_ptr<StoreServer> store;
};

absl::StatusOr<std::unique_ptr<RendezvousHost>> RendezvousHost::Start(const std::string& host,
                                                                      int port_min, int port_max,
                                                                      int world_size,
                                                                      absl::Duration timeout) {
  (void)timeout;  // each rank bounds its own calls (GroupOptions::timeout)
  absl::StatusOr<std::unique_ptr<StoreServer>> store =
      StoreServer::Start(host, port_min, port_max, world_size);
  if (!store.ok()) return store.status();
  auto host_object = std::unique_ptr<RendezvousHost>(new RendezvousHost());
  host_object->server_ = std::make_unique<Server>();
  host_object->server_->store = *std::move(store);
  host_object->port_ = host_object->server_->store->port();
  return host_object;
}

RendezvousHost::~RendezvousHost() = default;

const std::string& RendezvousHost::secret() const { return server_->store->secret(); }
std::string RendezvousHost::address() const { return server_->store->address(); }
int64_t RendezvousHost::stored_bytes() const { return server_->store->stored_bytes(); }

void RendezvousHost::Abort(const std::string& prefix, const std::string& reason) {
  try {
    c10d::PrefixStore store(prefix, c10::make_intrusive<HostSide>(*server_->store));
    store.set(kAbortKey, reason);
    store.set(kAllJoinedKey, "abort");
  } catch (const std::exception&) {
    // The store is going away: the ranks' waits fail on their own.
  }
}

struct CpuGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

absl::StatusOr<std::unique_ptr<CpuGroup>> CpuGroup::Join(const GroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " of ", options.world_size, " is not a rank"));
  }
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("a group needs a prefix (the job and its attempt)");
  }
  const std::string who =
      absl::StrCat("group '", options.prefix, "' rank ", options.rank, " of ", options.world_size);
  auto group = std::unique_ptr<CpuGroup>(new CpuGroup());
  group->impl_ = std::make_unique<Impl>();
  group->rank_ = options.rank;
  group->world_size_ = options.world_size;
  group->prefix_ = options.prefix;
  group->timeout_ = Millis(options.timeout);
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> client =
      ConnectStore(options.store_host, options.store_port, options.store_secret, options.timeout);
  if (!client.ok()) {
    return absl::Status(
        client.status().code(),
        absl::StrCat(who, ": cannot reach the rendezvous store at ", options.store_host, ":",
                     options.store_port, ": ", client.status().message()));
  }
  group->impl_->store = c10::make_intrusive<c10d::PrefixStore>(options.prefix, *std::move(client));
  c10d::Store& store = *group->impl_->store;
  // Every rank counts itself in; the last to come says so. A rank that never comes leaves the
  // others waiting only until the timeout, and they can say how many came.
  try {
    if (store.add(kJoinedKey, 1) == options.world_size) store.set(kAllJoinedKey, "1");
    store.wait({kAllJoinedKey}, Millis(options.timeout));
    if (store.check({kAbortKey})) {
      const std::vector<uint8_t> reason = store.get(kAbortKey);
      return absl::AbortedError(absl::StrCat(
          who, ": the leader gave the meeting up: ", std::string(reason.begin(), reason.end())));
    }
  } catch (const std::exception& error) {
    int64_t joined = -1;
    try {
      joined = store.add(kJoinedKey, 0);
    } catch (const std::exception&) {
    }
    return absl::DeadlineExceededError(
        absl::StrCat(who, ": only ", joined, " of ", options.world_size, " ranks joined within ",
                     absl::FormatDuration(options.timeout), " (", FirstLine(error), ")"));
  }
  // Gloo's transport writes to its peers' sockets with writev (PyTorch's Python ignores SIGPIPE for
  // it): a rank that leaves mid-collective would end this process by SIGPIPE instead of failing
  // the collective with EPIPE. Ignored process-wide, as the daemon does from its start.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(Millis(options.timeout));
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.interface_host));
    gloo_options->threads = 1;  // one collective at a time per rank: the step's bucket
    group->impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        group->impl_->store, options.rank, options.world_size, gloo_options);
  } catch (const std::exception& error) {
    return CollectiveError(absl::StrCat(who, ": cannot connect to the other ranks"), error);
  }
  return group;
}

CpuGroup::~CpuGroup() = default;

absl::Status CpuGroup::AllReduceSum(torch::Tensor& tensor) {
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.is_contiguous() ||
      (tensor.scalar_type() != torch::kFloat32 && tensor.scalar_type() != torch::kFloat64)) {
    return absl::InvalidArgumentError(
        "all-reduce takes a contiguous float32 or float64 CPU tensor");
  }
  try {
    std::vector<at::Tensor> tensors = {tensor};
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(EnqueueMutex());
      work = impl_->group->allreduce(tensors);
    }
    work->wait();
  } catch (const std::exception& error) {
    return CollectiveError(absl::StrCat("group '", prefix_, "' rank ", rank_, " of ", world_size_,
                                        ": all-reduce failed"),
                           error);
  }
  return absl::OkStatus();
}

absl::Status CpuGroup::AllReduceMean(const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return absl::OkStatus();
  std::vector<torch::Tensor> flat;
  flat.reserve(tensors.size());
  for (const torch::Tensor& t : tensors) flat.push_back(t.detach().reshape({-1}));
  torch::Tensor bucket = torch::cat(flat);
  if (absl::Status status = AllReduceSum(bucket); !status.ok()) return status;
  bucket.div_(static_cast<double>(world_size_));
  int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(bucket.narrow(0, offset, n).view_as(t));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status CpuGroup::AllReduceRowWeightedMean(const std::vector<torch::Tensor>& tensors,
                                                int64_t rows, std::vector<double>* extra) {
  if (tensors.empty()) return absl::OkStatus();
  // The bucket has the gradients' dtype (float32: half the bytes of float64 on the wire, and no
  // conversion); the row counts ride in it exactly (integers below 2^24).
  const torch::ScalarType dtype = tensors.front().scalar_type();
  std::vector<torch::Tensor> flat;
  flat.reserve(tensors.size() + 1);
  for (const torch::Tensor& t : tensors) {
    flat.push_back(t.detach().reshape({-1}).mul(static_cast<double>(rows)));
  }
  flat.push_back(torch::full({1}, static_cast<double>(rows), torch::TensorOptions(dtype)));
  const int64_t extras = extra != nullptr ? static_cast<int64_t>(extra->size()) : 0;
  for (int64_t i = 0; i < extras; ++i) {
    flat.push_back(torch::full({1}, (*extra)[i], torch::TensorOptions(dtype)));
  }
  torch::Tensor bucket = torch::cat(flat);
  if (absl::Status status = AllReduceSum(bucket); !status.ok()) return status;
  const int64_t total = bucket.numel() - 1 - extras;
  for (int64_t i = 0; i < extras; ++i) (*extra)[i] = bucket[total + 1 + i].item().toDouble();
  const double all_rows = bucket[total].item().toDouble();
  if (!(all_rows > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("group '", prefix_, "': the ranks' batches have no rows"));
  }
  bucket = bucket.narrow(0, 0, total).div_(all_rows);
  int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(bucket.narrow(0, offset, n).view_as(t));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status CpuGroup::Send(const torch::Tensor& bytes, int to) {
  const std::string what =
      absl::StrCat("group '", prefix_, "' rank ", rank_, " of ", world_size_, ": sending ",
                   bytes.numel(), " bytes to rank ", to, " failed");
  try {
    std::vector<at::Tensor> tensors = {bytes};
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(EnqueueMutex());
      work = impl_->group->send(tensors, to, kPointToPointTag);
    }
    if (!work->wait(timeout_)) return absl::AbortedError(absl::StrCat(what, ": aborted"));
  } catch (const std::exception& error) {
    return CollectiveError(what, error);
  }
  return absl::OkStatus();
}

absl::Status CpuGroup::Receive(torch::Tensor& bytes, int from) {
  const std::string what =
      absl::StrCat("group '", prefix_, "' rank ", rank_, " of ", world_size_, ": receiving ",
                   bytes.numel(), " bytes from rank ", from, " failed");
  try {
    std::vector<at::Tensor> tensors = {bytes};
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(EnqueueMutex());
      work = impl_->group->recv(tensors, from, kPointToPointTag);
    }
    if (!work->wait(timeout_)) return absl::AbortedError(absl::StrCat(what, ": aborted"));
  } catch (const std::exception& error) {
    return CollectiveError(what, error);
  }
  return absl::OkStatus();
}

absl::Status CpuGroup::Barrier() {
  try {
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(EnqueueMutex());
      work = impl_->group->barrier();
    }
    work->wait();
  } catch (const std::exception& error) {
    return CollectiveError(
        absl::StrCat("group '", prefix_, "' rank ", rank_, " of ", world_size_, ": barrier failed"),
        error);
  }
  return absl::OkStatus();
}

}  // namespace trainerd::engine
