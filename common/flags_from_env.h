// Settings from the environment, as containers pass them: TRAINERD_<FLAG> sets --<flag>
// (TRAINERD_DATA_DIR=/data is --data_dir=/data). A flag given on the command line wins, because
// the environment is applied first and the command line parsed after it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace trainerd {

// Applies every `prefix`NAME=VALUE of `environment` (entries "KEY=VALUE", as environ holds them)
// whose lower-cased NAME is a flag of this program, parsing VALUE as that flag's type.
// INVALID_ARGUMENT naming the variable when a value does not parse. Variables with the prefix that
// name no flag are returned in `unknown` (the caller warns: a misspelt setting should not pass
// silently), except those in `not_flags` (the variables that other programs of the project read,
// such as TRAINERD_TOKEN). Absl's own flags (flagfile, help, ...) are never set this way.
absl::Status ApplyFlagsFromEnvironment(const std::string& prefix,
                                       const std::vector<std::string>& environment,
                                       const std::vector<std::string>& not_flags,
                                       std::vector<std::string>* unknown);

// The process's environment as "KEY=VALUE" entries.
std::vector<std::string> ProcessEnvironment();

}  // namespace trainerd
