// Where the engine keeps its job records, so that they outlive the process: the interface the job
// manager writes through (one call per state change and per epoch, never per step) and reads
// from for listings, for jobs it no longer holds in memory, and for recovery at start. The
// implementation (SQLite, server/store/) is given to the engine by the server, so that the engine
// itself stays free of the database and of the API's protos. LibTorch-free.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/types.h"

namespace trainerd::engine {

// Which jobs a listing returns, and how much of each.
struct JobQuery {
  std::optional<JobState> state;     // only jobs in this state; unset: any
  std::string dataset;               // only jobs on this dataset; empty: any
  std::optional<std::string> owner;  // only this tenant's jobs (access.h); unset: everyone's
  int32_t page_size = 100;           // at most this many (1..kMaxJobPageSize)
  std::string page_token;            // from the previous page; empty: the first page
  bool full = false;                 // with epochs, parameters and checkpoints; else a summary
  bool newest_first = false;         // else oldest first
  std::string request_id;            // only jobs submitted with this request id; empty: any
  std::string sweep_id;              // only the members of this sweep; empty: any
};

inline constexpr int32_t kMaxJobPageSize = 1000;

struct JobPage {
  std::vector<JobSnapshot> jobs;
  std::string next_page_token;  // empty: no more
  // resume_tokens[i] continues the listing after jobs[i], so that a caller that sends fewer jobs
  // than it got (a reply held to a size) can still give the right next token.
  std::vector<std::string> resume_tokens;
};

// What a page token is bound to: every filter of the query and its order (not the page size or
// the view, which a caller may change between pages).
inline std::string JobQueryFilter(const JobQuery& query) {
  return std::string("state=") +
         (query.state.has_value() ? std::to_string(static_cast<int>(*query.state)) : "any") +
         ";dataset=" + std::to_string(query.dataset.size()) + ":" + query.dataset + ";owner=" +
         (query.owner.has_value() ? std::to_string(query.owner->size()) + ":" + *query.owner
                                  : "any") +
         ";order=" + (query.newest_first ? "newest" : "oldest") +
         ";request=" + std::to_string(query.request_id.size()) + ":" + query.request_id +
         ";sweep=" + std::to_string(query.sweep_id.size()) + ":" + query.sweep_id;
}

// Thread-safe. Errors are INTERNAL sentences naming the store (the database file), except where
// a method says otherwise.
class JobStore {
 public:
  virtual ~JobStore() = default;

  // The job as it stands after a state change or a new checkpoint, without its epochs (which
  // AppendEpoch adds one by one; job.epochs is not read). Durable when it returns.
  virtual absl::Status SaveJob(const JobSnapshot& job) = 0;
  // Several jobs at once (a sweep's members), all or none, durable when it returns: one write where
  // the store can. This default saves them one by one and deletes again those it saved when one
  // fails.
  virtual absl::Status SaveJobs(const std::vector<const JobSnapshot*>& jobs) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (absl::Status saved = SaveJob(*jobs[i]); !saved.ok()) {
        for (size_t j = 0; j < i; ++j) (void)DeleteJob(jobs[j]->id);
        return saved;
      }
    }
    return absl::OkStatus();
  }
  // One finished epoch and the job's figures after it (steps, syncs, final loss...), together.
  virtual absl::Status AppendEpoch(const JobSnapshot& job, const EpochResult& epoch) = 0;
  // Several jobs' epochs at once (a pack's members after one or more epochs, each job's in
  // order), all or none: one write where the store can, which keeps each job's figures as its
  // last epoch here leaves them. This default appends them one by one.
  virtual absl::Status AppendEpochs(
      const std::vector<std::pair<const JobSnapshot*, const EpochResult*>>& epochs) {
    for (const auto& [job, epoch] : epochs) {
      if (absl::Status appended = AppendEpoch(*job, *epoch); !appended.ok()) return appended;
    }
    return absl::OkStatus();
  }
  // The job with every epoch. NOT_FOUND for an unknown id.
  virtual absl::StatusOr<JobSnapshot> LoadJob(const std::string& id) = 0;
  // The job's epochs after `after`, at most `limit`, in order (a watch pages a long history).
  // NOT_FOUND for an unknown id. This default reads the whole job; stores override it.
  virtual absl::StatusOr<std::vector<EpochResult>> LoadEpochs(const std::string& id, int32_t after,
                                                              int32_t limit) {
    absl::StatusOr<JobSnapshot> job = LoadJob(id);
    if (!job.ok()) return job.status();
    std::vector<EpochResult> out;
    for (const EpochResult& epoch : job->epochs) {
      if (epoch.epoch > after && static_cast<int32_t>(out.size()) < limit) out.push_back(epoch);
    }
    return out;
  }
  // A page of jobs in creation order. INVALID_ARGUMENT for a page token this store did not make.
  // Only here does a job come back with its request_digest (a submit's retry compares it).
  virtual absl::StatusOr<JobPage> ListJobs(const JobQuery& query) = 0;
  // Jobs that were QUEUED or RUNNING when the records were last written, oldest first, with
  // their epochs: what a restart must take up again.
  virtual absl::StatusOr<std::vector<JobSnapshot>> LoadUnfinishedJobs() = 0;
  // Forgets the job and its epochs. NOT_FOUND for an unknown id.
  virtual absl::Status DeleteJob(const std::string& id) = 0;
  // Forgets the job's epochs after `epoch` (a resume from an earlier checkpoint runs them again).
  virtual absl::Status DeleteEpochsAfter(const std::string& id, int32_t epoch) = 0;
  // Ended jobs beyond the newest `keep` ended ones (keep < 0: none beyond), and ended jobs that
  // ended before `ended_before`, oldest first: what retention removes.
  virtual absl::StatusOr<std::vector<std::string>> EndedJobsToPrune(int64_t keep,
                                                                    absl::Time ended_before) = 0;
  // Rewrites the dataset names of the jobs that name one of `renames`' keys (their dataset or
  // validation dataset): each to its value, in one transaction, durable when it returns. The
  // engine's move of an older data folder's datasets (one namespace for every tenant) to their
  // owners' names (dataset_registry.h: DatasetRenames). A record that does not parse is left.
  virtual absl::Status RenameDatasets(const std::map<std::string, std::string>& renames) = 0;
  // Makes every write so far durable (AppendEpoch's are not, alone): before files that only the
  // older records still name are deleted. A store without such a distinction has nothing to do.
  virtual absl::Status Sync() { return absl::OkStatus(); }
};

}  // namespace trainerd::engine
