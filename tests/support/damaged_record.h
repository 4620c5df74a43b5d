// Damages one job's record in a trainerd jobs.db on disk, as a bad sector or a stray write would:
// the row stays (id, state and the other columns), its serialized trainerd.v1.Job becomes bytes
// that do not parse. For the store's and the engine's tests of damaged records; header-only, so
// that only tests that link Debian's libsqlite3 include it.
#pragma once

#include <sqlite3.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainerd::testing {

inline void DamageJobRecord(const std::string& path, const std::string& id) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string sql =
      absl::StrCat("UPDATE jobs SET record = x'ffffffff0badf00d' WHERE id = '", id, "'");
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(sqlite3_changes(db), 1) << "no job '" << id << "' in " << path;
  sqlite3_close(db);
}

}  // namespace trainerd::testing
