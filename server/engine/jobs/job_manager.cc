// JobManager (job_manager.h): its construction and ids, the accessors the engine asks
// (accepting, DeviceLoad, JobUsingDataset), drain and shutdown, and the helpers its files share
// (job_manager_internal.h). Its other parts: job_queue.cc (queueing and admission to the queues),
// job_runner.cc (running jobs on the devices' workers), job_events.cc (publishing and watches),
// job_records.cc (reads, cancel, delete, retention). mu_ guards the records, queues and workers'
// state; a job's publish_mu orders its events and is taken before mu_.
#include "server/engine/jobs/job_manager.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/page_token.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/engine/devices/device.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/torchscript_export.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {
namespace job_internal {

JobSnapshot SummaryOf(JobSnapshot& snap) {
  std::vector<EpochResult> epochs = std::move(snap.epochs);
  std::vector<ParameterValues> parameters = std::move(snap.parameters);
  JobSnapshot copy;
  try {
    copy = snap;
  } catch (...) {
    snap.epochs = std::move(epochs);
    snap.parameters = std::move(parameters);
    throw;
  }
  snap.epochs = std::move(epochs);
  snap.parameters = std::move(parameters);
  copy.epochs_completed = std::max(snap.epochs_completed, static_cast<int32_t>(snap.epochs.size()));
  return copy;
}

void RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    LogWarning(absl::StrCat("cannot delete '", path, "': ", std::strerror(errno)));
  }
}

}  // namespace job_internal

namespace job_internal {

std::string ExceptionText(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return "out of host memory (std::bad_alloc)";
  } catch (const std::exception& ex) {
    return FirstLineOf(ex);
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace job_internal

using job_internal::ExceptionText;
using job_internal::kModulesFolder;
using job_internal::RemoveFile;
using job_internal::SummaryOf;

JobManager::JobManager(JobManagerOptions options)
    : options_(std::move(options)),
      store_(options_.store.get()),
      cpu_threads_(options_.cpu_cores > 0 ? options_.cpu_cores : UsableCores()) {}

JobManager::~JobManager() { Shutdown(); }

std::string JobManager::NewId() {
  while (true) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      id = absl::StrFormat("job-%012x", rng_() & 0xffffffffffffULL);
      if (jobs_.count(id)) continue;
    }
    // A job from before a restart may have it (48 random bits: rare, but records are kept).
    if (store_ != nullptr && store_->LoadJob(id).status().code() != absl::StatusCode::kNotFound) {
      continue;
    }
    return id;
  }
}

std::shared_ptr<JobManager::Record> JobManager::FindLocked(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::string JobManager::ModuleFilePath(const std::string& id) const {
  if (options_.data_dir.empty()) return "";
  return absl::StrCat(options_.data_dir, "/", kModulesFolder, "/", id, ".pt");
}

bool JobManager::accepting() const {
  absl::MutexLock lock(&mu_);
  return !stopping_;
}

int64_t JobManager::DeviceLoad(const std::string& device) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(device);
  if (it == workers_.end()) return 0;
  return static_cast<int64_t>(it->second->queued()) + it->second->running;
}

std::string JobManager::JobUsingDataset(const std::string& dataset) const {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : order_) {
    const JobSnapshot& snap = jobs_.at(id)->snap;
    if (IsTerminal(snap.state)) continue;
    if (snap.spec.dataset == dataset || snap.spec.validation_dataset == dataset) return id;
  }
  return "";
}

void JobManager::Drain(absl::Duration timeout) {
  peer_ranks_stop_.store(true);
  if (store_ == nullptr) {
    Shutdown();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // no new jobs; workers take no queued job
    for (auto& [name, worker] : workers_) worker->cv.SignalAll();
    for (auto& [id, record] : jobs_) {
      if (record->claimed && !IsTerminal(record->snap.state)) {
        record->drain.store(true);
      }
    }
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const auto& [name, worker] : workers_) {
      if (worker->running > 0) return false;
    }
    return true;
  };
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      LogWarning(absl::StrCat("jobs still run after --shutdown_timeout (",
                              absl::FormatDuration(timeout),
                              "); they stop now and resume from their last checkpoint"));
    }
  }
  Shutdown();
}

void JobManager::Shutdown(const std::string& reason) {
  peer_ranks_stop_.store(true);
  std::vector<std::shared_ptr<Record>> queued;
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ && workers_.empty()) return;
    stopping_ = true;
    stopped_ = true;
    stop_reason_ = reason;
    for (auto& [name, worker] : workers_) {
      // With a store the queued jobs stay QUEUED in the records (the next start runs them); only
      // their watches end.
      for (auto& queue : worker->queues) {
        for (const std::string& id : queue) queued.push_back(jobs_.at(id));
        queue.clear();
      }
      worker->cv.SignalAll();
    }
    for (auto& [id, record] : jobs_) {
      if (IsTerminal(record->snap.state)) continue;
      if (store_ == nullptr) {
        record->cancel.store(true);
      } else {
        record->interrupt.store(true);
      }
    }
  }
  for (const auto& record : queued) {
    if (store_ != nullptr) {
      EndWatches(record.get());
      continue;
    }
    PublishOutsideWorker(record.get(), JobEvent{}, [&](JobSnapshot& snap) {
      snap.state = JobState::kCancelled;
      snap.error = reason;
      snap.end_time = absl::Now();
    });
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, worker] : workers_) {
      for (std::thread& t : worker->threads) threads.push_back(std::move(t));
    }
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  absl::MutexLock lock(&mu_);
  workers_.clear();
}

}  // namespace trainerd::engine
