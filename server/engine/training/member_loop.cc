// MemberLoop's steps (member_loop.h): a job's setup, epochs, validation, the epoch's one host
// transfer and what follows it (checkpoint, early stop, publishing), and its end. Moved out of
// trainer.cc, which drives the members of a pack through these calls.
#include "server/engine/training/member_loop.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
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
#include "server/engine/training/loss.h"
#include "server/engine/training/optimizer.h"
#include "server/engine/training/stacked_path.h"
#include "server/engine/training/training_path.h"

namespace trainerd::engine::trainer_internal {
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

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

namespace {

// dst[r] = src[index[r]] for rows of T; false (nothing promised of dst) when an index is out of
// range, which index_select then reports.
template <typename T>
bool CopyRows(const T* src, int64_t rows, const int64_t* index, int64_t n, int64_t per_row,
              T* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const int64_t from = index[r];
    if (from < 0 || from >= rows) return false;
    const T* row = src + from * per_row;
    for (int64_t k = 0; k < per_row; ++k) dst[r * per_row + k] = row[k];
  }
  return true;
}

}  // namespace

torch::Tensor GatherRows(const torch::Tensor& source, const torch::Tensor& index) {
  const bool plain = source.device().is_cpu() && index.device().is_cpu() && source.dim() >= 1 &&
                     source.is_contiguous() && index.scalar_type() == torch::kInt64 &&
                     index.dim() == 1 && index.is_contiguous();
  if (plain) {
    const int64_t rows = source.size(0);
    const int64_t n = index.size(0);
    std::vector<int64_t> shape = source.sizes().vec();
    shape[0] = n;
    torch::Tensor out = torch::empty(shape, source.options());
    const int64_t row_bytes = rows > 0 ? static_cast<int64_t>(source.nbytes()) / rows : 0;
    const auto* src = static_cast<const char*>(source.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    const int64_t* idx = index.data_ptr<int64_t>();
    bool copied = false;
    // Typed by the widest word that divides a row and aligns both tensors' data.
    const auto aligned = [&](uintptr_t word) {
      return row_bytes % word == 0 && reinterpret_cast<uintptr_t>(src) % word == 0 &&
             reinterpret_cast<uintptr_t>(dst) % word == 0;
    };
    if (aligned(8)) {
      copied = CopyRows(reinterpret_cast<const uint64_t*>(src), rows, idx, n, row_bytes / 8,
                        reinterpret_cast<uint64_t*>(dst));
    } else if (aligned(4)) {
      copied = CopyRows(reinterpret_cast<const uint32_t*>(src), rows, idx, n, row_bytes / 4,
                        reinterpret_cast<uint32_t*>(dst));
    } else {
      copied = CopyRows(src, rows, idx, n, row_bytes, dst);
    }
    if (copied) return out;
  }
  return source.index_select(/*dim=*/0, index);
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

// Whether the job's steps run on the fused path; `reason` says why not when engine auto cannot.
bool TakesFusedPath(const TrainingRun& run, std::string* reason) {
  const JobSpec& spec = run.spec;
  const DatasetMeta& meta = run.dataset->meta;
  std::string not_fused = FusedPathUnsupported(spec, run.model, meta.feature_shape,
                                               run.submitted_module(), run.device);
  if (not_fused.empty() && spec.engine == EngineKind::kAuto) {
    const int64_t train_rows = meta.rows - HeldOutRows(spec.validation_fraction, meta.rows);
    not_fused = FusedPathSlower(run.model, meta.feature_shape,
                                std::max<int64_t>(1, std::min(spec.batch_size, train_rows)));
  }
  *reason = not_fused;
  return spec.engine != EngineKind::kLibTorch && not_fused.empty();
}

bool MemberLoop::Setup(const torch::Tensor& features, const torch::Tensor& targets,
                       StackedPack* pack, size_t index, int64_t world) {
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
    absl::StatusOr<LoopState> state =
        path_->ReadCheckpoint(run_.resume_from, run_.resume_bytes.get());
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
  //    The split is one permutation of the rows drawn on the CPU from a generator of its own
  //    seeded with the job's split seed (its seed unless it names one), whatever the device: rows -
  //    HeldOutRows(f, rows) train (the product rounded half away from zero), the rest validate.
  //    That is torch.randperm(rows, generator=torch.Generator().manual_seed(seed)) in PyTorch (the
  //    same LibTorch), so that a caller can recover the held-out rows and evaluate the trained
  //    model on them (JobSpec.validation_fraction in jobs.proto; Job.validation_rows() in the
  //    Python client). The job's own generator (which the model's set-up may have drawn from) is
  //    left to the shuffles. The split is kept as index tensors (gathered per batch, as shuffled
  //    batches are anyway) rather than as copies, so the resident dataset is never duplicated on
  //    the device.
  //  - Without validation the generator draws exactly what it did before validation existed,
  //    so existing seeds keep their losses.
  val_features_ = features_;
  val_targets_ = targets_;
  const int64_t dataset_rows = features_.size(0);
  rows_ = dataset_rows;
  if (spec_.validation_fraction > 0) {
    val_rows_ = HeldOutRows(spec_.validation_fraction, dataset_rows);
    rows_ = dataset_rows - val_rows_;
    at::Generator split_gen = at::detail::createCPUGenerator(spec_.split_seed.value_or(seed));
    torch::Tensor split =
        torch::randperm(dataset_rows, split_gen, torch::TensorOptions().dtype(torch::kLong))
            .to(index_options.device());
    train_index_ = split.narrow(/*dim=*/0, /*start=*/0, rows_);
    val_index_ = split.narrow(/*dim=*/0, /*start=*/rows_, val_rows_);
    // Without shuffling, both parts are taken in the dataset's order (ascending row index), as
    // "keep the rows in order" says; the held-out set is the same.
    if (!spec_.shuffle) {
      train_index_ = std::get<0>(train_index_.sort());
      val_index_ = std::get<0>(val_index_.sort());
    }
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
  val_divisor_ = static_cast<double>(val_rows_);
  if (classification_ && spec_.ignore_index.has_value() && !CountIgnoredTargets()) return false;
  // A step takes batch * world rows (a data-parallel job's global batch). drop_last leaves out
  // the epoch's short last one (CheckJobSpec saw that a whole batch fits).
  const int64_t step_rows = batch_ * std::max<int64_t>(world, 1);
  epoch_rows_ = spec_.drop_last ? rows_ / step_rows * step_rows : rows_;
  // The schedule's steps per epoch: the epoch's optimizer steps, one per
  // gradient_accumulation_steps batches (the last group may be shorter).
  const int64_t batches = std::max<int64_t>(1, (epoch_rows_ + step_rows - 1) / step_rows);
  const int64_t accumulate = std::max<int64_t>(spec_.gradient_accumulation_steps, 1);
  schedule_.emplace(spec_, (batches + accumulate - 1) / accumulate);
  const int64_t warmup_steps = spec_.schedule.warmup_steps;
  if (schedule_->per_step() && warmup_steps > 0 && warmup_steps >= schedule_->total_units()) {
    return End(JobState::kFailed,
               absl::StrCat("warm-up steps (", warmup_steps, ") must be fewer than the job's steps (",
                            schedule_->total_units(), ": ", spec_.epochs, " epochs of ",
                            schedule_->total_units() / std::max(spec_.epochs, 1), ")"));
  }
  keep_best_ = spec_.hands_back_best() && val_rows_ > 0;
  if (!run_.resume_from.empty()) {
    if (resumed.plateau_rate > 0) {
      schedule_->set_plateau({resumed.plateau_rate, resumed.plateau_best,
                              resumed.plateau_bad_epochs, resumed.plateau_cooldown_left});
    }
    best_val_loss_ = resumed.best_validation_loss;
    best_val_accuracy_ = resumed.best_validation_accuracy;
    epochs_without_improvement_ = resumed.epochs_without_improvement;
    best_epoch_ = resumed.best_epoch;
    // The best epoch's weights as the checkpoint kept them. A checkpoint without them (an older
    // build's, or a job that kept none) leaves the best to the epochs after the resume: the model
    // handed back is the best of those, or the last.
    if (keep_best_ && !resumed.best_model.empty()) {
      const std::vector<torch::Tensor> now = path_->ModelTensors();
      if (resumed.best_model.size() != now.size()) {
        return End(JobState::kFailed,
                   absl::StrCat("cannot resume from checkpoint '", run_.resume_from, "': it keeps ",
                                resumed.best_model.size(), " best-epoch tensors; the model has ",
                                now.size()));
      }
      for (size_t k = 0; k < now.size(); ++k) {
        if (!resumed.best_model[k].sizes().equals(now[k].sizes()) ||
            resumed.best_model[k].scalar_type() != now[k].scalar_type()) {
          return End(JobState::kFailed,
                     absl::StrCat("cannot resume from checkpoint '", run_.resume_from,
                                  "': its best-epoch tensor ", k, " is shaped ",
                                  c10::str(resumed.best_model[k].sizes()), "; the model's is ",
                                  c10::str(now[k].sizes())));
        }
      }
      best_model_ = std::move(resumed.best_model);
    } else if (keep_best_) {
      best_epoch_ = 0;
    }
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

// With ignore_index: the targets CheckLoss could not rule out from the dataset's range (negative
// ones other than the ignore_index) fail the job here, before its first step, and the validation
// rows not ignored become the validation sums' divisor. One transfer, counted.
bool MemberLoop::CountIgnoredTargets() {
  const int64_t ignore = *spec_.ignore_index;
  std::vector<torch::Tensor> counts = {IgnoredTargetCounts(spec_, targets_)};
  const bool own_validation = run_.validation_dataset != nullptr && val_rows_ > 0;
  if (val_index_.defined()) {
    counts.push_back(IgnoredTargetCounts(spec_, targets_.index_select(/*dim=*/0, val_index_)));
  } else if (own_validation) {
    counts.push_back(IgnoredTargetCounts(spec_, val_targets_));
  }
  const torch::Tensor host = host_.ToHost(torch::cat(counts));
  const int64_t* value = host.data_ptr<int64_t>();
  const bool has_validation = counts.size() > 1;
  const int64_t invalid = value[1] + (own_validation ? value[3] : 0);
  if (invalid > 0) {
    const std::string name = own_validation && value[1] == 0 ? run_.validation_dataset->meta.name
                                                             : run_.dataset->meta.name;
    return End(JobState::kFailed,
               absl::StrCat("dataset '", name, "' has ", invalid,
                            " negative class target(s) that are not the ignore_index ", ignore,
                            "; a class target is 0..classes-1 or the ignore_index"));
  }
  if (has_validation) {
    if (value[2] == 0) {
      return End(JobState::kFailed,
                 absl::StrCat("every validation row's target is the ignore_index ", ignore,
                              ": there is nothing to validate on"));
    }
    val_divisor_ = static_cast<double>(value[2]);
  }
  return true;
}

bool MemberLoop::Cancelled() {
  if (run_.interrupt != nullptr && run_.interrupt->load(std::memory_order_relaxed)) {
    outcome_.interrupted = true;
    End(JobState::kRunning, "");
    return true;
  }
  if (run_.cancel == nullptr || !run_.cancel->load(std::memory_order_relaxed)) return false;
  End(JobState::kCancelled, "");
  return true;
}

void MemberLoop::BeginEpoch() {
  ++epoch_;
  // The schedule is host arithmetic on the epoch and step numbers (and, for plateau, on the
  // validation losses that the epochs' transfers brought): no device value is read.
  learning_rate_ = schedule_->Rate(epoch_, outcome_.steps);
  step_learning_rate_ = learning_rate_;
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

std::vector<torch::Tensor> MemberLoop::EpochValues() {
  batches_.reset();
  val_batches_.reset();
  std::vector<torch::Tensor> reduced = {path_->loss_sum() / static_cast<double>(epoch_rows_)};
  val_loss_at_ = -1;
  val_accuracy_at_ = -1;
  if (val_rows_ > 0) {
    val_loss_at_ = static_cast<int>(reduced.size());
    reduced.push_back(path_->validation_loss_sum() / val_divisor_);
    if (classification_) {
      val_accuracy_at_ = static_cast<int>(reduced.size());
      reduced.push_back(path_->validation_correct().to(torch::kFloat64) / val_divisor_);
    }
  }
  extra_at_ = static_cast<int>(reduced.size());
  for (torch::Tensor& value : path_->ExtraEpochValues()) {
    reduced.push_back(value.to(torch::kFloat64));
  }
  value_count_ = static_cast<int>(reduced.size());
  return reduced;
}

bool MemberLoop::AfterTransfer(const double* value) {
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
      return End(JobState::kFailed,
                 absl::StrCat("validation loss became ", std::isnan(val_loss) ? "NaN" : "infinite",
                              " at epoch ", epoch_, " (training loss ", mean_loss, ")"));
    }
    result.validation_loss = val_loss;
    if (val_accuracy_at_ >= 0) result.validation_accuracy = value[val_accuracy_at_];
    schedule_->EndEpoch(val_loss);
    // An improvement beats the best by more than min_delta, and only an improvement moves the
    // best (Keras' and Lightning's EarlyStopping).
    const double min_delta = spec_.early_stop_min_delta;
    bool improved = false;
    if (spec_.early_stop_metric == EarlyStopMetric::kValidationAccuracy &&
        result.validation_accuracy.has_value()) {
      improved = *result.validation_accuracy - min_delta > best_val_accuracy_;
      if (improved) best_val_accuracy_ = *result.validation_accuracy;
    } else {
      improved = val_loss + min_delta < best_val_loss_;
      if (improved) best_val_loss_ = val_loss;
    }
    if (improved) {
      epochs_without_improvement_ = 0;
      best_epoch_ = epoch_;
      if (keep_best_) KeepBest();
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
  bool stops_early =
      patience > 0 && epochs_without_improvement_ >= patience && epoch_ < spec_.epochs;
  std::string stop_reason;
  if (stops_early) {
    stop_reason = absl::StrCat("no better validation metric in ", patience, " epochs (patience)");
  } else if (run_.stop_at_rung && epoch_ < spec_.epochs) {
    if (std::optional<std::string> behind = run_.stop_at_rung(result)) {
      stops_early = true;
      stop_reason = *std::move(behind);
    }
  }
  const bool draining = run_.drain != nullptr && run_.drain->load(std::memory_order_relaxed) &&
                        epoch_ < spec_.epochs && !stops_early && !run_.checkpoint_dir.empty();
  if (!run_.checkpoint_dir.empty() &&
      (draining || (spec_.checkpoint_every > 0 && epoch_ % spec_.checkpoint_every == 0))) {
    const std::string file_name = CheckpointFileName(epoch_);
    const absl::Status allowed = run_.may_checkpoint ? run_.may_checkpoint() : absl::OkStatus();
    if (!allowed.ok()) {
      const std::string why =
          absl::StrCat("the checkpoint of epoch ", epoch_, " was not written: ", allowed.message());
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
      state.best_validation_accuracy = best_val_accuracy_;
      state.epochs_without_improvement = epochs_without_improvement_;
      state.best_epoch = best_epoch_;
      if (keep_best_) state.best_model = best_model_;
      if (spec_.schedule.kind == ScheduleKind::kPlateau) {
        const PlateauState& plateau = schedule_->plateau();
        state.plateau_rate = plateau.rate;
        state.plateau_best = plateau.best;
        state.plateau_bad_epochs = plateau.bad_epochs;
        state.plateau_cooldown_left = plateau.cooldown_left;
      }
      absl::StatusOr<int64_t> size =
          path_->WriteCheckpoint(absl::StrCat(run_.checkpoint_dir, "/", file_name), state);
      outcome_.checkpoint_seconds += SecondsSince(checkpoint_start);
      if (!size.ok()) {
        const std::string why = absl::StrCat("cannot write the checkpoint of epoch ", epoch_, ": ",
                                             size.status().message());
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
    outcome_.stop_reason = std::move(stop_reason);
    stopped_ = true;
  }
  return true;
}

// The best epoch's weights copied aside on the device (the first time, allocated by the clone).
// Queued on the job's stream after the epoch's steps: nothing is read on the host.
void MemberLoop::KeepBest() {
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> now = path_->ModelTensors();
  if (best_model_.size() != now.size()) {
    best_model_.clear();
    for (const torch::Tensor& t : now) best_model_.push_back(t.detach().clone());
    return;
  }
  for (size_t k = 0; k < now.size(); ++k) best_model_[k].copy_(now[k]);
}

void MemberLoop::Finish() {
  loop_end_seconds_ = SecondsSince(start_);
  outcome_.loop_host_transfer_seconds = host_.seconds();
  outcome_.best_epoch = best_epoch_;
  outcome_.model_epoch = epoch_;
  if (keep_best_ && !best_model_.empty() && best_epoch_ > 0) {
    outcome_.model_epoch = best_epoch_;
    if (best_epoch_ != epoch_) {
      torch::NoGradGuard no_grad;
      const std::vector<torch::Tensor> now = path_->ModelTensors();
      for (size_t k = 0; k < now.size(); ++k) now[k].copy_(best_model_[k]);
    }
    best_model_.clear();
  }
  absl::StatusOr<std::string> archive = path_->Finish(host_, outcome_);
  if (!archive.ok()) {
    End(JobState::kFailed, std::string(archive.status().message()));
    return;
  }
  outcome_.model_archive = *std::move(archive);
  End(JobState::kSucceeded, "");
}

bool MemberLoop::End(JobState state, std::string error) {
  if (ended_) return false;
  ended_ = true;
  outcome_.state = state;
  if (!error.empty()) outcome_.error = std::move(error);
  batches_.reset();
  val_batches_.reset();
  best_model_.clear();
  path_.reset();
  return false;
}

void MemberLoop::Fail(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError&) {
    End(JobState::kFailed, "");  // frees the member's tensors before the cache goes
    ReleaseCachedMemory(run_.device);
    outcome_.error = absl::StrCat("out of memory on ", DeviceName(run_.device), " at epoch ",
                                  outcome_.epochs_done + 1, "; try a smaller batch size or model");
  } catch (const std::bad_alloc&) {
    End(JobState::kFailed,
        absl::StrCat("out of host memory (std::bad_alloc) at epoch ", outcome_.epochs_done + 1,
                     "; try a smaller batch size or model"));
  } catch (const std::exception& e) {
    End(JobState::kFailed,
        absl::StrCat("training failed at epoch ", outcome_.epochs_done + 1, ": ", FirstLineOf(e)));
  } catch (...) {
    End(JobState::kFailed, absl::StrCat("training failed at epoch ", outcome_.epochs_done + 1));
  }
}

TrainingOutcome MemberLoop::TakeOutcome(std::optional<Clock::time_point> loop_start,
                                        int64_t peak_bytes) {
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

}  // namespace trainerd::engine::trainer_internal
