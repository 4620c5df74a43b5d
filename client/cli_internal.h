// What the files behind client/cli.h share (internal to client/): the command table
// (command_table.cc) takes submit's and sweep's flags from submit_flags.cc, and the parser
// (cli.cc) takes a group's usage from usage_text.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/cli.h"

namespace trainerd::client {

// The flags of `submit`: the JobSpec's fields. `sweep` takes them too (SweepFlags).
std::vector<FlagSpec> SubmitFlags();

// The flags of `sweep`: submit's, taken from SubmitFlags so that a flag added to submit reaches
// sweeps too, except that the four swept values take lists (client/requests.h,
// SweepRequestFromFlags) and --torchscript is left out: the members of a sweep share a text
// model, which is what lets the daemon pack them into one.
std::vector<FlagSpec> SweepFlags();

// `trainctl GROUP --help` (and `trainctl help GROUP`): the commands of a group of two-word
// commands (dataset, job, config), each with its summary.
std::string GroupUsage(absl::string_view group);

}  // namespace trainerd::client
