// One job's epoch loop as the trainer drives it (trainer.cc, RunMembers): MemberLoop, cut at the
// points where a pack of jobs meets, and EpochBatches, an epoch's batches gathered on the device.
// Internal to the training room: only trainer.cc and member_loop.cc include it (and its test).
// No locks: a MemberLoop belongs to the one job thread that runs its pack.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/engine/training/optimizer.h"
#include "server/engine/training/stacked_path.h"
#include "server/engine/training/trainer.h"
#include "server/engine/training/training_path.h"

namespace trainerd::engine::trainer_internal {

using Clock = std::chrono::steady_clock;

// Rows are gathered for a chunk of whole batches at a time, at most this many bytes of features
// and targets (or one batch, when a batch is larger): a dataset under it is gathered once per
// epoch. Bounded so that a job on a large dataset holds one more chunk, not a second copy of its
// data; a few percent of what a job on such a dataset holds anyway.
constexpr int64_t kGatherChunkBytes = int64_t{16} << 20;

// Rows `index` (int64) of `source` along dim 0: what index_select gives. On the CPU, for a
// contiguous source, a copy loop typed by the row's size: index_select copies a row at a time
// through memmove, which for the few bytes a row of a small model's data holds costs more than
// the steps that use them (the seed's 64-member sweep spent more on it than on training).
torch::Tensor GatherRows(const torch::Tensor& source, const torch::Tensor& index);

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
      chunk_features_ = GatherRows(features_, idx);
      chunk_targets_ = GatherRows(targets_, idx);
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

// A GPU job runs on a CUDA stream of its own, so that jobs sharing a device overlap their
// kernels instead of queueing behind each other on the default stream. The stream first waits
// (on the device, not the host) for the work queued before it on the default stream, e.g. the
// copy that made the dataset resident.
std::optional<c10::cuda::CUDAStream> JobStream(const torch::Device& device);

// Whether the job's steps run on the fused path; `reason` says why not when engine auto cannot.
bool TakesFusedPath(const TrainingRun& run, std::string* reason);

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
  // The rows an epoch trains on: rows(), or with drop_last the whole batches of them (of
  // batch() * world rows for a data-parallel rank: Setup).
  int64_t epoch_rows() const { return epoch_rows_; }
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
  // `world`: the data-parallel ranks that share each step (1 alone): a step takes batch * world
  // rows, which sets the steps of an epoch for a per-step schedule.
  bool Setup(const torch::Tensor& features, const torch::Tensor& targets, StackedPack* pack,
             size_t index, int64_t world = 1);

  // A cancel or an interrupt seen before a step: ends the member's run (its outcome set).
  bool Cancelled();

  void BeginEpoch();

  // The batch at `begin` of the epoch's order: an optimizer step, or with gradient accumulation
  // (n batches a step) its part of one, the step taken at the n-th batch of a group or the epoch's
  // last.
  void Step(int64_t begin) {
    const BatchView batch = batches_->Get(begin, std::min(batch_, epoch_rows_ - begin));
    const int32_t n = spec_.gradient_accumulation_steps;
    if (n <= 1) {
      ScheduleStep();
      path_->Step(batch);
      ++outcome_.steps;
      return;
    }
    const int64_t index = begin / batch_;
    const bool first = index % n == 0;
    const bool last = (index + 1) % n == 0 || begin + batch_ >= epoch_rows_;
    // A per-step schedule counts optimizer steps: the group's step trains at the rate set at its
    // first batch.
    if (first) ScheduleStep();
    path_->AccumulationStep(batch, first, last, n);
    if (last) ++outcome_.steps;
  }
  // A data-parallel rank's step on rows [begin, begin + len) of the epoch's order (none: a step
  // that only exchanges and updates, training_path.h).
  void StepRows(int64_t begin, int64_t len) {
    ScheduleStep();
    path_->Step(len > 0 ? batches_->Get(begin, len) : BatchView{&features_, &targets_, 0, 0});
    ++outcome_.steps;
  }
  bool SetGradientExchange(GradientExchange* exchange) {
    return path_->SetGradientExchange(exchange);
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
  // A data-parallel rank's share of a validation batch: rows [begin, begin + len), maybe none.
  void ValidateRows(int64_t begin, int64_t len) {
    if (len > 0) path_->ValidateBatch(val_batches_->Get(begin, len));
  }
  void EndValidation() { path_->EndValidation(); }

  // The epoch's values for the one transfer (float64 scalars): training loss, then validation loss
  // and accuracy, then the path's own values (fp16's loss scale and skipped steps).
  std::vector<torch::Tensor> EpochValues();

  // The epoch's values arrived (EpochValues' order). Checks them, checkpoints, publishes the
  // epoch. False when the member's run ended here (a NaN, a failed checkpoint, a drain); an
  // early stop ends the loop (more_epochs() false) with the job still to Finish.
  bool AfterTransfer(const double* value);

  // After the member's last epoch: the trained model, exported.
  void Finish();

  // Ends the member's run with `state` (kRunning: interrupted) and frees its path; returns false,
  // so that `return End(...)` reads as "the run ended".
  bool End(JobState state, std::string error);
  // A LibTorch error or an allocation failure in one of the member's calls.
  void Fail(std::exception_ptr error);

  // The outcome with its times and counts; `loop_start` is when the pack's first step began.
  TrainingOutcome TakeOutcome(std::optional<Clock::time_point> loop_start, int64_t peak_bytes);

 private:
  // A per-step schedule's rate for the coming step (its first was set by BeginEpoch).
  void ScheduleStep() {
    if (!schedule_->per_step()) return;
    const double rate = schedule_->Rate(epoch_, outcome_.steps);
    if (rate != step_learning_rate_) {
      step_learning_rate_ = rate;
      path_->SetLearningRate(rate);
    }
  }

  const TrainingRun& run_;
  const JobSpec& spec_;
  const Clock::time_point start_;
  TrainingOutcome outcome_;
  HostTransfers host_;
  bool ended_ = false;
  bool stopped_ = false;          // early stop: no more epochs, the job still to Finish
  double earlier_seconds_ = 0;    // a resumed job's running time before this run
  double loop_end_seconds_ = -1;  // since start; < 0 while the loop runs
  // Setup's part for ignore_index (member_loop.cc); false when the job ended there.
  bool CountIgnoredTargets();

  at::Generator gen_;
  std::unique_ptr<TrainingPath> path_;
  torch::Tensor features_;
  torch::Tensor targets_;
  torch::Tensor val_features_;
  torch::Tensor val_targets_;
  torch::Tensor train_index_;  // fraction only: the rows that train, in split order
  torch::Tensor val_index_;    // fraction only: the rows that validate
  int64_t rows_ = 0;           // training rows
  int64_t epoch_rows_ = 0;     // the rows each epoch trains on (drop_last: whole batches)
  int64_t val_rows_ = 0;
  // What the validation sums are divided by: val_rows_, or with ignore_index the validation rows
  // whose target is not ignored (counted once, at Setup).
  double val_divisor_ = 0.0;
  int64_t batch_ = 1;
  bool classification_ = false;
  int32_t epoch_ = 0;  // the last epoch begun (a resumed job's checkpoint epoch before its first)
  // The schedule (host arithmetic); the rate of the epoch's first step (EpochResult's) and the
  // rate the path has now.
  std::optional<LearningRateSchedule> schedule_;
  double learning_rate_ = 0.0;
  double step_learning_rate_ = 0.0;
  // Early stopping is decided on the host from values that the epoch's one transfer brought:
  // the best of the watched metric (the loss's or the accuracy's; the other stays at its start).
  double best_val_loss_ = std::numeric_limits<double>::infinity();
  double best_val_accuracy_ = -std::numeric_limits<double>::infinity();
  int32_t epochs_without_improvement_ = 0;
  // The best validation epoch so far (0 before one) and, when the job hands back its best
  // (keep_best_: JobSpec::hands_back_best with validation rows), a device copy of its
  // ModelTensors(), refreshed at each improvement (a copy on the device, no host sync) and put
  // back into the model before Finish.
  int32_t best_epoch_ = 0;
  bool keep_best_ = false;
  std::vector<torch::Tensor> best_model_;
  void KeepBest();
  std::optional<EpochBatches> batches_;
  std::optional<EpochBatches> val_batches_;
  int val_loss_at_ = -1;  // each value's place in the transfer; -1 when the job has no such value
  int val_accuracy_at_ = -1;
  int extra_at_ = 0;
  int value_count_ = 0;
};

}  // namespace trainerd::engine::trainer_internal
