// The training loop of one job on one device, built on the seed question's lessons: the dataset
// is already on the device, each epoch's permutation is generated there, a batch is a device-side
// gather, and the epoch's mean loss is reduced on the device and copied to the host exactly once
// (with the validation loss and accuracy, when the job validates, in the same copy).
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/model_spec.h"
#include "server/engine/datasets/dataset_registry.h"
#include "server/engine/training/exported_program.h"
#include "server/engine/training/training_outcome.h"
#include "server/engine/training/training_path.h"
#include "server/engine/types.h"

namespace trainerd::engine {

struct TrainingRun {
  JobSpec spec;     // resolved: seed set
  ModelSpec model;  // parsed and checked against the dataset
  // Bring your own model: the job's TorchScript module (checked at Submit, on the CPU), trained in
  // place instead of a model built from `model` (then empty). Its parameters are all trained;
  // its buffers are moved to the device and kept (a batchnorm's running statistics update as in
  // PyTorch's training mode). Null for a spec-built model.
  std::shared_ptr<torch::jit::Module> torchscript;
  // Bring your own model as an exported program (exported_program.h), trained in place as a
  // TorchScript module is (its parameters all train, its buffers kept); null otherwise.
  std::shared_ptr<ExportedProgram> exported;
  // Whether the job trains a submitted module (TorchScript or exported program).
  bool submitted_module() const { return torchscript != nullptr || exported != nullptr; }
  std::shared_ptr<const Dataset> dataset;  // resident tensors
  // spec.validation_dataset's tensors (same per-row shapes and dtype as `dataset`); null when the
  // job validates on a fraction of `dataset` (spec.validation_fraction) or not at all.
  std::shared_ptr<const Dataset> validation_dataset;
  torch::Device device = torch::kCPU;
  // > 0: the job's intra-op threads (cpu_threads.h), set on the calling thread before the job's
  // first operator; 0 leaves the thread's setting as it is.
  int intra_op_threads = 0;
  // Subnormal floats flush to zero on the calling thread while the job runs (cpu_threads.h,
  // SetFlushDenormal); set for every job, so that one job's setting never carries to the next.
  bool flush_denormal = true;
  // The nice value a CPU job's training thread runs at (cpu_threads.h, LowerThreadPriority), so
  // that the threads answering RPCs come first; 0: the daemon's own. Ignored on a GPU.
  int cpu_nice = 0;
  // Set by another thread to stop before the next step (a host flag: no device sync).
  const std::atomic<bool>* cancel = nullptr;
  // Set by another thread to stop without ending the job (outcome.interrupted): `drain` after the
  // current epoch, with a checkpoint of it (written even when checkpoint_every would not, given a
  // checkpoint_dir); `interrupt` before the next step, to resume from the last checkpoint.
  const std::atomic<bool>* drain = nullptr;
  const std::atomic<bool>* interrupt = nullptr;
  // A job taken up again: the checkpoint it resumes from (model, optimizer, loss scaler, the
  // generator and the loop's counters), so that it goes on exactly as if it had never stopped.
  // Empty: from epoch 1.
  std::string resume_from;
  // The checkpoint's bytes, when they are in memory already (a data-parallel job's ranks, which
  // all resume from the bytes rank 0 read or sent them): read instead of the file, which
  // `resume_from` then only names in messages.
  std::shared_ptr<const std::string> resume_bytes;
  // Called on the training thread after each epoch's single host transfer, with the running
  // totals of steps and host synchronisations.
  std::function<void(const EpochResult&, int64_t steps, int64_t host_syncs)> on_epoch;
  // A pack's events published together (set by the owner of a pack's runs, on every run): called
  // once after every member's on_epoch for one epoch of the pack, before any member's outcome is
  // delivered, and once after the outcomes delivered together, so that the owner may have had
  // on_epoch (and its own end of a run) only queue each member's event and now publish them all
  // in one write. Returns the members whose event could not be published, each with why: those
  // still running fail, as a member whose on_epoch threw does. Unset: nothing is called.
  std::function<std::vector<std::pair<const TrainingRun*, std::exception_ptr>>()> flush_epochs;
  // A sweep's halving (JobSpec::halving): asked after each epoch's transfer, before on_epoch;
  // a reason stops the job after this epoch (SUCCEEDED, stopped early, the reason recorded).
  std::function<std::optional<std::string>(const EpochResult&)> stop_at_rung;
  // spec.checkpoint_every > 0: the job's checkpoint folder (<data_dir>/checkpoints/<job-id>),
  // created when the first checkpoint is written; empty means checkpoints are not written.
  std::string checkpoint_dir;
  // Called on the training thread after each checkpoint file is complete (before that epoch's
  // on_epoch), with the epoch, the file's name within checkpoint_dir and its size. The totals
  // passed to on_epoch (steps, host syncs) and EpochResult::elapsed_seconds include a resumed
  // job's earlier runs.
  std::function<void(int32_t epoch, const std::string& file_name, int64_t size_bytes)>
      on_checkpoint;
  // Called on the training thread when a checkpoint cannot be written (a full disk, an I/O
  // error), with the epoch and why. The job goes on without it: a checkpoint is insurance, and a
  // disk that fills up must not end a long job that would otherwise finish. A resume then starts
  // from the last checkpoint that was written.
  std::function<void(int32_t epoch, const std::string& why)> on_checkpoint_failed;
  // Asked on the training thread before each checkpoint is written; an error (the owner's disk
  // quota, disk_quota.h) skips that checkpoint as a failed write does: on_checkpoint_failed with
  // its sentence, and the job goes on. Unset: every checkpoint is written.
  std::function<absl::Status()> may_checkpoint;
  // A pack on the CPU runs each member on its own path, in turn, so that every member's values
  // are the job alone's to the last bit; true stacks the pack there too (stacked_path.h, the
  // path a GPU's packs take), so that machines without a GPU test that path. Read from the
  // pack's first member; a job alone ignores it.
  bool stack_on_cpu = false;
};

// Runs the whole job on the calling thread. Never throws: LibTorch errors become kFailed with a
// sentence (out-of-memory named as such).
TrainingOutcome RunTraining(const TrainingRun& run);

// What a data-parallel job's rank needs of its group (distributed/data_parallel.h has the one on
// c10d): the gradient exchange of every step, and a sum of the epoch's values over the ranks.
// Methods throw (std::exception) when the ranks cannot combine.
class RankComms : public GradientExchange {
 public:
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sums `values` (a contiguous float64 CPU tensor) over the ranks, in place.
  virtual void AllReduceSum(torch::Tensor& values) = 0;
  // This rank's wish to stop (a cancel, an interrupt), carried by the next Exchange; after it,
  // agreed_stop() says whether any rank wished it: every rank stops after the same step.
  struct StopVote {
    bool cancel = false;
    bool interrupt = false;
  };
  virtual void VoteStop(StopVote vote) = 0;
  virtual StopVote agreed_stop() const = 0;
};

// Why a job cannot train as ranks today ("" when it can): ranks train on the CPU (Gloo; NCCL for
// GPUs is not wired yet), on the LibTorch path in float32, from a text-spec model without dropout
// (each rank's masks would draw from the generator that shuffles, and the ranks' orders would part)
// or batchnorm (its statistics would be each rank's slice's, not the global batch's). Checked at
// admission (as INVALID_ARGUMENT, or FAILED_PRECONDITION for the device) and again by RunRank.
std::string DataParallelSpecUnsupported(const JobSpec& spec, const ModelSpec& model,
                                        bool torchscript, const torch::Device& device);
std::string DataParallelUnsupported(const TrainingRun& run);

// Rank comms.rank() of a data-parallel job (run.spec.replicas = comms.world_size()) on the
// calling thread: the job's loop on the LibTorch path, each step on the rank's slice of the global
// batch of world_size * batch_size rows of the epoch's order (slices of ceil(rows / world_size),
// the last ones shorter or empty), its gradients exchanged before the update; validation split
// alike; the epoch's values summed over the ranks in one all-reduce before the one transfer, so
// that every rank sees the same losses and takes the same decisions (a NaN, an early stop). Rank
// 0 reports the epochs, writes the checkpoints and exports the model; the others are silent. The
// job then trains as one rank with batch world_size * batch_size and the same seed does, within
// float32 rounding. Never throws.
TrainingOutcome RunRank(const TrainingRun& run, RankComms& comms);

// Why `member` cannot train in one pack with `lead` ("" when it can): packed members share the
// dataset, the device, the model, the batch size, the epochs and the validation split's size (a
// sweep's members differ only in learning rate, momentum, weight decay and seed); a TorchScript
// job and a job taken up again from a checkpoint train alone.
std::string PackUnsupported(const TrainingRun& lead, const TrainingRun& member);
// The specs' part of it: whether two members' specs differ only in what a pack varies (learning
// rate, momentum, weight decay, seed); how a sweep's members are grouped into packs when it is
// queued (JobManager::EnqueueSweep).
std::string SpecsPackUnsupported(const JobSpec& a, const JobSpec& b);

// A sweep's members trained together as one pack on the calling thread: one epoch loop whose
// steps run every member's step in turn, and whose epochs bring every member's values to the host
// in one transfer. Each member keeps its own generator (initial weights, shuffle, validation
// split), optimizer, schedule, cancel flag and callbacks, so that its results are those of the
// same job run alone (RunTraining is a pack of one). A member that fails (a NaN loss, an error in
// its step) or is cancelled ends alone; the others go on. `deliver` is called once per member, on
// the calling thread, with its index in `runs` and its outcome, as soon as that member's run
// ended. The pack takes runs.front()'s intra-op threads. Members that cannot share a pack
// (PackUnsupported) run alone one after another.
void RunPackedTraining(const std::vector<const TrainingRun*>& runs,
                       const std::function<void(size_t, TrainingOutcome)>& deliver);

}  // namespace trainerd::engine
