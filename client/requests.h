// Turns a parsed trainctl command line into what is sent to trainerd for a job: the JobSpec of
// `submit`, the request of `sweep` (client/upload_input.h has `dataset upload`'s). Everything here is checked locally,
// before a connection is made; errors are INVALID_ARGUMENT (or the readers' codes) with a sentence
// meant for "trainctl: <message>" and exit code 2.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli.h"
#include "common/job_limits.h"
#include "trainerd/v1/jobs.pb.h"

namespace trainerd::client {

// The spec of `submit` (and of `sweep`, whose messages name it): --dataset and --model are
// required, the model spec is parsed (and sent in canonical form), and numbers are range-checked.
// Defaults: mse, sgd, lr 0.01, batch size 32, 10 epochs, momentum 0, shuffle on, seed and device
// left to the daemon. With --torchscript FILE instead of --model (not both), the spec's model is
// "torchscript". For `sweep`, --nodes without --replicas spreads the members over the nodes (a
// job's --nodes place its ranks, and need --replicas).
absl::StatusOr<v1::JobSpec> JobSpecFromFlags(const Invocation& invocation);

// A sweep's limits, the daemon's too (SubmitSweep): values in each list, and members in all (the
// product of the lists' sizes).
inline constexpr int kMaxSweepValues = 256;
inline constexpr int kMaxSweepMembers = 256;

// The values of a swept flag (--lr, --momentum, --weight-decay; `flag` without dashes names it
// in messages): a comma-separated list such as "0.1,0.03,0.01", or one value. INVALID_ARGUMENT
// for an empty element ("0.1,,0.2", a trailing comma), an element that is not a finite number,
// or more than kMaxSweepValues elements. Ranges are left to SweepRequestFromFlags.
absl::StatusOr<std::vector<double>> ParseSweepValues(absl::string_view flag,
                                                     absl::string_view text);
// --seed's list for a sweep: the same rules, each element a whole number in [0, 2^64).
absl::StatusOr<std::vector<uint64_t>> ParseSweepSeeds(absl::string_view text);

// The request of `sweep`: submit's flags make the spec (JobSpecFromFlags, with every list at its
// first value, so the spec alone is the first member), and each of --lr, --momentum,
// --weight-decay and --seed that is given fills its repeated field with every value in order.
// Each value is checked as submit checks its flag (its range, and what depends on it, such as
// --nesterov on the momentum or --min-lr below each rate); the product of the lists may not
// exceed kMaxSweepMembers. --torchscript is refused: a sweep trains a text model.
absl::StatusOr<v1::SubmitSweepRequest> SweepRequestFromFlags(const Invocation& invocation);

// `sweep --points FILE` (FILE "-": standard input): the members one by one
// (SubmitSweepRequest.points). The file is CSV: a header naming some of the columns lr
// (learning_rate), momentum, weight-decay (weight_decay) and seed, in any order, then a line per
// member; an empty cell keeps the spec's value; blank lines and lines starting with '#' are
// skipped. At most kMaxSweepMembers members and kMaxSweepPointsFileBytes bytes.
inline constexpr int64_t kMaxSweepPointsFileBytes = int64_t{1} << 20;
struct SweepPointRow {
  int line = 0;  // 1-based, for messages
  v1::SweepPoint point;
  std::map<std::string, std::string> flags;  // the values as written, by flag (lr, seed, ...)
};
// The members of a points file's text. INVALID_ARGUMENT naming the line: an unknown or repeated
// column, a line with another number of values, a value that is not a number (a seed: a whole
// number), more than kMaxSweepMembers members, no header or no members.
absl::StatusOr<std::vector<SweepPointRow>> ParseSweepPoints(absl::string_view text);
// The request of `sweep --points`: submit's flags make the spec (--lr, --momentum, --weight-decay
// and --seed take one value, the members' default), and each member's values are checked as
// submit checks its flags, the line named in the message.
absl::StatusOr<v1::SubmitSweepRequest> SweepPointsRequestFromFlags(const Invocation& invocation);
// The request of `sweep --search FILE --trials N [--search-seed S]`: a random search the daemon
// draws (SubmitSweepRequest.search). Each line of FILE is FLAG KIND VALUES: one of submit's flags
// that take a value (lr, batch-size, model, optimizer, ...), then uniform LOW HIGH, log-uniform
// LOW HIGH, integer LOW HIGH, log-integer LOW HIGH or choice VALUE...; the field it sets is found
// by building the spec with the flag at each value (so each value meets submit's checks).
absl::StatusOr<v1::SubmitSweepRequest> SweepSearchRequestFromFlags(const Invocation& invocation);

// "queued", "running", "succeeded", "failed" or "cancelled" (any case) as the API's JobState;
// INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<v1::JobState> ParseJobState(absl::string_view text);

// The bytes of --torchscript FILE for SubmitJobRequest.torchscript_module; "" without the flag.
// The file's reader errors, or INVALID_ARGUMENT when it is empty or over kMaxTorchScriptBytes
// (common/job_limits.h, the daemon's own limit).
absl::StatusOr<std::string> ReadTorchScriptFlag(const Invocation& invocation);

// Whether a --torchscript file is an exported program (the zip torch.export.save writes, which
// holds <name>/models/model.json) rather than a TorchScript archive: it then travels as
// SubmitJobRequest.exported_program. The daemon checks either kind itself.
bool IsExportedProgramFile(absl::string_view bytes);

}  // namespace trainerd::client
