#include "server/engine/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/checkpoint.h"
#include "server/engine/cpu_threads.h"
#include "server/engine/device.h"
#include "server/engine/fused_path.h"
#include "server/engine/log.h"
#include "server/engine/optimizer.h"
#include "server/engine/training_path.h"

namespace trainerd::engine {
namespace {

// The job's own generator on its device (shuffling, dropout): nothing else draws from it (not
// Diagnose, not the other jobs on the device), so a seed gives the same losses whatever else runs.
at::Generator JobGenerator(const torch::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  at::Generator gen = at::cuda::detail::createCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
  return gen;
}

// A GPU job runs on a CUDA stream of its own, so that jobs sharing a device overlap their
// kernels instead of queueing behind each other on the default stream. The stream first waits
// (on the device, not the host) for the work queued before it on the default stream, e.g. the
// copy that made the dataset resident.
std::optional<c10::cuda::CUDAStream> JobStream(const torch::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  c10::cuda::CUDAStream stream =
      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getDefaultCUDAStream(device.index()));
  ready.block(stream);
  return stream;
}

// Rows are gathered for a chunk of whole batches at a time, at most this many bytes of features
// and targets (or one batch, when a batch is larger): a dataset under it is gathered once per
// epoch. Bounded so that a job on a large dataset holds one more chunk, not a second copy of its
// data; a few percent of what a job on such a dataset holds anyway.
constexpr int64_t kGatherChunkBytes = int64_t{16} << 20;

// An epoch's batches in `order` (or as the rows lie, as narrow views, when `order` is undefined),
// gathered on the device a chunk at a time (kGatherChunkBytes): each batch is then a view of its
// chunk, so a step costs no gather of its own. Never a host copy. Batches are asked for in order,
// at multiples of `batch` (the last may be shorter).
class EpochBatches {
 public:
  EpochBatches(const torch::Tensor& features, const torch::Tensor& targets, torch::Tensor order,
               int64_t batch)
      : features_(features), targets_(targets), order_(std::move(order)) {
    const int64_t rows = std::max<int64_t>(features.size(0), 1);
    const int64_t row_bytes = std::max<int64_t>(1, (features.nbytes() + targets.nbytes()) / rows);
    const int64_t batches = std::max<int64_t>(1, kGatherChunkBytes / row_bytes / batch);
    chunk_rows_ = batches * batch;
  }

  // Rows [begin, begin + len) of the epoch's order, as a range of the chunk that holds them (no
  // tensor is made for the batch itself: BatchView::x() and y() make the views when asked).
  BatchView Get(int64_t begin, int64_t len) {
    if (!order_.defined()) return BatchView{&features_, &targets_, begin, len};
    if (!chunk_features_.defined() || begin < chunk_begin_ || begin + len > chunk_end_) {
      chunk_begin_ = begin;
      chunk_end_ = std::min(order_.size(0), begin + std::max(chunk_rows_, len));
      const torch::Tensor idx = order_.narrow(/*dim=*/0, begin, chunk_end_ - begin);
      chunk_features_ = features_.index_select(/*dim=*/0, idx);
      chunk_targets_ = targets_.index_select(/*dim=*/0, idx);
    }
    return BatchView{&chunk_features_, &chunk_targets_, begin - chunk_begin_, len};
  }

 private:
  torch::Tensor features_;
  torch::Tensor targets_;
  torch::Tensor order_;
  int64_t chunk_rows_ = 0;
  int64_t chunk_begin_ = 0;
  int64_t chunk_end_ = 0;
  torch::Tensor chunk_features_;
  torch::Tensor chunk_targets_;
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TrainingOutcome RunTraining(const TrainingRun& run) {
  TrainingOutcome outcome;
  HostTransfers host;
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> loop_start;
  double loop_end_seconds = -1;  // since start; < 0 while the loop runs
  double earlier_seconds = 0;    // a resumed job's running time before this run
  ResetPeakMemory(run.device);
  const int64_t allocated_at_start = AllocatedBytes(run.device);
  // Called wherever the run ends (every return below goes through `finish`).
  auto finish = [&](TrainingOutcome& o) -> TrainingOutcome& {
    o.wall_seconds = SecondsSince(start);
    o.host_syncs = host.count();
    o.host_transfer_seconds = host.seconds();
    if (loop_start) {
      o.data_seconds = std::chrono::duration<double>(*loop_start - start).count();
      const double end = loop_end_seconds >= 0 ? loop_end_seconds : o.wall_seconds;
      o.loop_seconds = std::max(0.0, end - o.data_seconds);
    } else {
      o.data_seconds = o.wall_seconds;
    }
    if (o.loop_host_transfer_seconds == 0) o.loop_host_transfer_seconds = host.seconds();
    o.peak_memory_bytes = std::max<int64_t>(0, PeakAllocatedBytes(run.device) - allocated_at_start);
    o.wall_seconds += earlier_seconds;  // the job's running time, earlier runs included
    return o;
  };
  const JobSpec& spec = run.spec;
  const uint64_t seed = spec.seed.value_or(0);
  try {
    if (run.intra_op_threads > 0) SetIntraOpThreads(run.intra_op_threads);
    SetFlushDenormal(run.flush_denormal);
    // Everything the job queues on a GPU goes on its own stream (until the function returns).
    std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
    if (std::optional<c10::cuda::CUDAStream> stream = JobStream(run.device)) {
      stream_guard.emplace(*stream);
    }
    // The job's own generator on its device: shuffling and any random layer (dropout) draw from it.
    at::Generator gen = JobGenerator(run.device, seed);
    // The way the job's steps run (training_path.h): its model, built with the job's seed, its
    // optimizer and its mixed precision. The fused path when the job qualifies, unless it asked
    // for LibTorch.
    const DatasetMeta& meta = run.dataset->meta;
    std::string not_fused = FusedPathUnsupported(spec, run.model, meta.feature_shape,
                                                 run.torchscript != nullptr, run.device);
    if (not_fused.empty() && spec.engine == EngineKind::kAuto) {
      const int64_t train_rows = meta.rows - HeldOutRows(spec.validation_fraction, meta.rows);
      not_fused = FusedPathSlower(run.model, meta.feature_shape,
                                  std::max<int64_t>(1, std::min(spec.batch_size, train_rows)));
    }
    const bool fused = spec.engine != EngineKind::kLibTorch && not_fused.empty();
    outcome.engine = fused ? "fused" : "libtorch";
    if (!fused && spec.engine == EngineKind::kAuto) outcome.engine_reason = not_fused;
    if (!fused && spec.engine == EngineKind::kFused) {
      outcome.state = JobState::kFailed;
      outcome.error = absl::StrCat("engine fused cannot run this job: ", not_fused);
      return finish(outcome);
    }
    std::unique_ptr<TrainingPath> path =
        fused ? MakeFusedCpuPath(run, gen) : MakeLibTorchPath(run, gen);

    // The dataset normally lives on the job's device already; a job on another device gets one
    // copy at start, never one per batch.
    torch::Tensor features = run.dataset->features;
    torch::Tensor targets = run.dataset->targets;
    if (features.device() != run.device) {
      host.CountCrossDeviceCopy();
      features = features.to(run.device);
      targets = targets.to(run.device);
      if (!run.device.is_cpu()) {
        outcome.host_to_device_bytes += features.nbytes() + targets.nbytes();
      }
    }
    const auto index_options = torch::TensorOptions(torch::kInt64).device(run.device);

    // A job taken up again: the checkpoint's model, optimizer, loss scaler and counters, read
    // into what was just built (its tensors straight onto the device). Its generator state is
    // put back below, after the validation split, which is drawn afresh from the seed as at the
    // job's first start.
    int32_t first_epoch = 1;
    LoopState resumed;
    if (!run.resume_from.empty()) {
      absl::StatusOr<LoopState> state = path->ReadCheckpoint(run.resume_from);
      if (!state.ok()) {
        outcome.state = JobState::kFailed;
        outcome.error = std::string(state.status().message());
        return finish(outcome);
      }
      resumed = *std::move(state);
      first_epoch = resumed.epoch + 1;
      outcome.steps = resumed.steps;
      outcome.resumed_steps = resumed.steps;
      outcome.epochs_done = resumed.epoch;
      outcome.final_loss = resumed.loss;
      host.AddEarlierCount(resumed.host_syncs);
      earlier_seconds = resumed.elapsed_seconds;
    }

    // Validation rows: a fixed held-out part of the dataset, or a second dataset.
    //  - A fraction is split once per job, not per epoch, so that validation rows never train.
    //    The split is one permutation drawn from the job's generator before the first epoch's
    //    shuffle, so the seed reproduces it; rows - round(f * rows) train, the rest validate. The
    //    split is kept as index tensors (gathered per batch, as shuffled batches are anyway)
    //    rather than as copies, so the resident dataset is never duplicated on the device.
    //  - Without validation the generator draws exactly what it did before validation existed,
    //    so existing seeds keep their losses.
    torch::Tensor val_features = features;
    torch::Tensor val_targets = targets;
    torch::Tensor train_index;  // fraction only: the rows that train, in split order
    torch::Tensor val_index;    // fraction only: the rows that validate
    const int64_t dataset_rows = features.size(0);
    int64_t rows = dataset_rows;  // training rows
    int64_t val_rows = 0;
    if (spec.validation_fraction > 0) {
      val_rows = HeldOutRows(spec.validation_fraction, dataset_rows);
      rows = dataset_rows - val_rows;
      torch::Tensor split = torch::randperm(dataset_rows, gen, index_options);
      train_index = split.narrow(/*dim=*/0, /*start=*/0, rows);
      val_index = split.narrow(/*dim=*/0, /*start=*/rows, val_rows);
    } else if (run.validation_dataset != nullptr) {
      val_features = run.validation_dataset->features;
      val_targets = run.validation_dataset->targets;
      if (val_features.device() != run.device) {
        host.CountCrossDeviceCopy();
        val_features = val_features.to(run.device);
        val_targets = val_targets.to(run.device);
        if (!run.device.is_cpu()) {
          outcome.host_to_device_bytes += val_features.nbytes() + val_targets.nbytes();
        }
      }
      val_rows = val_features.size(0);
    }
    const bool classification = spec.loss == LossKind::kCrossEntropy || spec.loss == LossKind::kNll;
    const int32_t patience = spec.early_stop_patience;

    const int64_t batch = std::min<int64_t>(spec.batch_size, rows);
    // Early stopping is decided on the host from values that the epoch's one transfer brought.
    double best_val_loss = std::numeric_limits<double>::infinity();
    int32_t epochs_without_improvement = 0;
    if (!run.resume_from.empty()) {
      best_val_loss = resumed.best_validation_loss;
      epochs_without_improvement = resumed.epochs_without_improvement;
      if (resumed.generator_state.defined()) {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(resumed.generator_state);
      }
      // Stopped early at the checkpoint's epoch, before the daemon stopped.
      if (patience > 0 && epochs_without_improvement >= patience && resumed.epoch < spec.epochs) {
        outcome.stopped_early = true;
        first_epoch = spec.epochs + 1;
      }
    }

    auto cancelled = [&] {
      if (run.interrupt != nullptr && run.interrupt->load(std::memory_order_relaxed)) {
        outcome.interrupted = true;
        outcome.state = JobState::kRunning;
        return true;
      }
      if (run.cancel == nullptr || !run.cancel->load(std::memory_order_relaxed)) return false;
      outcome.state = JobState::kCancelled;
      return true;
    };
    CountHostToDeviceBytes(outcome.host_to_device_bytes);
    loop_start = std::chrono::steady_clock::now();

    for (int32_t epoch = first_epoch; epoch <= spec.epochs; ++epoch) {
      // The schedule is host arithmetic on the epoch number: no device value is read.
      const double learning_rate = LearningRateForEpoch(spec, epoch);
      path->SetLearningRate(learning_rate);
      // The epoch's rows in order; undefined means rows 0..rows-1 as they lie (narrow views).
      torch::Tensor order;
      if (spec.shuffle) {
        order = torch::randperm(rows, gen, index_options);
        if (train_index.defined()) order = train_index.index_select(/*dim=*/0, order);
      } else if (train_index.defined()) {
        order = train_index;
      }
      path->BeginEpoch();
      EpochBatches batches(features, targets, std::move(order), batch);
      for (int64_t begin = 0; begin < rows; begin += batch) {
        if (cancelled()) return finish(outcome);
        const int64_t len = std::min(batch, rows - begin);
        path->Step(batches.Get(begin, len));
        ++outcome.steps;
      }

      // Validation: eval mode (dropout off, batchnorm on its running statistics), no autograd,
      // in batches of batch_size; the loss (the training loss function with the same options)
      // and the correct count are summed on the device like the training loss.
      // Each value's place in the transfer; -1 when the job has no such value.
      std::vector<torch::Tensor> reduced = {path->loss_sum() / static_cast<double>(rows)};
      int val_loss_at = -1;
      int val_accuracy_at = -1;
      if (val_rows > 0) {
        path->BeginValidation();
        const int64_t val_batch = std::min<int64_t>(spec.batch_size, val_rows);
        EpochBatches val_batches(val_features, val_targets, val_index, val_batch);
        for (int64_t begin = 0; begin < val_rows; begin += val_batch) {
          if (cancelled()) return finish(outcome);
          const int64_t len = std::min(val_batch, val_rows - begin);
          path->ValidateBatch(val_batches.Get(begin, len));
        }
        path->EndValidation();
        val_loss_at = static_cast<int>(reduced.size());
        reduced.push_back(path->validation_loss_sum() / static_cast<double>(val_rows));
        if (classification) {
          val_accuracy_at = static_cast<int>(reduced.size());
          reduced.push_back(path->validation_correct().to(torch::kFloat64) /
                            static_cast<double>(val_rows));
        }
      }
      const int extra_at = static_cast<int>(reduced.size());
      for (torch::Tensor& value : path->ExtraEpochValues()) {
        reduced.push_back(value.to(torch::kFloat64));
      }

      // The epoch's one host transfer: training loss, then validation loss and accuracy, then the
      // path's own values (fp16's loss scale and skipped steps).
      const torch::Tensor values = host.ToHost(torch::stack(reduced)).contiguous();
      const double* value = values.data_ptr<double>();
      const double mean_loss = value[0];
      outcome.epochs_done = epoch;
      outcome.final_loss = mean_loss;
      if (!std::isfinite(mean_loss)) {
        outcome.state = JobState::kFailed;
        outcome.error =
            absl::StrCat("loss became ", std::isnan(mean_loss) ? "NaN" : "infinite", " at epoch ",
                         epoch, "; try a smaller learning rate (", spec.learning_rate, ")");
        return finish(outcome);
      }
      EpochResult result;
      result.epoch = epoch;
      result.loss = mean_loss;
      result.elapsed_seconds = earlier_seconds + SecondsSince(start);
      result.learning_rate = learning_rate;
      if (static_cast<int64_t>(reduced.size()) > extra_at) {
        // fp16: the loss scale and the epoch's skipped steps; the path corrects its step counts
        // before any checkpoint of this epoch.
        result.loss_scale = value[extra_at];
        result.skipped_steps = std::llround(value[extra_at + 1]);
      }
      path->AfterTransfer(value + extra_at);
      if (val_rows > 0) {
        const double val_loss = value[val_loss_at];
        if (!std::isfinite(val_loss)) {
          outcome.state = JobState::kFailed;
          outcome.error =
              absl::StrCat("validation loss became ", std::isnan(val_loss) ? "NaN" : "infinite",
                           " at epoch ", epoch, " (training loss ", mean_loss, ")");
          return finish(outcome);
        }
        result.validation_loss = val_loss;
        if (val_accuracy_at >= 0) result.validation_accuracy = value[val_accuracy_at];
        if (val_loss < best_val_loss) {
          best_val_loss = val_loss;
          epochs_without_improvement = 0;
        } else {
          ++epochs_without_improvement;
        }
      }
      // Checkpoint at the epoch boundary, after the epoch's one transfer (so a NaN epoch is never
      // saved) and before its event, so that the epoch's host_syncs and the Job's checkpoint
      // list agree when a watcher sees the epoch. Serialising copies the device's parameters,
      // buffers and optimizer state to the host: off the CPU that is one more host sync per
      // checkpoint (host_syncs = epochs + 1 + checkpoints on a GPU); on the CPU nothing crosses.
      // A drain stops the job after this epoch (unless it was the last, or an early stop): it
      // gets a checkpoint now, whatever checkpoint_every says, and resumes from it.
      const bool stops_early =
          patience > 0 && epochs_without_improvement >= patience && epoch < spec.epochs;
      const bool draining = run.drain != nullptr && run.drain->load(std::memory_order_relaxed) &&
                            epoch < spec.epochs && !stops_early && !run.checkpoint_dir.empty();
      if (!run.checkpoint_dir.empty() &&
          (draining || (spec.checkpoint_every > 0 && epoch % spec.checkpoint_every == 0))) {
        const std::string file_name = CheckpointFileName(epoch);
        if (!run.device.is_cpu()) host.CountCrossDeviceCopy();
        const auto checkpoint_start = std::chrono::steady_clock::now();
        LoopState state;
        state.epoch = epoch;
        state.seed = seed;
        state.steps = outcome.steps;
        state.host_syncs = host.count();
        state.elapsed_seconds = result.elapsed_seconds;
        state.loss = mean_loss;
        {
          std::lock_guard<std::mutex> lock(gen.mutex());
          state.generator_state = gen.get_state();
        }
        state.best_validation_loss = best_val_loss;
        state.epochs_without_improvement = epochs_without_improvement;
        absl::StatusOr<int64_t> size =
            path->WriteCheckpoint(absl::StrCat(run.checkpoint_dir, "/", file_name), state);
        if (!size.ok()) {
          outcome.state = JobState::kFailed;
          outcome.error = absl::StrCat("cannot write checkpoint at epoch ", epoch, ": ",
                                       size.status().message());
          return finish(outcome);
        }
        outcome.checkpoint_seconds += SecondsSince(checkpoint_start);
        if (run.on_checkpoint) run.on_checkpoint(epoch, file_name, *size);
      }
      if (run.on_epoch) run.on_epoch(result, outcome.steps, host.count());
      if (draining) {
        outcome.interrupted = true;
        outcome.state = JobState::kRunning;
        return finish(outcome);
      }
      // Stopping after the last planned epoch is no early stop.
      if (stops_early) {
        outcome.stopped_early = true;
        break;
      }
    }

    loop_end_seconds = SecondsSince(start);
    outcome.loop_host_transfer_seconds = host.seconds();
    absl::StatusOr<std::string> archive = path->Finish(host, outcome);
    if (!archive.ok()) {
      outcome.state = JobState::kFailed;
      outcome.error = std::string(archive.status().message());
      return finish(outcome);
    }
    outcome.model_archive = *std::move(archive);
    outcome.state = JobState::kSucceeded;
  } catch (const c10::OutOfMemoryError& e) {
    // The job's tensors are gone with its scope; the allocator's cache of them goes too, so
    // that the next job on the device starts from what is really free.
    ReleaseCachedMemory(run.device);
    outcome.state = JobState::kFailed;
    outcome.error = absl::StrCat("out of memory on ", DeviceName(run.device), " at epoch ",
                                 outcome.epochs_done + 1, "; try a smaller batch size or model");
  } catch (const std::bad_alloc&) {
    outcome.state = JobState::kFailed;
    outcome.error = absl::StrCat("out of host memory (std::bad_alloc) at epoch ",
                                 outcome.epochs_done + 1, "; try a smaller batch size or model");
  } catch (const std::exception& e) {
    outcome.state = JobState::kFailed;
    outcome.error =
        absl::StrCat("training failed at epoch ", outcome.epochs_done + 1, ": ", FirstLineOf(e));
  }
  return finish(outcome);
}

}  // namespace trainerd::engine
