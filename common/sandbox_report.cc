// The sandbox report's one-line form, and the /proc status field both its sides read
// (sandbox_report.h).
#include "common/sandbox_report.h"

#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainerd {
namespace {

constexpr size_t kMaxLineBytes = 1024;
constexpr size_t kMaxTokenBytes = 32;

// A reason token: short, and only letters, digits and '_' (an errno's name, "probe").
bool IsToken(absl::string_view v) {
  if (v.size() > kMaxTokenBytes) return false;
  for (char c : v) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::string EncodeSandboxReport(const SandboxReport& r) {
  auto token = [](const std::string& v) { return IsToken(v) ? v : std::string("other"); };
  std::string line = absl::StrCat(
      "program=", token(r.program), " landlock_abi=", r.landlock_abi,
      " landlock=", r.landlock ? 1 : 0, " seccomp=", r.seccomp ? 1 : 0,
      " no_new_privileges=", r.no_new_privileges ? 1 : 0, " not_dumpable=", r.not_dumpable ? 1 : 0,
      " network_namespace=", r.network_namespace ? 1 : 0, " uid=", r.uid);
  if (!r.landlock_error.empty())
    absl::StrAppend(&line, " landlock_error=", token(r.landlock_error));
  if (!r.seccomp_error.empty()) absl::StrAppend(&line, " seccomp_error=", token(r.seccomp_error));
  if (!r.network_error.empty()) absl::StrAppend(&line, " network_error=", token(r.network_error));
  return line;
}

absl::StatusOr<SandboxReport> DecodeSandboxReport(absl::string_view line) {
  if (line.size() > kMaxLineBytes) {
    return absl::InvalidArgumentError("a sandbox report longer than 1024 bytes");
  }
  SandboxReport r;
  auto flag = [](absl::string_view v, bool* out) {
    if (v != "0" && v != "1") return false;
    *out = v == "1";
    return true;
  };
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    const size_t eq = word.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError("a sandbox report word without '='");
    }
    const absl::string_view key = word.substr(0, eq);
    const absl::string_view value = word.substr(eq + 1);
    bool ok = true;
    if (key == "program") {
      ok = IsToken(value);
      r.program = std::string(value);
    } else if (key == "landlock_abi") {
      ok = absl::SimpleAtoi(value, &r.landlock_abi) && r.landlock_abi >= 0 && r.landlock_abi < 1000;
    } else if (key == "landlock") {
      ok = flag(value, &r.landlock);
    } else if (key == "seccomp") {
      ok = flag(value, &r.seccomp);
    } else if (key == "no_new_privileges") {
      ok = flag(value, &r.no_new_privileges);
    } else if (key == "not_dumpable") {
      ok = flag(value, &r.not_dumpable);
    } else if (key == "network_namespace") {
      ok = flag(value, &r.network_namespace);
    } else if (key == "uid") {
      ok = absl::SimpleAtoi(value, &r.uid) && r.uid >= -1 && r.uid <= 0xffffffffLL;
    } else if (key == "landlock_error") {
      ok = IsToken(value);
      r.landlock_error = std::string(value);
    } else if (key == "seccomp_error") {
      ok = IsToken(value);
      r.seccomp_error = std::string(value);
    } else if (key == "network_error") {
      ok = IsToken(value);
      r.network_error = std::string(value);
    }  // an unknown key is skipped: a newer process may say more
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("a malformed sandbox report value for '", IsToken(key) ? key : "?", "'"));
    }
  }
  return r;
}

std::string ProcStatusField(const std::string& path, absl::string_view key) {
  std::ifstream status(path);
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, key)) {
      return std::string(absl::StripAsciiWhitespace(line.substr(key.size())));
    }
  }
  return "";
}

}  // namespace trainerd
