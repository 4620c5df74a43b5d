// The seam between a job's epoch loop (trainer.cc: schedule, shuffle, validation order, the epoch's
// one host transfer, checkpoints, early stop, drain) and the way its steps run. Each way is a
// TrainingPath in a file of its own: today LibTorch eager (libtorch_path.cc); fused kernels, CUDA
// graphs and packed sweeps implement the same interface, so that the loop, and every test that
// drives it, runs any path, and a new path touches nothing else.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "server/engine/training/checkpoint.h"
#include "server/engine/types.h"

namespace trainerd::engine {

struct TrainingRun;
struct TrainingOutcome;

// Every copy from the device to the host goes through here, so host_syncs is an exact count.
// It also times them: on a GPU a copy waits for the kernels queued before it, so the time is
// an upper bound on the copy itself (DeviceReport says so).
class HostTransfers {
 public:
  torch::Tensor ToHost(const torch::Tensor& t) {
    ++count_;
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor out = t.to(torch::kCPU);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  void CountCrossDeviceCopy() { ++count_; }
  // A transfer made for several jobs at once (a pack's epoch values), `seconds` long: counted as
  // one of this job's.
  void CountShared(double seconds) {
    ++count_;
    seconds_ += seconds;
  }
  // A resumed job's copies before this run.
  void AddEarlierCount(int64_t count) { count_ += count; }
  void AddSeconds(double seconds) { seconds_ += seconds; }
  int64_t count() const { return count_; }
  double seconds() const { return seconds_; }

 private:
  int64_t count_ = 0;
  double seconds_ = 0.0;
};

// A batch: rows [offset, offset + rows) of `features` and `targets`, which are the epoch's
// gathered chunk (or the resident tensors themselves, unshuffled), contiguous. A path that reads
// memory directly takes the range; x() and y() make the views for one that wants tensors.
struct BatchView {
  const torch::Tensor* features = nullptr;
  const torch::Tensor* targets = nullptr;
  int64_t offset = 0;
  int64_t rows = 0;

  torch::Tensor x() const { return features->narrow(/*dim=*/0, offset, rows); }
  torch::Tensor y() const { return targets->narrow(/*dim=*/0, offset, rows); }
};

// How a data-parallel job's ranks combine their gradients between backward and the optimizer's
// update (distributed/gradient_exchange.h is the one on c10d). Each rank's path computes
// the gradients of its slice's mean loss, `rows` rows of the step's global batch; Exchange leaves
// in `gradients`, on every rank, their rows-weighted mean over the ranks: the gradients of the
// global batch's mean loss, what one process training on the whole global batch computes. Called
// on the path's thread once per step, in the same order on every rank; throws (std::exception)
// when the ranks cannot combine (a rank left, a timeout), which fails the job.
class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  virtual void Exchange(const std::vector<torch::Tensor>& gradients, int64_t rows) = 0;
};

// One way of running a job's steps. The loop calls, per epoch: SetLearningRate, BeginEpoch,
// Step for each batch (under a per-step schedule, SetLearningRate before any step whose rate
// differs from the last), then (with validation) BeginValidation, ValidateBatch for each batch,
// EndValidation; then it stacks EpochValues() into the epoch's one transfer and hands the values
// after the loop's own back to AfterTransfer. Nothing a path does inside an epoch may read a device
// value on the host. Used on the job's one worker thread; methods may throw c10::Error (the loop
// turns it into a failed job).
class TrainingPath {
 public:
  virtual ~TrainingPath() = default;

  // The learning rate of the coming steps (the schedule is the loop's): a host scalar, set
  // between steps.
  virtual void SetLearningRate(double learning_rate) = 0;
  // Zeroes the epoch's device-side sums.
  virtual void BeginEpoch() = 0;
  // One optimizer step on a batch; adds its mean loss times its rows to the epoch's loss sum.
  virtual void Step(const BatchView& batch) = 0;
  // Gradient accumulation (JobSpec.gradient_accumulation_steps = n > 1): a batch's part of an
  // optimizer step. `first`: the gradients are zeroed before; the batch's mean loss divided by n
  // is backpropagated into them; `last`: then the step (fp16's unscaling and check, clipping, the
  // update) on the accumulated gradients. Adds the batch's undivided mean loss times its rows to
  // the epoch's loss sum. Only the LibTorch path accumulates (the others' jobs are refused it:
  // FusedPathUnsupported, StackedPathUnsupported); the default throws.
  virtual void AccumulationStep(const BatchView& batch, bool first, bool last, int32_t n);
  // The validation pass: eval mode (dropout off, batchnorm on running statistics), no autograd;
  // each batch adds its loss times its rows, and for a class loss its correct count, to sums.
  virtual void BeginValidation() = 0;
  virtual void ValidateBatch(const BatchView& batch) = 0;
  virtual void EndValidation() = 0;
  // The epoch's device sums (float64 or int64 scalars): the training loss sum, the validation loss
  // sum and correct count (defined after a validation pass).
  virtual torch::Tensor loss_sum() const = 0;
  virtual torch::Tensor validation_loss_sum() const = 0;
  virtual torch::Tensor validation_correct() const = 0;
  // Further float64 scalars the path wants in the epoch's transfer (fp16's loss scale and skipped
  // steps), and what it does with their values once they arrived.
  virtual std::vector<torch::Tensor> ExtraEpochValues() = 0;
  virtual void AfterTransfer(const double* extra_values) = 0;

  // A data-parallel job's rank: `exchange` (outliving the path) combines every step's gradients
  // with the other ranks' after backward (and after fp16's unscaling, so that an overflow on one
  // rank skips the step on all) and before clipping and the update, so that clipping sees the
  // global batch's gradients as one process would. False for a path that cannot (the fused and
  // stacked paths, today): the job must then run on one that can. With an exchange, a Step on no
  // rows (a rank's empty slice of a short last global batch) still exchanges and updates.
  virtual bool SetGradientExchange(GradientExchange* exchange) { return false; }
  // The model's parameters and buffers (batchnorm's running statistics), in an order fixed for
  // the path's life: the tensors themselves (or views of them), so that copying into them under
  // NoGradGuard sets the model. The loop keeps the best validation epoch's weights by copying
  // these on the device, and puts them back before Finish (JobSpec::model_from).
  virtual std::vector<torch::Tensor> ModelTensors() = 0;
  // Checkpoints: the model, the optimizer and the path's own state with the loop's `state`.
  virtual absl::StatusOr<int64_t> WriteCheckpoint(const std::string& path,
                                                  const LoopState& state) = 0;
  // `bytes`, when set: the checkpoint already in memory, read instead of `path` (which then only
  // names it).
  virtual absl::StatusOr<LoopState> ReadCheckpoint(const std::string& path,
                                                   const std::string* bytes) = 0;

  // After the last epoch: the trained model as a TorchScript archive, with the parameter count
  // and (small models) the parameters' values in `outcome`; counts its copies in `host`.
  virtual absl::StatusOr<std::string> Finish(HostTransfers& host, TrainingOutcome& outcome) = 0;
};

// The job's model built from its spec with its seed's initial weights (LibTorch's global CPU
// generator seeded under a process-wide lock; `gen`, the job's generator, for layers that draw),
// on `run.device`. Every path that trains a spec-built model starts from it.
torch::nn::Sequential BuildSeededModel(const TrainingRun& run, at::Generator& gen);

// The end of a job, shared by the paths: the parameter count and, for a small model (at most
// kMaxReportedParameters values), the values of `parameters` as float32 in `outcome`; true when
// the values were read back.
bool ReportParameters(const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                      TrainingOutcome& outcome);

// The end of a spec-built model's job: its state copied to the host (one counted transfer off the
// CPU; on the CPU the read-back of a small model counts as one), its parameters reported, its
// state_dict as safetensors in outcome.state_dict, and its TorchScript export (returned).
absl::StatusOr<std::string> FinishSequential(const torch::nn::Sequential& model,
                                             const ModelSpec& spec,
                                             const std::vector<int64_t>& feature_shape,
                                             const torch::Device& device, HostTransfers& host,
                                             TrainingOutcome& outcome);

// The LibTorch eager path (libtorch_path.cc): a Sequential built from the spec, or the job's
// TorchScript module, with LibTorch's optimizers, autocast and loss scaling. Builds the model on
// `device` with the job's seed; `gen` is the job's generator (dropout draws from it).
std::unique_ptr<TrainingPath> MakeLibTorchPath(const TrainingRun& run, at::Generator gen);

}  // namespace trainerd::engine
