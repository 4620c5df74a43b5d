// trainctl's usage texts (client/cli.h): the top-level usage, a group's and a command's (its
// flags from their specs), generated from the command table, and the list of exit codes.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/cli.h"
#include "client/cli_internal.h"

namespace trainerd::client {
namespace {

// Width of the name column in the usage texts.
constexpr int kUsageColumn = 28;

std::string PadRight(std::string text, size_t width) {
  if (text.size() < width)
    text.append(width - text.size(), ' ');
  else
    text.append(2, ' ');
  return text;
}

std::string CommandLine(const CommandSpec& command) {
  std::string line(command.path);
  if (!command.args.empty()) absl::StrAppend(&line, " ", command.args);
  return line;
}

}  // namespace

std::string GroupUsage(absl::string_view group) {
  std::string text =
      absl::StrCat("Usage: trainctl ", group, " SUBCOMMAND [ARGS...] [FLAGS]\n\n", "Commands:\n");
  for (const CommandSpec& command : Commands()) {
    if (command.hidden || !absl::StartsWith(command.path, absl::StrCat(group, " "))) continue;
    absl::StrAppend(&text, "  ", PadRight(CommandLine(command), kUsageColumn), command.summary,
                    "\n");
  }
  absl::StrAppend(&text, "\nRun 'trainctl ", group,
                  " SUBCOMMAND --help' for a command's flags,\n'trainctl --help' for the global "
                  "flags.\n");
  return text;
}

std::string TopLevelUsage() {
  std::string text =
      "Usage: trainctl [--addr HOST:PORT|unix:PATH | --context NAME]\n"
      "                [-o table|wide|json|yaml|name] [--no-headers]\n"
      "                [--timeout SECONDS] [--token-file FILE] [--tls-ca FILE]\n"
      "                [--tls-cert FILE --tls-key FILE]\n"
      "                COMMAND [ARGS...]\n"
      "\n"
      "trainctl is the command-line client of trainerd, a daemon that trains models on datasets\n"
      "kept resident on the GPU.\n"
      "\n"
      "Commands:\n";
  for (const CommandSpec& command : Commands()) {
    if (command.hidden) continue;
    std::string line = CommandLine(command);
    if (command.path == "submit") line = "submit --dataset NAME --model SPEC";
    // The example shows the lists, which are what sets sweep apart from submit.
    if (command.path == "sweep") {
      line = "sweep --dataset NAME --model SPEC --lr 0.1,0.01 --seed 1,2";
    }
    if (line.size() >= kUsageColumn) {
      absl::StrAppend(&text, "  ", line, "\n  ", std::string(kUsageColumn, ' '), command.summary,
                      "\n");
    } else {
      absl::StrAppend(&text, "  ", PadRight(line, kUsageColumn), command.summary, "\n");
    }
  }
  absl::StrAppend(
      &text,
      "\n"
      "Global flags (before or after the command):\n"
      "  --addr HOST:PORT            trainerd's address (default: the context's, else\n"
      "                              $TRAINERD_ADDR, else the current context's, else ",
      kDefaultAddress,
      ")\n"
      "  --context NAME              a context of the config file ($TRAINCTL_CONFIG, else\n"
      "                              ~/.config/trainctl/config.yaml): its address and\n"
      "                              credentials, where no flag gives them (trainctl config)\n"
      "  -o, --output FORMAT         table (default), wide (more columns), json, yaml, or\n"
      "                              name (one name or id per line, for scripts)\n"
      "  --no-headers                tables without their header line\n"
      "  --timeout SECONDS           deadline of each request (default 30; diagnose 120,\n"
      "                              uploads at least 10 minutes, watching none)\n"
      "  --token-file FILE           send the bearer token in FILE with every call (default:\n"
      "                              $TRAINERD_TOKEN, the token itself, when set)\n"
      "  --tls-ca FILE               use TLS; trust trainerd's certificate if FILE (PEM)\n"
      "                              signed it (without it: TLS with the system's CAs when\n"
      "                              another --tls flag is given)\n"
      "  --tls-cert FILE, --tls-key FILE\n"
      "                              client certificate and key (PEM) for mutual TLS\n"
      "  --tls-server-name NAME      the name to check trainerd's certificate against\n"
      "  -h, --help                  show help\n"
      "\n"
      "Exit status: 0 success, 1 trainerd refused or could not be reached, 2 bad usage or\n"
      "local input, 3 the watched or awaited job failed, 4 it was cancelled ('trainctl help\n"
      "exit-codes').\n"
      "\n"
      "Run 'trainctl COMMAND --help' for a command's flags.\n");
  return text;
}

std::string CommandUsage(const CommandSpec& command) {
  std::string text = absl::StrCat("Usage: trainctl ", CommandLine(command));
  if (!command.flags.empty()) absl::StrAppend(&text, " [FLAGS]");
  absl::StrAppend(&text, "\n\n", command.description);
  if (!command.alias.empty()) {
    absl::string_view prefix = command.path.substr(0, command.path.rfind(' ') + 1);
    absl::StrAppend(&text, "\nAlias: trainctl ", prefix, command.alias, "\n");
  }
  if (!command.flags.empty()) {
    absl::StrAppend(&text, "\nFlags:\n");
    for (const FlagSpec& flag : command.flags) {
      std::string left = flag.short_name.empty()
                             ? absl::StrCat("--", flag.name)
                             : absl::StrCat("-", flag.short_name, ", --", flag.name);
      if (!flag.value_name.empty()) absl::StrAppend(&left, " ", flag.value_name);
      std::vector<absl::string_view> lines = absl::StrSplit(flag.help, '\n');
      // A flag too long for the column has its help start on the next line.
      if (left.size() >= kUsageColumn) {
        absl::StrAppend(&text, "  ", left, "\n");
        left.clear();
      }
      for (size_t i = 0; i < lines.size(); ++i) {
        absl::StrAppend(&text, "  ", PadRight(i == 0 ? left : "", kUsageColumn), lines[i], "\n");
      }
    }
  }
  absl::StrAppend(&text,
                  "\nGlobal flags: --addr HOST:PORT, --context NAME, -o "
                  "table|wide|json|yaml|name, --no-headers,\n--timeout SECONDS, --token-file "
                  "FILE, --tls-ca FILE, --tls-cert FILE, --tls-key FILE,\n--tls-server-name NAME "
                  "(see 'trainctl --help').\n");
  return text;
}

std::string ExitCodesHelp() {
  return "trainctl's exit codes:\n"
         "  0  success\n"
         "  1  trainerd refused the request or could not be reached (or a wait timed out)\n"
         "  2  bad command line or local input (a file that cannot be read, a bad value);\n"
         "     nothing was sent\n"
         "  3  the watched or awaited job FAILED (job watch, job wait, submit --watch, sweep\n"
         "     --watch: any member)\n"
         "  4  the watched or awaited job was CANCELLED (sweep --watch: a member, none failed)\n"
         "\n"
         "  trainctl submit --dataset iris --model linear:3 --loss cross_entropy --watch\n"
         "  case $? in 0) echo trained;; 3) echo failed;; 4) echo cancelled;; *) echo error;; "
         "esac\n";
}

}  // namespace trainerd::client
