// The daemon-worker protocol (worker_protocol.h).
#include "server/engine/torchscript/worker_protocol.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/job_limits.h"
#include "common/safe_text.h"
#include "common/status_macros.h"

namespace trainerd::engine {
namespace {

constexpr uint32_t kMagic = 0x57445254;  // "TRDW"
// Bounds on what a payload may hold, far above what a job has (names, shapes, parameters).
constexpr size_t kMaxNameBytes = 64 << 10;
constexpr size_t kMaxErrorBytes = 64 << 10;
constexpr size_t kMaxDims = 64;
constexpr int64_t kMaxRows = std::numeric_limits<int64_t>::max();

void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

absl::Status Short(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("the worker's message ends inside ",
                                                 absl::string_view(what.data(), what.size())));
}

bool KnownFrame(uint32_t type) {
  switch (static_cast<WorkerFrame>(type)) {
    case WorkerFrame::kStart:
    case WorkerFrame::kControl:
    case WorkerFrame::kReady:
    case WorkerFrame::kCheckpoint:
    case WorkerFrame::kEpoch:
    case WorkerFrame::kOutcome:
      return true;
  }
  return false;
}

absl::Status CheckHeader(const char* header, size_t max_payload, WorkerFrame* type,
                         uint64_t* length) {
  if (GetU32(header) != kMagic || !KnownFrame(GetU32(header + 4))) {
    return absl::InvalidArgumentError("the worker sent a frame that is not of the protocol");
  }
  *type = static_cast<WorkerFrame>(GetU32(header + 4));
  *length = GetU64(header + 8);
  if (*length > max_payload) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the worker sent a frame of ", *length, " bytes; at most ", max_payload, " are accepted"));
  }
  return absl::OkStatus();
}

void PutMeta(WireWriter& w, const DatasetMeta& m) {
  w.Str(m.name);
  w.I64s(m.feature_shape);
  w.I64s(m.target_shape);
  w.I64(m.target_dtype == TargetDType::kInt64 ? 1 : 0);
  w.I64(m.rows);
  w.I64(m.size_bytes);
  w.I64(m.feature_bytes);
  w.I64(m.target_min);
  w.I64(m.target_max);
}

absl::StatusOr<DatasetMeta> GetMeta(WireReader& r) {
  DatasetMeta m;
  TRAINERD_ASSIGN_OR_RETURN(m.name, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(m.feature_shape, r.I64s(kMaxDims));
  TRAINERD_ASSIGN_OR_RETURN(m.target_shape, r.I64s(kMaxDims));
  TRAINERD_ASSIGN_OR_RETURN(const int64_t dtype, r.Int(0, 1, "a target dtype"));
  m.target_dtype = dtype == 1 ? TargetDType::kInt64 : TargetDType::kFloat32;
  TRAINERD_ASSIGN_OR_RETURN(m.rows, r.Int(0, kMaxRows, "a row count"));
  TRAINERD_ASSIGN_OR_RETURN(m.size_bytes, r.Int(0, kMaxRows, "a dataset size"));
  TRAINERD_ASSIGN_OR_RETURN(m.feature_bytes, r.Int(0, m.size_bytes, "the features' size"));
  TRAINERD_ASSIGN_OR_RETURN(m.target_min, r.I64());
  TRAINERD_ASSIGN_OR_RETURN(m.target_max, r.I64());
  return m;
}

void PutDataset(WireWriter& w, const WorkerDataset& d) {
  PutMeta(w, d.meta);
  w.I64(d.features_region_bytes);
  w.I64(d.features_offset);
  w.I64(d.targets_region_bytes);
  w.I64(d.targets_offset);
}

absl::StatusOr<WorkerDataset> GetDataset(WireReader& r) {
  WorkerDataset d;
  TRAINERD_ASSIGN_OR_RETURN(d.meta, GetMeta(r));
  TRAINERD_ASSIGN_OR_RETURN(d.features_region_bytes, r.Int(0, kMaxRows, "a region size"));
  TRAINERD_ASSIGN_OR_RETURN(d.features_offset, r.Int(0, d.features_region_bytes, "an offset"));
  TRAINERD_ASSIGN_OR_RETURN(d.targets_region_bytes, r.Int(0, kMaxRows, "a region size"));
  TRAINERD_ASSIGN_OR_RETURN(d.targets_offset, r.Int(0, d.targets_region_bytes, "an offset"));
  return d;
}

// A loss's weights (class weights, pos_weight): their count, then each value's bits.
void PutF64s(WireWriter& w, const std::vector<double>& values) {
  w.I64(static_cast<int64_t>(values.size()));
  for (double v : values) w.F64(v);
}

absl::StatusOr<std::vector<double>> GetF64s(WireReader& r, std::string_view what) {
  TRAINERD_ASSIGN_OR_RETURN(const int64_t count, r.Int(0, kMaxLossWeights, what));
  std::vector<double> values;  // grown as values arrive: a short message allocates little
  for (int64_t i = 0; i < count; ++i) {
    TRAINERD_ASSIGN_OR_RETURN(double v, r.F64());
    values.push_back(v);
  }
  return values;
}

void PutSpec(WireWriter& w, const JobSpec& s) {
  w.Str(s.dataset);
  w.Str(s.model);
  w.I64(static_cast<int64_t>(s.loss));
  w.I64(static_cast<int64_t>(s.optimizer));
  w.F64(s.learning_rate);
  w.F64(s.momentum);
  w.Bool(s.nesterov);
  w.OptF64(s.weight_decay);
  w.OptF64(s.beta1);
  w.OptF64(s.beta2);
  w.OptF64(s.eps);
  w.OptF64(s.alpha);
  w.Bool(s.amsgrad);
  w.Bool(s.centered);
  w.OptF64(s.momentum_decay);
  w.Bool(s.decoupled_weight_decay);
  w.OptF64(s.lr_decay);
  w.OptF64(s.initial_accumulator_value);
  w.Bool(s.weight_decay_exclude_bias_and_norm);
  w.F64(s.huber_delta);
  w.F64(s.label_smoothing);
  w.I64(static_cast<int64_t>(s.schedule.kind));
  w.I64(s.schedule.step_epochs);
  w.F64(s.schedule.gamma);
  w.F64(s.schedule.min_learning_rate);
  w.I64(s.schedule.warmup_epochs);
  w.Bool(s.schedule.per_step);
  w.I64(s.schedule.warmup_steps);
  w.I64s(std::vector<int64_t>(s.schedule.milestones.begin(), s.schedule.milestones.end()));
  w.I64(s.schedule.t_0);
  w.Bool(s.schedule.t_mult.has_value());
  w.I64(s.schedule.t_mult.value_or(0));
  w.OptF64(s.schedule.pct_start);
  w.Str(s.schedule.anneal_strategy);
  w.OptF64(s.schedule.div_factor);
  w.OptF64(s.schedule.final_div_factor);
  w.Bool(s.schedule.three_phase);
  w.OptF64(s.schedule.factor);
  w.Bool(s.schedule.patience.has_value());
  w.I64(s.schedule.patience.value_or(0));
  w.OptF64(s.schedule.threshold);
  w.I64(s.schedule.cooldown);
  w.F64(s.clip_grad_norm);
  w.I64(s.batch_size);
  w.I64(s.epochs);
  w.Bool(s.shuffle);
  w.Bool(s.seed.has_value());
  w.I64(static_cast<int64_t>(s.seed.value_or(0)));
  w.Str(s.device);
  w.F64(s.validation_fraction);
  w.Str(s.validation_dataset);
  w.I64(s.early_stop_patience);
  w.I64(s.checkpoint_every);
  w.I64(static_cast<int64_t>(s.precision));
  w.I64(static_cast<int64_t>(s.priority));
  w.I64(static_cast<int64_t>(s.engine));
  w.F64(s.max_job_seconds);
  PutF64s(w, s.class_weights);
  w.Bool(s.ignore_index.has_value());
  w.I64(s.ignore_index.value_or(0));
  PutF64s(w, s.pos_weight);
  w.F64(s.early_stop_min_delta);
  w.I64(static_cast<int64_t>(s.early_stop_metric));
  w.I64(s.gradient_accumulation_steps);
  w.Bool(s.drop_last);
  w.I64(static_cast<int64_t>(s.model_from));
}

absl::StatusOr<JobSpec> GetSpec(WireReader& r) {
  JobSpec s;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  TRAINERD_ASSIGN_OR_RETURN(s.dataset, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(s.model, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(int64_t v, r.Int(0, static_cast<int>(LossKind::kNll), "a loss"));
  s.loss = static_cast<LossKind>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, static_cast<int>(OptimizerKind::kAdagrad), "an optimizer"));
  s.optimizer = static_cast<OptimizerKind>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.learning_rate, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.momentum, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.nesterov, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(s.weight_decay, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.beta1, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.beta2, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.eps, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.alpha, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.amsgrad, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(s.centered, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(s.momentum_decay, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.decoupled_weight_decay, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(s.lr_decay, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.initial_accumulator_value, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.weight_decay_exclude_bias_and_norm, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(s.huber_delta, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.label_smoothing, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(
      v, r.Int(0, static_cast<int>(ScheduleKind::kCosineWarmRestarts), "a schedule"));
  s.schedule.kind = static_cast<ScheduleKind>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "step epochs"));
  s.schedule.step_epochs = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.gamma, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.min_learning_rate, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "warm-up epochs"));
  s.schedule.warmup_epochs = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.per_step, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "warm-up steps"));
  s.schedule.warmup_steps = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(const std::vector<int64_t> milestones, r.I64s(ScheduleSpec::kMaxMilestones));
  for (int64_t milestone : milestones) {
    if (milestone < 1 || milestone > kInt32Max) {
      return absl::InvalidArgumentError("a milestone is out of range");
    }
    s.schedule.milestones.push_back(static_cast<int32_t>(milestone));
  }
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "t_0"));
  s.schedule.t_0 = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(const bool has_t_mult, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "t_mult"));
  if (has_t_mult) s.schedule.t_mult = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.pct_start, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.anneal_strategy, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.div_factor, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.final_div_factor, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.three_phase, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.factor, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(const bool has_patience, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "plateau patience"));
  if (has_patience) s.schedule.patience = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.schedule.threshold, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "plateau cooldown"));
  s.schedule.cooldown = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.clip_grad_norm, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.batch_size, r.Int(1, kMaxRows, "a batch size"));
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(1, kInt32Max, "epochs"));
  s.epochs = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.shuffle, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(const bool has_seed, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.I64());
  if (has_seed) s.seed = static_cast<uint64_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.device, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(s.validation_fraction, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.validation_dataset, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "patience"));
  s.early_stop_patience = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, kInt32Max, "checkpoint_every"));
  s.checkpoint_every = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, static_cast<int>(Precision::kFp16), "a precision"));
  s.precision = static_cast<Precision>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, static_cast<int>(JobPriority::kHigh), "a priority"));
  s.priority = static_cast<JobPriority>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, static_cast<int>(EngineKind::kLibTorch), "an engine"));
  s.engine = static_cast<EngineKind>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.max_job_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(s.class_weights, GetF64s(r, "class weights"));
  TRAINERD_ASSIGN_OR_RETURN(const bool has_ignore_index, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.I64());
  if (has_ignore_index) s.ignore_index = v;
  TRAINERD_ASSIGN_OR_RETURN(s.pos_weight, GetF64s(r, "pos_weight values"));
  TRAINERD_ASSIGN_OR_RETURN(s.early_stop_min_delta, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(
      v, r.Int(0, static_cast<int>(EarlyStopMetric::kValidationAccuracy), "an early stop metric"));
  s.early_stop_metric = static_cast<EarlyStopMetric>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(1, kInt32Max, "gradient accumulation steps"));
  s.gradient_accumulation_steps = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(s.drop_last, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, static_cast<int>(ModelFrom::kBest), "a model_from"));
  s.model_from = static_cast<ModelFrom>(v);
  return s;
}

void PutEpoch(WireWriter& w, const EpochResult& e) {
  w.I64(e.epoch);
  w.F64(e.loss);
  w.F64(e.elapsed_seconds);
  w.F64(e.learning_rate);
  w.OptF64(e.validation_loss);
  w.OptF64(e.validation_accuracy);
  w.OptF64(e.loss_scale);
  w.I64(e.skipped_steps);
}

absl::StatusOr<EpochResult> GetEpoch(WireReader& r, int32_t max_epoch) {
  EpochResult e;
  TRAINERD_ASSIGN_OR_RETURN(int64_t v, r.Int(1, max_epoch, "an epoch number"));
  e.epoch = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(e.loss, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(e.elapsed_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(e.learning_rate, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(e.validation_loss, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(e.validation_accuracy, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(e.loss_scale, r.OptF64());
  TRAINERD_ASSIGN_OR_RETURN(e.skipped_steps, r.Int(0, kMaxRows, "skipped steps"));
  return e;
}

}  // namespace

void WireWriter::I64(int64_t v) {
  char b[8];
  PutU64(b, static_cast<uint64_t>(v));
  out_.append(b, 8);
}

void WireWriter::F64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  I64(static_cast<int64_t>(bits));
}

void WireWriter::Str(std::string_view v) {
  I64(static_cast<int64_t>(v.size()));
  out_.append(v.data(), v.size());
}

void WireWriter::I64s(const std::vector<int64_t>& v) {
  I64(static_cast<int64_t>(v.size()));
  for (int64_t x : v) I64(x);
}

void WireWriter::OptF64(const std::optional<double>& v) {
  Bool(v.has_value());
  F64(v.value_or(0.0));
}

absl::StatusOr<uint8_t> WireReader::U8() {
  if (in_.empty()) return Short("a byte");
  const uint8_t v = static_cast<uint8_t>(in_[0]);
  in_.remove_prefix(1);
  return v;
}

absl::StatusOr<bool> WireReader::Bool() {
  TRAINERD_ASSIGN_OR_RETURN(const uint8_t v, U8());
  if (v > 1)
    return absl::InvalidArgumentError("the worker's message has a flag that is not 0 or 1");
  return v == 1;
}

absl::StatusOr<int64_t> WireReader::I64() {
  if (in_.size() < 8) return Short("a number");
  const uint64_t v = GetU64(in_.data());
  in_.remove_prefix(8);
  return static_cast<int64_t>(v);
}

absl::StatusOr<double> WireReader::F64() {
  TRAINERD_ASSIGN_OR_RETURN(const int64_t bits, I64());
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}

absl::StatusOr<std::string> WireReader::Str(size_t max_bytes) {
  TRAINERD_ASSIGN_OR_RETURN(const int64_t n, I64());
  if (n < 0 || static_cast<uint64_t>(n) > max_bytes || static_cast<uint64_t>(n) > in_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the worker's message declares a string of ", n, " bytes"));
  }
  std::string v(in_.substr(0, static_cast<size_t>(n)));
  in_.remove_prefix(static_cast<size_t>(n));
  return v;
}

absl::StatusOr<std::vector<int64_t>> WireReader::I64s(size_t max_count) {
  TRAINERD_ASSIGN_OR_RETURN(const int64_t n, I64());
  if (n < 0 || static_cast<uint64_t>(n) > max_count || static_cast<uint64_t>(n) > in_.size() / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("the worker's message declares a list of ", n, " numbers"));
  }
  std::vector<int64_t> v;
  v.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    TRAINERD_ASSIGN_OR_RETURN(const int64_t x, I64());
    v.push_back(x);
  }
  return v;
}

absl::StatusOr<std::optional<double>> WireReader::OptF64() {
  TRAINERD_ASSIGN_OR_RETURN(const bool has, Bool());
  TRAINERD_ASSIGN_OR_RETURN(const double v, F64());
  if (!has) return std::optional<double>();
  return std::optional<double>(v);
}

absl::StatusOr<int64_t> WireReader::Int(int64_t lo, int64_t hi, std::string_view what) {
  TRAINERD_ASSIGN_OR_RETURN(const int64_t v, I64());
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("the worker's message has ",
                                                   absl::string_view(what.data(), what.size()),
                                                   " of ", v, ", outside [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::Status SendFrame(int socket, WorkerFrame type, std::string_view payload,
                       const std::vector<int>& fds) {
  char header[kFrameHeaderBytes];
  PutU32(header, kMagic);
  PutU32(header + 4, static_cast<uint32_t>(type));
  PutU64(header + 8, payload.size());
  std::string_view parts[2] = {std::string_view(header, sizeof(header)), payload};
  bool first = true;
  for (std::string_view part : parts) {
    while (!part.empty()) {
      iovec iov{const_cast<char*>(part.data()), part.size()};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameDescriptors)];
      if (first && !fds.empty()) {
        if (fds.size() > static_cast<size_t>(kMaxFrameDescriptors)) {
          return absl::InternalError("too many descriptors for one frame");
        }
        std::memset(control, 0, sizeof(control));
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
      }
      const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(
            absl::StrCat("cannot write to the worker's socket: ", std::strerror(errno)));
      }
      first = false;
      part.remove_prefix(static_cast<size_t>(n));
    }
  }
  return absl::OkStatus();
}

namespace {

// Reads exactly `size` bytes (blocking), collecting descriptors.
absl::Status ReadExactly(int socket, char* out, size_t size, std::vector<int>* fds) {
  while (size > 0) {
    iovec iov{out, size};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameDescriptors)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("cannot read from the socket: ", std::strerror(errno)));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds != nullptr) {
          fds->push_back(fd);
        } else {
          ::close(fd);
        }
      }
    }
    if (n == 0) return absl::UnavailableError("the socket was closed");
    out += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReceiveFrame(int socket, size_t max_payload, WorkerFrame* type, std::string* payload,
                          std::vector<int>* fds) {
  char header[kFrameHeaderBytes];
  TRAINERD_RETURN_IF_ERROR(ReadExactly(socket, header, sizeof(header), fds));
  uint64_t length = 0;
  TRAINERD_RETURN_IF_ERROR(CheckHeader(header, max_payload, type, &length));
  payload->assign(static_cast<size_t>(length), '\0');
  return ReadExactly(socket, payload->data(), payload->size(), fds);
}

absl::Status FrameAssembler::ReadAvailable(int socket, bool* closed) {
  *closed = false;
  TRAINERD_RETURN_IF_ERROR(error_);
  // The frames Next() took leave the front here, once per read rather than once per frame: a
  // worker that sends megabytes of tiny frames costs time linear in its bytes.
  if (start_ > 0) {
    buffer_.erase(0, start_);
    start_ = 0;
  }
  char chunk[64 << 10];
  size_t read_now = 0;
  // At most this much per call, so that a worker that never stops sending cannot keep the
  // daemon's thread reading: the caller takes the frames, then reads again.
  constexpr size_t kMaxReadPerCall = size_t{4} << 20;
  while (read_now < kMaxReadPerCall) {
    std::vector<int> fds;
    iovec iov{chunk, sizeof(chunk)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameDescriptors)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      *closed = true;
      return absl::OkStatus();
    }
    // The worker has no business sending descriptors: they are closed unread.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        ::close(fd);
      }
    }
    if (n == 0) {
      *closed = true;
      return absl::OkStatus();
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    read_now += static_cast<size_t>(n);
    // The header is checked as soon as it is there, so that a frame over the bound is refused
    // before its bytes are kept.
    if (buffer_.size() >= kFrameHeaderBytes) {
      WorkerFrame type;
      uint64_t length = 0;
      TRAINERD_RETURN_IF_ERROR(CheckHeader(buffer_.data(), max_payload_, &type, &length));
    }
  }
  return absl::OkStatus();
}

bool FrameAssembler::Next(WorkerFrame* type, std::string* payload) {
  if (!error_.ok() || buffer_.size() - start_ < kFrameHeaderBytes) return false;
  uint64_t length = 0;
  if (absl::Status header = CheckHeader(buffer_.data() + start_, max_payload_, type, &length);
      !header.ok()) {
    error_ = header;  // the next ReadAvailable returns it
    return false;
  }
  if (buffer_.size() - start_ - kFrameHeaderBytes < length) return false;
  payload->assign(buffer_, start_ + kFrameHeaderBytes, static_cast<size_t>(length));
  start_ += kFrameHeaderBytes + static_cast<size_t>(length);
  return true;
}

std::string EncodeWorkerReady(const WorkerReady& ready) {
  WireWriter w;
  w.Str(EncodeSandboxReport(ready.sandbox));
  w.Str(ready.applied.substr(0, 4096));
  return w.Take();
}

absl::StatusOr<WorkerReady> DecodeWorkerReady(std::string_view payload) {
  WireReader r(payload);
  WorkerReady ready;
  TRAINERD_ASSIGN_OR_RETURN(const std::string line, r.Str(1024));
  TRAINERD_ASSIGN_OR_RETURN(ready.sandbox, DecodeSandboxReport(line));
  TRAINERD_ASSIGN_OR_RETURN(ready.applied, r.Str(4096));
  if (!r.done()) return absl::InvalidArgumentError("the worker's ready message has trailing bytes");
  return ready;
}

std::string EncodeWorkerJob(const WorkerJob& job) {
  WireWriter w;
  w.Str(job.job_id);
  PutSpec(w, job.spec);
  w.Str(job.device);
  w.I64(job.intra_op_threads);
  w.Bool(job.flush_denormal);
  w.I64(job.cpu_nice);
  w.Bool(job.checkpoints);
  PutDataset(w, job.dataset);
  w.Bool(job.validation_dataset.has_value());
  if (job.validation_dataset) PutDataset(w, *job.validation_dataset);
  w.Str(job.module);
  w.Str(job.resume_checkpoint);
  w.I64(job.memory_limit_bytes);
  w.I64(job.cpu_seconds);
  w.I64(job.data_limit_bytes);
  w.I64(job.device_memory_limit_bytes);
  return w.Take();
}

absl::StatusOr<WorkerJob> DecodeWorkerJob(std::string_view payload) {
  WireReader r(payload);
  WorkerJob job;
  TRAINERD_ASSIGN_OR_RETURN(job.job_id, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(job.spec, GetSpec(r));
  TRAINERD_ASSIGN_OR_RETURN(job.device, r.Str(kMaxNameBytes));
  TRAINERD_ASSIGN_OR_RETURN(const int64_t threads, r.Int(1, 4096, "a thread count"));
  job.intra_op_threads = static_cast<int32_t>(threads);
  TRAINERD_ASSIGN_OR_RETURN(job.flush_denormal, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(const int64_t nice, r.Int(0, 19, "a nice value"));
  job.cpu_nice = static_cast<int32_t>(nice);
  TRAINERD_ASSIGN_OR_RETURN(job.checkpoints, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(job.dataset, GetDataset(r));
  TRAINERD_ASSIGN_OR_RETURN(const bool has_validation, r.Bool());
  if (has_validation) {
    TRAINERD_ASSIGN_OR_RETURN(WorkerDataset validation, GetDataset(r));
    job.validation_dataset = std::move(validation);
  }
  TRAINERD_ASSIGN_OR_RETURN(job.module, r.Str(payload.size()));
  TRAINERD_ASSIGN_OR_RETURN(job.resume_checkpoint, r.Str(payload.size()));
  TRAINERD_ASSIGN_OR_RETURN(job.memory_limit_bytes, r.Int(0, kMaxRows, "a memory limit"));
  TRAINERD_ASSIGN_OR_RETURN(job.cpu_seconds, r.Int(0, kMaxRows, "a CPU time limit"));
  TRAINERD_ASSIGN_OR_RETURN(job.data_limit_bytes, r.Int(0, kMaxRows, "a memory limit"));
  TRAINERD_ASSIGN_OR_RETURN(job.device_memory_limit_bytes, r.Int(0, kMaxRows, "a memory limit"));
  if (!r.done()) return absl::InvalidArgumentError("the job message has bytes after its end");
  return job;
}

std::string EncodeWorkerEpoch(const WorkerEpoch& epoch) {
  WireWriter w;
  PutEpoch(w, epoch.epoch);
  w.I64(epoch.steps);
  w.I64(epoch.host_syncs);
  return w.Take();
}

absl::StatusOr<WorkerEpoch> DecodeWorkerEpoch(std::string_view payload) {
  WireReader r(payload);
  WorkerEpoch e;
  TRAINERD_ASSIGN_OR_RETURN(e.epoch, GetEpoch(r, std::numeric_limits<int32_t>::max()));
  TRAINERD_ASSIGN_OR_RETURN(e.steps, r.Int(0, kMaxRows, "a step count"));
  TRAINERD_ASSIGN_OR_RETURN(e.host_syncs, r.Int(0, kMaxRows, "a sync count"));
  if (!r.done()) return absl::InvalidArgumentError("the epoch message has bytes after its end");
  return e;
}

std::string EncodeWorkerCheckpoint(const WorkerCheckpoint& checkpoint) {
  WireWriter w;
  w.I64(checkpoint.epoch);
  w.Str(checkpoint.bytes);
  return w.Take();
}

absl::StatusOr<WorkerCheckpoint> DecodeWorkerCheckpoint(std::string_view payload,
                                                        int32_t max_epoch) {
  WireReader r(payload);
  WorkerCheckpoint c;
  TRAINERD_ASSIGN_OR_RETURN(const int64_t epoch, r.Int(1, max_epoch, "a checkpoint's epoch"));
  c.epoch = static_cast<int32_t>(epoch);
  TRAINERD_ASSIGN_OR_RETURN(c.bytes, r.Str(payload.size()));
  if (!r.done())
    return absl::InvalidArgumentError("the checkpoint message has bytes after its end");
  return c;
}

std::string EncodeWorkerOutcome(const TrainingOutcome& o) {
  WireWriter w;
  w.I64(static_cast<int64_t>(o.state));
  w.Bool(o.interrupted);
  w.I64(o.resumed_steps);
  w.Str(o.error);
  w.I64(o.steps);
  w.I64(o.host_syncs);
  w.I64(o.epochs_done);
  w.Bool(o.stopped_early);
  w.I64(o.model_epoch);
  w.I64(o.best_epoch);
  w.F64(o.final_loss);
  w.F64(o.wall_seconds);
  w.I64(o.parameter_count);
  w.I64(static_cast<int64_t>(o.parameters.size()));
  for (const ParameterValues& p : o.parameters) {
    w.Str(p.name);
    w.I64s(p.shape);
    w.Str(std::string_view(reinterpret_cast<const char*>(p.values.data()),
                           p.values.size() * sizeof(float)));
  }
  w.F64(o.data_seconds);
  w.F64(o.loop_seconds);
  w.F64(o.host_transfer_seconds);
  w.F64(o.loop_host_transfer_seconds);
  w.F64(o.checkpoint_seconds);
  w.I64(o.host_to_device_bytes);
  w.I64(o.peak_memory_bytes);
  w.Str(o.engine);
  w.Str(o.engine_reason);
  w.Str(o.model_archive);
  w.Str(o.state_dict);
  return w.Take();
}

absl::StatusOr<TrainingOutcome> DecodeWorkerOutcome(std::string_view payload, int32_t max_epochs) {
  WireReader r(payload);
  TrainingOutcome o;
  TRAINERD_ASSIGN_OR_RETURN(int64_t v, r.Int(static_cast<int>(JobState::kRunning),
                                             static_cast<int>(JobState::kCancelled), "a state"));
  o.state = static_cast<JobState>(v);
  TRAINERD_ASSIGN_OR_RETURN(o.interrupted, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(o.resumed_steps, r.Int(0, kMaxRows, "a step count"));
  TRAINERD_ASSIGN_OR_RETURN(o.error, r.Str(kMaxErrorBytes));
  // The worker's words go into logs, records and terminals: as text, in one line.
  o.error = EscapeControls(o.error, LineBreaks::kSpace);
  TRAINERD_ASSIGN_OR_RETURN(o.steps, r.Int(0, kMaxRows, "a step count"));
  TRAINERD_ASSIGN_OR_RETURN(o.host_syncs, r.Int(0, kMaxRows, "a sync count"));
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, max_epochs, "an epoch count"));
  o.epochs_done = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(o.stopped_early, r.Bool());
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, o.epochs_done, "a model epoch"));
  o.model_epoch = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(v, r.Int(0, o.epochs_done, "a best epoch"));
  o.best_epoch = static_cast<int32_t>(v);
  TRAINERD_ASSIGN_OR_RETURN(o.final_loss, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.wall_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.parameter_count, r.Int(0, kMaxRows, "a parameter count"));
  TRAINERD_ASSIGN_OR_RETURN(const int64_t count,
                            r.Int(0, kMaxReportedParameters, "a parameter list"));
  int64_t values = 0;
  for (int64_t i = 0; i < count; ++i) {
    ParameterValues p;
    TRAINERD_ASSIGN_OR_RETURN(p.name, r.Str(kMaxNameBytes));
    p.name = EscapeControls(p.name);
    TRAINERD_ASSIGN_OR_RETURN(p.shape, r.I64s(kMaxDims));
    TRAINERD_ASSIGN_OR_RETURN(const std::string raw, r.Str(sizeof(float) * kMaxReportedParameters));
    if (raw.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError("the worker's parameter values are not whole floats");
    }
    p.values.resize(raw.size() / sizeof(float));
    std::memcpy(p.values.data(), raw.data(), raw.size());
    values += static_cast<int64_t>(p.values.size());
    if (values > kMaxReportedParameters) {
      return absl::InvalidArgumentError("the worker reported more parameter values than allowed");
    }
    o.parameters.push_back(std::move(p));
  }
  TRAINERD_ASSIGN_OR_RETURN(o.data_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.loop_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.host_transfer_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.loop_host_transfer_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.checkpoint_seconds, r.F64());
  TRAINERD_ASSIGN_OR_RETURN(o.host_to_device_bytes, r.Int(0, kMaxRows, "a byte count"));
  TRAINERD_ASSIGN_OR_RETURN(o.peak_memory_bytes, r.Int(0, kMaxRows, "a byte count"));
  TRAINERD_ASSIGN_OR_RETURN(o.engine, r.Str(256));
  TRAINERD_ASSIGN_OR_RETURN(o.engine_reason, r.Str(kMaxErrorBytes));
  o.engine_reason = EscapeControls(o.engine_reason, LineBreaks::kSpace);
  TRAINERD_ASSIGN_OR_RETURN(o.model_archive, r.Str(payload.size()));
  TRAINERD_ASSIGN_OR_RETURN(o.state_dict, r.Str(payload.size()));
  if (!r.done()) return absl::InvalidArgumentError("the outcome message has bytes after its end");
  return o;
}

}  // namespace trainerd::engine
