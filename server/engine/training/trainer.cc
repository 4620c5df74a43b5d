// The trainer's driver (trainer.h): RunTraining, RunPackedTraining and the pack's epoch loop
// (RunMembers), which runs each member's MemberLoop (member_loop.h) step by step and brings the
// epoch's values to the host in one transfer. Runs on the job's own thread; it takes no lock of its
// own (a job's publishing and cancel checks go through the TrainingRun's hooks).
#include "server/engine/training/trainer.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
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

// What a member of a pack that runs its members in turn says of its values against the same job
// run alone (DeviceReport.packed_numerics): each member is exactly a job alone, interleaved.
constexpr char kInTurnNumerics[] =
    "bitwise the job alone: the member ran on its own path, the job alone's operators in the "
    "same order, in turn with the others";

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
  // What the owner queued (flush_epochs): a member still running whose event could not be
  // published fails; one that ended already keeps its end.
  auto flush = [&] {
    if (!first.flush_epochs) return;
    for (const auto& [run, error] : first.flush_epochs()) {
      for (size_t i = 0; i < runs.size(); ++i) {
        if (runs[i] == run && !members[i]->ended()) members[i]->Fail(error);
      }
    }
  };
  auto deliver_ended = [&] {
    bool any = false;
    for (size_t i = 0; i < members.size(); ++i) {
      if (delivered[i] || !members[i]->ended()) continue;
      delivered[i] = true;
      any = true;
      deliver(i, members[i]->TakeOutcome(loop_start, peak_bytes()));
    }
    if (any) flush();  // the ends the deliveries queued, published together
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
    // Members not on the fused path train stacked on a GPU: one batched step for all
    // (stacked_path.h), where a small model's step is launch-bound. On the CPU every member keeps
    // its own path (fused or LibTorch) and a packed step runs them in turn: a batched product
    // does the same arithmetic there, only in another order, so stacking would save operator
    // dispatch and give up the job alone's values to the last bit.
    std::string not_fused;
    if (members.size() > 1 && (!device.is_cpu() || first.stack_on_cpu) &&
        !TakesFusedPath(first, &not_fused) && first.spec.engine != EngineKind::kFused &&
        StackedPathUnsupported(first).empty()) {
      pack = std::make_unique<StackedPack>(runs);
    }
    for (size_t i = 0; i < members.size(); ++i) {
      if (members.size() > 1) {
        members[i]->outcome().packed_bitwise = pack == nullptr;
        members[i]->outcome().packed_numerics =
            pack == nullptr ? kInTurnNumerics : kStackedNumerics;
      }
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
      const int64_t rows = lead.epoch_rows();
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
      flush();
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

std::string DataParallelSpecUnsupported(const JobSpec& spec, const ModelSpec& model,
                                        bool torchscript, const torch::Device& device) {
  if (!device.is_cpu()) {
    return "ranks on a GPU need NCCL, which this daemon does not wire yet (train the ranks on "
           "device cpu, or one rank on the GPU)";
  }
  if (torchscript) return "a submitted module (TorchScript or exported program) trains on one rank";
  if (spec.precision != Precision::kFp32) return "ranks train in float32 (precision fp32)";
  if (spec.engine == EngineKind::kFused) {
    return "ranks train on the LibTorch path (engine auto or libtorch, not fused)";
  }
  // The ranks' gradients are averaged weighted by their rows, which is the global batch's when
  // each rank's loss is a mean over its rows. With class weights or ignored rows a batch's loss
  // is a ratio of sums over its rows (weights, rows not ignored), which that average is not.
  if (!spec.class_weights.empty()) {
    return "class_weights train on one rank (a weighted mean's divisor is the global batch's "
           "sum of weights, which the ranks' rows-weighted gradient average does not use)";
  }
  if (spec.ignore_index.has_value()) {
    return "ignore_index trains on one rank (the mean is over the global batch's rows not "
           "ignored, which the ranks' rows-weighted gradient average does not count)";
  }
  if (spec.gradient_accumulation_steps > 1) {
    return "gradient accumulation trains on one rank (the ranks exchange gradients once per "
           "batch, weighted by its rows; accumulated gradients are not a global batch's mean)";
  }
  for (const LayerSpec& layer : model.layers) {
    if (layer.kind == LayerKind::kDropout) {
      return "dropout layers train on one rank (each rank's masks would draw from the "
             "generator that shuffles the rows, and the ranks' orders would part)";
    }
    if (layer.kind == LayerKind::kBatchNorm) {
      return "batchnorm layers train on one rank (their statistics would be each rank's "
             "slice's, not the global batch's: there is no synchronised batchnorm yet)";
    }
  }
  return "";
}

std::string DataParallelUnsupported(const TrainingRun& run) {
  return DataParallelSpecUnsupported(run.spec, run.model, run.submitted_module(), run.device);
}

namespace {

// Rank `rank` of `world`'s rows of the global batch [begin, begin + rows): equal slices of
// ceil(rows / world), the last ones shorter or empty.
std::pair<int64_t, int64_t> RankSlice(int64_t begin, int64_t rows, int rank, int world) {
  const int64_t each = (rows + world - 1) / world;
  const int64_t from = std::min(rows, rank * each);
  const int64_t to = std::min(rows, (rank + 1) * each);
  return {begin + from, to - from};
}

}  // namespace

TrainingOutcome RunRank(const TrainingRun& job, RankComms& comms) {
  const auto start = Clock::now();
  const int rank = comms.rank();
  const int world = comms.world_size();
  // The rank's copy of the run: on the LibTorch path (the one that exchanges gradients); rank 0
  // alone reports epochs and writes checkpoints.
  TrainingRun run = job;
  run.spec.engine = EngineKind::kLibTorch;
  // A drain (the daemon stopping: finish the epoch, checkpoint, resume at the next start) is
  // voted on at each epoch's end like a cancel, so that every rank stops after the same epoch;
  // the loop sees the agreed vote. Every rank takes the job up from rank 0's checkpoint.
  std::atomic<bool> drain_agreed{false};
  run.drain = &drain_agreed;
  if (rank != 0) {
    // Rank 0 hands back the model (its best epoch's when the job keeps it); the others keep no
    // copy of theirs, which is the same model.
    run.spec.model_from = ModelFrom::kLast;
    run.on_epoch = nullptr;
    run.checkpoint_dir.clear();
    run.on_checkpoint = nullptr;
    run.on_checkpoint_failed = nullptr;
  }
  MemberLoop member(run, start);
  std::optional<Clock::time_point> loop_start;
  std::optional<CpuMemoryMeter> cpu_meter;
  int64_t cpu_peak = 0;
  const std::string unsupported = DataParallelUnsupported(run);
  if (!unsupported.empty()) {
    member.End(JobState::kFailed, absl::StrCat("this job cannot train as ranks: ", unsupported));
    return member.TakeOutcome(loop_start, 0);
  }
  try {
    if (run.intra_op_threads > 0) SetIntraOpThreads(run.intra_op_threads);
    SetFlushDenormal(run.flush_denormal);
    LowerThreadPriority(run.cpu_nice);
    cpu_meter.emplace();
    if (member.Setup(run.dataset->features, run.dataset->targets, nullptr, 0, world)) {
      if (!member.SetGradientExchange(&comms)) {
        member.End(JobState::kFailed, "this job's training path cannot exchange gradients");
      } else if (member.epoch_rows() == 0) {
        // drop_last drops the epoch's short last global batch.
        member.End(JobState::kFailed,
                   absl::StrCat("drop_last with ", world, " ranks of batch size ", member.batch(),
                                " drops every one of the ", member.rows(), " training rows"));
      }
    }
    loop_start = Clock::now();
    while (!member.ended() && member.more_epochs()) {
      member.BeginEpoch();
      const int64_t global = member.batch() * world;
      bool stop = false;
      for (int64_t begin = 0; begin < member.epoch_rows() && !stop; begin += global) {
        // Each rank's cancel and interrupt flags ride in the step's exchange: the ranks agree on
        // the step they stop after (a rank alone stopping would leave the others waiting).
        comms.VoteStop(
            {run.cancel != nullptr && run.cancel->load(std::memory_order_relaxed),
             run.interrupt != nullptr && run.interrupt->load(std::memory_order_relaxed)});
        const auto [from, len] =
            RankSlice(begin, std::min(global, member.epoch_rows() - begin), rank, world);
        member.StepRows(from, len);
        const RankComms::StopVote agreed = comms.agreed_stop();
        if (agreed.interrupt) {
          member.outcome().interrupted = true;
          member.End(JobState::kRunning, "");
          stop = true;
        } else if (agreed.cancel) {
          member.End(JobState::kCancelled, "");
          stop = true;
        }
      }
      if (stop) break;
      if (member.val_rows() > 0) {
        const int64_t global_val = member.val_batch() * world;
        member.BeginValidation();
        for (int64_t begin = 0; begin < member.val_rows(); begin += global_val) {
          const auto [from, len] =
              RankSlice(begin, std::min(global_val, member.val_rows() - begin), rank, world);
          member.ValidateRows(from, len);
        }
        member.EndValidation();
      }
      // The epoch's values summed over the ranks (each rank's loss sum over the job's rows is
      // its share of the mean), with the ranks' cancel and interrupt flags: every rank sees the
      // same figures and stops at the same epoch.
      std::vector<torch::Tensor> values = member.EpochValues();
      const bool cancel = run.cancel != nullptr && run.cancel->load(std::memory_order_relaxed);
      const bool interrupt =
          run.interrupt != nullptr && run.interrupt->load(std::memory_order_relaxed);
      const bool drain = job.drain != nullptr && job.drain->load(std::memory_order_relaxed);
      values.push_back(torch::full({}, drain ? 1.0 : 0.0, torch::kFloat64));
      values.push_back(torch::full({}, cancel ? 1.0 : 0.0, torch::kFloat64));
      values.push_back(torch::full({}, interrupt ? 1.0 : 0.0, torch::kFloat64));
      torch::Tensor reduced = torch::stack(values).contiguous();
      comms.AllReduceSum(reduced);
      HostTransfers transfer;
      const torch::Tensor host = transfer.ToHost(reduced).contiguous();
      member.host().CountShared(transfer.seconds());
      const double* value = host.data_ptr<double>();
      const int64_t count = host.numel();
      if (cpu_meter.has_value()) {  // the first epoch's peak stands for the job's
        cpu_peak = cpu_meter->peak_bytes();
        cpu_meter.reset();
      }
      if (value[count - 1] > 0) {
        member.outcome().interrupted = true;
        member.End(JobState::kRunning, "");
        break;
      }
      if (value[count - 2] > 0) {
        member.End(JobState::kCancelled, "");
        break;
      }
      drain_agreed.store(value[count - 3] > 0, std::memory_order_relaxed);
      const bool went_on = member.AfterTransfer(value);
      // Rank 0 checkpointed and stopped for the drain (AfterTransfer); the others stop with it.
      if (went_on && rank != 0 && drain_agreed.load(std::memory_order_relaxed) &&
          !job.checkpoint_dir.empty() && member.epoch() < run.spec.epochs &&
          !member.outcome().stopped_early) {
        member.outcome().interrupted = true;
        member.End(JobState::kRunning, "");
        break;
      }
      if (went_on && !member.more_epochs()) {
        if (rank == 0) {
          member.Finish();
        } else {
          member.End(JobState::kSucceeded, "");
        }
      }
    }
    if (!member.ended()) {  // an early stop: the loop is done, the job still to finish
      if (rank == 0) {
        member.Finish();
      } else {
        member.End(JobState::kSucceeded, "");
      }
    }
  } catch (...) {
    member.Fail(std::current_exception());
  }
  const int64_t peak = cpu_meter.has_value() ? cpu_meter->peak_bytes() : cpu_peak;
  return member.TakeOutcome(loop_start, peak);
}

std::string PackUnsupported(const TrainingRun& lead, const TrainingRun& member) {
  if (member.submitted_module() || lead.submitted_module()) {
    return "a submitted module trains alone";
  }
  if (!member.resume_from.empty() || !lead.resume_from.empty()) {
    return "a job taken up again from a checkpoint trains alone";
  }
  if (member.dataset != lead.dataset || member.validation_dataset != lead.validation_dataset) {
    return "the members train on different datasets";
  }
  if (member.device != lead.device) return "the members run on different devices";
  return SpecsPackUnsupported(lead.spec, member.spec);
}

std::string SpecsPackUnsupported(const JobSpec& a, const JobSpec& b) {
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
      a.amsgrad != b.amsgrad || a.centered != b.centered || a.momentum_decay != b.momentum_decay ||
      a.decoupled_weight_decay != b.decoupled_weight_decay || a.lr_decay != b.lr_decay ||
      a.initial_accumulator_value != b.initial_accumulator_value ||
      a.weight_decay_exclude_bias_and_norm != b.weight_decay_exclude_bias_and_norm ||
      a.huber_delta != b.huber_delta || a.label_smoothing != b.label_smoothing ||
      a.class_weights != b.class_weights || a.ignore_index != b.ignore_index ||
      a.pos_weight != b.pos_weight || s != t ||
      a.clip_grad_norm != b.clip_grad_norm || a.shuffle != b.shuffle ||
      a.validation_dataset != b.validation_dataset ||
      a.early_stop_patience != b.early_stop_patience ||
      a.early_stop_min_delta != b.early_stop_min_delta ||
      a.early_stop_metric != b.early_stop_metric ||
      a.gradient_accumulation_steps != b.gradient_accumulation_steps ||
      a.drop_last != b.drop_last || a.precision != b.precision || a.engine != b.engine) {
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
