// The engine's domain types: plain C++ values that the service layer converts to and from protos.
// None of them is thread-safe by itself; the engine hands out copies (snapshots).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dataset_header.h"
#include "common/sandbox_report.h"
#include "common/table.h"
#include "server/engine/devices/device_cost.h"
#include "server/engine/devices/speed_report.h"

namespace trainerd::engine {

// What a client declares before streaming a dataset's payload (common/dataset_header.h).
using ::trainerd::DatasetHeader;

// Where a dataset's tensors are now (proto DatasetLocation): resident on its device, or only in
// its file on disk (not loaded yet at start, or evicted to make room), loaded when a job needs it.
// kHost is for a later version that keeps evicted GPU datasets in host memory.
enum class DatasetLocation { kDevice, kHost, kDisk };

// A registered dataset, as listed.
struct DatasetMeta {
  std::string name;
  std::vector<int64_t> feature_shape;
  std::vector<int64_t> target_shape;
  TargetDType target_dtype = TargetDType::kFloat32;
  int64_t rows = 0;
  int64_t size_bytes = 0;  // payload: features + targets
  std::string sha256;      // of the payload
  std::string device;      // the device it is (or will be) resident on, e.g. "cuda:0"
  DatasetLocation location = DatasetLocation::kDevice;
  absl::Time create_time = absl::UnixEpoch();
  // When a job last took it (its upload when none has); kept across restarts as its file's
  // modification time. The registry's to set; an upload's is ignored.
  absl::Time last_used = absl::InfinitePast();
  int64_t target_min = 0;     // int64 targets only: smallest class index
  int64_t target_max = 0;     // int64 targets only: largest class index
  int64_t feature_bytes = 0;  // the features' part of the payload (CheckDatasetHeader)
  std::string owner;          // who uploaded it: a token's name or a certificate's subject;
                              // empty when the daemon runs without authentication
  bool shared = false;        // other tenants' jobs may train on it (ShareDataset)
  // Uploaded here by another daemon (a leader, with its peer credentials) for the ranks or sweep
  // members it runs here, in the name of the tenant who submitted there (DatasetHeader proto's
  // for_peer_jobs): removed once no job has used it for --peer_copy_retention.
  bool peer_copy = false;
};

// Dataset names are per owner (docs/SECURITY.md, "Tenants"). A dataset's key is what the engine,
// the registry and the job records name it by, whoever asks: "OWNER/NAME" for a dataset with an
// owner, the bare "NAME" for one without (uploaded without authentication, or before it was
// turned on). Names cannot contain '/', so a key splits at its last one.
std::string DatasetKey(const std::string& owner, const std::string& name);
inline std::string DatasetKeyOf(const DatasetMeta& meta) {
  return DatasetKey(meta.owner, meta.name);
}
struct DatasetKeyParts {
  std::string owner;  // empty: no owner
  std::string name;
};
DatasetKeyParts SplitDatasetKey(const std::string& key);
// The key of the dataset a caller named `caller_owner` means by `reference`: a bare "NAME" is its
// own, "OWNER/NAME" OWNER's ("/NAME": the one of that name without an owner). INVALID_ARGUMENT
// for a reference of another form (ParseDatasetReference). Whether the caller may see it is
// access.h's question.
absl::StatusOr<std::string> ResolveDatasetReference(const std::string& reference,
                                                    const std::string& caller_owner);
// How a caller named `viewer` names the dataset with key `key`: its own by the bare name, another
// owner's as "OWNER/NAME", one without an owner as "/NAME" (as "NAME" to a caller without a name:
// the one local admin of a daemon without authentication).
std::string DatasetNameFor(const std::string& key, const std::string& viewer);

enum class LossKind { kMse, kCrossEntropy, kL1, kHuber, kBceWithLogits, kNll };
enum class OptimizerKind { kSgd, kAdam, kAdamW, kRmsprop, kNAdam, kRAdam, kAdagrad };
enum class ScheduleKind {
  kConstant,
  kStep,
  kCosine,
  kOneCycle,
  kPlateau,
  kMultiStep,
  kExponential,
  kCosineWarmRestarts,
};
// The precision of a job's forward passes (see proto/trainerd/v1/jobs.proto, enum Precision).
enum class Precision { kFp32, kBf16, kFp16 };
// Which queued job a device runs next (proto JobPriority): high, then normal, then low; FIFO
// within a priority.
enum class JobPriority { kLow, kNormal, kHigh };

const char* LossKindName(LossKind loss);            // "mse", "cross_entropy", "l1", ...
// "sgd", "adam", "adamw", "rmsprop", "nadam", "radam", "adagrad"
const char* OptimizerKindName(OptimizerKind kind);
// "constant", "step", "cosine", "onecycle", "plateau", "multistep", "exponential",
// "cosine_restarts"
const char* ScheduleKindName(ScheduleKind kind);
const char* PrecisionName(Precision precision);     // "fp32", "bf16", "fp16"
const char* JobPriorityName(JobPriority priority);  // "low", "normal", "high"

// How a job's steps run (proto Engine; training_path.h): kAuto takes the fused path when the job
// qualifies for it (fused_path.h) and LibTorch otherwise; kFused requires it (Submit refuses a job
// that does not qualify, saying why); kLibTorch always runs on LibTorch.
enum class EngineKind { kAuto, kFused, kLibTorch };
const char* EngineKindName(EngineKind engine);  // "auto", "fused", "libtorch"

// What early stopping watches (proto EarlyStopMetric): the validation loss (lower is better) or
// the validation accuracy (higher is better; class losses only).
enum class EarlyStopMetric { kValidationLoss, kValidationAccuracy };
const char* EarlyStopMetricName(EarlyStopMetric metric);  // "loss", "accuracy"

// Which weights a job hands back (proto ModelFrom): kAuto the best validation epoch's when the job
// has early stopping, else the last epoch's; kLast the last epoch's; kBest the best validation
// epoch's (needs validation), by early stopping's metric and min_delta.
enum class ModelFrom { kAuto, kLast, kBest };
const char* ModelFromName(ModelFrom from);  // "auto", "last", "best"

// The learning rate per epoch (see proto/trainerd/v1/jobs.proto, message Schedule).
// A learning-rate schedule, as torch.optim.lr_scheduler's twin of each kind (jobs.proto, Schedule,
// says each field's meaning). Its unit is the epoch, or the optimizer step when per_step (always
// for kOneCycle). Unset optionals take PyTorch's defaults.
struct ScheduleSpec {
  static constexpr size_t kMaxMilestones = 1024;
  ScheduleKind kind = ScheduleKind::kConstant;
  int32_t step_epochs = 0;         // kStep: >= 1 (units: steps when per_step)
  double gamma = 0.1;              // kStep, kMultiStep, kExponential: (0, 1]
  // kCosine and kCosineWarmRestarts: eta_min, [0, learning_rate); kPlateau: min_lr, >= 0.
  double min_learning_rate = 0.0;
  int32_t warmup_epochs = 0;  // linear warm-up first; 0 = none (epoch schedules)
  bool per_step = false;      // advance every optimizer step instead of every epoch
  int32_t warmup_steps = 0;   // per_step: linear warm-up over the first steps; 0 = none
  std::vector<int32_t> milestones;  // kMultiStep: ascending, >= 1, at most kMaxMilestones
  int32_t t_0 = 0;                  // kCosineWarmRestarts: >= 1
  std::optional<int32_t> t_mult;    // kCosineWarmRestarts: >= 1; unset: 1
  std::optional<double> pct_start;  // kOneCycle: [0, 1]; unset: 0.3
  std::string anneal_strategy;      // kOneCycle: "cos" or "linear"; empty: "cos"
  std::optional<double> div_factor;        // kOneCycle: > 0; unset: 25
  std::optional<double> final_div_factor;  // kOneCycle: > 0; unset: 1e4
  bool three_phase = false;                // kOneCycle
  std::optional<double> factor;     // kPlateau: (0, 1); unset: 0.1
  std::optional<int32_t> patience;  // kPlateau: >= 0; unset: 10
  std::optional<double> threshold;  // kPlateau: [0, 1); unset: 1e-4 (relative)
  int32_t cooldown = 0;             // kPlateau: >= 0

  bool operator==(const ScheduleSpec& o) const {
    return kind == o.kind && step_epochs == o.step_epochs && gamma == o.gamma &&
           min_learning_rate == o.min_learning_rate && warmup_epochs == o.warmup_epochs &&
           per_step == o.per_step && warmup_steps == o.warmup_steps &&
           milestones == o.milestones && t_0 == o.t_0 && t_mult == o.t_mult &&
           pct_start == o.pct_start && anneal_strategy == o.anneal_strategy &&
           div_factor == o.div_factor && final_div_factor == o.final_div_factor &&
           three_phase == o.three_phase && factor == o.factor && patience == o.patience &&
           threshold == o.threshold && cooldown == o.cooldown;
  }
  bool operator!=(const ScheduleSpec& o) const { return !(*this == o); }
};

// Asynchronous successive halving over a sweep's members (ASHA, as Ray Tune's ASHAScheduler):
// the rungs are at min_epochs, min_epochs * reduction_factor, ... epochs (below the spec's
// epochs). A member that reaches a rung is compared with the members that reached it before: it
// stops there when its metric is behind their (1 - 1/reduction_factor) quantile (the validation
// loss, or accuracy with early_stop_metric accuracy; the training loss without validation).
struct HalvingSpec {
  int32_t min_epochs = 1;        // >= 1, below the spec's epochs
  int32_t reduction_factor = 3;  // >= 2
  bool operator==(const HalvingSpec& other) const {
    return min_epochs == other.min_epochs && reduction_factor == other.reduction_factor;
  }
  bool operator!=(const HalvingSpec& other) const { return !(*this == other); }
};

struct JobSpec {
  // The dataset's key (DatasetKey): "OWNER/NAME", or "NAME" for one without an owner. A caller's
  // reference ("NAME" for its own) until Submit resolves it.
  std::string dataset;
  std::string model;  // text spec, see common/model_spec.h
  // Bring your own model: a TorchScript archive's bytes (torch.jit.save), trained instead of a text
  // spec; `model` must then be empty or "torchscript". Submit loads and checks it, then replaces
  // `model` with "torchscript (N bytes)" and clears this, so that jobs never echo the bytes.
  std::string torchscript;
  // Bring your own model as an exported program: the bytes torch.export.save writes (.pt2),
  // trained instead of a text spec; `model` must then be empty or "exported". Exclusive with
  // `torchscript`. Submit checks that it is such an archive and then carries it in `torchscript`
  // (a submitted module, whose kind its archive says) and names it "exported (N bytes)".
  std::string exported_program;
  LossKind loss = LossKind::kMse;
  // The caller named no loss: admission picks it by the dataset's targets (ResolveLossFromTargets)
  // and clears this, so that a queued job's spec always names its loss.
  bool loss_from_targets = false;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double learning_rate = 0.0;          // > 0
  double momentum = 0.0;               // sgd and rmsprop, [0, 1)
  bool nesterov = false;               // sgd only
  std::optional<double> weight_decay;  // unset: 0 (adamw: 0.01)
  std::optional<double> beta1;         // adam/adamw/nadam/radam; unset: 0.9
  std::optional<double> beta2;         // adam/adamw/nadam/radam; unset: 0.999
  std::optional<double> eps;           // all but sgd; unset: 1e-8 (adagrad: 1e-10)
  std::optional<double> alpha;         // rmsprop; unset: 0.99
  bool amsgrad = false;                // adam/adamw
  bool centered = false;               // rmsprop
  std::optional<double> momentum_decay;             // nadam, >= 0; unset: 4e-3
  bool decoupled_weight_decay = false;              // nadam/radam: AdamW-style decay
  std::optional<double> lr_decay;                   // adagrad, >= 0; unset: 0
  std::optional<double> initial_accumulator_value;  // adagrad, >= 0; unset: 0
  // Parameters of 1 dimension or fewer (biases, normalisation weights) get weight decay 0.
  bool weight_decay_exclude_bias_and_norm = false;
  double huber_delta = 1.0;            // kHuber: > 0
  double label_smoothing = 0.0;        // kCrossEntropy: [0, 1)
  // Training-only loss terms (the validation loss is the plain loss without them; loss.h):
  // kCrossEntropy/kNll: one positive weight per class (torch's `weight`); empty = none.
  std::vector<double> class_weights;
  // kCrossEntropy/kNll: rows whose target is this value add nothing; unset = none.
  std::optional<int64_t> ignore_index;
  // kBceWithLogits: one positive weight per output column (torch's `pos_weight`); empty = none.
  std::vector<double> pos_weight;
  ScheduleSpec schedule;
  double clip_grad_norm = 0.0;  // > 0: clip the global gradient norm; 0 = off
  int64_t batch_size = 0;       // >= 1
  int32_t epochs = 0;           // >= 1
  bool shuffle = true;
  std::optional<uint64_t> seed;  // filled in at Submit when absent
  std::string device;            // "" = the engine's default device; filled in at Submit
  // Validation: hold out HeldOutRows(validation_fraction, rows) rows of `dataset` (a split fixed
  // once per job from its seed), or validate on a second dataset; at most one of the two. 0 / "" =
  // none.
  double validation_fraction = 0.0;  // [0, 1)
  // The seed of that split; unset: the job's seed. A sweep sets every member's to the sweep's
  // seed, so that its members validate on the same rows and rank fairly.
  std::optional<uint64_t> split_seed;
  // A sweep's asynchronous successive halving (ASHA; a sweep's members only, proto
  // JobSpec.halving): compared at rungs of min_epochs * reduction_factor^k epochs, a member behind
  // the cutoff of the members that reached the rung before it stops there.
  std::optional<HalvingSpec> halving;
  std::string validation_dataset;    // a key too; same feature/target shapes and dtype as `dataset`
  int32_t early_stop_patience = 0;   // > 0: epochs without a new best validation metric; 0 = off
  // Early stopping: an improvement must beat the best by more than this (>= 0), as Keras'
  // EarlyStopping(min_delta=...); and what it watches (validation loss, or accuracy for class
  // losses).
  double early_stop_min_delta = 0.0;
  EarlyStopMetric early_stop_metric = EarlyStopMetric::kValidationLoss;
  // The weights the job hands back (ModelFrom); HandsBackBest says which rule applies.
  ModelFrom model_from = ModelFrom::kAuto;
  // >= 1: the optimizer steps once per this many batches, on their gradients summed and divided
  // by it (the epoch's last group too, however short); clipping and fp16's unscaling act on the
  // accumulated gradients (proto JobSpec.gradient_accumulation_steps).
  int32_t gradient_accumulation_steps = 1;
  // Each epoch's last batch is dropped when shorter than batch_size (DataLoader's drop_last).
  bool drop_last = false;
  // > 0: write a checkpoint (model, optimizer, epoch, seed) at the end of every N-th epoch,
  // 1 <= N <= epochs; 0 = off.
  int32_t checkpoint_every = 0;
  // Forward passes under autocast in bf16 or fp16 (parameters, optimizer state and losses stay
  // float32); fp16 adds dynamic loss scaling. kFp32: no autocast.
  Precision precision = Precision::kFp32;
  JobPriority priority = JobPriority::kNormal;
  EngineKind engine = EngineKind::kAuto;
  // > 1: a data-parallel job of this many ranks (proto JobSpec.replicas). Each rank trains its
  // slice of every global batch of replicas * batch_size rows (RunRank,
  // distributed/data_parallel.h).
  int32_t replicas = 1;
  // Peers (their --peers names) that run some of this job's ranks, round-robin after this daemon
  // (NodeOf, distributed/node_placement.h; proto JobSpec.nodes with replicas); empty: every rank
  // here.
  std::vector<std::string> nodes;
  // A sweep's member that the sweep dealt to a peer (a sweep's proto JobSpec.nodes without
  // replicas): it trains there whole, as a job of that daemon's (PeerJobCalls::RunJob). Empty:
  // here. In the API and the records the member's spec.nodes is this one peer.
  std::string peer;
  // With nodes: the names the nodes know the job's dataset and validation dataset by there, as
  // the job's owner's datasets there (a copy sent at submit, or her own upload there); set by
  // the daemon at submit (CheckPeers) and sent to the nodes in place of `dataset` and
  // `validation_dataset`, which are this daemon's keys. Empty: the keys themselves, qualified.
  std::string node_dataset;
  std::string node_validation_dataset;
  // > 0: a TorchScript job's worker process is ended (and the job FAILED) after it has run this
  // many seconds; 0: the daemon's default (--max_job_time). Spec-built jobs are bounded by their
  // epochs and ignore it.
  double max_job_seconds = 0.0;

  bool has_validation() const { return validation_fraction > 0 || !validation_dataset.empty(); }
  // Whether the job hands back its best validation epoch's weights (model_from).
  bool hands_back_best() const {
    return model_from == ModelFrom::kBest ||
           (model_from == ModelFrom::kAuto && early_stop_patience > 0);
  }
  bool runs_on_peer() const { return !peer.empty(); }
};

// The most members one sweep may have (Engine::SubmitSweep).
inline constexpr int64_t kMaxSweepMembers = 256;

// How many of `rows` a validation fraction holds out: llround(fraction * rows), the product in
// double rounded half away from zero (10 rows at 0.25 hold out 3; Python's round() would give 2).
// Rounding rather than truncating, so that 0.29 of 100 rows is 29 and not 28 (0.29 * 100 is
// 28.999... in doubles).
int64_t HeldOutRows(double validation_fraction, int64_t rows);

// The rows each epoch of `spec` trains on, of a dataset of `rows`: those not held out, less the
// short last batch (of replicas * batch_size rows) with drop_last.
int64_t TrainedRowsPerEpoch(const JobSpec& spec, int64_t rows);

// A spec that named no loss (loss_from_targets) gets the one its dataset's targets call for:
// cross_entropy for int64 class indices, mse for float32 values. Nothing for a spec that named one.
void ResolveLossFromTargets(JobSpec& spec, const DatasetMeta& dataset);

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

const char* JobStateName(JobState state);  // "QUEUED", ...
inline bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

struct EpochResult {
  int32_t epoch = 0;                          // 1-based
  double loss = 0.0;                          // mean training loss over the epoch's rows
  double elapsed_seconds = 0.0;               // since the job started running
  double learning_rate = 0.0;                 // used during this epoch
  std::optional<double> validation_loss;      // with validation
  std::optional<double> validation_accuracy;  // with validation and a class loss; [0, 1]
  std::optional<double> loss_scale;           // fp16: the loss scale at the end of the epoch
  int64_t skipped_steps = 0;  // fp16 (with loss_scale): steps skipped this epoch because
                              // the scaled gradients overflowed
};

struct ParameterValues {
  std::string name;  // e.g. "0.weight"
  std::vector<int64_t> shape;
  std::vector<float> values;  // C order
};

// A checkpoint a job wrote (JobSpec::checkpoint_every).
struct CheckpointInfo {
  int32_t epoch = 0;  // written at the end of this epoch, 1-based
  std::string path;   // relative to the data folder: "checkpoints/<job-id>/epoch-000010.pt"
  int64_t size_bytes = 0;
  absl::Time create_time = absl::InfinitePast();
  std::string sha256;  // of the file as written; empty from older builds
};

// Where a job's time went and what bounded its speed (proto DeviceReport). Times and counts are
// filled in as the job runs; utilization, memory, FLOPs and the verdict when it ends.
struct DeviceReport {
  double queue_seconds = 0.0;          // create to start
  double data_seconds = 0.0;           // start to the first step
  double compute_seconds = 0.0;        // the epochs, less host transfers and checkpoint writes
  double host_transfer_seconds = 0.0;  // inside the job's device-to-host copies
  std::optional<double> utilization_average;  // 0..1, sampled while the job ran
  std::optional<double> utilization_peak;
  int64_t peak_memory_bytes = 0;
  double steps_per_second = 0.0;  // per second of compute
  int64_t host_syncs = 0;
  int64_t host_to_device_bytes = 0;
  double flops_per_step = 0.0;  // 0: unknown (TorchScript)
  double achieved_flops_per_second = 0.0;
  std::optional<double> peak_fraction;
  std::optional<double> overhead_fraction;
  SpeedBound bound = SpeedBound::kUnspecified;
  std::string verdict;           // one line; empty until the job ends
  int32_t intra_op_threads = 0;  // the job's LibTorch intra-op threads; 0 before it starts
  std::string engine;            // the path its steps ran on: "fused" or "libtorch"
  std::string engine_reason;     // with engine auto on "libtorch": why not fused
  // The sweep members that trained together with the job as one pack (the job included); 0 when
  // it trained alone.
  int32_t packed_members = 0;
  // A packed member: whether its values are the job alone's to the last bit, and what its path
  // does about that, in a sentence (proto DeviceReport.packed_numerics). Unset when alone.
  bool packed_bitwise = false;
  std::string packed_numerics;
  // A TorchScript job: the seconds from starting its worker process to the worker's first
  // message (the process, LibTorch's start and the sandbox); 0 for a job run in the daemon.
  double worker_start_seconds = 0.0;
  // A TorchScript job: the confinement its worker got, as measured before it was given the job
  // (sandbox_report.h); unset for a job run in the daemon.
  std::optional<SandboxReport> worker_sandbox;
  // A data-parallel job: rank 0's seconds inside collectives and their share of compute_seconds.
  double collective_seconds = 0.0;
  std::optional<double> collective_fraction;
};

// This daemon's name in rank placements: `configured` (--node_name), or the host name.
std::string NodeName(const std::string& configured);

// Where one rank of a data-parallel job ran (proto RankPlacement).
struct RankPlacement {
  int32_t rank = 0;
  std::string device;  // "cpu", "cuda:1"
  std::string node;    // the daemon's node name
};

// A sweep's member on a peer (JobSpec::peer): its job there, as far as this daemon knows it
// (jobs/job_remote.cc). In the API and the records: Job.ranks[0]'s job_id, request_id and
// sweep_member.
struct JobOnPeer {
  std::string job_id;  // its id there, once the peer took it
  // The request id it was submitted there with, recorded before the call, by which a daemon
  // killed before it learned the id finds it there.
  std::string request_id;
  // Sent with others of its sweep as one sweep there: its place in it, 1-based; 0: alone.
  int32_t sweep_member = 0;
};

// A job taken up again at a daemon's start (proto JobRestart).
struct JobRestart {
  absl::Time time = absl::InfinitePast();
  int32_t from_epoch = 0;  // the checkpoint's epoch; 0: started over
  JobState previous_state = JobState::kQueued;
};

// Everything the engine knows about a job, copied out under its lock.
struct JobSnapshot {
  std::string id;
  JobSpec spec;       // as accepted, defaults filled in
  std::string owner;  // who submitted it: a token's name or a certificate's subject; empty when
                      // the daemon runs without authentication
  JobState state = JobState::kQueued;
  std::string error;  // FAILED (and CANCELLED by shutdown): a sentence
  std::vector<EpochResult> epochs;
  int32_t epochs_completed = 0;  // epochs finished; equals epochs.size() unless a summary (a job
                                 // store's listing) left the epochs out
  double final_loss = 0.0;
  double wall_seconds = 0.0;
  int64_t steps = 0;
  double samples_per_second = 0.0;
  std::string device;
  int64_t host_syncs = 0;
  std::vector<ParameterValues> parameters;  // only when parameter_count <= kMaxReportedParameters
  int64_t parameter_count = 0;
  bool stopped_early = false;  // SUCCEEDED before spec.epochs by early stopping or at a rung
  // Why it stopped early: a sentence naming the rule (patience, or the rung and the cutoff it
  // was behind); empty otherwise.
  std::string stop_reason;
  // The epoch whose weights the trained model holds (SUCCEEDED; 0 before), and the best
  // validation epoch so far by early stopping's metric (0 without validation).
  int32_t model_epoch = 0;
  int32_t best_epoch = 0;
  // A cancel was asked for while the job ran: recorded before the cancel is answered, so that a
  // restart ends the job CANCELLED instead of taking it up again.
  bool cancel_requested = false;
  std::vector<CheckpointInfo> checkpoints;  // oldest first
  DeviceReport report;
  std::vector<JobRestart> restarts;    // oldest first
  int64_t estimated_memory_bytes = 0;  // the working set Submit estimated (parameters, gradients,
                                       // optimizer state, one batch's activations)
  // Submitted with device "auto": each measured device's estimated step and job time
  // (device_cost.h); the job runs on the cheapest. Empty otherwise.
  std::vector<DeviceCostEstimate> device_estimates;
  std::string sweep_id;      // the sweep it is a member of (SubmitSweep); empty for a job alone
  int32_t sweep_member = 0;  // its place in that sweep, 1-based; 0 for a job alone
  absl::Time create_time = absl::InfinitePast();
  absl::Time start_time = absl::InfinitePast();  // InfinitePast: not started
  absl::Time end_time = absl::InfinitePast();    // InfinitePast: not ended
  // A listing's stand-in for a job whose stored record cannot be read: why (only the id and the
  // state are known then).
  std::string record_damaged;
  std::string checkpoint_error;  // the last checkpoint that could not be written, in a sentence
  std::string model_sha256;      // of the trained model's archive, once written
  // A data-parallel job (spec.replicas > 1): where each rank ran, rank 0 first; set when it
  // starts. Empty for a one-rank job; one for a member on a peer (spec.peer).
  std::vector<RankPlacement> ranks;
  // A member on a peer: its job there (empty otherwise).
  JobOnPeer there;
  // The caller's request id (CallContext::request_id) and the digest of the rest of its request:
  // a submit that repeats the id gets this job back (Engine::SubmitJob). Empty without one.
  std::string request_id;
  std::string request_digest;

  // A member on a peer whose job there the peer took: its id there; else empty. Such a member
  // is cancelled there, even after this daemon's restart (jobs/job_remote.cc).
  std::string peer_job_id() const { return spec.runs_on_peer() ? there.job_id : std::string(); }
  // A member on a peer that a run before may have submitted there: its id there is known, or the
  // request id it was submitted with (its id there then found by that).
  bool may_be_on_peer() const {
    return spec.runs_on_peer() && (!there.job_id.empty() || !there.request_id.empty());
  }
};

// Models with at most this many parameter values report them in the Job.
inline constexpr int64_t kMaxReportedParameters = 1000;

// One event of a job's stream: an epoch finished, or the job changed state; or, to a job's own
// sinks only (never the observer), kInterrupted: the daemon stopped before the job ended (it stays
// QUEUED or RUNNING in the records and resumes at the next start), so nothing more follows.
struct JobEvent {
  enum class Kind { kEpoch, kState, kInterrupted };
  Kind kind = Kind::kState;
  std::string job_id;
  EpochResult epoch;  // kEpoch
  JobSnapshot job;    // kState: the job after the change
  // kEpoch: the job's running totals after this epoch (so that observers need no snapshot).
  int64_t steps = 0;
  int64_t host_syncs = 0;
  int32_t epochs_planned = 0;
  int64_t rows_per_epoch = 0;  // rows trained (validation rows and a dropped last batch excluded)
  double samples_per_second = 0.0;
};

// One dataset upload in progress (see Engine::BeginUpload). Not thread-safe: one upload stream
// owns it (only the flag from cancellation() may be set from elsewhere). Destroying it without
// committing releases the name and the staging memory.
class UploadSession {
 public:
  virtual ~UploadSession() = default;
  // Appends the next payload bytes. INVALID_ARGUMENT past the size the header declared;
  // RESOURCE_EXHAUSTED when the staging memory it needs would take the uploads in flight past
  // the daemon's bound (EngineOptions::max_upload_bytes_in_flight) or cannot be allocated.
  virtual absl::Status Append(std::string_view chunk) = 0;
  // The payload's SHA-256 (lower-case hex) sent after the last chunk, for a client that checksums
  // a file as it streams it: verified at commit like the header's. INVALID_ARGUMENT when the
  // header carried one, when one was given already, or when it is not 64 lower-case hex digits.
  virtual absl::Status SetTrailingSha256(const std::string& sha256) = 0;
  virtual int64_t received_bytes() const = 0;
  virtual int64_t expected_bytes() const = 0;
  // Host memory staged for this upload now: it grows with the bytes received (geometrically, up
  // to the declared size), never with what the header declared.
  virtual int64_t staged_bytes() const = 0;
  // Set it when the client cancelled the stream or went away: a commit that finds it set
  // discards the upload (CANCELLED) instead of registering it. Shared, so that it can be set
  // while the session is being committed on another thread.
  virtual std::shared_ptr<std::atomic<bool>> cancellation() const = 0;
};

// Receives a job's events in order. Push is called from engine threads (workers, or the thread
// that cancelled a queued job), never under an engine-wide lock; it must not block and must not
// call back into the engine. Implementations are thread-safe.
class JobEventSink {
 public:
  virtual ~JobEventSink() = default;
  virtual void Push(const JobEvent& event) = 0;
};

}  // namespace trainerd::engine
