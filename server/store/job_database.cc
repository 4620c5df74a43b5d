// OpenJobDatabase (job_database.h): the file checked, its schema brought up to date.
#include "server/store/job_database.h"

#include <sqlite3.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/page_token.h"
#include "server/store/sqlite_job_store.h"
#include "server/store/sqlite_statement.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::store {
namespace {

using sqlite::Error;
using sqlite::Exec;
using sqlite::Statement;
using sqlite::Transaction;

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

absl::StatusOr<JobDatabase> OpenJobDatabase(const std::string& path) {
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
  return JobDatabase{*writer, *reader, *std::move(key)};
}

}  // namespace trainerd::store
