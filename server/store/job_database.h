// The job records' file (SqliteJobStore's): opened, checked and brought to this trainerd's
// schema. A file SQLite finds damaged is DATA_LOSS (SqliteJobStore::OpenOrSetAside moves it
// aside); one written by a newer trainerd, or that cannot be migrated, FAILED_PRECONDITION naming
// the file. Migrations run one version at a time, each in its own transaction, filling new
// columns from the records where they need it. Private to server/store/.
#pragma once

#include <string>

#include "absl/status/statusor.h"

struct sqlite3;

namespace trainerd::store {

// Two connections to one database in WAL mode: the writer (which made any migration) and a
// read-only reader, and the key that signs this database's page tokens (kept in its meta table,
// so that a token outlives a restart but is good for this database only). The caller closes the
// connections.
struct JobDatabase {
  sqlite3* writer = nullptr;
  sqlite3* reader = nullptr;
  std::string page_token_key;
};

absl::StatusOr<JobDatabase> OpenJobDatabase(const std::string& path);

}  // namespace trainerd::store
