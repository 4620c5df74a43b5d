// SQLite's C API as the job store uses it: a prepared statement and a transaction that clean up
// when they go out of scope, and errors as statuses naming the records' file. Private to
// server/store/.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainerd::store::sqlite {

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

inline absl::Status Error(sqlite3* db, const std::string& path, const char* what) {
  return absl::InternalError(
      absl::StrCat("job records '", path, "': cannot ", what, ": ", sqlite3_errmsg(db)));
}

inline absl::Status Exec(sqlite3* db, const std::string& path, const char* sql, const char* what) {
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

}  // namespace trainerd::store::sqlite
