// trainerd-worker: trains one TorchScript job in a process of its own (see
// server/engine/worker_launcher.h for the daemon's side and server/worker/sandbox.h for the
// confinement). The daemon starts it with a socketpair on descriptor 3 and sends the job; the
// worker maps the job's datasets read-only, warms LibTorch up, locks itself down, and only then
// parses the module and trains it on the same epoch loop as a job in the daemon (RunTraining),
// sending each epoch, each checkpoint's bytes and the outcome back.
//
// Usage (by the daemon only): trainerd-worker --socket_fd=3
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <signal.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/datasets/shared_memory.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "server/engine/torchscript/worker_protocol.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/trainer.h"
#include "server/worker/sandbox.h"
#include "server/worker/under_asan.h"

// Under AddressSanitizer (make test-asan) the worker gets no ASAN_OPTIONS from the daemon (its
// environment is fixed): no leak check at exit (LeakSanitizer stops the world with ptrace, which
// the sandbox refuses, and LibTorch keeps process-lifetime allocations), and an allocation over
// ASan's cap returns null, which LibTorch reports as out of memory, as without ASan.
#ifdef TRAINERD_UNDER_ASAN
extern "C" const char* __asan_default_options() {
  return "detect_leaks=0:allocator_may_return_null=1";
}
#endif

namespace {

using trainerd::engine::WorkerFrame;

constexpr char kResumeMarker[] = "daemon:resume";
constexpr char kCheckpointDir[] = "daemon:checkpoints";

// Frames are written by the training thread only; the control thread only reads.
int g_socket = 3;

int Die(const std::string& why) {
  std::cerr << "trainerd-worker: " << why << std::endl;
  return 1;
}

absl::StatusOr<std::shared_ptr<const trainerd::engine::Dataset>> MapDataset(
    const trainerd::engine::WorkerDataset& wire, int features_fd, int targets_fd) {
  absl::StatusOr<torch::Tensor> features =
      trainerd::engine::MapReadOnly(features_fd, wire.features_region_bytes);
  absl::StatusOr<torch::Tensor> targets =
      trainerd::engine::MapReadOnly(targets_fd, wire.targets_region_bytes);
  if (!features.ok()) return features.status();
  if (!targets.ok()) return targets.status();
  const trainerd::engine::DatasetMeta& meta = wire.meta;
  const int64_t target_bytes = meta.size_bytes - meta.feature_bytes;
  if (meta.feature_bytes > wire.features_region_bytes - wire.features_offset ||
      target_bytes > wire.targets_region_bytes - wire.targets_offset) {
    return absl::InvalidArgumentError("the dataset's tensors lie outside its shared memory");
  }
  auto dataset = std::make_shared<trainerd::engine::Dataset>();
  dataset->meta = meta;
  std::vector<int64_t> feature_shape = {meta.rows};
  feature_shape.insert(feature_shape.end(), meta.feature_shape.begin(), meta.feature_shape.end());
  std::vector<int64_t> target_shape = {meta.rows};
  target_shape.insert(target_shape.end(), meta.target_shape.begin(), meta.target_shape.end());
  const auto target_dtype =
      meta.target_dtype == trainerd::TargetDType::kInt64 ? torch::kInt64 : torch::kFloat32;
  try {
    dataset->features = features->narrow(0, wire.features_offset, meta.feature_bytes)
                            .view(torch::kFloat32)
                            .reshape(feature_shape);
    dataset->targets = targets->narrow(0, wire.targets_offset, target_bytes)
                           .view(target_dtype)
                           .reshape(target_shape);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the dataset's shape does not fit its bytes: ", e.what()));
  }
  return dataset;
}

// Loads the libraries and code a job's first steps need (the operators, autograd, an optimizer
// step, on a GPU the CUDA context), so that nothing needs a file after the lockdown.
void WarmUp(const torch::Device& device) {
  torch::manual_seed(0);
  torch::nn::Linear layer(4, 4);
  layer->to(device);
  torch::optim::Adam optimizer(layer->parameters());
  const torch::Tensor x = torch::ones({2, 4}, torch::TensorOptions().device(device));
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      layer(x), torch::zeros({2}, torch::TensorOptions(torch::kInt64).device(device)));
  loss.backward();
  optimizer.step();
  (void)loss.item<float>();
  std::ostringstream out;
  torch::save(layer, out);
  if (device.is_cuda()) {
    // cuDNN is loaded on its first use, from a folder the lockdown no longer lets it read.
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 1, 3));
    conv->to(device);
    conv(torch::ones({1, 1, 4, 4}, torch::TensorOptions().device(device))).sum().backward();
    torch::cuda::synchronize();
  }
}

}  // namespace

int main(int argc, char** argv) {
  // First, while the process has one thread: death with the daemon, a network of its own.
  trainerd::SandboxReport report;
  report.program = "trainerd-worker";
  const std::vector<std::string> namespaces = trainerd::worker::EnterNamespaces(&report);
  if (getppid() == 1) return 1;  // the daemon is already gone
  std::string device_name = "cpu";
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (absl::StartsWith(arg, "--socket_fd=")) {
      if (!absl::SimpleAtoi(arg.substr(12), &g_socket)) return Die("bad --socket_fd");
    } else if (absl::StartsWith(arg, "--device=")) {
      device_name = std::string(arg.substr(9));
    } else {
      return Die(absl::StrCat("unknown argument '", arg, "'"));
    }
  }

  // LibTorch warm on the job's device, on one thread, before the lockdown (its libraries, its
  // operators, an optimizer step, a GPU's context): nothing needs a file afterwards. The job's
  // intra-op threads start after the lockdown, so that they inherit it (Landlock and seccomp bind
  // the threads that exist and their children). A pooled worker does all this before it has a job.
  torch::Device device = torch::kCPU;
  try {
    device = torch::Device(device_name);
    at::set_num_threads(1);
    WarmUp(device);
  } catch (const std::exception& e) {
    return Die(absl::StrCat("cannot start LibTorch on ", device_name, ": ", e.what()));
  }
  trainerd::worker::SandboxOptions sandbox;
  sandbox.gpu = device.is_cuda();
  // The job's intra-op threads (at most the cores) and LibTorch's own, with room to spare.
  sandbox.max_threads = 2 * static_cast<int64_t>(std::thread::hardware_concurrency()) + 64;
  absl::StatusOr<std::vector<std::string>> locked = trainerd::worker::LockDown(sandbox, &report);
  if (!locked.ok()) return Die(std::string(locked.status().message()));
  std::vector<std::string> applied = namespaces;
  applied.insert(applied.end(), locked->begin(), locked->end());
  // What is in force, as measured: the daemon sends the job (and its module) only to a worker
  // whose sandbox holds what it requires.
  trainerd::engine::WorkerReady ready;
  ready.sandbox = report;
  ready.applied = absl::StrJoin(applied, "; ");
  if (!trainerd::engine::SendFrame(g_socket, WorkerFrame::kReady,
                                   trainerd::engine::EncodeWorkerReady(ready))
           .ok()) {
    return 1;
  }

  // The job (from the daemon, which is trusted; the lengths are still bounded).
  WorkerFrame type;
  std::string payload;
  std::vector<int> fds;
  absl::Status received =
      trainerd::engine::ReceiveFrame(g_socket, size_t{64} << 30, &type, &payload, &fds);
  if (!received.ok() || type != WorkerFrame::kStart) return Die("no job from the daemon");
  absl::StatusOr<trainerd::engine::WorkerJob> job = trainerd::engine::DecodeWorkerJob(payload);
  payload.clear();
  payload.shrink_to_fit();
  if (!job.ok()) return Die(std::string(job.status().message()));
  const size_t wanted_fds = job->validation_dataset ? 4 : 2;
  if (fds.size() != wanted_fds) return Die("the job came without its datasets");

  trainerd::engine::TrainingOutcome failure;
  failure.state = trainerd::engine::JobState::kFailed;
  auto report_failure = [&](const std::string& why) {
    failure.error = why;
    (void)trainerd::engine::SendFrame(g_socket, WorkerFrame::kOutcome,
                                      trainerd::engine::EncodeWorkerOutcome(failure));
    return 0;
  };
  if (job->device != device_name) {
    return report_failure(
        absl::StrCat("the worker was started for ", device_name, ", not ", job->device));
  }
  absl::StatusOr<std::shared_ptr<const trainerd::engine::Dataset>> dataset =
      MapDataset(job->dataset, fds[0], fds[1]);
  if (!dataset.ok()) return report_failure(std::string(dataset.status().message()));
  std::shared_ptr<const trainerd::engine::Dataset> validation;
  if (job->validation_dataset) {
    absl::StatusOr<std::shared_ptr<const trainerd::engine::Dataset>> mapped =
        MapDataset(*job->validation_dataset, fds[2], fds[3]);
    if (!mapped.ok()) return report_failure(std::string(mapped.status().message()));
    validation = *std::move(mapped);
  }
  // The job's own limits, now that its datasets are mapped (limits only go down from here).
  trainerd::worker::SandboxOptions limits;
#ifndef TRAINERD_UNDER_ASAN
  limits.address_space_bytes = job->memory_limit_bytes;
#endif
  limits.cpu_seconds = job->cpu_seconds;
#ifndef TRAINERD_UNDER_ASAN
  limits.data_bytes = job->data_limit_bytes;
#endif
  if (absl::Status limited = trainerd::worker::ApplyJobLimits(limits); !limited.ok()) {
    return report_failure(std::string(limited.message()));
  }
  // A GPU job's device memory: LibTorch's allocator refuses past it, as the host's limits do.
  if (device.is_cuda() && job->device_memory_limit_bytes > 0) {
    try {
      const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
      const int64_t total =
          static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
      if (total > 0) {
        c10::cuda::CUDACachingAllocator::setMemoryFraction(
            std::min(1.0, static_cast<double>(job->device_memory_limit_bytes) /
                              static_cast<double>(total)),
            index);
      }
    } catch (const std::exception& e) {
      return report_failure(absl::StrCat("cannot cap the job's device memory: ", e.what()));
    }
  }

  // The daemon's requests, on a thread of their own; a daemon that goes away interrupts the job.
  static std::atomic<bool> cancel{false};
  static std::atomic<bool> drain{false};
  static std::atomic<bool> interrupt{false};
  std::thread control([] {
    while (true) {
      WorkerFrame t;
      std::string p;
      if (!trainerd::engine::ReceiveFrame(g_socket, 16, &t, &p, nullptr).ok()) {
        // The daemon is gone (or broke its end): nothing of this job can be kept, and a forward
        // that never returns would never see a flag.
        _exit(1);
      }
      if (t != WorkerFrame::kControl || p.size() != 1) continue;
      switch (static_cast<trainerd::engine::WorkerControl>(p[0])) {
        case trainerd::engine::WorkerControl::kCancel:
          cancel.store(true);
          break;
        case trainerd::engine::WorkerControl::kDrain:
          drain.store(true);
          break;
        case trainerd::engine::WorkerControl::kInterrupt:
          interrupt.store(true);
          break;
      }
    }
  });
  control.detach();

  // Checkpoints go to the daemon; the one to resume from came with the job.
  const std::string resume = std::move(job->resume_checkpoint);
  trainerd::engine::CheckpointFiles files;
  files.write = [](const std::string& path, const std::string& bytes) -> absl::Status {
    const size_t dash = path.rfind("epoch-");
    int epoch = 0;
    if (dash == std::string::npos || std::sscanf(path.c_str() + dash, "epoch-%d.pt", &epoch) != 1) {
      return absl::InternalError(absl::StrCat("not a checkpoint's name: '", path, "'"));
    }
    trainerd::engine::WorkerCheckpoint checkpoint{epoch, bytes};
    return trainerd::engine::SendFrame(g_socket, WorkerFrame::kCheckpoint,
                                       trainerd::engine::EncodeWorkerCheckpoint(checkpoint));
  };
  files.read = [&resume](const std::string& path) -> absl::StatusOr<std::string> {
    if (path != kResumeMarker) return absl::NotFoundError("only the job's checkpoint can be read");
    return resume;
  };
  trainerd::engine::SetCheckpointFiles(std::move(files));

  // Now the module: checked again, then loaded, inside the sandbox. An exported program (a .pt2
  // archive) runs on the interpreter of exported_program.h, a TorchScript archive on LibTorch's.
  trainerd::engine::TrainingRun run;
  if (trainerd::engine::IsExportedProgramArchive(job->module)) {
    absl::StatusOr<std::shared_ptr<trainerd::engine::ExportedProgram>> program =
        trainerd::engine::ExportedProgram::Load(job->module);
    job->module.clear();
    job->module.shrink_to_fit();
    if (!program.ok()) return report_failure(std::string(program.status().message()));
    run.exported = *std::move(program);
  } else {
    absl::StatusOr<std::shared_ptr<torch::jit::Module>> module =
        trainerd::engine::LoadCheckedModule(job->module);
    job->module.clear();
    job->module.shrink_to_fit();
    if (!module.ok()) return report_failure(std::string(module.status().message()));
    run.torchscript = *std::move(module);
  }
  run.spec = job->spec;
  run.dataset = *std::move(dataset);
  run.validation_dataset = std::move(validation);
  run.device = device;
  run.intra_op_threads = job->intra_op_threads;
  run.flush_denormal = job->flush_denormal;
  run.cpu_nice = job->cpu_nice;
  run.cancel = &cancel;
  run.drain = &drain;
  run.interrupt = &interrupt;
  if (!resume.empty()) run.resume_from = kResumeMarker;
  if (job->checkpoints) run.checkpoint_dir = kCheckpointDir;
  run.on_epoch = [](const trainerd::engine::EpochResult& epoch, int64_t steps, int64_t syncs) {
    trainerd::engine::WorkerEpoch message{epoch, steps, syncs};
    if (!trainerd::engine::SendFrame(g_socket, WorkerFrame::kEpoch,
                                     trainerd::engine::EncodeWorkerEpoch(message))
             .ok()) {
      interrupt.store(true);  // the daemon is gone
    }
  };
  trainerd::engine::TrainingOutcome outcome = trainerd::engine::RunTraining(run);
  const absl::Status sent = trainerd::engine::SendFrame(
      g_socket, WorkerFrame::kOutcome, trainerd::engine::EncodeWorkerOutcome(outcome));
  // Without the destructors of LibTorch's globals (the control thread still runs), and with its
  // socket and streams closed first: the daemon takes the outcome as final once they close, so
  // the job ends without waiting for the kernel to unmap this process.
  // (The control thread still reads the socket, so its writing end is shut rather than closed.)
  std::fflush(nullptr);
  ::shutdown(g_socket, SHUT_WR);
  ::close(STDOUT_FILENO);
  ::close(STDERR_FILENO);
  _exit(sent.ok() ? 0 : 1);
}
