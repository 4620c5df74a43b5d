// RunTrainingInWorker: a TorchScript job in a worker process (worker_launcher.h); the pool that
// starts the processes is worker_pool.cc.
#include "server/engine/torchscript/worker_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checked_size.h"
#include "common/file_io.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "server/engine/datasets/shared_memory.h"
#include "server/engine/devices/cpu_threads.h"
#include "server/engine/devices/device.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/module_check.h"
#include "server/engine/torchscript/reaper.h"
#include "server/engine/torchscript/worker_protocol.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/exported_program.h"
#include "server/engine/training/torchscript_export.h"

namespace trainerd::engine {
namespace {

// What is logged of a worker's output: lines of at most this many characters, this many lines a
// job (the rest counted), each prefixed with the job and with control characters escaped, so that
// a module cannot write lines that pass for the daemon's own.
constexpr size_t kMaxLogLineChars = 300;
constexpr int kMaxLogLines = 50;
constexpr size_t kKeptErrorChars = 4096;

std::string Escaped(std::string_view line) {
  std::string out;
  for (char c : line.substr(0, kMaxLogLineChars)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  if (line.size() > kMaxLogLineChars) out += "...";
  return out;
}

// The worker's standard output and error, logged line by line under the job's name.
class WorkerOutput {
 public:
  explicit WorkerOutput(std::string job_id) : job_id_(std::move(job_id)) {}
  void Add(std::string_view bytes) {
    pending_.append(bytes.data(), bytes.size());
    size_t end;
    while ((end = pending_.find('\n')) != std::string::npos) {
      Line(pending_.substr(0, end));
      pending_.erase(0, end + 1);
    }
    if (pending_.size() > kMaxLogLineChars * 4) {
      Line(pending_);
      pending_.clear();
    }
  }
  void Flush() {
    if (!pending_.empty()) Line(pending_);
    pending_.clear();
    if (dropped_ > 0) {
      LogWarning(
          absl::StrCat("job '", job_id_, "' worker: ", dropped_, " more line(s) not logged"));
    }
  }
  // The last line, for a death's reason.
  const std::string& last() const { return last_; }

 private:
  void Line(const std::string& line) {
    if (line.empty()) return;
    last_ = Escaped(line);
    if (logged_ >= kMaxLogLines) {
      ++dropped_;
      return;
    }
    ++logged_;
    LogInfo(absl::StrCat("job '", job_id_, "' worker says: ", last_));
  }
  std::string job_id_;
  std::string pending_;
  std::string last_;
  int logged_ = 0;
  int64_t dropped_ = 0;
};

// A tensor's bytes as the worker maps them: the daemon's own shared memory when the tensor lies
// there (a CPU dataset), else a copy made into new shared memory (a dataset resident on a GPU:
// the worker copies it to its device; see docs/SECURITY.md).
struct SharedTensor {
  torch::Tensor keep_alive;  // the copy, when one was made
  int64_t region_bytes = 0;
  int64_t offset = 0;
  int fd = -1;  // read-only; the caller closes it
};

absl::StatusOr<SharedTensor> ShareTensor(const torch::Tensor& t, const std::string& name) {
  SharedTensor out;
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  std::optional<SharedRegion> region;
  if (t.device().is_cpu() && t.is_contiguous()) region = FindSharedRegion(t.data_ptr(), bytes);
  if (!region) {
    TRAINERD_ASSIGN_OR_RETURN(out.keep_alive, AllocateSharedHostBytes(bytes, name));
    try {
      const torch::Tensor host = t.contiguous().to(torch::kCPU);
      std::memcpy(out.keep_alive.data_ptr(), host.data_ptr(), static_cast<size_t>(bytes));
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot share dataset '", name, "': ", FirstLineOf(e)));
    }
    region = FindSharedRegion(out.keep_alive.data_ptr(), bytes);
    if (!region) return absl::InternalError("the shared copy of the dataset has no region");
  }
  out.region_bytes = region->size;
  out.offset = region->offset;
  out.fd = ReadOnlyDescriptor(*region);
  if (out.fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open the dataset's shared memory read-only: ", std::strerror(errno)));
  }
  return out;
}

struct SharedDataset {
  SharedTensor features;
  SharedTensor targets;
  WorkerDataset wire;
};

absl::StatusOr<SharedDataset> ShareDataset(const Dataset& dataset) {
  SharedDataset out;
  TRAINERD_ASSIGN_OR_RETURN(out.features, ShareTensor(dataset.features, dataset.meta.name));
  absl::StatusOr<SharedTensor> targets = ShareTensor(dataset.targets, dataset.meta.name);
  if (!targets.ok()) {
    ::close(out.features.fd);
    return targets.status();
  }
  out.targets = *std::move(targets);
  out.wire.meta = dataset.meta;
  out.wire.meta.feature_bytes = static_cast<int64_t>(dataset.features.nbytes());
  out.wire.meta.size_bytes =
      out.wire.meta.feature_bytes + static_cast<int64_t>(dataset.targets.nbytes());
  out.wire.features_region_bytes = out.features.region_bytes;
  out.wire.features_offset = out.features.offset;
  out.wire.targets_region_bytes = out.targets.region_bytes;
  out.wire.targets_offset = out.targets.offset;
  return out;
}

std::string SignalText(int signal) {
  const char* name = strsignal(signal);
  return absl::StrCat("signal ", signal, name != nullptr ? absl::StrCat(", ", name) : "");
}

}  // namespace

TrainingOutcome RunTrainingInWorker(const TrainingRun& run, const std::string& job_id,
                                    const TorchScriptJob& module, absl::Duration max_time,
                                    WorkerPool& pool, double* worker_start_seconds) {
  const WorkerOptions& options = pool.options();
  TrainingOutcome outcome;
  outcome.state = JobState::kFailed;
  outcome.engine = "libtorch-worker";
  const auto started = std::chrono::steady_clock::now();
  auto fail = [&](std::string why) {
    outcome.state = JobState::kFailed;
    outcome.error = std::move(why);
    return outcome;
  };
  if (options.program.empty()) {
    return fail(
        "this daemon has no worker program (trainerd-worker), so it cannot train "
        "TorchScript modules");
  }

  // --- The job, its datasets and the process ----------------------------------------------------
  WorkerJob job;
  job.job_id = job_id;
  job.spec = run.spec;
  job.spec.torchscript.clear();
  job.device = DeviceName(run.device);
  job.intra_op_threads = std::max(1, run.intra_op_threads);
  job.flush_denormal = run.flush_denormal;
  job.cpu_nice = run.cpu_nice;
  job.checkpoints = !run.checkpoint_dir.empty();
  job.module = module.archive;
  if (!run.resume_from.empty()) {
    absl::StatusOr<std::string> bytes = ReadFileToString(run.resume_from);
    if (!bytes.ok()) {
      return fail(absl::StrCat("cannot read checkpoint '", run.resume_from,
                               "' to resume from: ", bytes.status().message()));
    }
    job.resume_checkpoint = *std::move(bytes);
  }
  // The descriptors travel with the job: the dataset's features and targets, then the
  // validation dataset's.
  std::vector<std::unique_ptr<ScopedFd>> shared_fds;
  std::vector<SharedDataset> shared;  // keeps any copies alive until the worker mapped them
  int64_t mapped = 0;
  for (const Dataset* d : {run.dataset.get(), run.validation_dataset.get()}) {
    if (d == nullptr) continue;
    absl::StatusOr<SharedDataset> one = ShareDataset(*d);
    if (!one.ok()) return fail(std::string(one.status().message()));
    shared_fds.push_back(std::make_unique<ScopedFd>(one->features.fd));
    shared_fds.push_back(std::make_unique<ScopedFd>(one->targets.fd));
    mapped += one->features.region_bytes + one->targets.region_bytes;
    shared.push_back(*std::move(one));
  }
  job.dataset = shared[0].wire;
  if (shared.size() > 1) job.validation_dataset = shared[1].wire;
  if (!run.device.is_cuda() && options.memory_limit_bytes > 0) {
    job.memory_limit_bytes = options.memory_limit_bytes + mapped;
  } else if (run.device.is_cuda() && options.memory_limit_bytes > 0) {
    // CUDA reserves address space far beyond its use: the heap and the device memory instead.
    job.data_limit_bytes = options.memory_limit_bytes;
    job.device_memory_limit_bytes = options.memory_limit_bytes;
  }
  if (max_time > absl::ZeroDuration()) {
    // CPU time over every thread: the wall-clock limit times the job's threads, and a margin.
    job.cpu_seconds =
        static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(max_time))) * job.intra_op_threads +
        10;
  }

  const absl::Time start = absl::Now();
  absl::StatusOr<WorkerProcess> taken = pool.Take(job.device);
  if (!taken.ok()) return fail(std::string(taken.status().message()));
  // The next job's worker starts warming up now when two cores are left beside this job's
  // threads (one for its start, LibTorch's loading; one for the daemon and its clients), so that
  // a job submitted as this one ends finds it ready; else once this one is done (below): on a
  // 2-core machine a start beside a one-thread job slowed the job by 0.17 s, as much as it saves
  // the next one.
  if (job.intra_op_threads + 2 <= UsableCores()) pool.Refill(job.device);
  const pid_t pid = taken->pid;
  ScopedFd socket(taken->socket);
  ScopedFd output(taken->output);
  std::vector<int> fds;
  for (const auto& fd : shared_fds) fds.push_back(fd->get());
  // The job (its datasets, its module, a checkpoint to resume from) goes to the worker only once
  // its sandbox is measured and holds what the daemon requires (`ready`, below).
  absl::Status sent = absl::OkStatus();
  bool job_sent = false;
  auto send_job = [&] {
    job_sent = true;
    sent = SendFrame(socket.get(), WorkerFrame::kStart, EncodeWorkerJob(job), fds);
    shared_fds.clear();
    fds.clear();
    job.module.clear();
    job.resume_checkpoint.clear();
  };

  // --- Its messages, until it ends -------------------------------------------------------------
  // A frame holds at most a checkpoint or the model (its archive and its state_dict): parameters
  // with two optimizer slots and gradients' worth of slack, and room for the archive's own
  // records.
  const int64_t slack = int64_t{64} << 20;
  const int64_t per_parameter = 16;
  const size_t max_frame = static_cast<size_t>(
      std::min<int64_t>(module.parameter_count, int64_t{1} << 36) * per_parameter + slack);
  FrameAssembler frames(max_frame);
  WorkerOutput said(job_id);
  std::optional<TrainingOutcome> reported;
  std::string broken;   // a protocol error: the worker is killed and the job fails
  std::string refused;  // its sandbox falls short: killed before it got the job
  int32_t last_epoch = 0;
  int32_t last_checkpoint = 0;
  bool closed = false;
  bool ready = false;
  const absl::Time deadline =
      max_time > absl::ZeroDuration() ? start + max_time : absl::InfiniteFuture();
  std::optional<absl::Time> asked_to_stop;  // cancel or interrupt sent
  bool sent_cancel = false, sent_drain = false, sent_interrupt = false;
  enum class Kill {
    kNone,
    kCancel,
    kInterrupt,
    kTimeLimit,
    kProtocol,
    kLingered,
    kSandbox,
    kStart
  };
  Kill killed = Kill::kNone;
  std::optional<absl::Time> closed_at;
  auto kill_now = [&](Kill why) {
    if (killed != Kill::kNone) return;
    killed = why;
    ::kill(pid, SIGKILL);
  };
  auto control = [&](WorkerControl what) {
    const char byte = static_cast<char>(what);
    // A control frame is small; a worker that stopped reading still gets killed by its deadline.
    (void)SendFrame(socket.get(), WorkerFrame::kControl, std::string_view(&byte, 1));
  };

  auto handle = [&](WorkerFrame type, const std::string& payload) {
    if (!job_sent && type != WorkerFrame::kReady) {
      broken = "the worker sent a message before it was ready";
      return;
    }
    switch (type) {
      case WorkerFrame::kReady: {
        if (ready) {
          broken = "the worker said it was ready twice";
          return;
        }
        absl::StatusOr<WorkerReady> decoded = DecodeWorkerReady(payload);
        if (!decoded.ok()) {
          broken = std::string(decoded.status().message());
          return;
        }
        ready = true;
        if (worker_start_seconds != nullptr) {
          *worker_start_seconds = absl::ToDoubleSeconds(absl::Now() - start);
        }
        SandboxReport sandbox = decoded->sandbox;
        MeasureFromOutside(pid, options.sandbox_policy, &sandbox);
        outcome.worker_sandbox = sandbox;
        if (options.on_sandbox) options.on_sandbox(sandbox);
        LogInfo(absl::StrCat("job '", job_id, "' worker ", pid, " started (",
                             Escaped(decoded->applied.substr(0, 1000)),
                             "); measured: ", DescribeSandbox(sandbox)));
        if (absl::Status confined = CheckSandbox(sandbox, options.sandbox_policy); !confined.ok()) {
          refused = std::string(confined.message());
          kill_now(Kill::kSandbox);
          return;
        }
        send_job();
        if (!sent.ok()) broken = std::string(sent.message());
        return;
      }
      case WorkerFrame::kCheckpoint: {
        absl::StatusOr<WorkerCheckpoint> checkpoint =
            DecodeWorkerCheckpoint(payload, run.spec.epochs);
        if (!checkpoint.ok()) {
          broken = std::string(checkpoint.status().message());
          return;
        }
        if (run.checkpoint_dir.empty()) {
          broken = "the worker sent a checkpoint the job does not keep";
          return;
        }
        // Only what the job's schedule has: an epoch it checkpoints (checkpoint_every), or the
        // epoch a drain stops after; once per epoch, before that epoch's report. A worker that
        // sends more is killed rather than let fill the disk.
        {
          const int32_t e = checkpoint->epoch;
          const bool scheduled =
              run.spec.checkpoint_every > 0 && e % run.spec.checkpoint_every == 0;
          const bool draining = sent_drain && e < run.spec.epochs;
          if (e <= last_epoch || e <= last_checkpoint || !(scheduled || draining)) {
            broken = absl::StrCat("the worker sent a checkpoint of epoch ", e,
                                  ", which the job's schedule (every ", run.spec.checkpoint_every,
                                  " epochs, after epoch ", last_epoch, ") does not have");
            return;
          }
          last_checkpoint = e;
        }
        // The file's name is the daemon's, from the epoch alone: nothing of the worker's becomes
        // a path.
        const std::string name = CheckpointFileName(checkpoint->epoch);
        const absl::Status allowed = run.may_checkpoint ? run.may_checkpoint() : absl::OkStatus();
        if (!allowed.ok()) {
          const std::string why = absl::StrCat("the checkpoint of epoch ", checkpoint->epoch,
                                               " was not written: ", allowed.message());
          LogWarning(absl::StrCat("job '", job_id, "': ", why, "; training goes on without it"));
          if (run.on_checkpoint_failed) run.on_checkpoint_failed(checkpoint->epoch, why);
          return;
        }
        const absl::Status written =
            WriteModelArchive(absl::StrCat(run.checkpoint_dir, "/", name), checkpoint->bytes);
        if (!written.ok()) {
          // The job goes on without it (trainer.h: on_checkpoint_failed).
          const std::string why = absl::StrCat("cannot write the checkpoint of epoch ",
                                               checkpoint->epoch, ": ", written.message());
          LogWarning(absl::StrCat("job '", job_id, "': ", why, "; training goes on without it"));
          if (run.on_checkpoint_failed) run.on_checkpoint_failed(checkpoint->epoch, why);
          return;
        }
        if (run.on_checkpoint) {
          run.on_checkpoint(checkpoint->epoch, name,
                            static_cast<int64_t>(checkpoint->bytes.size()));
        }
        return;
      }
      case WorkerFrame::kEpoch: {
        absl::StatusOr<WorkerEpoch> epoch = DecodeWorkerEpoch(payload);
        if (!epoch.ok()) {
          broken = std::string(epoch.status().message());
          return;
        }
        if (epoch->epoch.epoch <= last_epoch || epoch->epoch.epoch > run.spec.epochs) {
          broken = absl::StrCat("the worker reported epoch ", epoch->epoch.epoch, " after epoch ",
                                last_epoch, " of ", run.spec.epochs);
          return;
        }
        last_epoch = epoch->epoch.epoch;
        if (run.on_epoch) run.on_epoch(epoch->epoch, epoch->steps, epoch->host_syncs);
        return;
      }
      case WorkerFrame::kOutcome: {
        absl::StatusOr<TrainingOutcome> decoded = DecodeWorkerOutcome(payload, run.spec.epochs);
        if (!decoded.ok()) {
          broken = std::string(decoded.status().message());
          return;
        }
        reported = *std::move(decoded);
        return;
      }
      case WorkerFrame::kStart:
      case WorkerFrame::kControl:
        broken = "the worker sent a frame only the daemon sends";
        return;
    }
  };

  bool output_open = true;
  while (!closed || output_open) {
    pollfd fds_to_poll[2] = {{closed ? -1 : socket.get(), POLLIN, 0},
                             {output_open ? output.get() : -1, POLLIN, 0}};
    ::poll(fds_to_poll, 2, 100);
    if (output_open && fds_to_poll[1].revents != 0) {
      char chunk[4096];
      const ssize_t n = ::read(output.get(), chunk, sizeof(chunk));
      if (n > 0) {
        said.Add(std::string_view(chunk, static_cast<size_t>(n)));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        output_open = false;
      }
    }
    if (!closed && fds_to_poll[0].revents != 0) {
      absl::Status read = frames.ReadAvailable(socket.get(), &closed);
      if (!read.ok()) broken = std::string(read.message());
      WorkerFrame type;
      std::string payload;
      while (broken.empty() && frames.Next(&type, &payload)) {
        handle(type, payload);
      }
      if (broken.empty() && !frames.status().ok()) broken = std::string(frames.status().message());
      if (closed) closed_at = absl::Now();
    }
    if (!broken.empty()) kill_now(Kill::kProtocol);
    const absl::Time now = absl::Now();
    if (!job_sent && !closed && killed == Kill::kNone) {
      // Not given the job yet: a stop needs no asking, and a worker that never gets ready is
      // ended at the start timeout.
      if ((run.cancel != nullptr && run.cancel->load()) ||
          (run.interrupt != nullptr && run.interrupt->load())) {
        kill_now(run.cancel != nullptr && run.cancel->load() ? Kill::kCancel : Kill::kInterrupt);
      } else if (now - start > options.start_timeout) {
        kill_now(Kill::kStart);
      }
    }
    if (job_sent && !closed && killed == Kill::kNone) {
      if (run.cancel != nullptr && run.cancel->load() && !sent_cancel) {
        sent_cancel = true;
        asked_to_stop = now;
        control(WorkerControl::kCancel);
      }
      if (run.drain != nullptr && run.drain->load() && !sent_drain) {
        sent_drain = true;
        control(WorkerControl::kDrain);
      }
      if (run.interrupt != nullptr && run.interrupt->load() && !sent_interrupt) {
        sent_interrupt = true;
        asked_to_stop = now;
        control(WorkerControl::kInterrupt);
      }
      if (asked_to_stop && now - *asked_to_stop > options.grace) {
        kill_now(sent_cancel ? Kill::kCancel : Kill::kInterrupt);
      } else if (now > deadline) {
        kill_now(Kill::kTimeLimit);
      }
    }
    // A worker that closed its socket but lingers (or keeps its output open) is ended too.
    if (closed && closed_at && now - *closed_at > options.grace) {
      kill_now(Kill::kLingered);
      break;
    }
  }
  said.Flush();
  int wait_status = 0;
  if (reported && killed == Kill::kNone) {
    // It reported and closed its end: its exit status says nothing more.
    EndAndReap(pid);
  } else {
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
  // When it did not start beside this job, the next job's worker starts warming up now.
  pool.Refill(job.device);
  outcome.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // --- What became of it -----------------------------------------------------------------------
  const auto with_last = [&](std::string text) {
    if (!said.last().empty()) absl::StrAppend(&text, "; its last words: ", said.last());
    return text;
  };
  if (killed == Kill::kSandbox) {
    // The module never reached it.
    return fail(refused);
  }
  if (killed == Kill::kStart) {
    return fail(
        with_last(absl::StrCat("the job's worker did not get ready within ",
                               absl::FormatDuration(options.start_timeout), " and was killed")));
  }
  if (!job_sent && killed == Kill::kCancel) {
    outcome.state = JobState::kCancelled;
    outcome.error = "cancelled before its worker was given the job";
    return outcome;
  }
  if (!job_sent && !ready && killed == Kill::kNone && !reported) {
    return fail(with_last("the job's worker ended before it was ready"));
  }
  if (killed == Kill::kProtocol) {
    return fail(absl::StrCat("the job's worker broke the protocol and was killed: ", broken));
  }
  if (killed == Kill::kTimeLimit) {
    return fail(absl::StrFormat(
        "the job ran past its time limit of %s (--max-job-time) and its worker was killed",
        absl::FormatDuration(max_time)));
  }
  if (killed == Kill::kCancel && !reported) {
    outcome.state = JobState::kCancelled;
    outcome.error = absl::StrCat("cancelled; the job's worker did not stop within ",
                                 absl::FormatDuration(options.grace), " and was killed");
    outcome.epochs_done = last_epoch;
    return outcome;
  }
  if (killed == Kill::kInterrupt && !reported) {
    outcome.interrupted = true;
    outcome.state = JobState::kRunning;
    return outcome;
  }
  if (reported) {
    if (reported->state == JobState::kRunning && !reported->interrupted) {
      return fail("the job's worker reported a run that neither ended nor was interrupted");
    }
    // The worker's own account of the run (its times include a resumed job's earlier runs, as
    // in the daemon), under the path's name.
    std::optional<SandboxReport> sandbox = std::move(outcome.worker_sandbox);
    outcome = *std::move(reported);
    outcome.engine = "libtorch-worker";
    outcome.worker_sandbox = std::move(sandbox);
    if (outcome.state == JobState::kSucceeded && outcome.model_archive.empty()) {
      return fail("the job's worker reported success without a model");
    }
    // The model is served to its owner, whose torch.jit.load trusts it: it is checked as a
    // submitted module is (its records, its pickles, every tensor inside its storage) before it
    // is kept.
    if (outcome.state == JobState::kSucceeded) {
      // An exported program comes back as an exported program (its reader's checks), a
      // TorchScript module as TorchScript.
      const absl::Status sound =
          IsExportedProgramArchive(module.archive)
              ? (IsExportedProgramArchive(outcome.model_archive)
                     ? CheckExportedProgram(outcome.model_archive).status()
                     : absl::InvalidArgumentError("it is not an exported program"))
              : CheckTorchScriptArchive(outcome.model_archive);
      if (!sound.ok()) {
        outcome.model_archive.clear();
        return fail(
            absl::StrCat("the job's worker sent a model that is not kept: ", sound.message()));
      }
      // Its state_dict (none is not one) is served as safetensors, which readers trust to be
      // well formed.
      if (absl::Status sound = ParseSafetensors(outcome.state_dict).status(); !sound.ok()) {
        outcome.state_dict.clear();
        return fail(absl::StrCat("the job's worker sent a state_dict that is not kept: ",
                                 sound.message()));
      }
    }
    return outcome;
  }
  if (WIFSIGNALED(wait_status)) {
    const int signal = WTERMSIG(wait_status);
    if (signal == SIGXCPU) {
      return fail(with_last(absl::StrCat("the job's worker used up its CPU time limit (",
                                         job.cpu_seconds, " s) and was ended")));
    }
    if (signal == SIGKILL) {
      return fail(with_last(
          "the job's worker was killed (signal 9, SIGKILL: by the kernel for memory, or by "
          "someone else)"));
    }
    return fail(with_last(absl::StrCat("the job's worker died of ", SignalText(signal))));
  }
  return fail(with_last(absl::StrCat("the job's worker exited (status ", WEXITSTATUS(wait_status),
                                     ") without reporting an outcome")));
}

}  // namespace trainerd::engine
