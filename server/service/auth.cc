// Token files, the per-call authentication decision and the gRPC processor that applies it.
#include "server/service/auth.h"

#include <grpc/grpc_security_constants.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "server/engine/log.h"

namespace trainerd::service {
namespace {

constexpr absl::string_view kBearer = "Bearer ";
// VouchForCertificate's metadata: the subject (binary, so that any byte of it travels as it is)
// and the process's secret.
constexpr char kConsoleSubjectKey[] = "trainerd-console-subject-bin";
constexpr char kConsoleSecretKey[] = "trainerd-console-secret";
constexpr size_t kMaxTokenNameLength = 64;

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '@' ||
         c == '-';
}

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTokenNameLength) return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

absl::string_view View(const grpc_slice& slice) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
                           GRPC_SLICE_LENGTH(slice));
}

// The verified client certificate's subject on this connection, or "".
std::string CertificateSubject(const grpc_auth_context* context) {
  grpc_auth_property_iterator it =
      grpc_auth_context_find_properties_by_name(context, GRPC_X509_SUBJECT_PROPERTY_NAME);
  const grpc_auth_property* property = grpc_auth_property_iterator_next(&it);
  if (property == nullptr) return "";
  return std::string(property->value, property->value_length);
}

void Process(void* state, grpc_auth_context* context, const grpc_metadata* md, size_t num_md,
             grpc_process_auth_metadata_done_cb done, void* user_data) {
  auto* authenticator = static_cast<std::shared_ptr<Authenticator>*>(state)->get();
  absl::string_view method;
  std::vector<absl::string_view> authorization;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = View(md[i].key);
    if (key == ":path") method = View(md[i].value);
    if (key == "authorization") authorization.push_back(View(md[i].value));
  }
  const absl::StatusOr<Caller> caller =
      authenticator->Authenticate(method, authorization, CertificateSubject(context));
  if (caller.ok()) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  const std::string message(caller.status().message());
  done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
}

void Destroy(void* state) { delete static_cast<std::shared_ptr<Authenticator>*>(state); }

}  // namespace

TokenFile ParseTokenFile(absl::string_view text) {
  TokenFile file;
  std::set<std::string> digests;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto skip = [&](absl::string_view why) {
      file.skipped.push_back(absl::StrCat("line ", line_number, " of the token file ", why));
    };
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\v\f"), absl::SkipEmpty());
    TokenEntry entry;
    absl::string_view token = words[0];
    const size_t colon = token.find(':');
    if (colon != absl::string_view::npos && IsValidName(token.substr(0, colon))) {
      entry.name = std::string(token.substr(0, colon));
      token = token.substr(colon + 1);
    }
    bool bad_role = false;
    for (size_t i = 1; i < words.size(); ++i) {
      if (words[i] == "admin") {
        entry.admin = true;
      } else {
        bad_role = true;
      }
    }
    if (bad_role) {
      skip("has a word after its token other than 'admin' (the only role); skipped");
      continue;
    }
    if (token.size() < kMinTokenLength) {
      skip(absl::StrCat("has a token of ", token.size(), " characters; tokens need at least ",
                        kMinTokenLength, " (make one with: openssl rand -hex 32); skipped"));
      continue;
    }
    entry.sha256 = Sha256Hex(std::string_view(token.data(), token.size()));
    if (!digests.insert(entry.sha256).second) {
      skip("repeats an earlier token; skipped");
      continue;
    }
    if (entry.name.empty()) entry.name = absl::StrCat("token-", entry.sha256.substr(0, 8));
    file.tokens.push_back(std::move(entry));
  }
  return file;
}

bool IsHealthMethod(absl::string_view method) {
  return method == "/grpc.health.v1.Health/Check" || method == "/grpc.health.v1.Health/Watch" ||
         method == "/grpc.health.v1.Health/List";
}

absl::StatusOr<std::shared_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  std::shared_ptr<Authenticator> authenticator(new Authenticator(options));
  authenticator->self_ = authenticator;
  authenticator->required_ = !options.token_file.empty() || options.client_certificates;
  if (options.client_certificates) {
    unsigned char secret[32];
    if (RAND_bytes(secret, sizeof(secret)) != 1) {
      return absl::InternalError("cannot draw a random secret for the console (RAND_bytes)");
    }
    authenticator->console_secret_ =
        absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(secret), sizeof(secret)));
  }
  if (!options.token_file.empty()) {
    absl::MutexLock lock(&authenticator->mu_);
    absl::Status loaded = authenticator->Load(/*at_start=*/true);
    if (!loaded.ok()) return loaded;
  }
  return authenticator;
}

bool Authenticator::IsAdmin(const std::string& name) const {
  return std::find(options_.admins.begin(), options_.admins.end(), name) != options_.admins.end();
}

bool Authenticator::IsAdminName(const std::string& name) {
  if (IsAdmin(name)) return true;
  MaybeReload();
  absl::MutexLock lock(&mu_);
  return std::any_of(tokens_.begin(), tokens_.end(),
                     [&](const TokenEntry& token) { return token.admin && token.name == name; });
}

int64_t Authenticator::valid_tokens() {
  MaybeReload();
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(tokens_.size());
}

absl::Status Authenticator::Load(bool at_start) {
  const std::string signature = FileSignature(options_.token_file);
  absl::StatusOr<std::string> text = ReadFileToString(options_.token_file);
  if (!text.ok()) {
    if (at_start) {
      return absl::Status(text.status().code(),
                          absl::StrCat("--auth_token_file: ", text.status().message()));
    }
    // Gone or unreadable: whoever removed it meant to revoke what it held.
    if (!tokens_.empty()) {
      engine::LogWarning(absl::StrCat("every token is revoked: ", text.status().message(),
                                      " (only the health check answers until the file is back)"));
    }
    tokens_.clear();
    file_signature_ = signature;
    return absl::OkStatus();
  }
  TokenFile file = ParseTokenFile(*text);
  for (const std::string& why : file.skipped) {
    engine::LogWarning(absl::StrCat("--auth_token_file '", options_.token_file, "': ", why));
  }
  if (at_start && file.tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file '", options_.token_file, "' holds no usable token",
                     file.skipped.empty() ? "" : absl::StrCat(" (", file.skipped[0], ")")));
  }
  const size_t before = tokens_.size();
  tokens_ = std::move(file.tokens);
  file_signature_ = signature;
  if (!at_start) {
    if (tokens_.empty()) {
      engine::LogWarning(absl::StrCat("every token is revoked: ", options_.token_file,
                                      " holds no usable token (only the health check answers)"));
    } else {
      engine::LogInfo(absl::StrCat("re-read ", options_.token_file, ": ", tokens_.size(),
                                   " token", tokens_.size() == 1 ? "" : "s", " (was ", before,
                                   ")"));
    }
  }
  return absl::OkStatus();
}

void Authenticator::MaybeReload() {
  if (options_.token_file.empty()) return;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - last_check_ < options_.reload_interval) return;
  last_check_ = now;
  if (FileSignature(options_.token_file) == file_signature_) return;
  Load(/*at_start=*/false).IgnoreError();  // never fails after the start
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    absl::string_view method, const std::vector<absl::string_view>& authorization,
    absl::string_view certificate_subject) {
  if (!required_) return Caller{"", /*admin=*/true};
  if (IsHealthMethod(method)) return Caller{"", /*admin=*/false};
  if (authorization.size() > 1) {
    ++rejected_;
    return absl::UnauthenticatedError(absl::StrCat(
        "the call carried ", authorization.size(), " authorization headers; send exactly one"));
  }
  if (!authorization.empty()) {
    const absl::string_view value = authorization[0];
    if (!absl::StartsWith(value, kBearer) || options_.token_file.empty()) {
      ++rejected_;
      return absl::UnauthenticatedError(
          options_.token_file.empty()
              ? "this trainerd does not use tokens; it authenticates callers by their client "
                "certificate"
              : "the authorization metadata must be 'Bearer <token>'");
    }
    MaybeReload();
    const std::string digest = Sha256Hex(
        std::string_view(value.data() + kBearer.size(), value.size() - kBearer.size()));
    // Every token is compared, in constant time, whatever matched first.
    absl::MutexLock lock(&mu_);
    const TokenEntry* match = nullptr;
    for (const TokenEntry& entry : tokens_) {
      if (CRYPTO_memcmp(entry.sha256.data(), digest.data(), digest.size()) == 0) match = &entry;
    }
    if (match == nullptr) {
      ++rejected_;
      return absl::UnauthenticatedError(
          tokens_.empty() ? "this trainerd has no valid token now (its token file is empty or "
                            "gone); ask its operator"
                          : "the bearer token is not valid for this trainerd");
    }
    return Caller{match->name, match->admin || IsAdmin(match->name)};
  }
  if (options_.client_certificates && !certificate_subject.empty()) {
    std::string subject(certificate_subject);
    const bool admin = IsAdmin(subject);
    return Caller{std::move(subject), admin};
  }
  ++rejected_;
  if (options_.token_file.empty()) {
    return absl::UnauthenticatedError(
        "this trainerd requires a client certificate (mutual TLS)");
  }
  return absl::UnauthenticatedError(
      options_.client_certificates
          ? "this trainerd requires a bearer token ('authorization: Bearer <token>') or a client "
            "certificate"
          : "this trainerd requires a bearer token ('authorization: Bearer <token>')");
}

std::vector<std::pair<std::string, std::string>> Authenticator::VouchForCertificate(
    absl::string_view subject) const {
  if (console_secret_.empty()) return {};  // no client certificates: nothing to vouch for
  return {{kConsoleSubjectKey, std::string(subject)}, {kConsoleSecretKey, console_secret_}};
}

bool Authenticator::VouchedBy(absl::string_view secret) const {
  return !console_secret_.empty() && secret.size() == console_secret_.size() &&
         CRYPTO_memcmp(secret.data(), console_secret_.data(), secret.size()) == 0;
}

grpc_auth_metadata_processor Authenticator::Processor() {
  grpc_auth_metadata_processor processor;
  processor.process = Process;
  processor.destroy = Destroy;
  processor.state = new std::shared_ptr<Authenticator>(self_.lock());
  return processor;
}

Caller CallerOf(grpc::ServerContextBase* context, Authenticator* authenticator) {
  if (authenticator == nullptr || !authenticator->required()) return Caller{"", true};
  std::vector<absl::string_view> authorization;
  const auto& metadata = context->client_metadata();
  const auto [first, last] = metadata.equal_range("authorization");
  for (auto it = first; it != last; ++it) {
    authorization.emplace_back(it->second.data(), it->second.size());
  }
  std::string subject;
  if (const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context()) {
    const std::vector<grpc::string_ref> values =
        auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
    if (!values.empty()) subject.assign(values[0].data(), values[0].size());
  }
  if (subject.empty()) {
    const auto vouched = metadata.find(kConsoleSubjectKey);
    const auto secret = metadata.find(kConsoleSecretKey);
    if (vouched != metadata.end() && secret != metadata.end() &&
        authenticator->VouchedBy(absl::string_view(secret->second.data(), secret->second.size()))) {
      subject.assign(vouched->second.data(), vouched->second.size());
    }
  }
  // The processor let this call in; ask again only to learn who it is (the method is not
  // health). A token revoked between the two answers as nobody, who owns nothing.
  absl::StatusOr<Caller> caller = authenticator->Authenticate("/trainerd.v1/", authorization, subject);
  return caller.ok() ? *std::move(caller) : Caller{"", /*admin=*/false};
}

}  // namespace trainerd::service
