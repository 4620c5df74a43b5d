// A job's spec both ways: FromProto checks and bounds what a request declares before anything
// is copied from it, ToProto writes the engine's spec back as the API carries it (convert.h).
#include <google/protobuf/util/field_mask_util.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/job_limits.h"
#include "common/safe_text.h"
#include "common/status_macros.h"
#include "server/convert/convert.h"

namespace trainerd::convert {
namespace {

// What a request may declare of a data-parallel job before the daemon looks at it (its own
// --max_replicas, at most this, is checked at admission).
constexpr int32_t kMaxReplicasPerJob = 4096;
constexpr int kMaxNodesPerJob = 256;

// Proto3 leaves these 0 when unset.
constexpr double kDefaultHuberDelta = 1.0;
constexpr double kDefaultGamma = 0.1;

v1::Loss ToProto(engine::LossKind loss) {
  switch (loss) {
    case engine::LossKind::kMse:
      return v1::LOSS_MSE;
    case engine::LossKind::kCrossEntropy:
      return v1::LOSS_CROSS_ENTROPY;
    case engine::LossKind::kL1:
      return v1::LOSS_L1;
    case engine::LossKind::kHuber:
      return v1::LOSS_HUBER;
    case engine::LossKind::kBceWithLogits:
      return v1::LOSS_BCE_WITH_LOGITS;
    case engine::LossKind::kNll:
      return v1::LOSS_NLL;
  }
  return v1::LOSS_UNSPECIFIED;
}

v1::OptimizerKind ToProto(engine::OptimizerKind kind) {
  switch (kind) {
    case engine::OptimizerKind::kSgd:
      return v1::OPTIMIZER_KIND_SGD;
    case engine::OptimizerKind::kAdam:
      return v1::OPTIMIZER_KIND_ADAM;
    case engine::OptimizerKind::kAdamW:
      return v1::OPTIMIZER_KIND_ADAMW;
    case engine::OptimizerKind::kRmsprop:
      return v1::OPTIMIZER_KIND_RMSPROP;
    case engine::OptimizerKind::kNAdam:
      return v1::OPTIMIZER_KIND_NADAM;
    case engine::OptimizerKind::kRAdam:
      return v1::OPTIMIZER_KIND_RADAM;
    case engine::OptimizerKind::kAdagrad:
      return v1::OPTIMIZER_KIND_ADAGRAD;
  }
  return v1::OPTIMIZER_KIND_UNSPECIFIED;
}

v1::Engine ToProto(engine::EngineKind kind) {
  switch (kind) {
    case engine::EngineKind::kAuto:
      return v1::ENGINE_AUTO;
    case engine::EngineKind::kFused:
      return v1::ENGINE_FUSED;
    case engine::EngineKind::kLibTorch:
      return v1::ENGINE_LIBTORCH;
  }
  return v1::ENGINE_AUTO;
}

v1::JobPriority ToProto(engine::JobPriority priority) {
  switch (priority) {
    case engine::JobPriority::kLow:
      return v1::JOB_PRIORITY_LOW;
    case engine::JobPriority::kNormal:
      return v1::JOB_PRIORITY_NORMAL;
    case engine::JobPriority::kHigh:
      return v1::JOB_PRIORITY_HIGH;
  }
  return v1::JOB_PRIORITY_NORMAL;
}

v1::Precision ToProto(engine::Precision precision) {
  switch (precision) {
    case engine::Precision::kFp32:
      return v1::PRECISION_FP32;
    case engine::Precision::kBf16:
      return v1::PRECISION_BF16;
    case engine::Precision::kFp16:
      return v1::PRECISION_FP16;
  }
  return v1::PRECISION_UNSPECIFIED;
}

v1::Schedule::Kind ToProto(engine::ScheduleKind kind) {
  switch (kind) {
    case engine::ScheduleKind::kConstant:
      return v1::Schedule::CONSTANT;
    case engine::ScheduleKind::kStep:
      return v1::Schedule::STEP;
    case engine::ScheduleKind::kCosine:
      return v1::Schedule::COSINE;
    case engine::ScheduleKind::kOneCycle:
      return v1::Schedule::ONE_CYCLE;
    case engine::ScheduleKind::kPlateau:
      return v1::Schedule::REDUCE_ON_PLATEAU;
    case engine::ScheduleKind::kMultiStep:
      return v1::Schedule::MULTI_STEP;
    case engine::ScheduleKind::kExponential:
      return v1::Schedule::EXPONENTIAL;
    case engine::ScheduleKind::kCosineWarmRestarts:
      return v1::Schedule::COSINE_WARM_RESTARTS;
  }
  return v1::Schedule::KIND_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<engine::JobSpec> FromProto(const v1::JobSpec& spec) {
  // The strings first, before anything is copied or echoed from them.
  if (static_cast<int64_t>(spec.model().size()) > kMaxModelSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the model spec has ", spec.model().size(),
                                                   " characters; at most ", kMaxModelSpecBytes,
                                                   " are accepted"));
  }
  // Dataset references ("NAME", "OWNER/NAME"), bounded before they are copied or echoed; the
  // engine resolves them for the caller.
  for (const std::string* name : {&spec.dataset(), &spec.validation_dataset(), &spec.node_dataset(),
                                  &spec.node_validation_dataset()}) {
    if (!name->empty()) TRAINERD_RETURN_IF_ERROR(ParseDatasetReference(*name).status());
  }
  if (spec.device().size() > 32) {
    return absl::InvalidArgumentError(absl::StrCat("the device has ", spec.device().size(),
                                                   " characters; devices are 'cpu', 'cuda:N' or "
                                                   "'auto'"));
  }
  engine::JobSpec out;
  out.dataset = spec.dataset();
  out.model = spec.model();
  switch (spec.loss()) {
    case v1::LOSS_MSE:
      out.loss = engine::LossKind::kMse;
      break;
    case v1::LOSS_CROSS_ENTROPY:
      out.loss = engine::LossKind::kCrossEntropy;
      break;
    case v1::LOSS_L1:
      out.loss = engine::LossKind::kL1;
      break;
    case v1::LOSS_HUBER:
      out.loss = engine::LossKind::kHuber;
      break;
    case v1::LOSS_BCE_WITH_LOGITS:
      out.loss = engine::LossKind::kBceWithLogits;
      break;
    case v1::LOSS_NLL:
      out.loss = engine::LossKind::kNll;
      break;
    case v1::LOSS_UNSPECIFIED:
      // Picked at admission by the dataset's targets (engine::ResolveLossFromTargets).
      out.loss_from_targets = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown loss ", static_cast<int>(spec.loss()),
          ": LOSS_MSE, LOSS_CROSS_ENTROPY, LOSS_L1, LOSS_HUBER, LOSS_BCE_WITH_LOGITS or LOSS_NLL, "
          "or unset for the one the dataset's targets call for"));
  }
  const v1::Optimizer& optimizer = spec.optimizer();
  switch (optimizer.kind()) {
    case v1::OPTIMIZER_KIND_SGD:
      out.optimizer = engine::OptimizerKind::kSgd;
      break;
    case v1::OPTIMIZER_KIND_ADAM:
      out.optimizer = engine::OptimizerKind::kAdam;
      break;
    case v1::OPTIMIZER_KIND_ADAMW:
      out.optimizer = engine::OptimizerKind::kAdamW;
      break;
    case v1::OPTIMIZER_KIND_RMSPROP:
      out.optimizer = engine::OptimizerKind::kRmsprop;
      break;
    case v1::OPTIMIZER_KIND_NADAM:
      out.optimizer = engine::OptimizerKind::kNAdam;
      break;
    case v1::OPTIMIZER_KIND_RADAM:
      out.optimizer = engine::OptimizerKind::kRAdam;
      break;
    case v1::OPTIMIZER_KIND_ADAGRAD:
      out.optimizer = engine::OptimizerKind::kAdagrad;
      break;
    case v1::OPTIMIZER_KIND_UNSPECIFIED:  // unset: the default, as trainctl's
      out.optimizer = engine::OptimizerKind::kSgd;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer.kind ", static_cast<int>(optimizer.kind()),
          " is not one of OPTIMIZER_KIND_SGD, OPTIMIZER_KIND_ADAM, OPTIMIZER_KIND_ADAMW, "
          "OPTIMIZER_KIND_RMSPROP, OPTIMIZER_KIND_NADAM, OPTIMIZER_KIND_RADAM or "
          "OPTIMIZER_KIND_ADAGRAD"));
  }
  // 0 means unset for the learning rate, the batch size and the epochs (proto3 scalars): the
  // daemon's defaults (common/job_limits.h), whoever the client.
  out.learning_rate =
      optimizer.learning_rate() == 0 ? kDefaultLearningRate : optimizer.learning_rate();
  out.momentum = optimizer.momentum();
  out.nesterov = optimizer.nesterov();
  if (optimizer.has_weight_decay()) out.weight_decay = optimizer.weight_decay();
  if (optimizer.has_beta1()) out.beta1 = optimizer.beta1();
  if (optimizer.has_beta2()) out.beta2 = optimizer.beta2();
  if (optimizer.has_eps()) out.eps = optimizer.eps();
  if (optimizer.has_alpha()) out.alpha = optimizer.alpha();
  out.amsgrad = optimizer.amsgrad();
  out.centered = optimizer.centered();
  if (optimizer.has_momentum_decay()) out.momentum_decay = optimizer.momentum_decay();
  out.decoupled_weight_decay = optimizer.decoupled_weight_decay();
  if (optimizer.has_lr_decay()) out.lr_decay = optimizer.lr_decay();
  if (optimizer.has_initial_accumulator_value()) {
    out.initial_accumulator_value = optimizer.initial_accumulator_value();
  }
  out.weight_decay_exclude_bias_and_norm = optimizer.weight_decay_exclude_bias_and_norm();
  // 0 means unset for these two (proto3 scalars).
  out.huber_delta = spec.huber_delta() == 0 ? kDefaultHuberDelta : spec.huber_delta();
  out.label_smoothing = spec.label_smoothing();
  // Bounded before they are copied; CheckLoss holds them to the model's output width.
  if (spec.class_weights_size() > kMaxLossWeights || spec.pos_weight_size() > kMaxLossWeights) {
    return absl::InvalidArgumentError(
        absl::StrCat("class_weights and pos_weight hold at most ", kMaxLossWeights,
                     " values (one per class or output column); got ",
                     std::max(spec.class_weights_size(), spec.pos_weight_size())));
  }
  out.class_weights.assign(spec.class_weights().begin(), spec.class_weights().end());
  if (spec.has_ignore_index()) out.ignore_index = spec.ignore_index();
  out.pos_weight.assign(spec.pos_weight().begin(), spec.pos_weight().end());
  const v1::Schedule& schedule = spec.schedule();
  switch (schedule.kind()) {
    case v1::Schedule::KIND_UNSPECIFIED:
    case v1::Schedule::CONSTANT:
      out.schedule.kind = engine::ScheduleKind::kConstant;
      break;
    case v1::Schedule::STEP:
      out.schedule.kind = engine::ScheduleKind::kStep;
      break;
    case v1::Schedule::COSINE:
      out.schedule.kind = engine::ScheduleKind::kCosine;
      break;
    case v1::Schedule::ONE_CYCLE:
      out.schedule.kind = engine::ScheduleKind::kOneCycle;
      break;
    case v1::Schedule::REDUCE_ON_PLATEAU:
      out.schedule.kind = engine::ScheduleKind::kPlateau;
      break;
    case v1::Schedule::MULTI_STEP:
      out.schedule.kind = engine::ScheduleKind::kMultiStep;
      break;
    case v1::Schedule::EXPONENTIAL:
      out.schedule.kind = engine::ScheduleKind::kExponential;
      break;
    case v1::Schedule::COSINE_WARM_RESTARTS:
      out.schedule.kind = engine::ScheduleKind::kCosineWarmRestarts;
      break;
    default:
      return absl::InvalidArgumentError(
          "schedule.kind must be CONSTANT, STEP, COSINE, ONE_CYCLE, REDUCE_ON_PLATEAU, MULTI_STEP, "
          "EXPONENTIAL or COSINE_WARM_RESTARTS (or unset for constant)");
  }
  out.schedule.step_epochs = schedule.step_epochs();
  out.schedule.gamma = schedule.gamma() == 0 ? kDefaultGamma : schedule.gamma();
  out.schedule.min_learning_rate = schedule.min_learning_rate();
  out.schedule.warmup_epochs = schedule.warmup_epochs();
  out.schedule.per_step = schedule.per_step();
  out.schedule.warmup_steps = schedule.warmup_steps();
  out.schedule.milestones.assign(schedule.milestones().begin(), schedule.milestones().end());
  out.schedule.t_0 = schedule.t_0();
  if (schedule.has_t_mult()) out.schedule.t_mult = schedule.t_mult();
  if (schedule.has_pct_start()) out.schedule.pct_start = schedule.pct_start();
  out.schedule.anneal_strategy = schedule.anneal_strategy();
  if (schedule.has_div_factor()) out.schedule.div_factor = schedule.div_factor();
  if (schedule.has_final_div_factor()) out.schedule.final_div_factor = schedule.final_div_factor();
  out.schedule.three_phase = schedule.three_phase();
  if (schedule.has_factor()) out.schedule.factor = schedule.factor();
  if (schedule.has_patience()) out.schedule.patience = schedule.patience();
  if (schedule.has_threshold()) out.schedule.threshold = schedule.threshold();
  out.schedule.cooldown = schedule.cooldown();
  out.clip_grad_norm = spec.clip_grad_norm();
  out.batch_size = spec.batch_size() == 0 ? kDefaultBatchSize : spec.batch_size();
  out.epochs = spec.epochs() == 0 ? kDefaultEpochs : spec.epochs();
  out.shuffle = spec.has_shuffle() ? spec.shuffle() : true;
  if (spec.has_seed()) out.seed = spec.seed();
  out.device = spec.device();
  out.validation_fraction = spec.validation_fraction();
  if (spec.has_validation_split_seed()) out.split_seed = spec.validation_split_seed();
  if (spec.has_halving() && spec.halving().min_epochs() != 0) {
    engine::HalvingSpec halving;
    halving.min_epochs = spec.halving().min_epochs();
    if (spec.halving().reduction_factor() != 0) {
      halving.reduction_factor = spec.halving().reduction_factor();
    }
    out.halving = halving;
  }
  out.validation_dataset = spec.validation_dataset();
  out.node_dataset = spec.node_dataset();
  out.node_validation_dataset = spec.node_validation_dataset();
  out.early_stop_patience = spec.early_stop_patience();
  out.early_stop_min_delta = spec.early_stop_min_delta();
  switch (spec.early_stop_metric()) {
    case v1::EARLY_STOP_METRIC_UNSPECIFIED:
    case v1::EARLY_STOP_METRIC_VALIDATION_LOSS:
      out.early_stop_metric = engine::EarlyStopMetric::kValidationLoss;
      break;
    case v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY:
      out.early_stop_metric = engine::EarlyStopMetric::kValidationAccuracy;
      break;
    default:
      return absl::InvalidArgumentError(
          "early_stop_metric must be EARLY_STOP_METRIC_VALIDATION_LOSS or "
          "EARLY_STOP_METRIC_VALIDATION_ACCURACY (or unset for the loss)");
  }
  switch (spec.model_from()) {
    case v1::MODEL_FROM_UNSPECIFIED:
      out.model_from = engine::ModelFrom::kAuto;
      break;
    case v1::MODEL_FROM_LAST:
      out.model_from = engine::ModelFrom::kLast;
      break;
    case v1::MODEL_FROM_BEST:
      out.model_from = engine::ModelFrom::kBest;
      break;
    default:
      return absl::InvalidArgumentError(
          "model_from must be MODEL_FROM_LAST or MODEL_FROM_BEST (or unset: the best epoch with "
          "early stopping, else the last)");
  }
  if (spec.gradient_accumulation_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_accumulation_steps must be at least 1 (or unset for 1); got ",
                     spec.gradient_accumulation_steps()));
  }
  out.gradient_accumulation_steps = std::max(1, spec.gradient_accumulation_steps());
  out.drop_last = spec.drop_last();
  out.checkpoint_every = spec.checkpoint_every();
  switch (spec.precision()) {
    case v1::PRECISION_UNSPECIFIED:
    case v1::PRECISION_FP32:
      out.precision = engine::Precision::kFp32;
      break;
    case v1::PRECISION_BF16:
      out.precision = engine::Precision::kBf16;
      break;
    case v1::PRECISION_FP16:
      out.precision = engine::Precision::kFp16;
      break;
    default:
      return absl::InvalidArgumentError(
          "precision must be PRECISION_FP32, PRECISION_BF16 or PRECISION_FP16 (or unset for fp32)");
  }
  switch (spec.priority()) {
    case v1::JOB_PRIORITY_UNSPECIFIED:
    case v1::JOB_PRIORITY_NORMAL:
      out.priority = engine::JobPriority::kNormal;
      break;
    case v1::JOB_PRIORITY_LOW:
      out.priority = engine::JobPriority::kLow;
      break;
    case v1::JOB_PRIORITY_HIGH:
      out.priority = engine::JobPriority::kHigh;
      break;
    default:
      return absl::InvalidArgumentError(
          "priority must be JOB_PRIORITY_HIGH, JOB_PRIORITY_NORMAL or JOB_PRIORITY_LOW (or unset "
          "for normal)");
  }
  switch (spec.engine()) {
    case v1::ENGINE_UNSPECIFIED:
    case v1::ENGINE_AUTO:
      out.engine = engine::EngineKind::kAuto;
      break;
    case v1::ENGINE_FUSED:
      out.engine = engine::EngineKind::kFused;
      break;
    case v1::ENGINE_LIBTORCH:
      out.engine = engine::EngineKind::kLibTorch;
      break;
    default:
      return absl::InvalidArgumentError(
          "engine must be ENGINE_AUTO, ENGINE_FUSED or ENGINE_LIBTORCH (or unset for auto)");
  }
  if (!(spec.max_job_seconds() >= 0) || std::isinf(spec.max_job_seconds())) {
    return absl::InvalidArgumentError(
        "max_job_seconds must be a finite number of seconds >= 0 (0 or unset: the daemon's "
        "default)");
  }
  out.max_job_seconds = spec.max_job_seconds();
  if (spec.replicas() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas must be >= 1 (0 or unset: one rank), got ", spec.replicas()));
  }
  out.replicas = std::max<int32_t>(1, spec.replicas());
  // Bounded before anything is copied: the daemon's own --max_replicas is checked at admission.
  if (spec.replicas() > kMaxReplicasPerJob || spec.nodes_size() > kMaxNodesPerJob) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job has at most ", kMaxReplicasPerJob, " replicas and ", kMaxNodesPerJob,
                     " nodes; got ", spec.replicas(), " and ", spec.nodes_size()));
  }
  // What nodes mean (a job's ranks, a sweep's members) is the engine's to check.
  if (spec.nodes_size() > 0) {
    for (const std::string& node : spec.nodes()) {
      if (node.empty() || node.size() > 255) {
        return absl::InvalidArgumentError("each of nodes is a peer's host:port");
      }
      out.nodes.push_back(node);
    }
  }
  return out;
}

v1::JobSpec ToProto(const engine::JobSpec& spec) {
  v1::JobSpec out;
  out.set_dataset(spec.dataset);
  out.set_model(spec.model);
  out.set_loss(ToProto(spec.loss));
  v1::Optimizer* opt = out.mutable_optimizer();
  opt->set_kind(ToProto(spec.optimizer));
  opt->set_learning_rate(spec.learning_rate);
  opt->set_momentum(spec.momentum);
  opt->set_nesterov(spec.nesterov);
  if (spec.weight_decay.has_value()) opt->set_weight_decay(*spec.weight_decay);
  if (spec.beta1.has_value()) opt->set_beta1(*spec.beta1);
  if (spec.beta2.has_value()) opt->set_beta2(*spec.beta2);
  if (spec.eps.has_value()) opt->set_eps(*spec.eps);
  if (spec.alpha.has_value()) opt->set_alpha(*spec.alpha);
  opt->set_amsgrad(spec.amsgrad);
  opt->set_centered(spec.centered);
  if (spec.momentum_decay.has_value()) opt->set_momentum_decay(*spec.momentum_decay);
  opt->set_decoupled_weight_decay(spec.decoupled_weight_decay);
  if (spec.lr_decay.has_value()) opt->set_lr_decay(*spec.lr_decay);
  if (spec.initial_accumulator_value.has_value()) {
    opt->set_initial_accumulator_value(*spec.initial_accumulator_value);
  }
  opt->set_weight_decay_exclude_bias_and_norm(spec.weight_decay_exclude_bias_and_norm);
  // Options of other losses and schedules stay unset (0) rather than echoing their defaults.
  if (spec.loss == engine::LossKind::kHuber) out.set_huber_delta(spec.huber_delta);
  out.set_label_smoothing(spec.label_smoothing);
  out.mutable_class_weights()->Add(spec.class_weights.begin(), spec.class_weights.end());
  if (spec.ignore_index.has_value()) out.set_ignore_index(*spec.ignore_index);
  out.mutable_pos_weight()->Add(spec.pos_weight.begin(), spec.pos_weight.end());
  v1::Schedule* schedule = out.mutable_schedule();
  schedule->set_kind(ToProto(spec.schedule.kind));
  schedule->set_step_epochs(spec.schedule.step_epochs);
  const engine::ScheduleSpec& s = spec.schedule;
  if (s.kind == engine::ScheduleKind::kStep || s.kind == engine::ScheduleKind::kMultiStep ||
      s.kind == engine::ScheduleKind::kExponential) {
    schedule->set_gamma(s.gamma);
  }
  schedule->set_min_learning_rate(s.min_learning_rate);
  schedule->set_warmup_epochs(s.warmup_epochs);
  schedule->set_per_step(s.per_step);
  schedule->set_warmup_steps(s.warmup_steps);
  for (int32_t milestone : s.milestones) schedule->add_milestones(milestone);
  schedule->set_t_0(s.t_0);
  if (s.t_mult.has_value()) schedule->set_t_mult(*s.t_mult);
  if (s.pct_start.has_value()) schedule->set_pct_start(*s.pct_start);
  schedule->set_anneal_strategy(s.anneal_strategy);
  if (s.div_factor.has_value()) schedule->set_div_factor(*s.div_factor);
  if (s.final_div_factor.has_value()) schedule->set_final_div_factor(*s.final_div_factor);
  schedule->set_three_phase(s.three_phase);
  if (s.factor.has_value()) schedule->set_factor(*s.factor);
  if (s.patience.has_value()) schedule->set_patience(*s.patience);
  if (s.threshold.has_value()) schedule->set_threshold(*s.threshold);
  schedule->set_cooldown(s.cooldown);
  out.set_clip_grad_norm(spec.clip_grad_norm);
  out.set_batch_size(spec.batch_size);
  out.set_epochs(spec.epochs);
  out.set_shuffle(spec.shuffle);
  if (spec.seed.has_value()) out.set_seed(*spec.seed);
  out.set_device(spec.device);
  out.set_validation_fraction(spec.validation_fraction);
  if (spec.split_seed.has_value()) out.set_validation_split_seed(*spec.split_seed);
  if (spec.halving.has_value()) {
    out.mutable_halving()->set_min_epochs(spec.halving->min_epochs);
    out.mutable_halving()->set_reduction_factor(spec.halving->reduction_factor);
  }
  out.set_validation_dataset(spec.validation_dataset);
  out.set_node_dataset(spec.node_dataset);
  out.set_node_validation_dataset(spec.node_validation_dataset);
  out.set_early_stop_patience(spec.early_stop_patience);
  out.set_early_stop_min_delta(spec.early_stop_min_delta);
  out.set_early_stop_metric(spec.early_stop_metric == engine::EarlyStopMetric::kValidationAccuracy
                                ? v1::EARLY_STOP_METRIC_VALIDATION_ACCURACY
                                : v1::EARLY_STOP_METRIC_VALIDATION_LOSS);
  out.set_gradient_accumulation_steps(spec.gradient_accumulation_steps);
  out.set_drop_last(spec.drop_last);
  out.set_model_from(spec.model_from == engine::ModelFrom::kBest   ? v1::MODEL_FROM_BEST
                     : spec.model_from == engine::ModelFrom::kLast ? v1::MODEL_FROM_LAST
                                                                   : v1::MODEL_FROM_UNSPECIFIED);
  out.set_checkpoint_every(spec.checkpoint_every);
  out.set_precision(ToProto(spec.precision));
  out.set_priority(ToProto(spec.priority));
  out.set_engine(ToProto(spec.engine));
  out.set_max_job_seconds(spec.max_job_seconds);
  if (spec.replicas > 1) out.set_replicas(spec.replicas);  // one rank: left unset, as sent
  for (const std::string& node : spec.nodes) out.add_nodes(node);
  if (!spec.peer.empty()) out.add_nodes(spec.peer);  // a member on a peer: its one node
  return out;
}

absl::StatusOr<engine::JobSpec> MemberSpecFromProto(const v1::JobSpec& sweep,
                                                    const v1::SweepPoint& point) {
  using google::protobuf::util::FieldMaskUtil;
  if (point.fields().paths_size() > kMaxSweepPointFields) {
    return absl::InvalidArgumentError(absl::StrCat("fields names ", point.fields().paths_size(),
                                                   " paths; at most ", kMaxSweepPointFields));
  }
  for (const std::string& path : point.fields().paths()) {
    if (!FieldMaskUtil::GetFieldDescriptors(v1::JobSpec::descriptor(), path, nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fields: '", EscapeControls(absl::string_view(path).substr(0, 64)),
                       "' names no field of JobSpec"));
    }
  }
  v1::JobSpec member = sweep;
  FieldMaskUtil::MergeOptions options;
  options.set_replace_message_fields(true);
  options.set_replace_repeated_fields(true);
  FieldMaskUtil::MergeMessageTo(point.spec(), point.fields(), options, &member);
  return FromProto(member);
}

}  // namespace trainerd::convert
