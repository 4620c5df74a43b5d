// trainctl's views of the devices (client/output.h): the device report of `job get`, the tables
// of `devices` and `diagnose`, and the screen of `top` (the devices and the running jobs).
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/output.h"
#include "client/progress_bar.h"
#include "client/view_cells.h"
#include "trainerd/v1/jobs.pb.h"
#include "trainerd/v1/system.pb.h"

namespace trainerd::client {
namespace {

// A fraction (0..1) as a percentage: "34.5%" (report) or "35%" (tables).
std::string Percent(double fraction, int decimals) {
  return absl::StrFormat("%.*f%%", decimals, 100.0 * fraction);
}

// Microseconds for the diagnose table: "4.2 µs", "-" for 0 (nothing measured, or the CPU's sync,
// which has no queue to wait for).
std::string Microseconds(double seconds) {
  if (seconds <= 0 || !std::isfinite(seconds)) return "-";
  return absl::StrFormat("%.1f µs", seconds * 1e6);
}

// Cuts `text` to `width` columns, ending in "..." when cut. Names only (ASCII in practice).
std::string Truncate(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return absl::StrCat(text.substr(0, width - 3), "...");
}

// Model names of CPUs run long ("AMD EPYC 7763 64-Core Processor"); the tables cut them so that a
// row stays within about 100 columns. -o json has them whole.
constexpr size_t kMaxDeviceNameColumn = 24;
constexpr size_t kMaxDiagnoseNameColumn = 22;  // its other columns are wider
// Dataset names are listed in `devices` only while they fit this many columns.
constexpr size_t kMaxDatasetNames = 24;
// Cells inside the epoch bar of `top`.
constexpr int kTopBarWidth = 20;

// The RUNNING cell: the device's jobs, then the ranks it runs for peers' jobs ("job-…/rank-1 for
// 10.0.0.5", or "a rank for a peer" for a caller who is not an admin).
std::string RunningColumn(const v1::DeviceStatus& device) {
  std::vector<std::string> cells(device.running_jobs().begin(), device.running_jobs().end());
  cells.insert(cells.end(), device.peer_ranks().begin(), device.peer_ranks().end());
  return cells.empty() ? "-" : absl::StrJoin(cells, ",");
}

}  // namespace

std::string DescribeSandbox(const v1::WorkerSandbox& s) {
  std::vector<std::string> parts;
  parts.push_back(s.landlock() ? absl::StrCat("Landlock ABI ", s.landlock_abi())
                               : absl::StrCat("no Landlock (", OrDash(s.landlock_error()), ")"));
  parts.push_back(s.seccomp() ? "seccomp"
                              : absl::StrCat("no seccomp (", OrDash(s.seccomp_error()), ")"));
  parts.push_back(s.no_new_privileges() ? "no new privileges" : "new privileges possible");
  parts.push_back(s.not_dumpable() ? "not dumpable" : "dumpable");
  parts.push_back(s.network_namespace()
                      ? "network namespace"
                      : absl::StrCat("no network namespace (", OrDash(s.network_error()), ")"));
  parts.push_back(s.uid() < 0
                      ? "mixed user ids"
                      : absl::StrCat("user ", s.uid(),
                                     s.other_user() ? " (not the daemon's)" : " (the daemon's)"));
  return absl::StrJoin(parts, ", ");
}

std::string SandboxSection(const google::protobuf::RepeatedPtrField<v1::WorkerSandbox>& sandboxes) {
  if (sandboxes.empty()) return "";
  std::string text = "sandbox of submitted code:\n";
  for (const v1::WorkerSandbox& s : sandboxes) {
    std::string verdict = "complete";
    if (!s.missing().empty()) {
      verdict = absl::StrCat("REFUSED, lacks ", absl::StrJoin(s.missing(), ", "));
    } else if (!s.accepted_missing().empty()) {
      verdict = absl::StrCat("lacks ", absl::StrJoin(s.accepted_missing(), ", "),
                             " (accepted by --worker_sandbox_may_lack)");
    }
    absl::StrAppend(&text, "  ", s.program(), ": ", verdict, "\n    ", DescribeSandbox(s), "\n");
    if (!s.refusal().empty()) absl::StrAppend(&text, "    ", s.refusal(), "\n");
  }
  return text;
}

std::string DeviceReportSection(const v1::DeviceReport& report) {
  // A report the daemon never filled in (a job still queued) would be all zeros: say nothing.
  if (report.ByteSizeLong() == 0) return "";
  const double times[] = {report.queue_seconds(), report.data_seconds(), report.compute_seconds(),
                          report.host_transfer_seconds()};
  const char* const names[] = {"queue", "data", "compute", "host transfer"};
  double total = 0;
  for (const double seconds : times) total += seconds;
  std::vector<std::pair<std::string, std::string>> lines;
  for (int i = 0; i < 4; ++i) {
    std::string value = absl::StrFormat("%.2f s", times[i]);
    if (total > 0) absl::StrAppend(&value, " (", Percent(times[i] / total, 1), ")");
    lines.push_back({names[i], value});
  }
  if (report.has_utilization_average() || report.has_utilization_peak()) {
    std::vector<std::string> parts;
    if (report.has_utilization_average()) {
      parts.push_back(absl::StrCat("average ", Percent(report.utilization_average(), 1)));
    }
    if (report.has_utilization_peak()) {
      parts.push_back(absl::StrCat("peak ", Percent(report.utilization_peak(), 1)));
    }
    lines.push_back({"utilization", absl::StrJoin(parts, ", ")});
  }
  lines.push_back({"peak memory",
                   report.peak_memory_bytes() > 0 ? FormatBytes(report.peak_memory_bytes()) : "-"});
  lines.push_back({"steps/s", absl::StrFormat("%.1f", report.steps_per_second())});
  if (!report.engine().empty()) {
    lines.push_back({"engine", report.engine_reason().empty()
                                   ? report.engine()
                                   : absl::StrCat(report.engine(),
                                                  " (not fused: ", report.engine_reason(), ")")});
  }
  if (report.intra_op_threads() > 0) {
    lines.push_back({"threads", absl::StrCat(report.intra_op_threads(), " intra-op")});
  }
  // A TorchScript job trains in a sandboxed worker process: what starting it cost, and what its
  // sandbox held.
  if (report.worker_start_seconds() > 0) {
    lines.push_back({"worker start", absl::StrFormat("%.3f s (a sandboxed process of its own)",
                                                     report.worker_start_seconds())});
  }
  if (report.has_worker_sandbox()) {
    lines.push_back({"sandbox", DescribeSandbox(report.worker_sandbox())});
  }
  // A sweep member trained in a pack: the times and speeds above are the pack's; and whether its
  // values are the job alone's to the last bit (the daemon's sentence says why or why not).
  if (report.packed_members() > 0) {
    lines.push_back(
        {"packed", absl::StrCat(report.packed_members(), " sweep members trained as one pack")});
    if (!report.packed_numerics().empty()) {
      lines.push_back({"numerics", report.packed_numerics()});
    }
  }
  // A data-parallel job: rank 0's time in the all-reduces (part of compute).
  if (report.collective_seconds() > 0) {
    std::string collectives = absl::StrFormat("%.2f s", report.collective_seconds());
    if (report.has_collective_fraction()) {
      absl::StrAppend(&collectives, " (", Percent(report.collective_fraction(), 1),
                      " of compute, rank 0)");
    }
    lines.push_back({"collectives", collectives});
  }
  lines.push_back({"host syncs", absl::StrCat(report.host_syncs())});
  lines.push_back({"host→device", FormatBytes(report.host_to_device_bytes())});
  // FLOPs are unknown (0) for TorchScript modules; a dash says so rather than "0 FLOP".
  if (report.flops_per_step() > 0) {
    lines.push_back({"FLOPs/step", FormatSi(report.flops_per_step(), "FLOP")});
    std::string achieved = FormatSi(report.achieved_flops_per_second(), "FLOP/s");
    if (report.has_peak_fraction()) {
      absl::StrAppend(&achieved, " (", Percent(report.peak_fraction(), 1), " of measured peak)");
    }
    lines.push_back({"achieved", achieved});
  } else {
    lines.push_back({"FLOPs/step", "- (unknown for this model)"});
  }
  if (report.has_overhead_fraction()) {
    lines.push_back(
        {"overhead", absl::StrCat(Percent(report.overhead_fraction(), 1), " of step time")});
  }
  std::string text = "report:\n";
  for (absl::string_view line : absl::StrSplit(KeyValueLines(lines), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&text, "  ", line, "\n");
  }
  // The verdict carries its own bound ("launch-bound: ..."); the bound alone is the fallback.
  if (!report.verdict().empty()) {
    absl::StrAppend(&text, "verdict:  ", report.verdict(), "\n");
  } else if (report.bound() != v1::DeviceReport::BOUND_UNSPECIFIED) {
    absl::StrAppend(&text, "verdict:  ", BoundName(report.bound()), "\n");
  }
  return text;
}

std::string DeviceListTable(const v1::ListDevicesResponse& response, TableOptions options) {
  std::vector<std::string> headers = {"DEVICE",   "NAME",    "UTIL",  "MEMORY",
                                      "DATASETS", "RUNNING", "QUEUED"};
  if (options.wide) headers.push_back("UNUSABLE BECAUSE");
  TextTable table(std::move(headers));
  for (const v1::DeviceStatus& device : response.devices()) {
    std::string memory = "-";
    if (device.memory_total_bytes() > 0) {
      memory = absl::StrCat(FormatBytes(device.memory_used_bytes()), "/",
                            FormatBytes(device.memory_total_bytes()));
    } else if (device.memory_used_bytes() > 0) {
      memory = FormatBytes(device.memory_used_bytes());
    }
    std::string datasets = "-";
    if (device.datasets_size() > 0) {
      datasets = absl::StrCat(device.datasets_size(), ", ", FormatBytes(device.dataset_bytes()));
      const std::string names = absl::StrJoin(device.datasets(), ",");
      if (names.size() <= kMaxDatasetNames) absl::StrAppend(&datasets, " (", names, ")");
    }
    // A GPU NVML sees but the daemon cannot use is marked; `-o json` carries the reason.
    std::vector<std::string> row = {
        absl::StrCat(device.device(), device.is_default() ? "*" : "",
                     device.unusable_reason().empty() ? "" : " (unusable)"),
        OrDash(options.wide ? device.name() : Truncate(device.name(), kMaxDeviceNameColumn)),
        device.has_utilization() ? Percent(device.utilization(), 0) : "-",
        memory,
        datasets,
        RunningColumn(device),
        absl::StrCat(device.queued_jobs())};
    if (options.wide) row.push_back(OrDash(device.unusable_reason()));
    table.AddRow(std::move(row));
  }
  std::string text = table.Render(options.headers);
  // Only a refusal is worth a line under the table: the whole sandbox is `diagnose`'s.
  for (const v1::WorkerSandbox& s : response.worker_sandboxes()) {
    if (s.missing().empty()) continue;
    absl::StrAppend(&text, "TorchScript jobs are refused: ", s.program(), "'s sandbox lacks ",
                    absl::StrJoin(s.missing(), ", "), " (trainctl diagnose says why)\n");
  }
  return text;
}

std::string DiagnoseTable(const v1::DiagnoseResponse& response) {
  std::string measured = FormatTimestamp(response.measure_time());
  if (response.cached()) absl::StrAppend(&measured, " (cached; --refresh measures again)");
  std::vector<std::pair<std::string, std::string>> header = {
      {"libtorch",
       absl::StrCat(OrDash(response.libtorch_version()),
                    response.cuda_version().empty()
                        ? " (CPU-only build)"
                        : absl::StrCat(" (built with CUDA ", response.cuda_version(), ")"))},
  };
  if (!response.driver_version().empty()) {
    header.push_back({"driver", absl::StrCat("CUDA ", response.driver_version())});
  }
  header.push_back({"measured", measured});

  // A row per device rather than a block per device: rows let the devices be compared at a
  // glance. The units sit in the cells so that the headers stay short, and NAME is last (and cut)
  // because CPU model names are long; the figures keep their columns whatever the name.
  TextTable table({"DEVICE", "MEMORY", "MATMUL", "H2D", "LAUNCH", "SYNC", "UTIL", "SM", "NAME"});
  for (const v1::DeviceDiagnosis& device : response.devices()) {
    std::string matmul = "-";
    if (device.matmul_flops_per_second() > 0) {
      matmul = FormatSi(device.matmul_flops_per_second(), "FLOP/s");
      if (device.matmul_size() > 0) absl::StrAppend(&matmul, " n=", device.matmul_size());
    }
    table.AddRow(
        {device.device(),
         device.memory_total_bytes() > 0 ? FormatBytes(device.memory_total_bytes()) : "-", matmul,
         device.host_to_device_bytes_per_second() > 0
             ? absl::StrFormat("%.1f GB/s", device.host_to_device_bytes_per_second() / 1e9)
             : "-",
         Microseconds(device.launch_seconds()), Microseconds(device.sync_seconds()),
         device.has_utilization_during_matmul() ? Percent(device.utilization_during_matmul(), 0)
                                                : "-",
         device.has_sm_activity_during_matmul() ? Percent(device.sm_activity_during_matmul(), 0)
                                                : "-",
         OrDash(Truncate(device.name(), kMaxDiagnoseNameColumn))});
  }
  return absl::StrCat(
      KeyValueLines(header), "\n", table.Render(),
      "\nMATMUL: float32 n x n matrix product (2n^3 FLOPs); H2D: copies from pinned host memory\n"
      "(a memcpy on the cpu); LAUNCH: an empty kernel (the smallest op on the cpu); SYNC: one "
      "host\n"
      "synchronisation; UTIL, SM: utilization and SM activity during the matrix products.\n",
      response.worker_sandboxes().empty() ? "" : "\n", SandboxSection(response.worker_sandboxes()));
}

v1::ListJobsResponse RunningJobs(const v1::ListJobsResponse& response) {
  v1::ListJobsResponse running;
  for (const v1::Job& job : response.jobs()) {
    if (job.state() == v1::JOB_STATE_RUNNING) *running.add_jobs() = job;
  }
  return running;
}

std::string TopScreen(const v1::ListDevicesResponse& devices, const v1::ListJobsResponse& jobs) {
  std::string text = DeviceListTable(devices);
  const v1::ListJobsResponse running = RunningJobs(jobs);
  if (running.jobs_size() == 0) return absl::StrCat(text, "\nno running jobs\n");
  TextTable table({"JOB", "DEVICE", "EPOCH", "LOSS", "SAMPLES/S", "PROGRESS"});
  for (const v1::Job& job : running.jobs()) {
    const int32_t planned = job.spec().epochs();
    const double fraction =
        planned > 0 ? static_cast<double>(EpochsCompleted(job)) / static_cast<double>(planned)
                    : 0.0;
    table.AddRow({job.id(), JobDevice(job), EpochProgress(job),
                  // The full view's last epoch, else the summary's final loss.
                  job.epochs_size() > 0 ? FormatLoss(job.epochs(job.epochs_size() - 1).loss())
                                        : JobLoss(job),
                  absl::StrFormat("%.1f", job.samples_per_second()),
                  ProgressBar::Bar(fraction, kTopBarWidth)});
  }
  return absl::StrCat(text, "\n", table.Render());
}

}  // namespace trainerd::client
