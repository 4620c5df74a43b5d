// SqliteJobStore: job records in SQLite (see sqlite_job_store.h).
#include "server/store/sqlite_job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
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
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::store {
namespace {

// Each migration takes the schema from version i to i + 1 (index i - 1 here).
const char* const kMigrations[] = {
    // 0 -> 1: jobs (one row each, the record without its epochs) and their epochs.
    "CREATE TABLE jobs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"  // creation order, and the page token
    "  id TEXT NOT NULL UNIQUE,"
    "  state INTEGER NOT NULL,"  // trainerd.v1.JobState
    "  dataset TEXT NOT NULL,"
    "  end_time_ns INTEGER,"    // NULL until the job ends
    "  record BLOB NOT NULL);"  // trainerd.v1.Job without epochs
    "CREATE INDEX jobs_by_state ON jobs(state, seq);"
    "CREATE INDEX jobs_by_dataset ON jobs(dataset, seq);"
    "CREATE INDEX jobs_by_end ON jobs(end_time_ns);"
    "CREATE TABLE epochs ("
    "  job_seq INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL,"
    "  result BLOB NOT NULL,"  // trainerd.v1.EpochResult
    "  PRIMARY KEY (job_seq, epoch)) WITHOUT ROWID;",
    // 1 -> 2: each job's owner as a column, so that a tenant's listing pages by the index
    // (BackfillOwners fills it from the records in the same transaction).
    "ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
    "CREATE INDEX jobs_by_owner ON jobs(owner, seq);",
    // 2 -> 3: a submit's request id and the digest of the rest of its request, so that a retry
    // finds the job its first call queued (JobQuery::request_id) after that job ended or the
    // daemon restarted. NULL for a job submitted without one, which the index leaves out.
    "ALTER TABLE jobs ADD COLUMN request_id TEXT;"
    "ALTER TABLE jobs ADD COLUMN request_digest TEXT;"
    "CREATE INDEX jobs_by_request ON jobs(owner, request_id) WHERE request_id IS NOT NULL;",
    // 3 -> 4: each sweep member's sweep id as a column, so that a sweep's members are listed by
    // the index (JobQuery::sweep_id; BackfillColumn fills it from the records). NULL for a job
    // alone, which the index leaves out.
    "ALTER TABLE jobs ADD COLUMN sweep_id TEXT;"
    "CREATE INDEX jobs_by_sweep ON jobs(sweep_id, seq) WHERE sweep_id IS NOT NULL;",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kJobStoreSchemaVersion,
              "one migration per schema version");

// One prepared statement, finalized when it goes out of scope. Not thread-safe.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    status_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  // A kept statement (SqliteJobStore::PreparedLocked), reset for its next use when this ends.
  explicit Statement(sqlite3* db, sqlite3_stmt* kept)
      : db_(db), stmt_(kept), kept_(true), status_(kept != nullptr ? SQLITE_OK : SQLITE_ERROR) {}
  ~Statement() {
    if (!kept_) {
      sqlite3_finalize(stmt_);
    } else if (stmt_ != nullptr) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
    }
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return status_ == SQLITE_OK; }
  Statement& Bind(int index, int64_t value) {
    if (ok()) status_ = sqlite3_bind_int64(stmt_, index, value);
    return *this;
  }
  Statement& Bind(int index, const std::string& text) {
    if (ok())
      status_ = sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()),
                                  SQLITE_TRANSIENT);
    return *this;
  }
  Statement& BindBlob(int index, const std::string& bytes) {
    if (ok())
      status_ = sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()),
                                  SQLITE_TRANSIENT);
    return *this;
  }
  Statement& BindNull(int index) {
    if (ok()) status_ = sqlite3_bind_null(stmt_, index);
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE, or an error code.
  int Step() { return ok() ? sqlite3_step(stmt_) : status_; }
  int64_t Int(int column) const { return sqlite3_column_int64(stmt_, column); }
  std::string Blob(int column) const {
    const void* data = sqlite3_column_blob(stmt_, column);
    const int size = sqlite3_column_bytes(stmt_, column);
    return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), size);
  }
  std::string Text(int column) const {
    const unsigned char* text = sqlite3_column_text(stmt_, column);
    return text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text));
  }

 private:
  sqlite3* const db_;
  sqlite3_stmt* stmt_ = nullptr;
  bool kept_ = false;
  int status_ = SQLITE_OK;
};

absl::Status Error(sqlite3* db, const std::string& path, const char* what) {
  return absl::InternalError(
      absl::StrCat("job records '", path, "': cannot ", what, ": ", sqlite3_errmsg(db)));
}

absl::Status Exec(sqlite3* db, const std::string& path, const char* sql, const char* what) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string text = message != nullptr ? message : "unknown error";
    sqlite3_free(message);
    return absl::InternalError(absl::StrCat("job records '", path, "': cannot ", what, ": ", text));
  }
  return absl::OkStatus();
}

// A transaction on the writer: BEGIN IMMEDIATE now, ROLLBACK unless committed.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {
    begun_ = Exec(db, path, "BEGIN IMMEDIATE", "begin a transaction");
  }
  ~Transaction() {
    if (begun_.ok() && !committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  const absl::Status& begun() const { return begun_; }
  absl::Status Commit() {
    absl::Status status = Exec(db_, path_, "COMMIT", "commit");
    committed_ = status.ok();
    return status;
  }

 private:
  sqlite3* const db_;
  const std::string& path_;
  absl::Status begun_;
  bool committed_ = false;
};

// A read transaction on the reader: every statement inside it sees one snapshot of the database
// (a job's record and its epochs agree), and the writer goes on meanwhile (WAL).
class ReadTransaction {
 public:
  explicit ReadTransaction(sqlite3* db) : db_(db) {
    begun_ = sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  ~ReadTransaction() {
    if (begun_) sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  }
  ReadTransaction(const ReadTransaction&) = delete;
  ReadTransaction& operator=(const ReadTransaction&) = delete;

 private:
  sqlite3* const db_;
  bool begun_ = false;
};

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

// Fills a column of every job from its record, as `value` reads it (a migration's new column:
// the owner for 1 -> 2, the sweep id for 3 -> 4). A record that is damaged, or whose value is
// empty, keeps the column's default.
absl::Status BackfillColumn(sqlite3* db, const std::string& path, const char* update_sql,
                            const std::function<std::string(const v1::Job&)>& value) {
  std::vector<std::pair<int64_t, std::string>> values;
  {
    Statement select(db, "SELECT seq, record FROM jobs");
    int step = 0;
    while ((step = select.Step()) == SQLITE_ROW) {
      v1::Job job;
      if (!job.ParseFromString(select.Blob(1))) continue;
      std::string read = value(job);
      if (!read.empty()) values.emplace_back(select.Int(0), std::move(read));
    }
    if (step != SQLITE_DONE) return Error(db, path, "read the jobs to migrate");
  }
  for (const auto& [seq, text] : values) {
    Statement update(db, update_sql);
    if (update.Bind(1, seq).Bind(2, text).Step() != SQLITE_DONE) {
      return Error(db, path, "migrate a job's record");
    }
  }
  return absl::OkStatus();
}

// What a migration to `version` fills from the records after its SQL, if anything.
absl::Status BackfillFor(int version, sqlite3* db, const std::string& path) {
  if (version == 2) {
    return BackfillColumn(db, path, "UPDATE jobs SET owner = ?2 WHERE seq = ?1",
                          [](const v1::Job& job) { return job.owner(); });
  }
  if (version == 4) {
    return BackfillColumn(db, path, "UPDATE jobs SET sweep_id = ?2 WHERE seq = ?1",
                          [](const v1::Job& job) { return job.sweep_id(); });
  }
  return absl::OkStatus();
}

// The key that signs this database's page tokens, made once and kept in the meta table, so that
// a token outlives a restart of the daemon but is good for this database only.
absl::StatusOr<std::string> PageTokenKey(sqlite3* db, const std::string& path) {
  Statement read(db, "SELECT value FROM meta WHERE key = 'page_token_key'");
  if (read.Step() == SQLITE_ROW) return read.Text(0);
  const std::string key = RandomPageTokenKey();
  Statement write(db, "INSERT INTO meta(key, value) VALUES('page_token_key', ?1)");
  if (write.Bind(1, key).Step() != SQLITE_DONE) return Error(db, path, "store the page token key");
  return key;
}

absl::StatusOr<sqlite3*> OpenConnection(const std::string& path, bool writer) {
  sqlite3* db = nullptr;
  const int flags = (writer ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY) |
                    SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    const std::string message = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the job records '", path, "': ", message));
  }
  sqlite3_busy_timeout(db, 5000);
  return db;
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
  absl::StatusOr<sqlite3*> writer = OpenConnection(path, /*writer=*/true);
  if (!writer.ok()) return writer.status();
  const auto refuse = [&](const std::string& why) {
    sqlite3_close(*writer);
    return absl::FailedPreconditionError(absl::StrCat(
        "the job records '", path, "' ", why,
        "; move the file aside to start with no job history (datasets are kept apart)"));
  };
  // A file that is not a database at all, or whose pages SQLite finds damaged: DATA_LOSS, which
  // OpenOrSetAside answers by moving the file aside.
  const auto damaged = [&](const std::string& why) {
    sqlite3_close(*writer);
    return absl::DataLossError(
        absl::StrCat("the job records '", path, "' are damaged (", why, ")"));
  };
  const auto is_damage = [&] {
    const int code = sqlite3_errcode(*writer) & 0xff;
    return code == SQLITE_NOTADB || code == SQLITE_CORRUPT;
  };
  // WAL: readers do not block the writer; a crash of the process loses no committed transaction.
  char* message = nullptr;
  if (sqlite3_exec(*writer, "PRAGMA journal_mode=WAL", nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string text = message != nullptr ? message : "";
    sqlite3_free(message);
    if (is_damage()) return damaged(text);
    return refuse(absl::StrCat("cannot be used (", text, ")"));
  }
  {
    // The whole file's structure, once per start (milliseconds for a few thousand jobs).
    Statement check(*writer, "PRAGMA quick_check(1)");
    const int step = check.Step();
    if (step != SQLITE_ROW) {
      if (is_damage()) return damaged(sqlite3_errmsg(*writer));
    } else if (check.Text(0) != "ok") {
      const std::string why = check.Text(0);
      return damaged(why);
    }
  }
  int version = 0;
  {
    Statement meta(
        *writer, "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)");
    if (meta.Step() != SQLITE_DONE) {
      if (is_damage()) return damaged(sqlite3_errmsg(*writer));
      return refuse("is not a trainerd job database");
    }
    Statement read(*writer, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (read.Step() == SQLITE_ROW) version = static_cast<int>(read.Int(0));
  }
  if (version > kJobStoreSchemaVersion) {
    return refuse(absl::StrCat("were written by a newer trainerd (schema ", version,
                               "; this one reads up to ", kJobStoreSchemaVersion, ")"));
  }
  for (int next = version; next < kJobStoreSchemaVersion; ++next) {
    // The transaction ends (ROLLBACK unless committed) before `refuse` closes the connection.
    bool migrated = false;
    {
      Transaction transaction(*writer, path);
      if (transaction.begun().ok() && Exec(*writer, path, kMigrations[next], "migrate").ok() &&
          BackfillFor(next + 1, *writer, path).ok()) {
        Statement set(*writer,
                      "INSERT INTO meta(key, value) VALUES('schema_version', ?1) "
                      "ON CONFLICT(key) DO UPDATE SET value = excluded.value");
        migrated = set.Bind(1, next + 1).Step() == SQLITE_DONE && transaction.Commit().ok();
      }
    }
    if (!migrated) return refuse(absl::StrCat("cannot be migrated to schema ", next + 1));
  }
  absl::StatusOr<std::string> key = PageTokenKey(*writer, path);
  if (!key.ok()) {
    sqlite3_close(*writer);
    return key.status();
  }
  absl::StatusOr<sqlite3*> reader = OpenConnection(path, /*writer=*/false);
  if (!reader.ok()) {
    sqlite3_close(*writer);
    return reader.status();
  }
  return std::unique_ptr<SqliteJobStore>(
      new SqliteJobStore(path, *writer, *reader, *std::move(key)));
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
