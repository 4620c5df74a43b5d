#include "server/engine/engine.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "server/engine/dataset_registry.h"
#include "server/engine/device.h"
#include "server/engine/job_manager.h"
#include "server/engine/log.h"
#include "server/engine/model.h"
#include "server/engine/torchscript_module.h"

namespace trainerd::engine {

struct Engine::Impl {
  Impl(const EngineOptions& options, torch::Device device)
      : options(options),
        device(device),
        datasets(options.data_dir + "/datasets", device, options.max_dataset_bytes),
        jobs(options.data_dir + "/models", options.data_dir) {}

  const EngineOptions options;
  const torch::Device device;
  DatasetRegistry datasets;
  JobManager jobs;

  // Serialises Submit's dataset lookup with Delete's in-use check, so that a dataset cannot be
  // deleted between a job's admission and its registration.
  absl::Mutex admission_mu;

  // The I/O thread runs dataset commits (file writes and host-to-device copies), off gRPC's threads.
  std::mutex io_mu;
  std::condition_variable io_cv;
  std::deque<std::function<void()>> io_tasks;  // guarded by io_mu
  bool io_stopping = false;                     // guarded by io_mu
  std::thread io_thread;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir must not be empty");
  TRAINERD_ASSIGN_OR_RETURN(torch::Device device, ResolveDevice(options.device));
  auto impl = std::make_unique<Impl>(options, device);
  TRAINERD_RETURN_IF_ERROR(impl->datasets.LoadFromDisk());
  const size_t loaded = impl->datasets.List().size();
  LogInfo(absl::StrCat("engine ready on ", DeviceName(device), " with ", loaded,
                       " resident dataset", loaded == 1 ? "" : "s", " from ", options.data_dir));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->io_thread = std::thread([this] { IoLoop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  impl_->jobs.Shutdown();
  {
    std::lock_guard<std::mutex> lock(impl_->io_mu);
    impl_->io_stopping = true;
  }
  impl_->io_cv.notify_all();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
}

std::string Engine::default_device() const { return DeviceName(impl_->device); }

std::vector<std::string> Engine::devices() const { return AvailableDeviceNames(); }

void Engine::IoLoop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(impl_->io_mu);
      impl_->io_cv.wait(lock, [this] { return impl_->io_stopping || !impl_->io_tasks.empty(); });
      // Finish queued commits even while stopping: each has a waiting client.
      if (impl_->io_tasks.empty()) return;
      task = std::move(impl_->io_tasks.front());
      impl_->io_tasks.pop_front();
    }
    task();
  }
}

absl::StatusOr<std::unique_ptr<UploadSession>> Engine::BeginUpload(const DatasetHeader& header) {
  TRAINERD_ASSIGN_OR_RETURN(std::unique_ptr<DatasetUpload> upload,
                            impl_->datasets.BeginUpload(header));
  return std::unique_ptr<UploadSession>(std::move(upload));
}

absl::StatusOr<DatasetMeta> Engine::CommitUpload(std::unique_ptr<UploadSession> session) {
  // Every UploadSession comes from BeginUpload, which makes DatasetUploads.
  std::unique_ptr<DatasetUpload> upload(static_cast<DatasetUpload*>(session.release()));
  const std::string name = upload->meta().name;
  auto meta = impl_->datasets.Commit(std::move(upload));
  if (meta.ok()) {
    LogInfo(absl::StrCat("dataset '", name, "' resident on ", meta->device, ": ", meta->rows,
                         " rows, ", meta->size_bytes, " bytes"));
  }
  return meta;
}

void Engine::CommitUploadAsync(std::unique_ptr<UploadSession> upload,
                               std::function<void(absl::StatusOr<DatasetMeta>)> done) {
  // std::function needs a copyable callable; the upload moves into a shared holder.
  auto holder = std::make_shared<std::unique_ptr<UploadSession>>(std::move(upload));
  {
    std::lock_guard<std::mutex> lock(impl_->io_mu);
    if (!impl_->io_stopping) {
      impl_->io_tasks.push_back(
          [this, holder, done = std::move(done)] { done(CommitUpload(std::move(*holder))); });
      impl_->io_cv.notify_one();
      return;
    }
  }
  done(absl::UnavailableError("the daemon is shutting down"));
}

absl::StatusOr<DatasetMeta> Engine::GetDataset(const std::string& name) const {
  TRAINERD_ASSIGN_OR_RETURN(auto dataset, impl_->datasets.Get(name));
  return dataset->meta;
}

std::vector<DatasetMeta> Engine::ListDatasets() const { return impl_->datasets.List(); }

absl::Status Engine::DeleteDataset(const std::string& name) {
  absl::MutexLock lock(&impl_->admission_mu);
  const std::string job = impl_->jobs.JobUsingDataset(name);
  if (!job.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset '", name, "' is in use by job '", job, "'; cancel the job or wait for it to end"));
  }
  TRAINERD_RETURN_IF_ERROR(impl_->datasets.Delete(name));
  LogInfo(absl::StrCat("dataset '", name, "' deleted"));
  return absl::OkStatus();
}

absl::StatusOr<JobSnapshot> Engine::SubmitJob(JobSpec spec) {
  torch::Device device = impl_->device;
  if (!spec.device.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice(spec.device));
  }
  spec.device = DeviceName(device);
  if (!spec.seed.has_value()) {
    std::random_device random;
    spec.seed = (static_cast<uint64_t>(random()) << 32) | random();
  }
  absl::MutexLock lock(&impl_->admission_mu);
  TRAINERD_ASSIGN_OR_RETURN(auto dataset, impl_->datasets.Get(spec.dataset));
  TRAINERD_ASSIGN_OR_RETURN(ModelSpec model, CheckJobSpec(spec, dataset->meta));
  // Bring your own model: load and check the module now (see LoadTorchScriptModule), then keep
  // only a description in the spec, which every snapshot of the job copies.
  std::shared_ptr<torch::jit::Module> torchscript;
  std::vector<int64_t> torchscript_output;
  if (!spec.torchscript.empty()) {
    spec.model = absl::StrCat("torchscript (", spec.torchscript.size(), " bytes)");
    TRAINERD_ASSIGN_OR_RETURN(LoadedTorchScript loaded,
                              LoadTorchScriptModule(spec, dataset->meta));
    torchscript = std::move(loaded.module);
    torchscript_output = std::move(loaded.output_shape);
    spec.torchscript.clear();
    spec.torchscript.shrink_to_fit();
  }
  // The validation dataset is looked up under the same admission lock, so that it cannot be
  // deleted before the job holds it (JobUsingDataset counts it as in use).
  std::shared_ptr<const Dataset> validation;
  if (!spec.validation_dataset.empty()) {
    auto found = impl_->datasets.Get(spec.validation_dataset);
    if (!found.ok()) {
      return absl::Status(found.status().code(),
                          absl::StrCat("validation ", found.status().message()));
    }
    validation = *std::move(found);
    TRAINERD_RETURN_IF_ERROR(CheckValidationDataset(spec, model, dataset->meta, validation->meta,
                                                    torchscript ? &torchscript_output : nullptr));
  }
  TRAINERD_ASSIGN_OR_RETURN(JobSnapshot job,
                            impl_->jobs.Enqueue(std::move(spec), std::move(model), dataset,
                                                std::move(validation), device,
                                                std::move(torchscript)));
  LogInfo(absl::StrCat("job '", job.id, "' queued on ", job.device, ": ", job.spec.model,
                       " on dataset '", job.spec.dataset, "', ", job.spec.epochs, " epochs"));
  return job;
}

absl::StatusOr<JobSnapshot> Engine::GetJob(const std::string& id) const {
  return impl_->jobs.Get(id);
}

std::vector<JobSnapshot> Engine::ListJobs() const { return impl_->jobs.List(); }

absl::StatusOr<JobSnapshot> Engine::CancelJob(const std::string& id) {
  return impl_->jobs.Cancel(id);
}

absl::StatusOr<JobSnapshot> Engine::SubscribeJob(const std::string& id,
                                                 std::shared_ptr<JobEventSink> sink) {
  return impl_->jobs.Subscribe(id, std::move(sink));
}

absl::StatusOr<std::string> Engine::ModelArchivePath(const std::string& id) const {
  return impl_->jobs.ModelPath(id);
}

void Engine::UnsubscribeJob(const std::string& id, const JobEventSink* sink) {
  impl_->jobs.Unsubscribe(id, sink);
}

}  // namespace trainerd::engine
