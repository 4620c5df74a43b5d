// Job records, the per-device queues and workers, and each job's ordered event stream.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model_spec.h"
#include "server/engine/dataset_registry.h"
#include "server/engine/types.h"
#include <torch/script.h>
#include <torch/torch.h>

namespace trainerd::engine {

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
};

// Owns every job and one worker thread per device, created when the device gets its first job.
// A worker runs one job at a time; the others wait in that device's FIFO queue. Thread-safe: calls
// take a short lock and never wait for training. Owned by the Engine.
class JobManager {
 public:
  // A succeeded job's TorchScript model is kept as <models_dir>/<job-id>.pt (ModelPath); empty
  // means models are not kept. A job's checkpoints (JobSpec::checkpoint_every) go to
  // <data_dir>/checkpoints/<job-id>/ and are listed relative to `data_dir`; empty means none are
  // written.
  // `max_queued_jobs` bounds the jobs waiting in all queues together (0 = no bound).
  explicit JobManager(std::string models_dir = "", std::string data_dir = "", JobHooks hooks = {},
                      int64_t max_queued_jobs = 0)
      : models_dir_(std::move(models_dir)),
        data_dir_(std::move(data_dir)),
        hooks_(std::move(hooks)),
        max_queued_jobs_(max_queued_jobs) {}
  ~JobManager();  // Shutdown()
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Queues a checked job (spec with seed and device filled in) and returns it QUEUED.
  // `validation_dataset` is spec.validation_dataset's dataset, or null when it names none.
  // `torchscript` is a TorchScript job's checked module (then `model` is empty), trained in place;
  // null for a spec-built model. `owner` is recorded on the job (JobSnapshot::owner).
  // UNAVAILABLE after Shutdown; RESOURCE_EXHAUSTED when max_queued_jobs jobs already wait.
  absl::StatusOr<JobSnapshot> Enqueue(JobSpec spec, ModelSpec model,
                                      std::shared_ptr<const Dataset> dataset,
                                      std::shared_ptr<const Dataset> validation_dataset,
                                      torch::Device device,
                                      std::shared_ptr<torch::jit::Module> torchscript = nullptr,
                                      std::string owner = "");

  // NOT_FOUND for an unknown id.
  absl::StatusOr<JobSnapshot> Get(const std::string& id) const;
  // Oldest first.
  std::vector<JobSnapshot> List() const;
  // A queued job ends CANCELLED at once; a running one stops before its next step. Returns the
  // job as it stands. FAILED_PRECONDITION when the job already ended.
  absl::StatusOr<JobSnapshot> Cancel(const std::string& id);

  // The file of a SUCCEEDED job's TorchScript model. NOT_FOUND for an unknown id;
  // FAILED_PRECONDITION while the job has not succeeded, or when models are not kept.
  absl::StatusOr<std::string> ModelPath(const std::string& id) const;

  // The id of a queued or running job that uses the dataset (to train or to validate on), or ""
  // when none does.
  std::string JobUsingDataset(const std::string& dataset) const;

  // Registers `sink` for the job's future events and returns the job as it stands, atomically:
  // no event is missed or delivered twice. A job that already ended gets no events.
  absl::StatusOr<JobSnapshot> Subscribe(const std::string& id, std::shared_ptr<JobEventSink> sink);
  void Unsubscribe(const std::string& id, const JobEventSink* sink);

  // Cancels queued and running jobs (they end CANCELLED with `reason`) and joins the workers.
  // Idempotent.
  void Shutdown(const std::string& reason = "the daemon shut down");

 private:
  struct Record {
    JobSnapshot snap;  // guarded by JobManager::mu_
    ModelSpec model;
    std::shared_ptr<const Dataset> dataset;  // released when the job ends
    std::shared_ptr<const Dataset> validation_dataset;  // likewise; null when none
    std::shared_ptr<torch::jit::Module> torchscript;    // likewise; null for a spec-built model
    torch::Device device = torch::kCPU;
    std::atomic<bool> cancel{false};
    bool claimed = false;  // taken off the queue by its worker; guarded by JobManager::mu_
    std::mutex publish_mu;  // orders the job's events; lock order: publish_mu, then mu_
    std::vector<std::shared_ptr<JobEventSink>> sinks;  // guarded by publish_mu
  };
  struct Worker {
    std::deque<std::string> queue;
    std::thread thread;
    absl::CondVar cv;
  };

  void WorkerLoop(const std::string& device_name);
  void RunJob(Record* record);
  // Applies `mutate` to the job under mu_ and delivers the resulting event to its sinks, in order.
  // `event` comes with its kind and, for an epoch, the epoch and running totals; Publish adds the
  // job's id and, for a state change, the snapshot.
  void Publish(Record* record, JobEvent event, const std::function<void(JobSnapshot&)>& mutate);
  static JobEvent StateEvent() { return JobEvent{}; }
  std::string NewId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string models_dir_;
  const std::string data_dir_;  // for checkpoints; empty = none
  const JobHooks hooks_;
  const int64_t max_queued_jobs_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Record>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // ids, oldest first
  std::map<std::string, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
};

}  // namespace trainerd::engine
