// Who may call trainerd. Callers prove who they are with a bearer token from --auth_token_file
// (metadata "authorization: Bearer <token>") or, with mutual TLS, with a client certificate
// signed by --tls_client_ca_file. The decision is made once per call by gRPC's auth metadata
// processor (credentials.h installs Authenticator::Processor on the server's credentials), before
// any handler runs, so that no handler checks a token itself; handlers only ask CallerName for
// the name to record on what the call creates. The gRPC health service stays open to everyone
// (Kubernetes' gRPC probes cannot send metadata); every other method, reflection included, needs
// a caller.
#pragma once

#include <grpc/grpc_security.h>
#include <grpcpp/server_context.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainerd::service {

// The shortest token accepted: 16 characters (openssl rand -hex 32 makes 64).
inline constexpr size_t kMinTokenLength = 16;

// One accepted token: the name recorded on what its caller creates, whether that caller is an
// admin, and the token's SHA-256 (only digests are kept, and compared in constant time).
struct TokenEntry {
  std::string name;
  std::string sha256;  // lower-case hex
  bool admin = false;
};

// What a token file held: the tokens of its good lines, and one sentence per line that was
// skipped (naming the line, never the token).
struct TokenFile {
  std::vector<TokenEntry> tokens;
  std::vector<std::string> skipped;
};

// Parses a token file: one token per line, "NAME:TOKEN" or just "TOKEN", optionally followed by
// whitespace and the word "admin" (the caller sees and manages every tenant's datasets and jobs);
// blank lines and lines starting with '#' are skipped; surrounding whitespace is ignored. NAME
// matches [A-Za-z0-9._@-]{1,64}; an unnamed token is named "token-" plus the first 8 hex digits of
// its SHA-256. A line with a token shorter than kMinTokenLength, another word than "admin" after
// it, or a token an earlier line has is skipped (the others still count), so that one bad line
// in a file an operator edits does not lock every caller out.
TokenFile ParseTokenFile(absl::string_view text);

// Who made a call: the name recorded on what it creates (a token's name, a client certificate's
// subject; "" without authentication) and whether it may see and manage every tenant's datasets
// and jobs. Without authentication every caller is one local admin.
struct Caller {
  std::string name;
  bool admin = true;
};

struct AuthOptions {
  // A token file (ParseTokenFile), re-read when it changes on disk (checked at most once per
  // `reload_interval`). Its new content replaces the old: a bad line is skipped and logged, and a
  // file that is empty, holds no good line or is gone revokes every token (logged, and
  // trainerd_auth_tokens is 0; the health check still answers). At start the file must hold at
  // least one good token. Empty: no tokens.
  std::string token_file;
  // Callers that are admins whatever their token file line says: token names or certificate
  // subjects (--admin).
  std::vector<std::string> admins;
  absl::Duration reload_interval = absl::Seconds(1);
  // Mutual TLS: a client certificate verified against the client CA identifies its caller by
  // its subject.
  bool client_certificates = false;
};

// Decides each call. Thread-safe.
class Authenticator {
 public:
  // Reads the token file (errors name the file). Without tokens and client certificates every
  // caller is let in and named "".
  static absl::StatusOr<std::shared_ptr<Authenticator>> Create(const AuthOptions& options);

  // Whether calls need a caller at all.
  bool required() const { return required_; }

  // The caller of a call to `method` ("/trainerd.v1.JobService/SubmitJob") that carried
  // `authorization` (the metadata values, none when absent) over a connection whose verified
  // client certificate has `certificate_subject` ("" when none). A token, when sent, must be
  // valid and names the caller; otherwise the certificate does. UNAUTHENTICATED with a sentence
  // that says what to send, also for more than one authorization value. The standard health
  // methods (IsHealthMethod) are always let in, as a caller named "" that is no admin.
  absl::StatusOr<Caller> Authenticate(absl::string_view method,
                                      const std::vector<absl::string_view>& authorization,
                                      absl::string_view certificate_subject);

  // The C-core processor that calls Authenticate for every call, holding a reference to this.
  grpc_auth_metadata_processor Processor();

  // Whether the caller named `name` is an admin: named in --admin, or the name of a token whose
  // line is marked admin (an upload an admin makes in another owner's name counts against that
  // owner's quotas unless it is one).
  bool IsAdminName(const std::string& name);

  // The metadata by which this process's web console says, over the in-process channel (which
  // has no TLS and skips the processor), that the browser's connection presented a client
  // certificate with `subject` that the console verified against the client CA. It carries a
  // secret of this process (random, made at Create, never logged), so that no caller over the
  // network can claim a subject with it; CallerOf takes the subject as a verified connection's.
  std::vector<std::pair<std::string, std::string>> VouchForCertificate(
      absl::string_view subject) const;

  // Calls refused so far, and the tokens that are valid now (for the metrics).
  int64_t rejected_calls() const { return rejected_.load(); }
  int64_t valid_tokens();

 private:
  explicit Authenticator(const AuthOptions& options) : options_(options) {}
  // Re-reads the token file when it changed on disk and reload_interval has passed.
  void MaybeReload();
  // Reads the file and replaces the tokens with its good lines (logging the skipped ones);
  // `at_start`: refuses a file with no good token instead.
  absl::Status Load(bool at_start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsAdmin(const std::string& name) const;
  // Whether `secret` is VouchForCertificate's (compared in constant time).
  bool VouchedBy(absl::string_view secret) const;
  friend Caller CallerOf(grpc::ServerContextBase* context, Authenticator* authenticator);

  const AuthOptions options_;
  bool required_ = false;
  std::atomic<int64_t> rejected_{0};
  absl::Mutex mu_;
  std::vector<TokenEntry> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string file_signature_ ABSL_GUARDED_BY(mu_);  // inode, size, mtime of the token file
  std::weak_ptr<Authenticator> self_;
  std::string console_secret_;  // VouchForCertificate's: 32 random bytes, hex
};

// The health service's own methods, exactly: Check, Watch and List of grpc.health.v1.Health.
bool IsHealthMethod(absl::string_view method);

// The caller of a call the server let in: the token's name or the certificate's subject (the
// connection's, or the one the console vouched for), and whether it is an admin; {"", admin}
// when the server has no authenticator or calls need no caller.
Caller CallerOf(grpc::ServerContextBase* context, Authenticator* authenticator);

}  // namespace trainerd::service
