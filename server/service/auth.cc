// Token files, the per-call authentication decision and the gRPC processor that applies it.
#include "server/service/auth.h"

#include <grpc/grpc_security_constants.h>
#include <openssl/crypto.h>
#include <sys/stat.h>

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "server/engine/log.h"

namespace trainerd::service {
namespace {

constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kBearer = "Bearer ";
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

// inode, size and modification time: enough to notice a replaced or rewritten file (Kubernetes
// swaps a Secret's files by renaming a symlinked folder; the stat follows the link).
std::string FileSignature(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return "";
  return absl::StrCat(info.st_ino, ":", info.st_size, ":", info.st_mtim.tv_sec, ".",
                      info.st_mtim.tv_nsec);
}

std::string Value(const grpc_slice& slice) {
  return std::string(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
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
  std::string method;
  std::string authorization;
  for (size_t i = 0; i < num_md; ++i) {
    const std::string key = Value(md[i].key);
    if (key == ":path") method = Value(md[i].value);
    if (key == "authorization") authorization = Value(md[i].value);
  }
  const absl::StatusOr<std::string> caller =
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

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text) {
  std::vector<TokenEntry> tokens;
  std::set<std::string> digests;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    TokenEntry entry;
    absl::string_view token = line;
    const size_t colon = line.find(':');
    if (colon != absl::string_view::npos && IsValidName(line.substr(0, colon))) {
      entry.name = std::string(line.substr(0, colon));
      token = line.substr(colon + 1);
    }
    for (char c : token) {
      if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_number, " of the token file has a token with whitespace"));
      }
    }
    if (token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number, " of the token file has a token of ", token.size(),
          " characters; tokens need at least ", kMinTokenLength,
          " (make one with: openssl rand -hex 32)"));
    }
    entry.sha256 = Sha256Hex(std::string_view(token.data(), token.size()));
    if (!digests.insert(entry.sha256).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, " of the token file repeats an earlier token"));
    }
    if (entry.name.empty()) entry.name = absl::StrCat("token-", entry.sha256.substr(0, 8));
    tokens.push_back(std::move(entry));
  }
  if (tokens.empty()) return absl::InvalidArgumentError("the token file holds no token");
  return tokens;
}

absl::StatusOr<std::shared_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  std::shared_ptr<Authenticator> authenticator(new Authenticator(options));
  authenticator->self_ = authenticator;
  authenticator->required_ = !options.token_file.empty() || options.client_certificates;
  if (!options.token_file.empty()) {
    absl::MutexLock lock(&authenticator->mu_);
    absl::Status loaded = authenticator->Load();
    if (!loaded.ok()) return loaded;
  }
  return authenticator;
}

absl::Status Authenticator::Load() {
  const std::string signature = FileSignature(options_.token_file);
  absl::StatusOr<std::string> text = ReadFileToString(options_.token_file);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--auth_token_file: ", text.status().message()));
  }
  absl::StatusOr<std::vector<TokenEntry>> tokens = ParseTokenFile(*text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_token_file '", options_.token_file,
                                                   "': ", tokens.status().message()));
  }
  tokens_ = *std::move(tokens);
  file_signature_ = signature;
  last_check_ = absl::Now();
  return absl::OkStatus();
}

void Authenticator::MaybeReload() {
  if (options_.token_file.empty()) return;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - last_check_ < options_.reload_interval) return;
  last_check_ = now;
  if (FileSignature(options_.token_file) == file_signature_) return;
  const size_t before = tokens_.size();
  absl::Status loaded = Load();
  if (!loaded.ok()) {
    engine::LogWarning(
        absl::StrCat("keeping the previous tokens: ", loaded.message()));
    return;
  }
  engine::LogInfo(absl::StrCat("re-read ", options_.token_file, ": ", tokens_.size(),
                               " token", tokens_.size() == 1 ? "" : "s", " (was ", before, ")"));
}

absl::StatusOr<std::string> Authenticator::Authenticate(absl::string_view method,
                                                        absl::string_view authorization,
                                                        absl::string_view certificate_subject) {
  if (!required_ || absl::StartsWith(method, kHealthPrefix)) return std::string();
  if (!authorization.empty()) {
    if (!absl::StartsWith(authorization, kBearer) || options_.token_file.empty()) {
      ++rejected_;
      return absl::UnauthenticatedError(
          options_.token_file.empty()
              ? "this trainerd does not use tokens; it authenticates callers by their client "
                "certificate"
              : "the authorization metadata must be 'Bearer <token>'");
    }
    MaybeReload();
    const std::string digest = Sha256Hex(
        std::string_view(authorization.data() + kBearer.size(), authorization.size() - kBearer.size()));
    // Every token is compared, in constant time, whatever matched first.
    const TokenEntry* match = nullptr;
    absl::MutexLock lock(&mu_);
    for (const TokenEntry& entry : tokens_) {
      if (CRYPTO_memcmp(entry.sha256.data(), digest.data(), digest.size()) == 0) match = &entry;
    }
    if (match == nullptr) {
      ++rejected_;
      return absl::UnauthenticatedError("the bearer token is not valid for this trainerd");
    }
    return match->name;
  }
  if (options_.client_certificates && !certificate_subject.empty()) {
    return std::string(certificate_subject);
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

grpc_auth_metadata_processor Authenticator::Processor() {
  grpc_auth_metadata_processor processor;
  processor.process = Process;
  processor.destroy = Destroy;
  processor.state = new std::shared_ptr<Authenticator>(self_.lock());
  return processor;
}

std::string CallerName(grpc::ServerContextBase* context, Authenticator* authenticator) {
  if (authenticator == nullptr || !authenticator->required()) return "";
  std::string authorization;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization.assign(it->second.data(), it->second.size());
  }
  std::string subject;
  if (const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context()) {
    const std::vector<grpc::string_ref> values =
        auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
    if (!values.empty()) subject.assign(values[0].data(), values[0].size());
  }
  // The processor let this call in; ask again only to learn the name (the method is not health).
  absl::StatusOr<std::string> caller =
      authenticator->Authenticate("/trainerd.v1/", authorization, subject);
  return caller.ok() ? *caller : "";
}

}  // namespace trainerd::service
