// The per-caller disk quota (EngineOptions::max_disk_bytes_per_caller): the bytes under the data
// folder that one caller's things hold: its datasets' files, its TorchScript jobs' modules, its
// jobs' checkpoints and trained models. Checked when the caller uploads (with the declared size)
// and submits (refused once the caller is at its quota), and before each checkpoint of its jobs
// (skipped, the job going on, as for a full disk). A job's trained model is always kept: a job
// admitted under the quota keeps the promise a SUCCEEDED job makes. Admins are not held to it.
//
// The figures: a walk of the caller's files, measured at most every `refresh` (a walk costs a
// stat per file), plus what was charged since (checkpoints as they are written), so that a job
// writing a checkpoint every second cannot pass the quota by more than one checkpoint between
// walks. LibTorch-free. Thread-safe: one mutex (mu_) guards the figures; walks run outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainerd::engine {

class DiskQuota {
 public:
  struct Sources {
    std::string data_dir;
    // Bytes of the datasets `owner` owns (their files under data_dir/datasets).
    std::function<int64_t(const std::string& owner)> dataset_bytes;
    // Ids of every job `owner` owns, ended ones too (their files: modules/<id>.pt,
    // checkpoints/<id>/, models/<id>.pt).
    std::function<std::vector<std::string>(const std::string& owner)> job_ids;
  };

  // limit_bytes <= 0: no quota (every check passes, nothing is measured).
  DiskQuota(int64_t limit_bytes, Sources sources, absl::Duration refresh = absl::Seconds(5));

  bool enabled() const { return limit_bytes_ > 0; }
  int64_t limit_bytes() const { return limit_bytes_; }

  // The bytes `owner` holds now, as above.
  int64_t Used(const std::string& owner);
  // OK when `owner` may add `more` bytes: below its quota, and `more` fits what is left.
  // Otherwise RESOURCE_EXHAUSTED naming the quota, what it holds and `what` ("this upload").
  absl::Status Check(const std::string& owner, int64_t more, const std::string& what);
  // `bytes` written for `owner` since the last walk (a checkpoint).
  void Charge(const std::string& owner, int64_t bytes);
  // Drops every figure (a job or a dataset was deleted): the next check walks again.
  void Forget();

 private:
  struct Figures {
    int64_t measured = 0;
    int64_t charged = 0;  // since `at`
    absl::Time at = absl::InfinitePast();
  };
  int64_t Walk(const std::string& owner) const;

  const int64_t limit_bytes_;
  const Sources sources_;
  const absl::Duration refresh_;
  absl::Mutex mu_;
  std::map<std::string, Figures> figures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainerd::engine
