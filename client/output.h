// How trainctl shows trainerd's messages: aligned tables, key-value views, watch lines, and JSON.
// Pure functions of the messages (no gRPC, no I/O), so that their text can be tested as is.
//
// Where they are: output.cc holds the writers (TextTable, KeyValueLines, JSON and YAML) and the
// formatting of single values (bytes, times, losses, SI quantities, enum names); the views of
// particular messages are in dataset_views.cc, job_views.cc (with the lines of `job watch`),
// sweep_views.cc and device_views.cc (devices, diagnose, top, and the report of `job get`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "trainerd/v1/datasets.pb.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::client {

// Columns of text, left-aligned and separated by two spaces. A plain value; not thread-safe.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> headers);

  // A row with fewer cells than headers is padded with empty cells.
  void AddRow(std::vector<std::string> cells);
  // Header line (unless `headers` is false) and rows, each ending in "\n"; no trailing spaces.
  // The columns are as wide as the widest cell, headers included either way.
  std::string Render(bool headers = true) const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] holds the headers
};

// How a list is shown as a table: -o wide adds columns, --no-headers drops the header line.
struct TableOptions {
  bool wide = false;
  bool headers = true;
};

// Columns a UTF-8 string takes on a terminal: its code points (no wide characters are used).
size_t DisplayWidth(absl::string_view text);

// "key:  value" lines with the values aligned, each ending in "\n".
std::string KeyValueLines(const std::vector<std::pair<std::string, std::string>>& lines);

// The message as proto3 JSON with the .proto field names and every field, set or not. `pretty`
// adds indentation (for single messages); without it the object is one line (for JSON Lines).
// Ends without a newline.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty);

// JSON text (an object, array or value) as a YAML document, block style, keys in the JSON's
// order, ending in a newline. Strings that YAML would read as something else ("true", "1e3",
// "null", "", "- x", "13.0", and int64 fields, which proto3 JSON writes as strings) are quoted, so
// the document reads back as the same JSON. INVALID_ARGUMENT for text that is not JSON.
absl::StatusOr<std::string> JsonToYaml(absl::string_view json);
// The message as YAML (its ToJson form), as kubectl -o yaml prints objects.
absl::StatusOr<std::string> ToYaml(const google::protobuf::Message& message);

// "512 B", "2.9 KiB", "27.0 MiB".
std::string FormatBytes(int64_t bytes);
// Local time "2024-05-01 12:34:56"; "-" for an unset timestamp.
std::string FormatTimestamp(const google::protobuf::Timestamp& timestamp);
// Six decimals, "0.012345", "1234.567890"; with an exponent below 1e-3 or from 1e6 on,
// "1.500000e-09".
std::string FormatLoss(double loss);

// "QUEUED", "RUNNING", ...; "mse", "cross_entropy"; "sgd", "adam"; "float32", "int64".
std::string JobStateName(v1::JobState state);
std::string LossName(v1::Loss loss);
std::string OptimizerName(v1::OptimizerKind kind);
std::string DTypeName(v1::DType dtype);
bool IsTerminal(v1::JobState state);

// `dataset list` / `dataset get` and the result of `dataset upload`.
// Wide: OWNER and SHA256 too.
std::string DatasetListTable(const v1::ListDatasetsResponse& response, TableOptions options = {});
std::string DatasetDetails(const v1::Dataset& dataset);
// An upload's result in one line (what `dataset upload` prints without -o wide): "uploaded
// dataset 'digits': 1797 rows, features (64), targets int64 classes 0..9, 456.2 KiB on cpu".
std::string DatasetUploadedLine(const v1::Dataset& dataset);

// `job list` / `job get`. Details show at most kShownParameterValues values per parameter.
inline constexpr int kShownParameterValues = 10;
// Wide: the whole model, LOSS FN, OPTIMIZER, LR, ENGINE (the path that ran), SWEEP and OWNER too.
std::string JobListTable(const v1::ListJobsResponse& response, TableOptions options = {});
std::string JobDetails(const v1::Job& job);

// A quantity with a decimal prefix and three significant digits: "512 FLOP", "1.23 GFLOP/s",
// "45.6 TFLOP/s" (prefixes k, M, G, T, P); "-" for a non-finite value.
std::string FormatSi(double value, absl::string_view unit);

// "launch-bound", "compute-bound", ...; "-" for BOUND_UNSPECIFIED.
std::string BoundName(v1::DeviceReport::Bound bound);

// The "report:" section of `job get` (indented key-value lines: time split, utilization, memory,
// speed, FLOPs) followed by the "verdict:" line. "" for a report with nothing set.
std::string DeviceReportSection(const v1::DeviceReport& report);

// `trainctl devices`: one row per device, the default one marked with "*".
// Wide: the reason a GPU is unusable too.
std::string DeviceListTable(const v1::ListDevicesResponse& response, TableOptions options = {});

// `text` as a JSON string literal, quotes included (for the few outputs that are not protos).
std::string JsonString(absl::string_view text);

// `trainctl diagnose`: versions and measure time, then one row per device.
std::string DiagnoseTable(const v1::DiagnoseResponse& response);
// A process's sandbox in one line ("Landlock ABI 7, seccomp, ..."), and the section of `diagnose`
// that says, per program, whether the daemon runs submitted code in it and why not.
std::string DescribeSandbox(const v1::WorkerSandbox& sandbox);
std::string SandboxSection(const google::protobuf::RepeatedPtrField<v1::WorkerSandbox>& sandboxes);

// The RUNNING jobs of `response`, in its order.
v1::ListJobsResponse RunningJobs(const v1::ListJobsResponse& response);

// One screen of `trainctl top`: the devices table, then the running jobs with their epoch
// progress ("no running jobs" when there are none).
std::string TopScreen(const v1::ListDevicesResponse& devices, const v1::ListJobsResponse& jobs);

// `sweep`: the sweep's id on a line of its own (first, as submit prints a job's, so that scripts
// can take it with head -1), then the members in product order: ID, LR, MOMENTUM, WEIGHT DECAY,
// SEED, STATE. A value the member's optimizer does not use (momentum for adam) or that is unset
// (weight decay, seed) shows as "-".
std::string SweepSubmitTable(const v1::SubmitSweepResponse& response, TableOptions options = {});

// `sweep --watch`: the members sorted by loss, lowest first: by the last epoch's validation loss
// when the members validate (what tells them apart on rows they never trained on), else by the
// final training loss; members without that loss yet, or with a NaN one, after them, and members
// without a finished epoch last (ties keep product order). Columns ID, LR, MOMENTUM, WD, SEED,
// STATE, EPOCH ("3/20"), LOSS (final training loss), VAL LOSS and VAL ACC (the last epoch's, "-"
// without them). With `max_members` > 0 and more members than that, only the first max_members
// rows are shown and a last line says how many more there are (so that a redrawn table fits the
// terminal).
std::string SweepWatchTable(const google::protobuf::RepeatedPtrField<v1::Job>& members,
                            int max_members = 0);
// The line under the watched table, naming the best succeeded member and by what: "4 succeeded, 1
// failed, 1 cancelled; best job-0123456789ab by validation loss 0.081234, validation accuracy
// 97.2% (training loss 0.012345)", or "... best job-0123456789ab by training loss 0.012345 (the
// members do not validate)"; "no member succeeded" when none did. No trailing newline.
std::string SweepSummaryLine(const google::protobuf::RepeatedPtrField<v1::Job>& members);

// `job watch`: "epoch 12/100  loss 0.012345" (without "/N" when planned_epochs <= 0), followed by
// "  val_loss 0.023456  val_acc 97.25%" when the epoch carries them, and the closing line, e.g.
// "job job-0123456789ab SUCCEEDED in 1.23 s, final loss 0.009812" (plus " (stopped early after
// 7/20 epochs)") or "job job-0123456789ab FAILED: loss became NaN at epoch 3". No trailing newline.
std::string EpochLine(const v1::EpochResult& epoch, int32_t planned_epochs);
std::string JobOutcomeLine(const v1::Job& job);

}  // namespace trainerd::client
