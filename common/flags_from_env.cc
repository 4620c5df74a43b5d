#include "common/flags_from_env.h"

#include <algorithm>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace trainerd {
namespace {

// Flags that Abseil defines for every program: they steer parsing itself, never set from here.
const std::set<std::string>& AbseilFlags() {
  static const auto* flags = new std::set<std::string>{
      "flagfile",  "fromenv",     "tryfromenv", "undefok", "help",    "helpfull",
      "helpshort", "helppackage", "helpmatch",  "helpon",  "version", "only_check_args"};
  return *flags;
}

}  // namespace

absl::Status ApplyFlagsFromEnvironment(const std::string& prefix,
                                       const std::vector<std::string>& environment,
                                       const std::vector<std::string>& not_flags,
                                       std::vector<std::string>* unknown) {
  for (const std::string& entry : environment) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || entry.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string key = entry.substr(0, eq);
    const std::string value = entry.substr(eq + 1);
    const std::string name = absl::AsciiStrToLower(key.substr(prefix.size()));
    if (std::find(not_flags.begin(), not_flags.end(), key) != not_flags.end()) continue;
    absl::CommandLineFlag* flag =
        AbseilFlags().count(name) ? nullptr : absl::FindCommandLineFlag(name);
    if (flag == nullptr || flag->IsRetired()) {
      if (unknown != nullptr) unknown->push_back(key);
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, "='", value.substr(0, 200), "' is not a valid --", name, ": ", error));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ProcessEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

}  // namespace trainerd
