// SqliteJobStore: job records in SQLite (see sqlite_job_store.h).
#include "server/store/sqlite_job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/page_token.h"
#include "common/status_macros.h"
#include "server/convert/convert.h"
#include "server/store/job_database.h"
#include "server/store/sqlite_statement.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::store {
namespace {

using sqlite::Error;
using sqlite::Exec;
using sqlite::ReadTransaction;
using sqlite::Statement;
using sqlite::Transaction;

// The job as stored: the v1 message without its epochs (epochs_completed says how many; at least
// `epochs_completed`, the number of the epoch being appended).
std::string JobRecord(const engine::JobSnapshot& job, int32_t epochs_completed = 0) {
  engine::JobSnapshot without = job;
  without.epochs_completed =
      std::max({job.epochs_completed, static_cast<int32_t>(job.epochs.size()), epochs_completed});
  without.epochs.clear();
  return convert::ToProto(without).SerializeAsString();
}

int64_t EndTimeNanos(const engine::JobSnapshot& job) {
  return job.end_time == absl::InfinitePast() ? 0 : absl::ToUnixNanos(job.end_time);
}

absl::StatusOr<engine::JobSnapshot> ParseRecord(const std::string& bytes, const std::string& path,
                                                const std::string& id) {
  v1::Job job;
  if (!job.ParseFromString(bytes) || job.id() != id) {
    return absl::DataLossError(absl::StrCat("job records '", path, "': the record of job '", id,
                                            "' is damaged; delete the job (trainctl job delete ",
                                            id, ") or restore the file from a backup"));
  }
  absl::StatusOr<engine::JobSnapshot> snapshot = convert::FromProto(job);
  if (!snapshot.ok()) {
    return absl::DataLossError(absl::StrCat("job records '", path, "': job '", job.id(),
                                            "' cannot be read: ", snapshot.status().message()));
  }
  return snapshot;
}

// A listing's stand-in for a job whose record cannot be read: its id and state from the row's
// columns, and why.
engine::JobSnapshot DamagedJob(const std::string& id, int64_t state, const absl::Status& why) {
  engine::JobSnapshot job;
  job.id = id;
  absl::StatusOr<engine::JobState> known = convert::FromProto(static_cast<v1::JobState>(state));
  job.state = known.ok() ? *known : engine::JobState::kFailed;
  job.record_damaged = std::string(why.message());
  return job;
}

}  // namespace

SqliteJobStore::SqliteJobStore(std::string path, sqlite3* writer, sqlite3* reader,
                               std::string page_token_key)
    : path_(std::move(path)),
      page_token_key_(std::move(page_token_key)),
      writer_(writer),
      reader_(reader) {}

SqliteJobStore::~SqliteJobStore() {
  for (auto& [sql, statement] : kept_) sqlite3_finalize(statement);
  sqlite3_close(reader_);
  sqlite3_close(writer_);
}

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& path) {
  TRAINERD_ASSIGN_OR_RETURN(JobDatabase db, OpenJobDatabase(path));
  return std::unique_ptr<SqliteJobStore>(
      new SqliteJobStore(path, db.writer, db.reader, std::move(db.page_token_key)));
}

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::OpenOrSetAside(
    const std::string& path, std::string* note) {
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = Open(path);
  if (store.ok() || store.status().code() != absl::StatusCode::kDataLoss) return store;
  // As damaged dataset files are: renamed, never deleted (an operator may still recover rows
  // from it), and the daemon starts with an empty history.
  const std::string aside = absl::StrCat(path, ".damaged-", absl::ToUnixSeconds(absl::Now()));
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string from = path + suffix;
    if (::rename(from.c_str(), (aside + suffix).c_str()) != 0 && errno != ENOENT) {
      return absl::FailedPreconditionError(absl::StrCat(
          store.status().message(), "; and it cannot be moved aside: ", std::strerror(errno)));
    }
  }
  if (note != nullptr) {
    *note = absl::StrCat(store.status().message(), ": moved to '", aside,
                         "'; starting with no job history (datasets are kept)");
  }
  return Open(path);
}

absl::Status SqliteJobStore::RenameDatasets(const std::map<std::string, std::string>& renames) {
  if (renames.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(write_mu_);
  if (absl::Status full = SetSynchronousLocked(true); !full.ok()) return full;
  Transaction transaction(writer_, path_);
  TRAINERD_RETURN_IF_ERROR(transaction.begun());
  // Every record: a validation dataset has no column of its own. Once, when a data folder of an
  // older version is first opened; bounded by the jobs retention keeps.
  std::vector<std::tuple<int64_t, std::string, std::string>> rewritten;  // seq, dataset, record
  {
    Statement select(writer_, "SELECT seq, record FROM jobs");
    int step = 0;
    while ((step = select.Step()) == SQLITE_ROW) {
      v1::Job job;
      if (!job.ParseFromString(select.Blob(1))) continue;
      bool changed = false;
      for (std::string* name : {job.mutable_spec()->mutable_dataset(),
                                job.mutable_spec()->mutable_validation_dataset()}) {
        auto it = renames.find(*name);
        if (it == renames.end()) continue;
        *name = it->second;
        changed = true;
      }
      if (changed) {
        rewritten.emplace_back(select.Int(0), job.spec().dataset(), job.SerializeAsString());
      }
    }
    if (step != SQLITE_DONE) return Error(writer_, path_, "read the jobs to rename datasets");
  }
  for (const auto& [seq, dataset, record] : rewritten) {
    Statement update(writer_, "UPDATE jobs SET dataset = ?2, record = ?3 WHERE seq = ?1");
    if (update.Bind(1, seq).Bind(2, dataset).BindBlob(3, record).Step() != SQLITE_DONE) {
      return Error(writer_, path_, "rename a job's dataset");
    }
  }
  return transaction.Commit();
}

absl::Status SqliteJobStore::SetSynchronousLocked(bool full) {
  if (synchronous_full_ == static_cast<int>(full)) return absl::OkStatus();
  absl::Status set =
      Exec(writer_, path_, full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
           "set durability");
  synchronous_full_ = set.ok() ? static_cast<int>(full) : -1;
  return set;
}

sqlite3_stmt* SqliteJobStore::PreparedLocked(const char* sql) {
  auto it = kept_.find(sql);
  if (it != kept_.end()) return it->second;
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v3(writer_, sql, -1, SQLITE_PREPARE_PERSISTENT, &statement, nullptr) !=
      SQLITE_OK) {
    sqlite3_finalize(statement);
    return nullptr;
  }
  kept_.emplace(sql, statement);
  return statement;
}

absl::Status SqliteJobStore::SaveJob(const engine::JobSnapshot& job) {
  std::lock_guard<std::mutex> lock(write_mu_);
  // A state change is worth an fsync: a job the daemon accepted must survive a power loss.
  if (absl::Status full = SetSynchronousLocked(true); !full.ok()) return full;
  return WriteJobLocked(job);
}

absl::Status SqliteJobStore::SaveJobs(const std::vector<const engine::JobSnapshot*>& jobs) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (absl::Status full = SetSynchronousLocked(true); !full.ok()) return full;
  Transaction transaction(writer_, path_);
  TRAINERD_RETURN_IF_ERROR(transaction.begun());
  for (const engine::JobSnapshot* job : jobs) TRAINERD_RETURN_IF_ERROR(WriteJobLocked(*job));
  return transaction.Commit();
}

absl::Status SqliteJobStore::WriteJobLocked(const engine::JobSnapshot& job) {
  Statement upsert(
      writer_,
      PreparedLocked("INSERT INTO jobs(id, state, dataset, end_time_ns, record, owner, "
                     "request_id, request_digest, sweep_id) "
                     "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT(id) DO UPDATE SET "
                     "state = excluded.state, dataset = excluded.dataset, "
                     "end_time_ns = excluded.end_time_ns, record = excluded.record, "
                     "owner = excluded.owner, request_id = excluded.request_id, "
                     "request_digest = excluded.request_digest, sweep_id = excluded.sweep_id"));
  upsert.Bind(1, job.id).Bind(2, convert::ToProto(job.state)).Bind(3, job.spec.dataset);
  if (engine::IsTerminal(job.state)) {
    upsert.Bind(4, EndTimeNanos(job));
  } else {
    upsert.BindNull(4);
  }
  if (job.request_id.empty()) {
    upsert.BindNull(7).BindNull(8);
  } else {
    upsert.Bind(7, job.request_id).Bind(8, job.request_digest);
  }
  if (job.sweep_id.empty()) {
    upsert.BindNull(9);
  } else {
    upsert.Bind(9, job.sweep_id);
  }
  if (upsert.BindBlob(5, JobRecord(job)).Bind(6, job.owner).Step() != SQLITE_DONE) {
    return Error(writer_, path_, "save a job");
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::WriteEpochLocked(const engine::JobSnapshot& job,
                                              const engine::EpochResult& epoch,
                                              bool update_record) {
  Statement update(writer_,
                   PreparedLocked("UPDATE jobs SET state = ?2, record = ?3 WHERE id = ?1"));
  if (update_record && update.Bind(1, job.id)
                               .Bind(2, convert::ToProto(job.state))
                               .BindBlob(3, JobRecord(job, epoch.epoch))
                               .Step() != SQLITE_DONE) {
    return Error(writer_, path_, "save a job");
  }
  Statement insert(writer_, PreparedLocked("INSERT OR REPLACE INTO epochs(job_seq, epoch, result) "
                                           "SELECT seq, ?2, ?3 FROM jobs WHERE id = ?1"));
  if (insert.Bind(1, job.id)
          .Bind(2, epoch.epoch)
          .BindBlob(3, convert::ToProto(epoch).SerializeAsString())
          .Step() != SQLITE_DONE) {
    return Error(writer_, path_, "save an epoch");
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::AppendEpoch(const engine::JobSnapshot& job,
                                         const engine::EpochResult& epoch) {
  return AppendEpochs({{&job, &epoch}});
}

absl::Status SqliteJobStore::AppendEpochs(
    const std::vector<std::pair<const engine::JobSnapshot*, const engine::EpochResult*>>& epochs) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (absl::Status normal = SetSynchronousLocked(false); !normal.ok()) return normal;
  Transaction transaction(writer_, path_);
  if (!transaction.begun().ok()) return transaction.begun();
  // A job's record once, as its last epoch here leaves it (the figures after each epoch replace
  // the ones before); every epoch's row.
  std::map<std::string_view, size_t> last;  // job id -> its last entry
  for (size_t i = 0; i < epochs.size(); ++i) last[epochs[i].first->id] = i;
  for (size_t i = 0; i < epochs.size(); ++i) {
    const auto& [job, epoch] = epochs[i];
    TRAINERD_RETURN_IF_ERROR(WriteEpochLocked(*job, *epoch, last[job->id] == i));
  }
  return transaction.Commit();
}

namespace {

// Reads the epochs of the job with sequence number `seq` into `job`.
absl::Status ReadEpochsInto(sqlite3* db, const std::string& path, int64_t seq,
                            engine::JobSnapshot* job) {
  Statement select(db, "SELECT result FROM epochs WHERE job_seq = ?1 ORDER BY epoch");
  select.Bind(1, seq);
  int step = 0;
  job->epochs.clear();
  while ((step = select.Step()) == SQLITE_ROW) {
    v1::EpochResult epoch;
    if (!epoch.ParseFromString(select.Blob(0))) {
      return absl::DataLossError(
          absl::StrCat("job records '", path, "': an epoch of job '", job->id, "' is damaged"));
    }
    job->epochs.push_back(convert::FromProto(epoch));
  }
  if (step != SQLITE_DONE) return Error(db, path, "read epochs");
  job->epochs_completed = static_cast<int32_t>(job->epochs.size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<engine::JobSnapshot> SqliteJobStore::LoadJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(read_mu_);
  ReadTransaction snapshot(reader_);
  Statement select(reader_, "SELECT seq, record FROM jobs WHERE id = ?1");
  select.Bind(1, id);
  const int step = select.Step();
  if (step == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  if (step != SQLITE_ROW) return Error(reader_, path_, "read a job");
  absl::StatusOr<engine::JobSnapshot> job = ParseRecord(select.Blob(1), path_, id);
  if (!job.ok()) return job.status();
  if (absl::Status epochs = ReadEpochsInto(reader_, path_, select.Int(0), &*job); !epochs.ok()) {
    return epochs;
  }
  return job;
}

absl::StatusOr<std::vector<engine::EpochResult>> SqliteJobStore::LoadEpochs(const std::string& id,
                                                                            int32_t after,
                                                                            int32_t limit) {
  std::lock_guard<std::mutex> lock(read_mu_);
  ReadTransaction snapshot(reader_);
  Statement job(reader_, "SELECT seq FROM jobs WHERE id = ?1");
  const int found = job.Bind(1, id).Step();
  if (found == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  if (found != SQLITE_ROW) return Error(reader_, path_, "read a job");
  Statement select(reader_,
                   "SELECT result FROM epochs WHERE job_seq = ?1 AND epoch > ?2 ORDER BY epoch "
                   "LIMIT ?3");
  select.Bind(1, job.Int(0)).Bind(2, after).Bind(3, limit);
  std::vector<engine::EpochResult> epochs;
  int step = 0;
  while ((step = select.Step()) == SQLITE_ROW) {
    v1::EpochResult epoch;
    if (!epoch.ParseFromString(select.Blob(0))) {
      return absl::DataLossError(
          absl::StrCat("job records '", path_, "': an epoch of job '", id, "' is damaged"));
    }
    epochs.push_back(convert::FromProto(epoch));
  }
  if (step != SQLITE_DONE) return Error(reader_, path_, "read epochs");
  return epochs;
}

absl::StatusOr<engine::JobPage> SqliteJobStore::ListJobs(const engine::JobQuery& query) {
  const std::string filter = engine::JobQueryFilter(query);
  int64_t after = query.newest_first ? INT64_MAX : 0;
  if (!query.page_token.empty()) {
    absl::StatusOr<int64_t> seq = ReadPageToken(page_token_key_, query.page_token, filter);
    if (!seq.ok()) return seq.status();
    after = *seq;
  }
  const int64_t size = std::clamp<int64_t>(query.page_size, 1, engine::kMaxJobPageSize);
  const std::string sql = absl::StrCat(
      "SELECT seq, id, state, record, request_digest FROM jobs WHERE (?1 < 0 OR state = ?1) "
      "AND (?2 = '' OR dataset = ?2) AND (?5 = 0 OR owner = ?6) ",
      // A plain equality only with an id, so that the partial index serves it.
      query.request_id.empty() ? "" : "AND request_id = ?7 ",
      query.sweep_id.empty() ? "" : "AND sweep_id = ?8 ", "AND seq ",
      query.newest_first ? "<" : ">", " ?3 ORDER BY seq ", query.newest_first ? "DESC" : "ASC",
      " LIMIT ?4");
  std::lock_guard<std::mutex> lock(read_mu_);
  ReadTransaction snapshot(reader_);
  Statement select(reader_, sql.c_str());
  select
      .Bind(1, query.state.has_value() ? static_cast<int64_t>(convert::ToProto(*query.state))
                                       : int64_t{-1})
      .Bind(2, query.dataset)
      .Bind(3, after)
      .Bind(4, size + 1)  // one more tells whether another page follows
      .Bind(5, query.owner.has_value() ? int64_t{1} : int64_t{0})
      .Bind(6, query.owner.value_or(""));
  if (!query.request_id.empty()) select.Bind(7, query.request_id);
  if (!query.sweep_id.empty()) select.Bind(8, query.sweep_id);
  engine::JobPage page;
  int64_t last_seq = 0;
  int step = 0;
  while ((step = select.Step()) == SQLITE_ROW) {
    if (static_cast<int64_t>(page.jobs.size()) == size) {
      page.next_page_token = MakePageToken(page_token_key_, last_seq, filter);
      break;
    }
    last_seq = select.Int(0);
    absl::StatusOr<engine::JobSnapshot> job = ParseRecord(select.Blob(3), path_, select.Text(1));
    if (job.ok() && query.full) {
      if (absl::Status epochs = ReadEpochsInto(reader_, path_, last_seq, &*job); !epochs.ok()) {
        job = epochs;
      }
    }
    if (!job.ok()) {
      // One damaged record is shown as damaged; it never fails the listing of the others.
      page.jobs.push_back(DamagedJob(select.Text(1), select.Int(2), job.status()));
    } else {
      if (!query.full) {
        // The basic view: what a listing needs (AIP-157), not every value of every epoch.
        job->parameters.clear();
        job->checkpoints.clear();
      }
      job->request_digest = select.Text(4);
      page.jobs.push_back(*std::move(job));
    }
    page.resume_tokens.push_back(MakePageToken(page_token_key_, last_seq, filter));
  }
  if (step != SQLITE_ROW && step != SQLITE_DONE) return Error(reader_, path_, "list jobs");
  return page;
}

absl::StatusOr<std::vector<engine::JobSnapshot>> SqliteJobStore::LoadUnfinishedJobs() {
  std::lock_guard<std::mutex> lock(read_mu_);
  ReadTransaction snapshot(reader_);
  Statement select(reader_,
                   "SELECT seq, id, state, record FROM jobs WHERE state IN (?1, ?2) ORDER BY seq");
  select.Bind(1, v1::JOB_STATE_QUEUED).Bind(2, v1::JOB_STATE_RUNNING);
  std::vector<engine::JobSnapshot> jobs;
  int step = 0;
  while ((step = select.Step()) == SQLITE_ROW) {
    absl::StatusOr<engine::JobSnapshot> job = ParseRecord(select.Blob(3), path_, select.Text(1));
    if (job.ok()) {
      if (absl::Status epochs = ReadEpochsInto(reader_, path_, select.Int(0), &*job);
          !epochs.ok()) {
        job = epochs;
      }
    }
    // A record that cannot be read comes back marked, for the engine to set aside and name.
    jobs.push_back(job.ok() ? *std::move(job)
                            : DamagedJob(select.Text(1), select.Int(2), job.status()));
  }
  if (step != SQLITE_DONE) return Error(reader_, path_, "read unfinished jobs");
  return jobs;
}

absl::Status SqliteJobStore::DeleteJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(write_mu_);
  Transaction transaction(writer_, path_);
  if (!transaction.begun().ok()) return transaction.begun();
  Statement epochs(writer_,
                   "DELETE FROM epochs WHERE job_seq = (SELECT seq FROM jobs WHERE id = ?1)");
  if (epochs.Bind(1, id).Step() != SQLITE_DONE) return Error(writer_, path_, "delete epochs");
  Statement job(writer_, "DELETE FROM jobs WHERE id = ?1");
  if (job.Bind(1, id).Step() != SQLITE_DONE) return Error(writer_, path_, "delete a job");
  if (sqlite3_changes(writer_) == 0) {
    return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
  }
  return transaction.Commit();
}

absl::Status SqliteJobStore::Sync() {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (absl::Status full = SetSynchronousLocked(true); !full.ok()) return full;
  return Exec(writer_, path_, "UPDATE meta SET value = value WHERE key = 'schema_version'",
              "sync the records");
}

absl::Status SqliteJobStore::DeleteEpochsAfter(const std::string& id, int32_t epoch) {
  std::lock_guard<std::mutex> lock(write_mu_);
  Statement erase(writer_,
                  "DELETE FROM epochs WHERE epoch > ?2 AND "
                  "job_seq = (SELECT seq FROM jobs WHERE id = ?1)");
  if (erase.Bind(1, id).Bind(2, epoch).Step() != SQLITE_DONE) {
    return Error(writer_, path_, "delete epochs");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> SqliteJobStore::EndedJobsToPrune(int64_t keep,
                                                                          absl::Time ended_before) {
  std::lock_guard<std::mutex> lock(read_mu_);
  // Newest ended first: the first `keep` stay, unless they ended before `ended_before`.
  Statement select(reader_,
                   "SELECT id, end_time_ns FROM jobs WHERE end_time_ns IS NOT NULL "
                   "ORDER BY end_time_ns DESC, seq DESC");
  const int64_t cutoff =
      ended_before == absl::InfinitePast() ? INT64_MIN : absl::ToUnixNanos(ended_before);
  std::vector<std::string> doomed;
  int64_t kept = 0;
  int step = 0;
  while ((step = select.Step()) == SQLITE_ROW) {
    const bool too_old = select.Int(1) < cutoff;
    if (!too_old && (keep < 0 || kept < keep)) {
      ++kept;
      continue;
    }
    doomed.push_back(select.Text(0));
  }
  if (step != SQLITE_DONE) return Error(reader_, path_, "list ended jobs");
  std::reverse(doomed.begin(), doomed.end());  // oldest first
  return doomed;
}

}  // namespace trainerd::store
