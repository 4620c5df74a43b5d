// trainctl's command line: the table of commands and their flags, the parser that turns argv into
// an Invocation, and the usage texts generated from the same table. No gRPC, no I/O.
//
// Where they are: the table in command_table.cc (submit's and sweep's flags in submit_flags.cc),
// the parser in cli.cc, the usage texts in usage_text.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainerd::client {

// Process exit codes, listed by `trainctl help exit-codes` (ExitCodesHelp) and docs/CLI.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;       // trainerd refused, or could not be reached
inline constexpr int kExitUsage = 2;         // bad command line or local input; nothing was sent
inline constexpr int kExitJobFailed = 3;     // the watched or awaited job FAILED
inline constexpr int kExitJobCancelled = 4;  // the watched or awaited job was CANCELLED

inline constexpr absl::string_view kDefaultAddress = "127.0.0.1:50051";
inline constexpr absl::Duration kDefaultTimeout = absl::Seconds(30);

// -o/--output: table (the default), wide (tables with more columns), json, yaml, or name (the
// names or ids of what the command shows, one per line), as kubectl's.
enum class OutputFormat { kTable, kWide, kJson, kYaml, kName };

// Flags that every command accepts, before or after the command words.
struct GlobalOptions {
  // gRPC target of trainerd, e.g. "127.0.0.1:50051" or "unix:/run/trainerd.sock". Never empty.
  std::string address = std::string(kDefaultAddress);
  OutputFormat output = OutputFormat::kTable;
  // --no-headers: tables without their header line.
  bool no_headers = false;
  // Deadline of each unary call; always > 0.
  absl::Duration timeout = kDefaultTimeout;
  // --timeout was given: commands whose calls are slow by nature (diagnose) use their own longer
  // default only when the user did not pick one.
  bool timeout_given = false;
  // Security (docs/SECURITY.md): a file holding the bearer token (else $TRAINERD_TOKEN); TLS
  // files (PEM): the CA that signed trainerd's certificate, and a client certificate and key for
  // mutual TLS; the name to check trainerd's certificate against. Any TLS flag turns TLS on.
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  // --context NAME: a context of trainctl's config file (client/contexts.h); "" for none.
  std::string context;
  bool address_given = false;     // --addr was on the command line
  bool address_from_env = false;  // the address came from $TRAINERD_ADDR
};

struct FlagSpec {
  absl::string_view name;        // without the leading dashes, e.g. "batch-size"
  absl::string_view value_name;  // e.g. "N"; empty for a boolean flag that takes no value
  absl::string_view help;
  absl::string_view short_name = "";  // e.g. "f" for -f; empty for none
};

struct CommandSpec {
  absl::string_view path;   // the command words, e.g. "dataset upload"
  absl::string_view alias;  // another last word, e.g. "ls" for "dataset list"; may be empty
  absl::string_view args;   // positional arguments for the usage line, e.g. "NAME FILE"
  int min_args = 0;
  int max_args = 0;
  absl::string_view summary;      // one line for the command list
  absl::string_view description;  // paragraph(s) for `trainctl COMMAND --help`
  std::vector<FlagSpec> flags;
  // Left out of the usage texts (the completion scripts' helper).
  bool hidden = false;
};

// Every command, in the order the usage lists them.
const std::vector<CommandSpec>& Commands();

// A parsed command line. Not thread-safe (a plain value).
struct Invocation {
  GlobalOptions global;
  // The command; null only when show_help is set and no command was named.
  const CommandSpec* command = nullptr;
  // With show_help: the text to print on stdout (top-level, group or command usage).
  bool show_help = false;
  std::string help_text;
  std::vector<std::string> args;             // positional arguments
  std::map<std::string, std::string> flags;  // command flags by name; "" for boolean flags

  bool Has(absl::string_view flag) const;
  // The flag's value, or `fallback` when it was not given.
  std::string Get(absl::string_view flag, absl::string_view fallback = "") const;
  // Typed values; INVALID_ARGUMENT sentences that name the flag and the bad value.
  absl::StatusOr<int64_t> GetInt(absl::string_view flag, int64_t fallback, int64_t min,
                                 int64_t max) const;
  absl::StatusOr<uint64_t> GetUint(absl::string_view flag, uint64_t fallback) const;
  absl::StatusOr<double> GetDouble(absl::string_view flag, double fallback) const;
};

// Parses argv (argv[0] is the program name). `env_address` is $TRAINERD_ADDR, nullopt when unset.
// Errors are INVALID_ARGUMENT sentences meant for "trainctl: <message>" and exit code 2.
absl::StatusOr<Invocation> ParseCommandLine(const std::vector<std::string>& argv,
                                            std::optional<std::string> env_address);

// Usage texts (ending in a newline).
// A time flag's value: a number of seconds ("90", "0.5") or an Abseil duration ("2m", "1h30m"),
// positive and finite. INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag, const std::string& value);

std::string TopLevelUsage();
std::string CommandUsage(const CommandSpec& command);
// `trainctl help exit-codes`.
std::string ExitCodesHelp();
// The global flags, without dashes, and whether each takes a value (for completion scripts).
std::vector<std::pair<std::string, bool>> GlobalFlags();
// The words -o takes, in the order the usage gives them.
std::vector<std::string> OutputFormatNames();

}  // namespace trainerd::client
