// The engine's job records in an embedded SQLite database (Debian's libsqlite3), kept as
// <data_dir>/jobs.db in WAL mode. A job is one row holding the API's own trainerd.v1.Job message
// (without its epochs) plus the columns that listings filter and order on; each epoch is a row of
// its own holding a trainerd.v1.EpochResult, so that an epoch costs one small insert and a job's
// history is never rewritten. The API's messages are the storage format because they already
// carry every field and evolve compatibly (new fields get new numbers; old records read as before).
//
// Durability: state changes are committed with synchronous=FULL (a job the daemon accepted
// survives a power loss); epochs with synchronous=NORMAL (WAL: safe against a crash of the
// process; a power loss may lose the last epochs, which a resume from the last checkpoint runs
// again). The schema carries a version in the `meta` table and migrates forward at open.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/job_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace trainerd::store {

// The schema this build writes; Open migrates older databases to it and refuses newer ones.
inline constexpr int kJobStoreSchemaVersion = 4;

// Thread-safe: one connection for writes and one for reads, each behind its own mutex, so that a
// listing never waits for (or holds up) a write beyond SQLite's own WAL locking.
class SqliteJobStore final : public engine::JobStore {
 public:
  // Opens (creating if missing) the database at `path` and migrates it. FAILED_PRECONDITION for
  // a file that is not a trainerd job database or was written by a newer schema, naming the file
  // and what to do.
  // DATA_LOSS for a file that is not a database or whose pages are damaged.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path);
  // Open, and for a damaged file (DATA_LOSS) moves it (and its -wal and -shm) aside as
  // <path>.damaged-<unix seconds>, says so in `*note` (a sentence for the log; untouched
  // otherwise), and opens a new one: one damaged file never keeps the daemon from starting. Other
  // errors as Open's.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> OpenOrSetAside(const std::string& path,
                                                                        std::string* note);
  ~SqliteJobStore() override;
  SqliteJobStore(const SqliteJobStore&) = delete;
  SqliteJobStore& operator=(const SqliteJobStore&) = delete;

  absl::Status SaveJob(const engine::JobSnapshot& job) override;
  // One transaction (one fsync) for all.
  absl::Status SaveJobs(const std::vector<const engine::JobSnapshot*>& jobs) override;
  absl::Status AppendEpoch(const engine::JobSnapshot& job,
                           const engine::EpochResult& epoch) override;
  // One transaction for all: a pack of 32 members' epochs costs one commit, not 32.
  absl::Status AppendEpochs(
      const std::vector<std::pair<const engine::JobSnapshot*, const engine::EpochResult*>>& epochs)
      override;
  absl::StatusOr<engine::JobSnapshot> LoadJob(const std::string& id) override;
  absl::StatusOr<std::vector<engine::EpochResult>> LoadEpochs(const std::string& id, int32_t after,
                                                              int32_t limit) override;
  absl::StatusOr<engine::JobPage> ListJobs(const engine::JobQuery& query) override;
  absl::StatusOr<std::vector<engine::JobSnapshot>> LoadUnfinishedJobs() override;
  absl::Status DeleteJob(const std::string& id) override;
  absl::Status DeleteEpochsAfter(const std::string& id, int32_t epoch) override;
  absl::StatusOr<std::vector<std::string>> EndedJobsToPrune(int64_t keep,
                                                            absl::Time ended_before) override;
  absl::Status RenameDatasets(const std::map<std::string, std::string>& renames) override;
  // A write committed with synchronous=FULL: its fsync of the write-ahead log makes every earlier
  // commit (the epochs' NORMAL ones) durable too.
  absl::Status Sync() override;

  const std::string& path() const { return path_; }

 private:
  SqliteJobStore(std::string path, sqlite3* writer, sqlite3* reader, std::string page_token_key);

  const std::string path_;
  const std::string page_token_key_;  // signs page tokens (kept in the meta table)
  // The writer's durability for its next commits: synchronous=FULL (a state change, worth an
  // fsync) or NORMAL (an epoch), set only when it changes. Called with write_mu_ held.
  absl::Status SetSynchronousLocked(bool full);
  // The writer's statement for `sql` (a string literal: kept by its address), prepared once and
  // kept for the store's life, so that a job's every epoch does not parse its SQL again; null
  // when it cannot be prepared. Called with write_mu_ held.
  sqlite3_stmt* PreparedLocked(const char* sql);
  // One job's row inside the caller's transaction (or alone).
  absl::Status WriteJobLocked(const engine::JobSnapshot& job);
  // One epoch's writes inside the caller's transaction: the epoch's row, and with
  // `update_record` the job's record as the epoch leaves it.
  absl::Status WriteEpochLocked(const engine::JobSnapshot& job, const engine::EpochResult& epoch,
                                bool update_record);

  std::mutex write_mu_;
  sqlite3* const writer_;                      // guarded by write_mu_
  int synchronous_full_ = -1;                  // guarded by write_mu_; -1: not set yet
  std::map<const char*, sqlite3_stmt*> kept_;  // guarded by write_mu_
  std::mutex read_mu_;
  sqlite3* const reader_;  // guarded by read_mu_
};

}  // namespace trainerd::store
