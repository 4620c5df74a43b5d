// JobManager::RunPack: a sweep's members that share shapes and data trained together on one
// worker: their datasets and memory acquired (the first waits, the others take theirs or wait in
// their queue), one thread budget, their starts, epochs (held up to kPackEpochsHeldFor) and ends
// published together, and the members that end together keeping their model files as one batch
// (KeepModels) before their ends are heard. The locks are job_runner.cc's.
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/jobs/job_manager.h"
#include "server/engine/jobs/job_manager_internal.h"
#include "server/engine/log.h"
#include "server/engine/training/trainer.h"

namespace trainerd::engine {

using job_internal::ExceptionText;

void JobManager::RunPack(std::vector<std::shared_ptr<Record>> members) {
  // The first member that can start leads: it waits for its datasets and memory like any job.
  // The others each reserve theirs without waiting; one that must wait goes back to the front of
  // its queue, and runs (with any others left) once memory is free.
  std::vector<std::shared_ptr<Record>> acquired;
  size_t next = 0;
  while (next < members.size() && acquired.empty()) {
    if (AcquireDatasets(members[next])) acquired.push_back(members[next]);
    ++next;
  }
  std::vector<std::shared_ptr<Record>> later;
  for (; next < members.size(); ++next) {
    switch (TryAcquireDatasets(members[next])) {
      case Acquired::kYes:
        acquired.push_back(members[next]);
        break;
      case Acquired::kNotNow:
        later.push_back(members[next]);
        break;
      case Acquired::kEnded:
        break;
    }
  }
  if (!later.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto it = later.rbegin(); it != later.rend(); ++it) {
      (*it)->claimed = false;
      Worker* worker = workers_.at(job_internal::QueueOf((*it)->snap)).get();
      worker->queues[static_cast<int>((*it)->snap.spec.priority)].push_front((*it)->snap.id);
      worker->cv.Signal();
    }
  }
  if (acquired.empty()) return;
  // Each member's memory goes back as it ends; the pack's threads when the last one ended.
  std::vector<bool> released(acquired.size(), false);
  const int threads = WantedThreads(acquired.front());
  const bool cpu = acquired.front()->device.is_cpu();
  auto release_all = [&] {
    for (size_t i = 0; i < acquired.size(); ++i) {
      if (!released[i]) ReleaseResources(acquired[i]->snap.id, 0);
      released[i] = true;
    }
  };
  if (!AcquireThreads(acquired.front(), threads)) {
    // The lead was cancelled or the daemon stops; the others go the same way one by one.
    release_all();
    for (size_t i = 1; i < acquired.size(); ++i) {
      if (!StopsBeforeStart(acquired[i])) {
        absl::MutexLock lock(&mu_);
        acquired[i]->claimed = false;
        Worker* worker = workers_.at(job_internal::QueueOf(acquired[i]->snap)).get();
        worker->queues[static_cast<int>(acquired[i]->snap.spec.priority)].push_front(
            acquired[i]->snap.id);
        worker->cv.Signal();
      }
    }
    return;
  }
  struct ThreadRelease {
    JobManager* manager;
    int threads;
    ~ThreadRelease() { manager->ReleaseResources("", threads); }
  } thread_release{this, cpu ? threads : 0};
  const int32_t packed = static_cast<int32_t>(acquired.size());
  std::vector<StartedRun> started;
  std::vector<const TrainingRun*> runs;
  // With records, a pack's members start together and their epochs are written together: one
  // transaction for the starts, one for the epochs of up to kPackEpochsHeldFor (a member's own
  // transaction each made the seed's 64-member sweep spend more on SQLite than on training), one
  // for the members that end together, after their models; not when a member keeps a
  // bounded number of checkpoints, whose old files go only once the epoch that no longer lists
  // them is durable (the per-epoch path does that).
  bool batch_events = store_ != nullptr && acquired.size() > 1;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& member : acquired) {
      if (member->snap.spec.checkpoint_every != 0) batch_events = false;
    }
  }
  auto batch = batch_events ? std::make_shared<PublishBatch>() : nullptr;
  std::vector<bool> ended(acquired.size(), false);
  // With a batch, the members that end together end together: their model files made durable
  // in one batch (KeepModels), then their ends queued and published with one write.
  std::vector<std::pair<size_t, TrainingOutcome>> ending;
  using Failures = std::vector<std::pair<const TrainingRun*, std::exception_ptr>>;
  auto end_all = [&]() -> Failures {
    std::vector<std::pair<size_t, TrainingOutcome>> now;
    now.swap(ending);
    if (now.empty()) return {};
    // What waits is published first: nothing of the ending members may be held (an interrupted
    // run's watches end under its ordering lock).
    Failures failed = batch != nullptr ? PublishQueued(*batch) : Failures{};
    std::vector<EndingRun> files;
    files.reserve(now.size());
    for (auto& [i, outcome] : now) {
      files.push_back({acquired[i]->snap.id, started[i]->started.owner, &outcome, ""});
    }
    KeepModels(files);
    for (size_t k = 0; k < now.size(); ++k) {
      const size_t i = now[k].first;
      try {
        EndRun(
            acquired[i], *started[i], std::move(now[k].second),
            [&] {
              if (!released[i]) ReleaseResources(acquired[i]->snap.id, 0);
              released[i] = true;
            },
            &files[k]);
      } catch (...) {
        // Frees the ordering locks that FailAfterException takes.
        if (batch != nullptr) PublishQueued(*batch);
        FailAfterException(acquired[i], ExceptionText(std::current_exception()));
      }
    }
    return failed;
  };
  for (const auto& member : acquired) {
    started.push_back(StartRun(member, threads, packed > 1 ? packed : 0, batch));
    runs.push_back(&started.back()->run);
    if (batch != nullptr) {
      started.back()->run.flush_epochs = [this, batch, &end_all] {
        Failures failed = end_all();
        for (auto& failure : PublishQueued(*batch, /*hold_epochs=*/true)) {
          failed.push_back(std::move(failure));
        }
        return failed;
      };
    }
  }
  if (batch != nullptr) {
    for (const auto& [run, error] : PublishQueued(*batch)) {
      LogWarning(absl::StrCat("an event observer failed at a pack member's start: ",
                              ExceptionText(error)));
    }
  }
  try {
    RunPackedTraining(runs, [&](size_t i, TrainingOutcome outcome) {
      ended[i] = true;
      ending.emplace_back(i, std::move(outcome));
      if (batch == nullptr) end_all();  // alone: no flush_epochs to end it with the others
    });
  } catch (...) {
    const std::string what = ExceptionText(std::current_exception());
    if (batch != nullptr) {
      end_all();
      PublishQueued(*batch);  // what was queued first, and its locks freed
    }
    for (size_t i = 0; i < acquired.size(); ++i) {
      if (!ended[i]) FailAfterException(acquired[i], what);
    }
  }
  if (batch != nullptr) {
    end_all();
    PublishQueued(*batch);  // an end queued after the last flush, if any
  }
  release_all();
  for (const auto& member : acquired) ForgetEnded(member);
}

}  // namespace trainerd::engine
