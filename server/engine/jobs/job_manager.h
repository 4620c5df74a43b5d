// Job records, the per-device queues and workers, and each job's ordered event stream; with a job
// store, the records outlive the process (job_store.h) and jobs left unfinished are taken up again.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model_spec.h"
#include "common/page_token.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/devices/cpu_threads.h"
#include "server/engine/distributed/peers.h"
#include "server/engine/job_store.h"
#include "server/engine/jobs/halving.h"
#include "server/engine/jobs/job_options.h"
#include "server/engine/torchscript/worker_launcher.h"
#include "server/engine/training/trainer.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// How long a pack's epochs may wait to be written and heard together (PublishQueued).
inline constexpr absl::Duration kPackEpochsHeldFor = absl::Milliseconds(50);

// What the engine adds to a job's life beyond training it: an observer of every job's events (the
// metrics) and the report's device figures. All optional.
struct JobHooks {
  // Receives every job's events, in order per job (QUEUED from Enqueue too), like a job's own
  // sinks: Push must not block or call back into the engine.
  std::shared_ptr<JobEventSink> observer;
  // Called on the worker as a job starts (its snapshot RUNNING, its model, its dataset); returns
  // what the worker calls when the job has ended, with the ended job and the report whose times,
  // counts and memory are filled in, to add utilization, FLOPs and the verdict.
  std::function<std::function<void(const JobSnapshot&, DeviceReport&)>(
      const JobSnapshot&, const ModelSpec&, const DatasetMeta&)>
      start_report;
  // Called on the worker before a job runs (the job still QUEUED): its datasets, loaded onto the
  // device if they are not resident, with its working set reserved against the device's memory
  // budget (DatasetRegistry::AcquireForJob). UNAVAILABLE: not now (running jobs hold the memory;
  // the worker waits for one to end and asks again); any other error fails the job. Required.
  std::function<absl::StatusOr<JobDatasets>(const JobSnapshot&)> acquire;
  // Called once the job stops running (ended or interrupted) with what acquire reserved.
  std::function<void(const std::string& job_id)> release;
  // Called on the worker before a TorchScript job taken up after a restart runs (its module not
  // yet checked by this build): the module's check as at Submit, off the serving path. An error
  // fails the job with its sentence.
  std::function<absl::StatusOr<TorchScriptJob>(const JobSnapshot&, const TorchScriptJob&)>
      check_module;
  // Asked on the training thread before each checkpoint of a job of `owner` that is held to the
  // disk quota (Enqueue's quota_exempt false); an error skips that checkpoint (TrainingRun::
  // may_checkpoint). And told of each checkpoint and trained model written, with its size.
  std::function<absl::Status(const std::string& owner)> may_checkpoint;
  std::function<void(const std::string& owner, int64_t bytes)> wrote_file;
};

// The operator's settings (JobRunOptions, as EngineOptions::jobs carries them) and what the
// engine supplies.
struct JobManagerOptions : JobRunOptions {
  // A succeeded job's TorchScript model is kept as <models_dir>/<job-id>.pt (ModelPath), its
  // state_dict as <job-id>.safetensors with its SHA-256 in <job-id>.safetensors.sha256
  // (StateDictPath); empty means models are not kept.
  std::string models_dir;
  // A job's checkpoints (JobSpec::checkpoint_every, and the one a drain writes) go to
  // <data_dir>/checkpoints/<job-id>/ and are listed relative to `data_dir`; a TorchScript job's
  // module is kept as <data_dir>/modules/<job-id>.pt while the job may still run, so that a
  // restart can take the job up again. Empty: neither is written.
  std::string data_dir;
  JobHooks hooks;
  // Where the records are kept. With a store, a job is written through on every state change and
  // every epoch, leaves memory once it ended (Get, List, Subscribe and ModelPath read it back),
  // and Shutdown interrupts running jobs instead of cancelling them (they resume at the next
  // start). Null: records live in memory only and die with the process.
  std::shared_ptr<JobStore> store;
  // Ranks and sweep members on peers (JobSpec::nodes); null without peers.
  std::shared_ptr<Peers> peers;
};

// Where a job taken up again at start goes on from.
struct ResumePoint {
  std::string checkpoint_path;  // absolute; empty: from epoch 0
  int32_t epoch = 0;            // the checkpoint's epoch; 0 without one
};

// Who queues a job (Enqueue, EnqueueSweep), as recorded on it.
struct Submitter {
  std::string owner;
  // An admin's job, whose checkpoints JobHooks::may_checkpoint is not asked about (nor for a job
  // taken up after a restart).
  bool quota_exempt = false;
  // CallContext::request_id and request_digest: a submit that repeats the id finds the job.
  std::string request_id;
  std::string request_digest;
};

// One member of a sweep, checked and placed (Engine::SubmitSweep).
struct SweepMember {
  JobSpec spec;
  ModelSpec model;
  torch::Device device = torch::kCPU;
  int64_t estimated_memory_bytes = 0;
  std::vector<DeviceCostEstimate> device_estimates;
};

// Owns the jobs in memory and each device's workers (max_concurrent_jobs threads, created when the
// device gets its first job). A worker runs one job at a time; the others wait in that device's
// queue: high priority first, then normal, then low, first come first served within a priority.
// Thread-safe: calls take a short lock and never wait for training. Owned by the Engine.
class JobManager {
 public:
  explicit JobManager(JobManagerOptions options = {});
  ~JobManager();  // Shutdown()
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Queues a checked job (spec with seed and device filled in) and returns it QUEUED; with a
  // store, the job is durable when this returns. Its datasets are acquired when it starts
  // (JobHooks::acquire). `torchscript` is a TorchScript job's checked module (then `model` is
  // empty), trained in place, and `module_bytes` its archive (kept for a restart); null and empty
  // for a spec-built model. `by` is recorded on the job, and `estimated_memory_bytes` (its working
  // set, as Submit estimated it).
  // UNAVAILABLE after Shutdown or Drain; RESOURCE_EXHAUSTED when max_queued_jobs jobs already
  // wait; INTERNAL when the job cannot be recorded.
  absl::StatusOr<JobSnapshot> Enqueue(JobSpec spec, ModelSpec model, torch::Device device,
                                      std::shared_ptr<const TorchScriptJob> torchscript = nullptr,
                                      Submitter by = {}, std::string_view module_bytes = {},
                                      int64_t estimated_memory_bytes = 0,
                                      std::vector<DeviceCostEstimate> device_estimates = {});
  // Queues a sweep's checked members as jobs of one sweep (a new sweep id on each), all or none,
  // and returns them QUEUED in order. Members queued on one device together train as one pack
  // (RunPackedTraining) when a worker takes the first of them; a member taken up again after a
  // restart trains alone. The same errors as Enqueue (RESOURCE_EXHAUSTED when the members would
  // take the queues past max_queued_jobs).
  absl::StatusOr<std::vector<JobSnapshot>> EnqueueSweep(std::vector<SweepMember> members,
                                                        Submitter by = {});
  // Takes up a job the store had as QUEUED or RUNNING when the daemon stopped (at start, before
  // any Enqueue): `job` is its record with its epochs up to `resume.epoch` and the restart
  // appended; it is recorded QUEUED and queued behind the jobs requeued before it. Not bounded by
  // max_queued_jobs: the daemon had accepted it.
  absl::Status Requeue(JobSnapshot job, ModelSpec model, torch::Device device,
                       std::shared_ptr<const TorchScriptJob> torchscript, ResumePoint resume);
  // Records a job that cannot be taken up again as ended (FAILED, or CANCELLED for one whose
  // cancel was recorded) with `reason` (at start).
  absl::Status FailUnrecoverable(JobSnapshot job, const std::string& reason,
                                 JobState state = JobState::kFailed);

  // False once Drain or Shutdown began: Enqueue refuses new jobs.
  bool accepting() const;

  // NOT_FOUND for an unknown id.
  absl::StatusOr<JobSnapshot> Get(const std::string& id) const;
  // A page of jobs (job_store.h), from the store when there is one: never a copy of every job's
  // epochs under the lock that training takes. INVALID_ARGUMENT for a page token not given here.
  absl::StatusOr<JobPage> List(const JobQuery& query) const;
  // The queued and running jobs, without their epochs and parameters.
  std::vector<JobSnapshot> ActiveJobs() const;
  // A queued job ends CANCELLED at once; a running one stops before its next step. Returns the
  // job as it stands. FAILED_PRECONDITION when the job already ended.
  absl::StatusOr<JobSnapshot> Cancel(const std::string& id);
  // Forgets a job that ended: its record, model, checkpoints and module. NOT_FOUND for an unknown
  // id; FAILED_PRECONDITION while it is queued or running.
  absl::Status Delete(const std::string& id);
  // Applies the retention options (with a store). Logs what it deletes.
  void PruneEndedJobs();

  // The file of a SUCCEEDED job's TorchScript model. NOT_FOUND for an unknown id;
  // FAILED_PRECONDITION while the job has not succeeded, or when models are not kept.
  absl::StatusOr<std::string> ModelPath(const std::string& id) const;
  // The file of one of the job's checkpoints (Job.checkpoints): `epoch`'s, or with epoch 0 the
  // newest; `out` gets its record (epoch, size, SHA-256). NOT_FOUND for an unknown id, and for an
  // epoch without a checkpoint (naming the epochs that have one); FAILED_PRECONDITION without a
  // data folder.
  absl::StatusOr<std::string> CheckpointPath(const std::string& id, int32_t epoch,
                                             CheckpointInfo* out) const;
  // The safetensors file of a SUCCEEDED job's state_dict and the SHA-256 recorded when it was
  // written. As ModelPath, and FAILED_PRECONDITION when the job kept no state_dict (a job of an
  // older build, or one whose peer sent none).
  absl::StatusOr<std::pair<std::string, std::string>> StateDictPath(const std::string& id) const;
  // The .pt2 of a SUCCEEDED spec-built job's model for deployment (training/sequential_pt2.h) and
  // its SHA-256: made from the kept state_dict on the first call and kept beside it as
  // <models_dir>/<job-id>.pt2. As StateDictPath; FAILED_PRECONDITION for a TorchScript or
  // exported job, whose state_dict is not a spec's.
  absl::StatusOr<std::pair<std::string, std::string>> Pt2Path(const std::string& id) const;
  // Where a TorchScript job's module is kept for a restart ("" without a data folder).
  std::string ModuleFilePath(const std::string& id) const;

  // The id of a queued or running job that uses the dataset (to train or to validate on), or ""
  // when none does.
  std::string JobUsingDataset(const std::string& dataset) const;
  // The device's queued and running jobs ("cpu", "cuda:N"), for placement.
  int64_t DeviceLoad(const std::string& device) const;

  // A rank of another daemon's data-parallel job (Engine::RunRankForPeer, the leader's RunRank
  // call), run on the calling thread and admitted as this daemon's jobs are when they start: its
  // datasets resident and its working set reserved (JobHooks::acquire, under `rank.holder`),
  // waiting while running jobs hold the memory, woken as they give it back, until
  // `rank.wait_until` or a cancel; then one CPU thread counted in the jobs' budget at once, so
  // that jobs queued here wait for it. It never waits in a queue behind this daemon's jobs: the
  // job's other ranks already wait for it in a collective, and two daemons running ranks of each
  // other's jobs must not wait on each other. Listed (PeerRanks) while `train` runs; `train`
  // gets its datasets and the flag Drain and Shutdown set (stop at the next step). Everything is
  // given back however `train` ends. The acquire's error when it was not admitted (UNAVAILABLE
  // when the memory stayed held past the wait, or the daemon is stopping).
  struct PeerRank {
    std::string holder;  // "<job>/rank-<r>"
    std::string leader;  // the leader's host, as ListDevices shows it
    std::string dataset;
    std::string validation_dataset;  // "" for none
    int64_t reserve_bytes = 0;
    absl::Time wait_until = absl::InfinitePast();
    const std::atomic<bool>* cancel = nullptr;
  };
  using TrainPeerRank =
      std::function<TrainingOutcome(const JobDatasets&, const std::atomic<bool>& stop)>;
  absl::StatusOr<TrainingOutcome> RunPeerRank(const PeerRank& rank, const TrainPeerRank& train);
  // The ranks running here for other daemons' jobs: "<job>/rank-<r> for <leader host>".
  std::vector<std::string> PeerRanks() const;
  int CpuThreadsInUse() const { return cpu_threads_.in_use(); }

  // Registers `sink` for the job's future events and returns the job as it stands, atomically:
  // no event is missed or delivered twice. A job that already ended gets no events.
  // `summary`: without epochs and parameters (Engine::SubscribeJob).
  absl::StatusOr<JobSnapshot> Subscribe(const std::string& id, std::shared_ptr<JobEventSink> sink,
                                        bool summary = false);
  // Engine::JobEpochs.
  absl::StatusOr<std::vector<EpochResult>> Epochs(const std::string& id, int32_t after,
                                                  int32_t limit) const;
  void Unsubscribe(const std::string& id, const JobEventSink* sink);

  // Stops the daemon's jobs and joins the workers. Without a store, queued and running jobs end
  // CANCELLED with `reason`. With a store nothing is cancelled: running jobs stop at a step
  // boundary and stay RUNNING in the records, queued ones stay QUEUED, and the next start takes
  // them up again (from their last checkpoint). Idempotent.
  void Shutdown(const std::string& reason = "the daemon shut down");
  // SIGTERM's graceful stop (with a store; without one, Shutdown): refuses new jobs at once;
  // each running job finishes its current epoch and writes a checkpoint, then stops; past
  // `timeout` the jobs still running stop at a step boundary (they resume from their last
  // checkpoint). Then Shutdown.
  void Drain(absl::Duration timeout);

 private:
  struct Record {
    JobSnapshot snap;  // guarded by JobManager::mu_
    ModelSpec model;
    std::shared_ptr<const Dataset> dataset;  // acquired when the job starts, released when it ends
    std::shared_ptr<const Dataset> validation_dataset;  // likewise; null when none
    // A TorchScript job's module (trained in a worker process); null for a spec-built model.
    std::shared_ptr<const TorchScriptJob> torchscript;
    torch::Device device = torch::kCPU;
    ResumePoint resume;                  // a job taken up again: where it goes on from
    std::atomic<bool> cancel{false};     // job cancel: stop before the next step, CANCELLED
    std::atomic<bool> drain{false};      // finish the epoch, checkpoint, stop (stays RUNNING)
    std::atomic<bool> interrupt{false};  // stop before the next step (stays RUNNING)
    bool claimed = false;   // taken off the queue by its worker; guarded by JobManager::mu_
    std::mutex publish_mu;  // orders the job's events; lock order: publish_mu, then mu_
    std::vector<std::shared_ptr<JobEventSink>> sinks;  // guarded by publish_mu
    bool recorded_end = false;  // its terminal state is in the store; guarded by publish_mu
    // A sweep's member: the ids of its sweep's members (shared by them), which a worker takes
    // together; null for a job submitted alone or taken up again after a restart.
    std::shared_ptr<const std::vector<std::string>> pack;
    // A member of a sweep with halving (JobSpec::halving): its sweep's rungs, shared by the
    // members; null otherwise, and for a member taken up again after a restart (it trains on).
    std::shared_ptr<SweepRungs> rungs;
    bool quota_exempt = false;  // an admin's job (Enqueue); set before the job is queued
  };
  // A job's run once it started: the TrainingRun with its callbacks, the RUNNING snapshot, the
  // report's hook, and what its report says of threads and packing.
  // A pack's events (its members' starts, then each epoch's), queued as they happen and published
  // together (QueueEvent, PublishQueued): one store write for all.
  struct PendingEvent {
    Record* record = nullptr;
    const TrainingRun* run = nullptr;
    JobEvent event;
    JobSnapshot summary;                    // an epoch's record for the store
    std::unique_lock<std::mutex> ordering;  // the record's publish_mu, held until published
  };
  struct PublishBatch {
    // The pack's training thread only.
    std::vector<PendingEvent> pending;
    // The records whose ordering lock the pending events hold (one lock a record, however many
    // of its events wait), and whether a state change waits.
    std::set<const Record*> locked;
    bool has_state = false;
    absl::Time first_pending;  // when the oldest pending event was queued
    bool Holds(const Record* record) const { return locked.count(record) > 0; }
  };
  struct StartedRunState {
    TrainingRun run;
    JobSnapshot started;
    std::function<void(const JobSnapshot&, DeviceReport&)> finish_report;
    // A pack member whose epochs are published with its pack's (PublishQueued); null: alone.
    std::shared_ptr<PublishBatch> batch;
    int threads = 1;
    int32_t packed_members = 0;
    int64_t rows = 0;  // training rows (throughput)
    // A TorchScript job: its module, trained in a worker process, and that process's start time.
    std::shared_ptr<const TorchScriptJob> module;
    double worker_start_seconds = 0.0;
    // A job that trained on a peer (RunOnPeer): the peer's report and throughput, which the
    // job's report takes as they are (its queue time is this daemon's).
    std::optional<DeviceReport> peer_report;
    double peer_samples_per_second = 0.0;
  };
  using StartedRun = std::unique_ptr<StartedRunState>;
  enum class Acquired { kYes, kNotNow, kEnded };
  // One device's queue and workers; guarded by JobManager::mu_.
  struct Worker {
    std::deque<std::string> queues[3];  // ids by JobPriority (kLow, kNormal, kHigh), FIFO each
    std::vector<std::thread> threads;
    absl::CondVar cv;
    int running = 0;  // jobs its threads run now

    size_t queued() const { return queues[0].size() + queues[1].size() + queues[2].size(); }
    // The next job to run: the oldest of the highest priority. Requires queued() > 0.
    std::string PopNext();
    void Remove(const std::string& id);
  };

  // A sweep's rungs for its member taken up again at a start (Requeue): those of a member already
  // taken up, else rebuilt from the sweep's records, so that halving goes on comparing with what
  // the members reached before the restart.
  std::shared_ptr<SweepRungs> RecoveredRungs(const std::string& sweep_id,
                                             const HalvingSpec& halving);
  // The workers (jobs at once) of a device's queue: --max_concurrent_jobs, else the CPU's cores
  // or 4 on a GPU; 1 for a peer's queue.
  int WorkersFor(const std::string& device_name, bool on_peer) const;
  void WorkerLoop(const std::string& device_name);
  void RunJob(const std::shared_ptr<Record>& record);
  // A sweep's members taken off the queue together (claimed): trained as one pack.
  void RunPack(std::vector<std::shared_ptr<Record>> members);
  // A job that trains whole on a peer (JobSpec::peer; job_remote.cc): nothing of it is
  // held here but its record; a cancel cancels it there, a drain or a shutdown leaves it training
  // there (taken up again at the next start).
  void RunOnPeer(const std::shared_ptr<Record>& record);
  // A sweep's members dealt to one peer, taken off that peer's queue together: sent as one sweep
  // there (packed there), each then followed as RunOnPeer follows one.
  void RunPackOnPeer(std::vector<std::shared_ptr<Record>> members);
  // RunOnPeer's steps: the member published RUNNING with where it goes (durably, before any call
  // there); the calls through which the peer client reports its job there and asks whether to
  // go on; and its end from the peer's result.
  StartedRun StartOnPeer(const std::shared_ptr<Record>& record, const std::string& device,
                         const JobOnPeer& there);
  RemoteMemberCalls MemberCalls(Record* record);
  void EndOnPeer(const std::shared_ptr<Record>& record, StartedRunState& state,
                 RemoteJobResult result, const std::string& peer);
  // A job with replicas as its ranks (threads here, ranks on peers: `rank_peers`, "" for here),
  // with `threads` intra-op threads for the ranks here together; taken up once without a peer it
  // lost mid-job when it has a checkpoint (job_ranks.cc).
  TrainingOutcome RunRanks(const std::shared_ptr<Record>& shared, TrainingRun* run, int threads,
                           int32_t attempt, std::vector<std::string> rank_peers);
  // A data-parallel job that lost peers (`failed.lost_peers`) and has a checkpoint: its record
  // goes back to that checkpoint (epochs after it dropped, a restart recorded, the peer's ranks
  // placed here) and `run` resumes from it. False without a usable checkpoint.
  bool TakeUpWithoutPeer(const std::shared_ptr<Record>& shared, const TrainingOutcome& failed,
                         TrainingRun* run);
  // A job's intra-op threads (1 off the CPU), from its size or --intra_op_threads. Needs its
  // dataset acquired.
  int WantedThreads(const std::shared_ptr<Record>& record);
  // Takes a CPU job's threads from the budget, waiting while running jobs hold them. False when
  // the job will not run now (StopsBeforeStart).
  bool AcquireThreads(const std::shared_ptr<Record>& record, int threads);
  // Gives back a job's memory (JobHooks::release; none for an empty id) and `cpu_threads`
  // threads, and wakes the jobs waiting for them.
  void ReleaseResources(const std::string& id, int cpu_threads);
  // Publishes the job RUNNING and builds its TrainingRun (callbacks, flags, checkpoint folder).
  // With `batch`, the start (RUNNING) is queued there (QueueEvent) for the pack to publish with
  // its other members' (PublishQueued), and so are the run's epochs.
  StartedRun StartRun(const std::shared_ptr<Record>& record, int threads, int32_t packed_members,
                      std::shared_ptr<PublishBatch> batch = nullptr);
  // A run that ended, for KeepModels.
  struct EndingRun {
    std::string id;
    std::string owner;
    TrainingOutcome* outcome = nullptr;
    std::string model_sha256;  // of the model, once kept
  };
  // The files of the succeeded runs in `ending` (job_models.cc), written together
  // (WriteFilesAtomically) before any of them is published SUCCEEDED: the TorchScript model,
  // the state_dict (safetensors, the job's id stamped into its metadata) and its digest. A model
  // that cannot be kept fails its run (the outcome's state and error); a state_dict that cannot
  // be kept is logged and skipped.
  void KeepModels(std::vector<EndingRun>& ending);
  // After the run: keeps the model (KeepModels, unless `kept` says what a pack's KeepModels
  // kept of it), publishes the terminal state with its report (or, for an interrupted run,
  // leaves it RUNNING). `release_now` gives back its resources first.
  void EndRun(const std::shared_ptr<Record>& record, StartedRunState& state,
              TrainingOutcome outcome, const std::function<void()>& release_now,
              const EndingRun* kept = nullptr);
  // One try at AcquireDatasets: kNotNow when running jobs hold the memory it needs; kEnded when it
  // failed, was cancelled or the daemon stops (recorded as for AcquireDatasets).
  Acquired TryAcquireDatasets(const std::shared_ptr<Record>& record);
  // Before a job runs: its datasets and memory (JobHooks::acquire), waiting while running jobs
  // hold the memory. False when the job will not run now: it failed (recorded), was cancelled
  // (recorded), or the daemon is stopping (it stays QUEUED).
  bool AcquireDatasets(const std::shared_ptr<Record>& record);
  // Before a job runs: true when it must not start now, having recorded why (cancelled: ended
  // CANCELLED; the daemon draining or stopping: it stays QUEUED for the next start).
  // A TorchScript job taken up after a restart: its module's check (JobHooks::check_module) before
  // it runs. False when the job ended here (FAILED with the check's reason) or the daemon stops.
  bool CheckModuleBeforeStart(const std::shared_ptr<Record>& record);
  bool StopsBeforeStart(const std::shared_ptr<Record>& record);
  // Fails a job whose worker threw (std::bad_alloc, an observer's exception): the daemon goes on.
  void FailAfterException(const std::shared_ptr<Record>& record, const std::string& what);
  // Applies `mutate` to the job under mu_, writes the result through to the store, then delivers
  // the event to its sinks, in order. `event` comes with its kind and, for an epoch, the epoch and
  // running totals; Publish adds the job's id and, for a state change, the snapshot.
  // Rethrows the first exception of an observer or sink (after delivering to the others).
  // `recorded`, when given, receives the store's answer (a failed write is logged either way), so
  // that a call whose change could not be recorded is not acknowledged.
  void Publish(Record* record, JobEvent event, const std::function<void(JobSnapshot&)>& mutate,
               absl::Status* recorded = nullptr);
  // Publish's halves, shared with QueueEvent and PublishQueued, called with the job's publish_mu
  // held: the change made to the snapshot under mu_ (the event's job id, and for a state its
  // snapshot; returns an epoch's record for the store, empty otherwise), and the event handed to
  // the observer and the job's sinks (the first exception of one returned, the others served).
  JobSnapshot ApplyEvent(Record* record, JobEvent& event,
                         const std::function<void(JobSnapshot&)>& mutate);
  std::exception_ptr DeliverEvent(Record* record, const JobEvent& event);
  // Publish in two halves, for a pack's events: QueueEvent takes the job's publish_mu (kept until
  // published; taken once however many of the job's events wait) and changes the snapshot as
  // Publish does; PublishQueued writes every queued event to the store (the epochs in one
  // transaction, then the states in another), hands each to its observer and sinks in order, and
  // lets go of the ordering locks. Between the two nothing else of those jobs is published; code
  // on the pack's thread that changes a member's snapshot takes its publish_mu only when the
  // batch does not hold it (PublishBatch::Holds). With `hold_epochs`, epochs alone wait while the
  // oldest was queued less than kPackEpochsHeldFor ago: a pack of small jobs writes its epochs a
  // few times a second, not once an epoch each (the seed's sweep spent a third of its time on
  // those transactions). Returns the runs whose observer or sink threw, with the first exception.
  void QueueEvent(PublishBatch& batch, Record* record, const TrainingRun* run, JobEvent event,
                  const std::function<void(JobSnapshot&)>& mutate);
  std::vector<std::pair<const TrainingRun*, std::exception_ptr>> PublishQueued(
      PublishBatch& batch, bool hold_epochs = false);
  // The same off the job's worker (cancel, shutdown, a failed job): an observer's exception is
  // logged, the change stands.
  void PublishOutsideWorker(Record* record, JobEvent event,
                            const std::function<void(JobSnapshot&)>& mutate,
                            absl::Status* recorded = nullptr);
  // Tells the job's sinks that the daemon stopped before the job ended, and drops them.
  void EndWatches(Record* record);
  // After a job's terminal event: with a store, it leaves memory once its end is recorded.
  void ForgetEnded(const std::shared_ptr<Record>& record);
  // The jobs waiting in all queues, with those being admitted.
  int64_t QueuedLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Tells the observer that `job` was queued.
  void NotifyQueuedLocked(const JobSnapshot& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a queued record on its device's queue and starts the device's worker if needed.
  void QueueLocked(std::shared_ptr<Record> record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Record> FindLocked(const std::string& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A new id, unknown to memory and to the store.
  std::string NewId();
  // Deletes a job's model, checkpoints and module from disk (what Delete and retention remove).
  void DeleteJobFiles(const std::string& id) const;
  // keep_checkpoints: the files of all but the last N of `checkpoints`, removed from the list.
  std::vector<std::string> TrimCheckpoints(std::vector<CheckpointInfo>& checkpoints) const;

  const JobManagerOptions options_;
  JobStore* const store_;  // options_.store.get(); null without one
  // Signs the page tokens of listings kept in memory (no job store): valid until a restart.
  const std::string page_token_key_ = RandomPageTokenKey();
  mutable absl::Mutex mu_;
  // Held while a job's .pt2 is made (Pt2Path): one writer of its file at a time.
  mutable absl::Mutex pt2_mu_;
  std::map<std::string, std::shared_ptr<Record>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // ids in memory, oldest first
  std::map<std::string, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  int64_t pending_enqueues_ ABSL_GUARDED_BY(mu_) = 0;  // admitted, being recorded
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;         // refuses new jobs (Drain, Shutdown)
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;          // workers told to exit (Shutdown)
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
  std::mutex prune_mu_;  // one retention pass at a time
  // Signalled (with mu_) when a job gives back its memory or its CPU threads.
  absl::CondVar memory_released_;
  CpuThreadBudget cpu_threads_;  // the running CPU jobs' intra-op threads, peer ranks' too
  // Set as the daemon starts to stop (Drain, Shutdown): the ranks it runs for peers stop after
  // their next step (an interrupt, which the leader reports as the rank's daemon stopping).
  std::atomic<bool> peer_ranks_stop_{false};
  // The ranks running here for peers (RunPeerRank): holder to the leader's host.
  std::map<std::string, std::string> peer_ranks_ ABSL_GUARDED_BY(mu_);
  // TorchScript jobs' worker processes, kept warm per device. Declared last: destroyed (its idle
  // workers killed) after Shutdown has joined the device workers that take from it.
  WorkerPool worker_pool_{options_.worker};
};

}  // namespace trainerd::engine
