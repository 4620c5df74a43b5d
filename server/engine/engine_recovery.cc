// The engine's recovery at start (Impl::Recover): the jobs the store holds as QUEUED or RUNNING
// are taken up again from their last checkpoint, and those that cannot run any more are recorded
// as FAILED. Runs in Create, before any other thread of the engine starts.
#include "server/engine/engine_impl.h"

namespace trainerd::engine {

// How many times a TorchScript job is taken up again from the same epoch at a restart before it is
// FAILED instead (Recover).
constexpr int kMaxRestartsWithoutProgress = 3;

absl::Status Engine::Impl::Recover() {
  if (options.job_store == nullptr) return absl::OkStatus();
  TRAINERD_ASSIGN_OR_RETURN(std::vector<JobSnapshot> unfinished,
                            options.job_store->LoadUnfinishedJobs());
  int resumed = 0;
  for (JobSnapshot& job : unfinished) {
    if (!job.record_damaged.empty()) {
      // Nothing of it can be trusted to run; the others must not wait for it.
      ++records_set_aside;
      LogWarning(
          absl::StrCat("job '", job.id, "' is set aside and not resumed: ", job.record_damaged));
      continue;
    }
    const JobState previous = job.state;
    // A cancel recorded while it ran: it ends here, whatever stopped the daemon. A member that
    // went on training on a peer is first found again there, to be cancelled there too.
    if (job.cancel_requested && !job.may_be_on_peer()) {
      LogInfo(absl::StrCat("job '", job.id, "' was cancelled before the daemon stopped"));
      TRAINERD_RETURN_IF_ERROR(jobs.FailUnrecoverable(
          job, "cancelled (the daemon stopped before the job did)", JobState::kCancelled));
      continue;
    }
    // From the last checkpoint the records list whose file is there (a checkpoint is written
    // before its epoch's record, so a crash between the two leaves the earlier one listed).
    // Newest first, the first whose file is there and still matches the checksum recorded when
    // it was written: a checkpoint cut short or damaged since costs the epochs after the one
    // before it, not the job.
    ResumePoint resume;
    for (auto it = job.checkpoints.rbegin(); it != job.checkpoints.rend(); ++it) {
      const std::string path = absl::StrCat(options.data_dir, "/", it->path);
      absl::StatusOr<std::string> bytes = ReadFileToString(path);
      if (!bytes.ok()) continue;
      if (!it->sha256.empty() && Sha256Hex(*bytes) != it->sha256) {
        LogWarning(absl::StrCat("job '", job.id, "': the checkpoint of epoch ", it->epoch, " ('",
                                it->path, "') is damaged; trying the one before"));
        continue;
      }
      resume.checkpoint_path = path;
      resume.epoch = it->epoch;
      break;
    }
    const int32_t from = resume.epoch;
    job.epochs.erase(std::remove_if(job.epochs.begin(), job.epochs.end(),
                                    [from](const EpochResult& e) { return e.epoch > from; }),
                     job.epochs.end());
    job.checkpoints.erase(
        std::remove_if(job.checkpoints.begin(), job.checkpoints.end(),
                       [from](const CheckpointInfo& c) { return c.epoch > from; }),
        job.checkpoints.end());
    job.final_loss = job.epochs.empty() ? 0.0 : job.epochs.back().loss;
    if (from == 0) {
      job.steps = 0;
      job.host_syncs = 0;
      job.wall_seconds = 0;
      job.samples_per_second = 0;
    }
    job.restarts.push_back(JobRestart{absl::Now(), from, previous});
    // A TorchScript job taken up again and again from the same point: whatever ends it (its
    // worker, or the daemon with it) ends it every time. Three times in a row, and it is FAILED
    // rather than taken up once more, so that a crash loop cannot happen.
    if (absl::StartsWith(job.spec.model, "torchscript") ||
        absl::StartsWith(job.spec.model, "exported (")) {
      int in_a_row = 0;
      for (auto it = job.restarts.rbegin(); it != job.restarts.rend() && it->from_epoch == from;
           ++it) {
        ++in_a_row;
      }
      if (in_a_row >= kMaxRestartsWithoutProgress) {
        const std::string reason =
            absl::StrCat("taken up ", kMaxRestartsWithoutProgress, " times in a row from epoch ",
                         from, " without finishing an epoch; it is not taken up again");
        LogWarning(absl::StrCat("job '", job.id, "' ", reason));
        TRAINERD_RETURN_IF_ERROR(jobs.FailUnrecoverable(std::move(job), reason));
        continue;
      }
    }

    // What it needs to run again, checked as at Submit.
    auto take_up = [&]() -> absl::Status {
      TRAINERD_ASSIGN_OR_RETURN(const DatasetMeta dataset, datasets.GetMeta(job.spec.dataset));
      if (!job.spec.validation_dataset.empty()) {
        TRAINERD_RETURN_IF_ERROR(datasets.GetMeta(job.spec.validation_dataset).status());
      }
      // A sweep's member on a peer runs on the peer's device, which need not be one here.
      torch::Device device = torch::kCPU;
      if (!job.spec.runs_on_peer()) {
        TRAINERD_ASSIGN_OR_RETURN(device, ResolveDevice(job.spec.device));
      }
      ModelSpec model;
      std::shared_ptr<const TorchScriptJob> module;
      if (absl::StartsWith(job.spec.model, "torchscript") ||
          absl::StartsWith(job.spec.model, "exported (")) {
        if (!options.allow_torchscript) {
          return absl::PermissionDeniedError(
              "this daemon no longer accepts TorchScript modules (--allow_torchscript=false)");
        }
        // Checked again as code before it runs, on the job's worker thread: a newer build may
        // refuse what an older one let through, and the check must not hold up the start.
        TorchScriptJob unchecked;
        TRAINERD_ASSIGN_OR_RETURN(unchecked.archive, ReadFileToString(jobs.ModuleFilePath(job.id)));
        unchecked.checked = false;
        module = std::make_shared<const TorchScriptJob>(std::move(unchecked));
      } else {
        TRAINERD_ASSIGN_OR_RETURN(model, CheckJobSpec(job.spec, dataset));
      }
      const std::string id = job.id;
      // A member on a peer went on there: it is found again by its id there (job_remote.cc).
      const std::string how =
          job.spec.runs_on_peer() ? absl::StrCat("is followed again on peer ", job.spec.peer)
          : from > 0 ? absl::StrCat("resumes after epoch ", from, " from its last checkpoint")
                     : std::string("starts over");
      TRAINERD_RETURN_IF_ERROR(
          jobs.Requeue(std::move(job), std::move(model), device, std::move(module), resume));
      LogInfo(absl::StrCat("job '", id, "' (", JobStateName(previous), " when the daemon stopped) ",
                           how));
      return absl::OkStatus();
    };
    JobSnapshot copy = job;  // take_up moves `job` once it cannot fail any more
    absl::Status taken = take_up();
    if (taken.ok()) {
      ++resumed;
      continue;
    }
    const std::string reason =
        absl::StrCat("cannot run again after the daemon restarted: ", taken.message());
    LogWarning(absl::StrCat("job '", copy.id, "' ", reason));
    TRAINERD_RETURN_IF_ERROR(jobs.FailUnrecoverable(std::move(copy), reason));
  }
  if (!unfinished.empty()) {
    LogInfo(absl::StrCat(resumed, " of ", unfinished.size(),
                         " unfinished job(s) taken up again from the records"));
  }
  jobs.PruneEndedJobs();
  return absl::OkStatus();
}

}  // namespace trainerd::engine
