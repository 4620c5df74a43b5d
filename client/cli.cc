// trainctl's command-line parser (client/cli.h): argv to an Invocation (the global flags, the
// command words, the command's flags as its spec in the table declares them, help requests), and
// the typed values of the flags. The command table is in command_table.cc (submit's and sweep's
// flags in submit_flags.cc), the usage texts in usage_text.cc.
#include "client/cli.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cli_internal.h"

namespace trainerd::client {
namespace {

// The first words of two-word commands.
constexpr absl::string_view kGroups[] = {"dataset", "job", "config"};

std::string UsageHint(const CommandSpec* command) {
  if (command == nullptr) return " (see 'trainctl --help')";
  return absl::StrCat(" (see 'trainctl ", command->path, " --help')");
}

bool IsGroup(absl::string_view word) {
  return std::find(std::begin(kGroups), std::end(kGroups), word) != std::end(kGroups);
}

// The command whose full path (or alias form) is `path`, or null.
const CommandSpec* FindCommand(absl::string_view path) {
  for (const CommandSpec& command : Commands()) {
    if (command.path == path) return &command;
    if (command.alias.empty()) continue;
    absl::string_view prefix = command.path.substr(0, command.path.rfind(' ') + 1);
    if (absl::StrCat(prefix, command.alias) == path) return &command;
  }
  return nullptr;
}

const FlagSpec* FindFlag(const CommandSpec& command, absl::string_view name) {
  for (const FlagSpec& flag : command.flags) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

const FlagSpec* FindShortFlag(const CommandSpec& command, absl::string_view short_name) {
  for (const FlagSpec& flag : command.flags) {
    if (!flag.short_name.empty() && flag.short_name == short_name) return &flag;
  }
  return nullptr;
}

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& value) {
  return ParseDurationFlag("--timeout", value);
}

absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& value) {
  if (value == "table") return OutputFormat::kTable;
  if (value == "wide") return OutputFormat::kWide;
  if (value == "json") return OutputFormat::kJson;
  if (value == "yaml") return OutputFormat::kYaml;
  if (value == "name") return OutputFormat::kName;
  return absl::InvalidArgumentError(absl::StrCat("unknown output format '", value,
                                                 "' (expected table, wide, json, yaml or name)"));
}

// The command named by the words in argv[first...] that complete `*group` (the group word seen
// so far, if any), skipping flags and the values of the global flags that take one. Null when no
// command word follows; `*group` is set when only a group word does. INVALID_ARGUMENT for an
// unknown command, as without --help.
absl::StatusOr<const CommandSpec*> CommandAfterHelpFlag(const std::vector<std::string>& argv,
                                                        size_t first, bool only_words,
                                                        std::string* group) {
  for (size_t i = first; i < argv.size(); ++i) {
    const std::string& token = argv[i];
    if (!only_words && token == "--") {
      only_words = true;
      continue;
    }
    if (!only_words && token.size() >= 2 && token[0] == '-') {
      // Skip the separate value of a global flag ("--addr HOST"); command flags are not known
      // before the command, and a word after them is taken as a command word.
      const bool takes_value = token == "--addr" || token == "--address" || token == "-o" ||
                               token == "--output" || token == "--timeout" ||
                               token == "--token-file" || token == "--tls-ca" ||
                               token == "--tls-cert" || token == "--tls-key" ||
                               token == "--tls-server-name" || token == "--context";
      if (takes_value) ++i;
      continue;
    }
    if (!group->empty()) {
      const CommandSpec* command = FindCommand(absl::StrCat(*group, " ", token));
      if (command == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown command '", *group, " ", token,
                                                       "' (see 'trainctl ", *group, " --help')"));
      }
      return command;
    }
    if (IsGroup(token)) {
      *group = token;
      continue;
    }
    const CommandSpec* command = FindCommand(token);
    if (command == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command '", token, "'", UsageHint(nullptr)));
    }
    return command;
  }
  return nullptr;
}

}  // namespace

bool Invocation::Has(absl::string_view flag) const { return flags.count(std::string(flag)) > 0; }

std::string Invocation::Get(absl::string_view flag, absl::string_view fallback) const {
  auto it = flags.find(std::string(flag));
  return it == flags.end() ? std::string(fallback) : it->second;
}

absl::StatusOr<int64_t> Invocation::GetInt(absl::string_view flag, int64_t fallback, int64_t min,
                                           int64_t max) const {
  if (!Has(flag)) return fallback;
  std::string value = Get(flag);
  int64_t result = 0;
  if (!absl::SimpleAtoi(value, &result)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", value, "' is not a whole number"));
  }
  if (result < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be at least ", min, ", got ", result));
  }
  if (result > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be at most ", max, ", got ", result));
  }
  return result;
}

absl::StatusOr<uint64_t> Invocation::GetUint(absl::string_view flag, uint64_t fallback) const {
  if (!Has(flag)) return fallback;
  std::string value = Get(flag);
  uint64_t result = 0;
  if (absl::StartsWith(value, "-") || !absl::SimpleAtoi(value, &result)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", value,
                                                   "' is not a whole number between 0 and ",
                                                   std::numeric_limits<uint64_t>::max()));
  }
  return result;
}

absl::StatusOr<double> Invocation::GetDouble(absl::string_view flag, double fallback) const {
  if (!Has(flag)) return fallback;
  std::string value = Get(flag);
  double result = 0;
  if (!absl::SimpleAtod(value, &result) || !std::isfinite(result)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", value, "' is not a number"));
  }
  return result;
}

absl::StatusOr<Invocation> ParseCommandLine(const std::vector<std::string>& argv,
                                            std::optional<std::string> env_address) {
  Invocation invocation;
  if (env_address.has_value() && !env_address->empty()) {
    invocation.global.address = *env_address;
    invocation.global.address_from_env = true;
  }

  const CommandSpec* command = nullptr;
  std::string group;        // set while only the first of two command words has been seen
  bool only_words = false;  // after "--"

  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& token = argv[i];
    const bool is_flag = !only_words && token.size() >= 2 && token[0] == '-';
    if (!is_flag) {
      if (command != nullptr) {
        invocation.args.push_back(token);
      } else if (!group.empty()) {
        command = FindCommand(absl::StrCat(group, " ", token));
        if (command == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("unknown command '", group, " ", token,
                                                         "' (see 'trainctl ", group, " --help')"));
        }
      } else if (IsGroup(token)) {
        group = token;
      } else {
        command = FindCommand(token);
        if (command == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown command '", token, "'", UsageHint(nullptr)));
        }
      }
      continue;
    }
    if (token == "--") {
      only_words = true;
      continue;
    }

    // --name, --name=value, -x, -xVALUE, -x=VALUE
    std::string name;
    std::string shown;  // the flag as the user wrote it, for messages
    std::optional<std::string> inline_value;
    if (absl::StartsWith(token, "--")) {
      std::string body = token.substr(2);
      size_t eq = body.find('=');
      if (eq != std::string::npos) {
        inline_value = body.substr(eq + 1);
        body.resize(eq);
      }
      name = body;
      shown = absl::StrCat("--", body);
    } else {
      name = token.substr(1, 1);
      shown = token.substr(0, 2);
      if (token.size() > 2) inline_value = token.substr(token[2] == '=' ? 3 : 2);
    }
    auto take_value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value.has_value()) return *inline_value;
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", shown, " needs a value"));
      }
      return argv[++i];
    };

    if (name == "h" || name == "help") {
      invocation.show_help = true;
      // "trainctl --help submit" asks about submit as "trainctl submit --help" does: the command
      // words may still follow.
      if (command == nullptr) {
        absl::StatusOr<const CommandSpec*> later =
            CommandAfterHelpFlag(argv, i + 1, only_words, &group);
        if (!later.ok()) return later.status();
        command = *later;
      }
      break;
    }
    if (name == "addr" || name == "address") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      if (value->empty()) return absl::InvalidArgumentError("--addr needs a HOST:PORT");
      invocation.global.address = *value;
      invocation.global.address_given = true;
    } else if (name == "context") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      if (value->empty()) return absl::InvalidArgumentError("--context needs a NAME");
      invocation.global.context = *value;
    } else if (name == "o" || name == "output") {
      // One meaning everywhere, as in kubectl: the output format (job model writes to --file).
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      absl::StatusOr<OutputFormat> format = ParseOutputFormat(*value);
      if (!format.ok()) return format.status();
      invocation.global.output = *format;
    } else if (name == "no-headers" && absl::StartsWith(token, "--")) {
      if (inline_value.has_value()) {
        return absl::InvalidArgumentError("flag --no-headers takes no value");
      }
      invocation.global.no_headers = true;
    } else if (name == "token-file" || name == "tls-ca" || name == "tls-cert" ||
               name == "tls-key" || name == "tls-server-name") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      if (value->empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      std::string* field = name == "token-file" ? &invocation.global.token_file
                           : name == "tls-ca"   ? &invocation.global.tls_ca
                           : name == "tls-cert" ? &invocation.global.tls_cert
                           : name == "tls-key"  ? &invocation.global.tls_key
                                                : &invocation.global.tls_server_name;
      *field = *value;
    } else if (name == "timeout") {
      absl::StatusOr<std::string> value = take_value();
      if (!value.ok()) return value.status();
      absl::StatusOr<absl::Duration> timeout = ParseTimeout(*value);
      if (!timeout.ok()) return timeout.status();
      invocation.global.timeout = *timeout;
      invocation.global.timeout_given = true;
    } else if (const FlagSpec* flag = command == nullptr ? nullptr
                                      : absl::StartsWith(token, "--")
                                          ? FindFlag(*command, name)
                                          : FindShortFlag(*command, name);
               flag != nullptr) {
      name = std::string(flag->name);
      if (flag->value_name.empty()) {
        if (inline_value.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat("flag ", shown, " takes no value"));
        }
        invocation.flags[name] = "";
      } else {
        absl::StatusOr<std::string> value = take_value();
        if (!value.ok()) return value.status();
        invocation.flags[name] = *value;
      }
    } else {
      if (command != nullptr && command->path == "sweep" && name == "torchscript") {
        // Submit's one flag that sweep has not: say why rather than just "unknown".
        return absl::InvalidArgumentError(
            "--torchscript is for 'trainctl submit' only: the members of a sweep train a --model "
            "spec (see 'trainctl sweep --help')");
      }
      std::string where = command != nullptr ? absl::StrCat(" for '", command->path, "'") : "";
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '", shown, "'", where, UsageHint(command)));
    }
  }

  if (invocation.show_help) {
    if (command != nullptr && command->path != "help") {
      invocation.help_text = CommandUsage(*command);
    } else if (command == nullptr && !group.empty()) {
      invocation.help_text = GroupUsage(group);
    } else {
      invocation.help_text = TopLevelUsage();
    }
    invocation.command = command;
    return invocation;
  }

  if (command == nullptr) {
    if (!group.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", group, "' needs a subcommand (see 'trainctl ", group, " --help')"));
    }
    return absl::InvalidArgumentError(absl::StrCat("no command given", UsageHint(nullptr)));
  }
  invocation.command = command;

  if (command->path == "help") {
    std::string topic = absl::StrJoin(invocation.args, " ");
    invocation.show_help = true;
    if (topic.empty()) {
      invocation.help_text = TopLevelUsage();
    } else if (topic == "exit-codes") {
      invocation.help_text = ExitCodesHelp();
    } else if (IsGroup(topic)) {
      invocation.help_text = GroupUsage(topic);
    } else if (const CommandSpec* about = FindCommand(topic); about != nullptr) {
      invocation.help_text = CommandUsage(*about);
      invocation.command = about;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command '", topic, "'", UsageHint(nullptr)));
    }
    return invocation;
  }

  const int count = static_cast<int>(invocation.args.size());
  if (count < command->min_args) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", command->path, "' needs ", command->args, UsageHint(command)));
  }
  if (count > command->max_args) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '",
                                                   invocation.args[command->max_args], "' for '",
                                                   command->path, "'", UsageHint(command)));
  }
  return invocation;
}

absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag,
                                                 const std::string& value) {
  double seconds = 0;
  absl::Duration duration;
  if (absl::SimpleAtod(value, &seconds) && std::isfinite(seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(value, &duration)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", value, "' is not a number of seconds (or a duration like 2m)"));
  }
  if (duration <= absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be a positive, finite time, got '", value, "'"));
  }
  return duration;
}

std::vector<std::pair<std::string, bool>> GlobalFlags() {
  return {{"addr", true},    {"context", true},         {"output", true}, {"no-headers", false},
          {"timeout", true}, {"token-file", true},      {"tls-ca", true}, {"tls-cert", true},
          {"tls-key", true}, {"tls-server-name", true}, {"help", false}};
}

std::vector<std::string> OutputFormatNames() { return {"table", "wide", "json", "yaml", "name"}; }

}  // namespace trainerd::client
