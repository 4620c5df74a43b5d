// DiskQuota: a caller's files walked and summed, cached, and checked (disk_quota.h).
#include "server/engine/datasets/disk_quota.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace trainerd::engine {
namespace {

// The most callers whose figures are kept; past it, figures older than the refresh are dropped
// (the callers are the token file's names, so this is a bound that is never reached in practice).
constexpr size_t kMaxCallers = 4096;

}  // namespace

DiskQuota::DiskQuota(int64_t limit_bytes, Sources sources, absl::Duration refresh)
    : limit_bytes_(limit_bytes), sources_(std::move(sources)), refresh_(refresh) {}

int64_t DiskQuota::Walk(const std::string& owner) const {
  int64_t total = sources_.dataset_bytes ? sources_.dataset_bytes(owner) : 0;
  if (!sources_.job_ids) return total;
  const std::string& dir = sources_.data_dir;
  for (const std::string& id : sources_.job_ids(owner)) {
    total += BytesOnDisk(dir + "/modules/" + id + ".pt");
    total += BytesOnDisk(dir + "/checkpoints/" + id);
    total += BytesOnDisk(dir + "/models/" + id + ".pt");
  }
  return total;
}

int64_t DiskQuota::Used(const std::string& owner) {
  if (!enabled()) return 0;
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto it = figures_.find(owner);
    if (it != figures_.end() && now - it->second.at < refresh_) {
      return it->second.measured + it->second.charged;
    }
  }
  // Outside the lock: a walk stats every file of the caller's.
  const int64_t measured = Walk(owner);
  absl::MutexLock lock(&mu_);
  if (figures_.size() >= kMaxCallers && figures_.count(owner) == 0) {
    for (auto it = figures_.begin(); it != figures_.end();) {
      it = now - it->second.at >= refresh_ ? figures_.erase(it) : std::next(it);
    }
  }
  Figures& figures = figures_[owner];
  figures.measured = measured;
  figures.charged = 0;
  figures.at = now;
  return measured;
}

absl::Status DiskQuota::Check(const std::string& owner, int64_t more, const std::string& what) {
  if (!enabled()) return absl::OkStatus();
  const int64_t used = Used(owner);
  if (used < limit_bytes_ && more <= limit_bytes_ - used) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "caller '", owner, "' holds ", used,
      " bytes on the daemon's disk (datasets, modules, "
      "checkpoints and models)",
      more > 0 ? absl::StrCat(" and ", what, " needs ", more) : "", "; its quota is ", limit_bytes_,
      " bytes (--max_disk_bytes_per_caller): delete jobs or datasets it no longer needs"));
}

void DiskQuota::Charge(const std::string& owner, int64_t bytes) {
  if (!enabled() || bytes <= 0) return;
  absl::MutexLock lock(&mu_);
  auto it = figures_.find(owner);
  if (it != figures_.end()) it->second.charged += bytes;
}

void DiskQuota::Forget() {
  absl::MutexLock lock(&mu_);
  figures_.clear();
}

}  // namespace trainerd::engine
