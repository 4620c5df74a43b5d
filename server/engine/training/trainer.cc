#include "server/engine/training/trainer.h"

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
#include "server/engine/devices/cpu_threads.h"
#include "server/engine/devices/device.h"
#include "server/engine/log.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/training/fused_path.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/stacked_path.h"
#include "server/engine/training/training_path.h"

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

using Clock = std::chrono::steady_clock;

// Whether the job's steps run on the fused path; `reason` says why not when engine auto cannot.
bool TakesFusedPath(const TrainingRun& run, std::string* reason) {
  const JobSpec& spec = run.spec;
  const DatasetMeta& meta = run.dataset->meta;
  std::string not_fused = FusedPathUnsupported(spec, run.model, meta.feature_shape,
                                               run.torchscript != nullptr, run.device);
  if (not_fused.empty() && spec.engine == EngineKind::kAuto) {
    const int64_t train_rows = meta.rows - HeldOutRows(spec.validation_fraction, meta.rows);
    not_fused = FusedPathSlower(run.model, meta.feature_shape,
                                std::max<int64_t>(1, std::min(spec.batch_size, train_rows)));
  }
  *reason = not_fused;
  return spec.engine != EngineKind::kLibTorch && not_fused.empty();
}

// One job's epoch loop, cut at the points where a pack of jobs (a sweep's members, trained
// together) meets: each step, each validation batch, and the epoch's one host transfer. A job
// alone is a pack of one (RunTraining), so that a packed member runs exactly the code, the
// generator draws and the arithmetic of the same job run alone. Every method that runs LibTorch
// code may throw; the driver turns that into the member's failure.
class MemberLoop {
 public:
  MemberLoop(const TrainingRun& run, Clock::time_point start)
      : run_(run), spec_(run.spec), start_(start) {}

  const TrainingRun& run() const { return run_; }
  bool ended() const { return ended_; }
  int32_t epoch() const { return epoch_; }
  int64_t rows() const { return rows_; }
  int64_t batch() const { return batch_; }
  int64_t val_rows() const { return val_rows_; }
  int64_t val_batch() const { return std::min<int64_t>(spec_.batch_size, val_rows_); }
  HostTransfers& host() { return host_; }
  TrainingOutcome& outcome() { return outcome_; }
  // The epoch the next BeginEpoch starts, past spec.epochs when the loop is done.
  bool more_epochs() const { return epoch_ + 1 <= spec_.epochs && !stopped_; }

  // Everything before the first epoch: the path (with its model and optimizer), a resumed job's
  // checkpoint, the validation split. `features` and `targets` are the dataset on the job's device
  // (the driver made the one cross-device copy, when there was one). False when the job ended
  // here (its outcome is set).
  // `pack` (with the member's index in it): the stacked pack that runs the member's steps when it
  // is not on the fused path; null for a job alone.
  bool Setup(const torch::Tensor& features, const torch::Tensor& targets, StackedPack* pack,
             size_t index) {
    const uint64_t seed = spec_.seed.value_or(0);
    // The job's own generator on its device: shuffling and any random layer (dropout) draw from it.
    gen_ = JobGenerator(run_.device, seed);
    // The way the job's steps run (training_path.h): its model, built with the job's seed, its
    // optimizer and its mixed precision. The fused path when the job qualifies, unless it asked
    // for LibTorch; a packed member not on the fused path runs stacked with the others.
    std::string not_fused;
    const bool fused = TakesFusedPath(run_, &not_fused);
    outcome_.engine = fused ? "fused" : pack != nullptr ? "libtorch-stacked" : "libtorch";
    if (!fused && spec_.engine == EngineKind::kAuto) outcome_.engine_reason = not_fused;
    if (!fused && spec_.engine == EngineKind::kFused) {
      return End(JobState::kFailed, absl::StrCat("engine fused cannot run this job: ", not_fused));
    }
    if (fused) {
      path_ = MakeFusedCpuPath(run_, gen_);
    } else if (pack != nullptr) {
      path_ = pack->MemberPath(index, gen_);
    } else {
      path_ = MakeLibTorchPath(run_, gen_);
    }
    features_ = features;
    targets_ = targets;
    const auto index_options = torch::TensorOptions(torch::kInt64).device(run_.device);

    // A job taken up again: the checkpoint's model, optimizer, loss scaler and counters, read
    // into what was just built (its tensors straight onto the device). Its generator state is
    // put back below, after the validation split, which is drawn afresh from the seed as at the
    // job's first start.
    LoopState resumed;
    if (!run_.resume_from.empty()) {
      absl::StatusOr<LoopState> state = path_->ReadCheckpoint(run_.resume_from);
      if (!state.ok()) return End(JobState::kFailed, std::string(state.status().message()));
      resumed = *std::move(state);
      epoch_ = resumed.epoch;
      outcome_.steps = resumed.steps;
      outcome_.resumed_steps = resumed.steps;
      outcome_.epochs_done = resumed.epoch;
      outcome_.final_loss = resumed.loss;
      host_.AddEarlierCount(resumed.host_syncs);
      earlier_seconds_ = resumed.elapsed_seconds;
    }

    // Validation rows: a fixed held-out part of the dataset, or a second dataset.
    //  - A fraction is split once per job, not per epoch, so that validation rows never train.
    //    The split is one permutation drawn from the job's generator before the first epoch's
    //    shuffle, so the seed reproduces it; rows - round(f * rows) train, the rest validate. The
    //    split is kept as index tensors (gathered per batch, as shuffled batches are anyway)
    //    rather than as copies, so the resident dataset is never duplicated on the device.
    //  - Without validation the generator draws exactly what it did before validation existed,
    //    so existing seeds keep their losses.
    val_features_ = features_;
    val_targets_ = targets_;
    const int64_t dataset_rows = features_.size(0);
    rows_ = dataset_rows;
    if (spec_.validation_fraction > 0) {
      val_rows_ = HeldOutRows(spec_.validation_fraction, dataset_rows);
      rows_ = dataset_rows - val_rows_;
      torch::Tensor split = torch::randperm(dataset_rows, gen_, index_options);
      train_index_ = split.narrow(/*dim=*/0, /*start=*/0, rows_);
      val_index_ = split.narrow(/*dim=*/0, /*start=*/rows_, val_rows_);
    } else if (run_.validation_dataset != nullptr) {
      val_features_ = run_.validation_dataset->features;
      val_targets_ = run_.validation_dataset->targets;
      if (val_features_.device() != run_.device) {
        host_.CountCrossDeviceCopy();
        val_features_ = val_features_.to(run_.device);
        val_targets_ = val_targets_.to(run_.device);
        if (!run_.device.is_cpu()) {
          outcome_.host_to_device_bytes += val_features_.nbytes() + val_targets_.nbytes();
        }
      }
      val_rows_ = val_features_.size(0);
    }
    classification_ = spec_.loss == LossKind::kCrossEntropy || spec_.loss == LossKind::kNll;
    batch_ = std::min<int64_t>(spec_.batch_size, rows_);
    if (!run_.resume_from.empty()) {
      best_val_loss_ = resumed.best_validation_loss;
      epochs_without_improvement_ = resumed.epochs_without_improvement;
      if (resumed.generator_state.defined()) {
        std::lock_guard<std::mutex> lock(gen_.mutex());
        gen_.set_state(resumed.generator_state);
      }
      // Stopped early at the checkpoint's epoch, before the daemon stopped.
      const int32_t patience = spec_.early_stop_patience;
      if (patience > 0 && epochs_without_improvement_ >= patience && resumed.epoch < spec_.epochs) {
        outcome_.stopped_early = true;
        stopped_ = true;
      }
    }
    return true;
  }

  // A cancel or an interrupt seen before a step: ends the member's run (its outcome set).
  bool Cancelled() {
    if (run_.interrupt != nullptr && run_.interrupt->load(std::memory_order_relaxed)) {
      outcome_.interrupted = true;
      End(JobState::kRunning, "");
      return true;
    }
    if (run_.cancel == nullptr || !run_.cancel->load(std::memory_order_relaxed)) return false;
    End(JobState::kCancelled, "");
    return true;
  }

  void BeginEpoch() {
    ++epoch_;
    // The schedule is host arithmetic on the epoch number: no device value is read.
    learning_rate_ = LearningRateForEpoch(spec_, epoch_);
    path_->SetLearningRate(learning_rate_);
    // The epoch's rows in order; undefined means rows 0..rows-1 as they lie (narrow views).
    torch::Tensor order;
    if (spec_.shuffle) {
      const auto index_options = torch::TensorOptions(torch::kInt64).device(run_.device);
      order = torch::randperm(rows_, gen_, index_options);
      if (train_index_.defined()) order = train_index_.index_select(/*dim=*/0, order);
    } else if (train_index_.defined()) {
      order = train_index_;
    }
    path_->BeginEpoch();
    batches_.emplace(features_, targets_, std::move(order), batch_);
  }

  void Step(int64_t begin) {
    path_->Step(batches_->Get(begin, std::min(batch_, rows_ - begin)));
    ++outcome_.steps;
  }

  // Validation: eval mode (dropout off, batchnorm on its running statistics), no autograd, in
  // batches of batch_size; the loss (the training loss function with the same options) and the
  // correct count are summed on the device like the training loss.
  void BeginValidation() {
    path_->BeginValidation();
    val_batches_.emplace(val_features_, val_targets_, val_index_, val_batch());
  }
  void ValidateBatch(int64_t begin) {
    path_->ValidateBatch(val_batches_->Get(begin, std::min(val_batch(), val_rows_ - begin)));
  }
  void EndValidation() { path_->EndValidation(); }

  // The epoch's values for the one transfer (float64 scalars): training loss, then validation loss
  // and accuracy, then the path's own values (fp16's loss scale and skipped steps).
  std::vector<torch::Tensor> EpochValues() {
    batches_.reset();
    val_batches_.reset();
    std::vector<torch::Tensor> reduced = {path_->loss_sum() / static_cast<double>(rows_)};
    val_loss_at_ = -1;
    val_accuracy_at_ = -1;
    if (val_rows_ > 0) {
      val_loss_at_ = static_cast<int>(reduced.size());
      reduced.push_back(path_->validation_loss_sum() / static_cast<double>(val_rows_));
      if (classification_) {
        val_accuracy_at_ = static_cast<int>(reduced.size());
        reduced.push_back(path_->validation_correct().to(torch::kFloat64) /
                          static_cast<double>(val_rows_));
      }
    }
    extra_at_ = static_cast<int>(reduced.size());
    for (torch::Tensor& value : path_->ExtraEpochValues()) {
      reduced.push_back(value.to(torch::kFloat64));
    }
    value_count_ = static_cast<int>(reduced.size());
    return reduced;
  }

  // The epoch's values arrived (EpochValues' order). Checks them, checkpoints, publishes the
  // epoch. False when the member's run ended here (a NaN, a failed checkpoint, a drain); an
  // early stop ends the loop (more_epochs() false) with the job still to Finish.
  bool AfterTransfer(const double* value) {
    const double mean_loss = value[0];
    outcome_.epochs_done = epoch_;
    outcome_.final_loss = mean_loss;
    if (!std::isfinite(mean_loss)) {
      return End(
          JobState::kFailed,
          absl::StrCat("loss became ", std::isnan(mean_loss) ? "NaN" : "infinite", " at epoch ",
                       epoch_, "; try a smaller learning rate (", spec_.learning_rate, ")"));
    }
    EpochResult result;
    result.epoch = epoch_;
    result.loss = mean_loss;
    result.elapsed_seconds = earlier_seconds_ + SecondsSince(start_);
    result.learning_rate = learning_rate_;
    if (value_count_ > extra_at_) {
      // fp16: the loss scale and the epoch's skipped steps; the path corrects its step counts
      // before any checkpoint of this epoch.
      result.loss_scale = value[extra_at_];
      result.skipped_steps = std::llround(value[extra_at_ + 1]);
    }
    path_->AfterTransfer(value + extra_at_);
    if (val_rows_ > 0) {
      const double val_loss = value[val_loss_at_];
      if (!std::isfinite(val_loss)) {
        return End(
            JobState::kFailed,
            absl::StrCat("validation loss became ", std::isnan(val_loss) ? "NaN" : "infinite",
                         " at epoch ", epoch_, " (training loss ", mean_loss, ")"));
      }
      result.validation_loss = val_loss;
      if (val_accuracy_at_ >= 0) result.validation_accuracy = value[val_accuracy_at_];
      if (val_loss < best_val_loss_) {
        best_val_loss_ = val_loss;
        epochs_without_improvement_ = 0;
      } else {
        ++epochs_without_improvement_;
      }
    }
    // Checkpoint at the epoch boundary, after the epoch's one transfer (so a NaN epoch is never
    // saved) and before its event, so that the epoch's host_syncs and the Job's checkpoint
    // list agree when a watcher sees the epoch. Serialising copies the device's parameters,
    // buffers and optimizer state to the host: off the CPU that is one more host sync per
    // checkpoint (host_syncs = epochs + 1 + checkpoints on a GPU); on the CPU nothing crosses.
    // A drain stops the job after this epoch (unless it was the last, or an early stop): it
    // gets a checkpoint now, whatever checkpoint_every says, and resumes from it.
    const int32_t patience = spec_.early_stop_patience;
    const bool stops_early =
        patience > 0 && epochs_without_improvement_ >= patience && epoch_ < spec_.epochs;
    const bool draining = run_.drain != nullptr && run_.drain->load(std::memory_order_relaxed) &&
                          epoch_ < spec_.epochs && !stops_early && !run_.checkpoint_dir.empty();
    if (!run_.checkpoint_dir.empty() &&
        (draining || (spec_.checkpoint_every > 0 && epoch_ % spec_.checkpoint_every == 0))) {
      const std::string file_name = CheckpointFileName(epoch_);
      const absl::Status allowed = run_.may_checkpoint ? run_.may_checkpoint() : absl::OkStatus();
      if (!allowed.ok()) {
        const std::string why = absl::StrCat("the checkpoint of epoch ", epoch_,
                                             " was not written: ", allowed.message());
        LogWarning(absl::StrCat(why, "; training goes on without it"));
        if (run_.on_checkpoint_failed) run_.on_checkpoint_failed(epoch_, why);
      } else {
        if (!run_.device.is_cpu()) host_.CountCrossDeviceCopy();
        const auto checkpoint_start = Clock::now();
        LoopState state;
        state.epoch = epoch_;
        state.seed = spec_.seed.value_or(0);
        state.steps = outcome_.steps;
        state.host_syncs = host_.count();
        state.elapsed_seconds = result.elapsed_seconds;
        state.loss = mean_loss;
        {
          std::lock_guard<std::mutex> lock(gen_.mutex());
          state.generator_state = gen_.get_state();
        }
        state.best_validation_loss = best_val_loss_;
        state.epochs_without_improvement = epochs_without_improvement_;
        absl::StatusOr<int64_t> size =
            path_->WriteCheckpoint(absl::StrCat(run_.checkpoint_dir, "/", file_name), state);
        outcome_.checkpoint_seconds += SecondsSince(checkpoint_start);
        if (!size.ok()) {
          const std::string why = absl::StrCat("cannot write the checkpoint of epoch ", epoch_,
                                               ": ", size.status().message());
          LogWarning(absl::StrCat(why, "; training goes on without it"));
          if (run_.on_checkpoint_failed) run_.on_checkpoint_failed(epoch_, why);
        } else if (run_.on_checkpoint) {
          run_.on_checkpoint(epoch_, file_name, *size);
        }
      }
    }
    if (run_.on_epoch) run_.on_epoch(result, outcome_.steps, host_.count());
    if (draining) {
      outcome_.interrupted = true;
      return End(JobState::kRunning, "");
    }
    // Stopping after the last planned epoch is no early stop.
    if (stops_early) {
      outcome_.stopped_early = true;
      stopped_ = true;
    }
    return true;
  }

  // After the member's last epoch: the trained model, exported.
  void Finish() {
    loop_end_seconds_ = SecondsSince(start_);
    outcome_.loop_host_transfer_seconds = host_.seconds();
    absl::StatusOr<std::string> archive = path_->Finish(host_, outcome_);
    if (!archive.ok()) {
      End(JobState::kFailed, std::string(archive.status().message()));
      return;
    }
    outcome_.model_archive = *std::move(archive);
    End(JobState::kSucceeded, "");
  }

  // Ends the member's run with `state` (kRunning: interrupted) and frees its path; returns false,
  // so that `return End(...)` reads as "the run ended".
  bool End(JobState state, std::string error) {
    if (ended_) return false;
    ended_ = true;
    outcome_.state = state;
    if (!error.empty()) outcome_.error = std::move(error);
    batches_.reset();
    val_batches_.reset();
    path_.reset();
    return false;
  }
  // A LibTorch error or an allocation failure in one of the member's calls.
  void Fail(std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const c10::OutOfMemoryError&) {
      End(JobState::kFailed, "");  // frees the member's tensors before the cache goes
      ReleaseCachedMemory(run_.device);
      outcome_.error =
          absl::StrCat("out of memory on ", DeviceName(run_.device), " at epoch ",
                       outcome_.epochs_done + 1, "; try a smaller batch size or model");
    } catch (const std::bad_alloc&) {
      End(JobState::kFailed,
          absl::StrCat("out of host memory (std::bad_alloc) at epoch ", outcome_.epochs_done + 1,
                       "; try a smaller batch size or model"));
    } catch (const std::exception& e) {
      End(JobState::kFailed, absl::StrCat("training failed at epoch ", outcome_.epochs_done + 1,
                                          ": ", FirstLineOf(e)));
    } catch (...) {
      End(JobState::kFailed, absl::StrCat("training failed at epoch ", outcome_.epochs_done + 1));
    }
  }

  // The outcome with its times and counts; `loop_start` is when the pack's first step began.
  TrainingOutcome TakeOutcome(std::optional<Clock::time_point> loop_start, int64_t peak_bytes) {
    TrainingOutcome& o = outcome_;
    o.wall_seconds = SecondsSince(start_);
    o.host_syncs = host_.count();
    o.host_transfer_seconds = host_.seconds();
    if (loop_start) {
      o.data_seconds = std::chrono::duration<double>(*loop_start - start_).count();
      const double end = loop_end_seconds_ >= 0 ? loop_end_seconds_ : o.wall_seconds;
      o.loop_seconds = std::max(0.0, end - o.data_seconds);
    } else {
      o.data_seconds = o.wall_seconds;
    }
    if (o.loop_host_transfer_seconds == 0) o.loop_host_transfer_seconds = host_.seconds();
    o.peak_memory_bytes = peak_bytes;
    o.wall_seconds += earlier_seconds_;  // the job's running time, earlier runs included
    return std::move(outcome_);
  }

 private:
  const TrainingRun& run_;
  const JobSpec& spec_;
  const Clock::time_point start_;
  TrainingOutcome outcome_;
  HostTransfers host_;
  bool ended_ = false;
  bool stopped_ = false;          // early stop: no more epochs, the job still to Finish
  double earlier_seconds_ = 0;    // a resumed job's running time before this run
  double loop_end_seconds_ = -1;  // since start; < 0 while the loop runs
  at::Generator gen_;
  std::unique_ptr<TrainingPath> path_;
  torch::Tensor features_;
  torch::Tensor targets_;
  torch::Tensor val_features_;
  torch::Tensor val_targets_;
  torch::Tensor train_index_;  // fraction only: the rows that train, in split order
  torch::Tensor val_index_;    // fraction only: the rows that validate
  int64_t rows_ = 0;           // training rows
  int64_t val_rows_ = 0;
  int64_t batch_ = 1;
  bool classification_ = false;
  int32_t epoch_ = 0;  // the last epoch begun (a resumed job's checkpoint epoch before its first)
  double learning_rate_ = 0.0;
  // Early stopping is decided on the host from values that the epoch's one transfer brought.
  double best_val_loss_ = std::numeric_limits<double>::infinity();
  int32_t epochs_without_improvement_ = 0;
  std::optional<EpochBatches> batches_;
  std::optional<EpochBatches> val_batches_;
  int val_loss_at_ = -1;  // each value's place in the transfer; -1 when the job has no such value
  int val_accuracy_at_ = -1;
  int extra_at_ = 0;
  int value_count_ = 0;
};

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
      const int64_t peak = std::max<int64_t>(0, PeakAllocatedBytes(device) - allocated_at_start);
      deliver(i, members[i]->TakeOutcome(loop_start, peak));
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
