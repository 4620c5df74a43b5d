// The trainer's driver (trainer.h): RunTraining, RunPackedTraining and the pack's epoch loop
// (RunMembers), which runs each member's MemberLoop (member_loop.h) step by step and brings the
// epoch's values to the host in one transfer. Runs on the job's own thread; it takes no lock of its
// own (a job's publishing and cancel checks go through the TrainingRun's hooks).
#include "server/engine/training/trainer.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/engine/devices/cpu_memory_meter.h"
#include "server/engine/devices/cpu_threads.h"
#include "server/engine/devices/device.h"
#include "server/engine/training/member_loop.h"
#include "server/engine/training/stacked_path.h"

namespace trainerd::engine {
namespace {

using trainer_internal::Clock;
using trainer_internal::JobStream;
using trainer_internal::MemberLoop;
using trainer_internal::TakesFusedPath;

// Calls `f` on every member still running, in order; a member whose call throws fails alone.
template <typename F>
void ForEachRunning(std::vector<std::unique_ptr<MemberLoop>>& members, F f) {
  for (auto& member : members) {
    if (member->ended()) continue;
    try {
      f(*member);
    } catch (...) {
      member->Fail(std::current_exception());
    }
  }
}

// The pack's epoch loop: the members' steps interleaved (member after member within a step), their
// epoch values in one host transfer. All members have the same rows, batch size, validation rows
// and epochs (PackUnsupported), and start at the same epoch. `deliver` gets each member's outcome
// (by its index in `runs`) as soon as that member's run ended, once.
void RunMembers(const std::vector<const TrainingRun*>& runs,
                const std::function<void(size_t, TrainingOutcome)>& deliver) {
  const auto start = Clock::now();
  const TrainingRun& first = *runs.front();
  const torch::Device device = first.device;
  ResetPeakMemory(device);
  const int64_t allocated_at_start = AllocatedBytes(device);
  // On the CPU, the pack's own tensors are counted as this thread allocates and frees them, from
  // the members' set-up to the end of the first epoch: by then every step has allocated what
  // every later one will (optimizer state comes at the first step, validation at the epoch's
  // end), and the count's cost (a lookup per allocation) is not paid for the whole job.
  std::optional<CpuMemoryMeter> cpu_meter;
  int64_t cpu_peak = 0;
  if (device.is_cpu()) cpu_meter.emplace();
  auto peak_bytes = [&]() -> int64_t {
    if (device.is_cpu()) return cpu_meter.has_value() ? cpu_meter->peak_bytes() : cpu_peak;
    return std::max<int64_t>(0, PeakAllocatedBytes(device) - allocated_at_start);
  };
  // Declared before the members, so that it outlives their paths (which point into it).
  std::unique_ptr<StackedPack> pack;
  std::vector<std::unique_ptr<MemberLoop>> members;
  for (const TrainingRun* run : runs) members.push_back(std::make_unique<MemberLoop>(*run, start));
  std::optional<Clock::time_point> loop_start;
  std::vector<bool> delivered(members.size(), false);
  auto deliver_ended = [&] {
    for (size_t i = 0; i < members.size(); ++i) {
      if (delivered[i] || !members[i]->ended()) continue;
      delivered[i] = true;
      deliver(i, members[i]->TakeOutcome(loop_start, peak_bytes()));
    }
  };
  try {
    if (first.intra_op_threads > 0) SetIntraOpThreads(first.intra_op_threads);
    SetFlushDenormal(first.flush_denormal);
    if (device.is_cpu()) LowerThreadPriority(first.cpu_nice);
    // Everything the pack queues on a GPU goes on its own stream (until the function returns).
    std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
    if (std::optional<c10::cuda::CUDAStream> stream = JobStream(device)) {
      stream_guard.emplace(*stream);
    }
    // The dataset normally lives on the job's device already; a job on another device gets one
    // copy at start (one for the whole pack), never one per batch.
    torch::Tensor features = first.dataset->features;
    torch::Tensor targets = first.dataset->targets;
    int64_t copied_bytes = 0;
    if (features.device() != device) {
      features = features.to(device);
      targets = targets.to(device);
      if (!device.is_cpu()) copied_bytes = features.nbytes() + targets.nbytes();
      for (auto& member : members) {
        member->host().CountCrossDeviceCopy();
        member->outcome().host_to_device_bytes += copied_bytes;
      }
    }
    // Members not on the fused path train stacked: one batched step for all (stacked_path.h).
    std::string not_fused;
    if (members.size() > 1 && !TakesFusedPath(first, &not_fused) &&
        first.spec.engine != EngineKind::kFused && StackedPathUnsupported(first).empty()) {
      pack = std::make_unique<StackedPack>(runs);
    }
    for (size_t i = 0; i < members.size(); ++i) {
      try {
        members[i]->Setup(features, targets, pack.get(), i);
      } catch (...) {
        members[i]->Fail(std::current_exception());
      }
    }
    // The pack's own step: a failure there fails every member still running.
    auto pack_step = [&](void (StackedPack::*step)()) {
      if (pack == nullptr) return;
      try {
        ((*pack).*step)();
      } catch (...) {
        const std::exception_ptr error = std::current_exception();
        for (auto& member : members) {
          if (!member->ended()) member->Fail(error);
        }
      }
    };
    deliver_ended();
    CountHostToDeviceBytes(copied_bytes);
    for (auto& member : members) {
      if (!member->ended())
        CountHostToDeviceBytes(member->outcome().host_to_device_bytes - copied_bytes);
    }
    loop_start = Clock::now();

    auto any_running = [&] {
      for (auto& member : members) {
        if (!member->ended() && member->more_epochs()) return true;
      }
      return false;
    };
    while (any_running()) {
      // Members that are done (an early stop) wait for Finish below; the rest run the epoch.
      std::vector<MemberLoop*> epoch_members;
      for (auto& member : members) {
        if (!member->ended() && member->more_epochs()) epoch_members.push_back(member.get());
      }
      const MemberLoop& lead = *epoch_members.front();
      const int64_t rows = lead.rows();
      const int64_t batch = lead.batch();
      auto for_each = [&](auto f) {
        for (MemberLoop* m : epoch_members) {
          if (m->ended()) continue;
          try {
            f(*m);
          } catch (...) {
            m->Fail(std::current_exception());
          }
        }
      };
      for_each([](MemberLoop& m) { m.BeginEpoch(); });
      for (int64_t begin = 0; begin < rows; begin += batch) {
        for_each([&](MemberLoop& m) {
          if (!m.Cancelled()) m.Step(begin);
        });
        pack_step(&StackedPack::StepAll);
        deliver_ended();  // a cancelled or failed member ends now, not with the pack
      }
      if (lead.val_rows() > 0) {
        const int64_t val_batch = lead.val_batch();
        for_each([](MemberLoop& m) { m.BeginValidation(); });
        for (int64_t begin = 0; begin < lead.val_rows(); begin += val_batch) {
          for_each([&](MemberLoop& m) {
            if (!m.Cancelled()) m.ValidateBatch(begin);
          });
          pack_step(&StackedPack::ValidateAll);
          deliver_ended();
        }
        for_each([](MemberLoop& m) { m.EndValidation(); });
      }
      // The epoch's one host transfer, for every member of the pack together.
      std::vector<torch::Tensor> reduced;
      std::vector<std::pair<MemberLoop*, size_t>> at;
      for_each([&](MemberLoop& m) {
        std::vector<torch::Tensor> values = m.EpochValues();
        at.emplace_back(&m, reduced.size());
        for (torch::Tensor& v : values) reduced.push_back(std::move(v));
      });
      deliver_ended();
      if (at.empty()) continue;
      HostTransfers transfer;
      const torch::Tensor values = transfer.ToHost(torch::stack(reduced)).contiguous();
      for (auto& [m, offset] : at) {
        if (m->ended()) continue;
        m->host().CountShared(transfer.seconds());
        try {
          // A member done with its epochs (the last one, or an early stop) finishes now.
          if (m->AfterTransfer(values.data_ptr<double>() + offset) && !m->more_epochs()) {
            m->Finish();
          }
        } catch (...) {
          m->Fail(std::current_exception());
        }
      }
      deliver_ended();
      if (cpu_meter.has_value()) {  // the first epoch ended: its peak stands for the job's
        cpu_peak = cpu_meter->peak_bytes();
        cpu_meter.reset();
      }
    }
    ForEachRunning(members, [](MemberLoop& m) { m.Finish(); });
  } catch (...) {
    // The pack's own work (its stream, the dataset's copy) failed: every member still running
    // fails with it.
    const std::exception_ptr error = std::current_exception();
    for (auto& member : members) {
      if (!member->ended()) member->Fail(error);
    }
  }
  deliver_ended();
}

}  // namespace

TrainingOutcome RunTraining(const TrainingRun& run) {
  TrainingOutcome outcome;
  RunMembers({&run}, [&](size_t, TrainingOutcome o) { outcome = std::move(o); });
  return outcome;
}

std::string PackUnsupported(const TrainingRun& lead, const TrainingRun& member) {
  if (member.torchscript != nullptr || lead.torchscript != nullptr) {
    return "a TorchScript module trains alone";
  }
  if (!member.resume_from.empty() || !lead.resume_from.empty()) {
    return "a job taken up again from a checkpoint trains alone";
  }
  if (member.dataset != lead.dataset || member.validation_dataset != lead.validation_dataset) {
    return "the members train on different datasets";
  }
  if (member.device != lead.device) return "the members run on different devices";
  const JobSpec& a = lead.spec;
  const JobSpec& b = member.spec;
  if (a.model != b.model || a.batch_size != b.batch_size || a.epochs != b.epochs ||
      a.validation_fraction != b.validation_fraction) {
    return "the members differ in model, batch size, epochs or validation";
  }
  // Everything else but what a sweep varies (learning rate, momentum, weight decay, seed) is the
  // pack's: one loss, one optimizer kind, one schedule, one clipping norm.
  const ScheduleSpec& s = a.schedule;
  const ScheduleSpec& t = b.schedule;
  if (a.loss != b.loss || a.optimizer != b.optimizer || a.nesterov != b.nesterov ||
      a.beta1 != b.beta1 || a.beta2 != b.beta2 || a.eps != b.eps || a.alpha != b.alpha ||
      a.huber_delta != b.huber_delta || a.label_smoothing != b.label_smoothing ||
      s.kind != t.kind || s.step_epochs != t.step_epochs || s.gamma != t.gamma ||
      s.min_learning_rate != t.min_learning_rate || s.warmup_epochs != t.warmup_epochs ||
      a.clip_grad_norm != b.clip_grad_norm || a.shuffle != b.shuffle ||
      a.validation_dataset != b.validation_dataset ||
      a.early_stop_patience != b.early_stop_patience || a.precision != b.precision ||
      a.engine != b.engine) {
    return "the members differ in more than learning rate, momentum, weight decay and seed";
  }
  return "";
}

void RunPackedTraining(const std::vector<const TrainingRun*>& runs,
                       const std::function<void(size_t, TrainingOutcome)>& deliver) {
  if (runs.empty()) return;
  for (const TrainingRun* run : runs) {
    if (!PackUnsupported(*runs.front(), *run).empty()) {
      // Not a pack after all: each member alone, one after another.
      for (size_t i = 0; i < runs.size(); ++i) deliver(i, RunTraining(*runs[i]));
      return;
    }
  }
  RunMembers(runs, deliver);
}

}  // namespace trainerd::engine
