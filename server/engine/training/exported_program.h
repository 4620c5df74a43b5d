// Bring your own model as an exported program: the archive torch.export.save writes (.pt2), read
// and checked without unpickling anything, and run by a small interpreter of its graph that calls
// each node's ATen operator through LibTorch's dispatcher, so that autograd records every operator
// exactly as eager PyTorch does (docs/ARCHITECTURE.md says why neither torch::nativert nor a
// Python worker runs it).
//
// The archive (a zip with one top folder, "<name>/"):
//   models/model.json                          the graph as JSON (read)
//   data/weights/model_weights_config.json     each parameter's and buffer's record and metadata
//   data/weights/weight_N                      raw little-endian tensor bytes
//   data/constants/model_constants_config.json must be empty (lifted constants are refused)
//   data/sample_inputs/model.pt                a pickle: never read
// Every weight whose config says use_pickle is refused. Every size, stride and storage offset is
// checked (common/checked_size.h) against its record's size before anything is allocated.
//
// The checker refuses any node whose target is not on the allow-list (ExportedOperatorAllowed):
// ATen operators of tensor arithmetic, plus the Python integer operators export emits for symbolic
// sizes (_operator.mul, add, sub, floordiv). No custom operators, no higher-order operators, no
// Python callables. The graph's inputs are its parameters, its buffers and one user input (the
// batch, first dimension dynamic); its one output is a tensor with the batch dimension first.
//
// Train and evaluation mode: the program is exported in training mode; the interpreter switches
// the nodes' own mode arguments (dropout's `train`, batch_norm's `training` when it has running
// statistics, the recurrent layers' `train`, scaled_dot_product_attention's `dropout_p`), and in
// evaluation mode no buffer is mutated (batch norm's num_batches_tracked), as nn.Module.eval().
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace trainerd::engine {

// The JobSpec::model text an exported-program job may give instead of an empty one; the job then
// reports "exported (N bytes)".
inline constexpr char kExportedModelName[] = "exported";

// At most this many graph nodes; an archive's records expand to at most 4 x kMaxTorchScriptBytes
// in all (both limits beside the TorchScript ones, common/job_limits.h).
inline constexpr int64_t kMaxExportedNodes = 20000;

// Whether `archive` is a zip whose first record lies under "<name>/" and that holds
// "<name>/models/model.json" (an exported program), as opposed to a TorchScript archive. Reads
// the zip's central directory only. Never throws.
bool IsExportedProgramArchive(std::string_view archive);

// Whether `target` ("torch.ops.aten.linear.default", "_operator.mul") is on the allow-list.
bool ExportedOperatorAllowed(std::string_view target);

// The allow-list, one target per entry, for docs and error messages.
const std::vector<std::string>& ExportedOperatorList();

// What the checks found in an archive, without any of its tensors.
struct ExportedProgramInfo {
  std::vector<int64_t> input_shape;   // per row: the user input's shape after its batch dim
  std::vector<int64_t> output_shape;  // per row: the output's shape after its batch dim
  int64_t parameter_count = 0;        // values in all parameters
  int64_t node_count = 0;
};

class ExportedProgram;

// Reads and checks the archive (everything above) without allocating a tensor or running an
// operator. INVALID_ARGUMENT for an archive that is not a well-formed exported program (naming
// the record, node or weight), PERMISSION_DENIED for an operator off the list, a pickled weight or
// a higher-order operator. Never throws.
absl::StatusOr<ExportedProgramInfo> CheckExportedProgram(std::string_view archive);

// The interpreter of one checked program. Not thread-safe (one job's thread).
class ExportedProgram {
 public:
  // Checks (CheckExportedProgram) and loads the archive onto the CPU: parameters become leaf
  // tensors that require grad, buffers tensors that do not. `generator` (the job's) draws
  // dropout's masks in training mode (x * mask / (1 - p), mask ~ Bernoulli(1 - p)); the default
  // generator when not given. Never throws.
  static absl::StatusOr<std::shared_ptr<ExportedProgram>> Load(
      std::string_view archive, std::optional<at::Generator> generator = std::nullopt);

  ~ExportedProgram();
  ExportedProgram(const ExportedProgram&) = delete;
  ExportedProgram& operator=(const ExportedProgram&) = delete;

  // Runs the graph on a batch shaped [rows, *input_shape]. Throws c10::Error (and
  // std::runtime_error for a shape that does not fit) as LibTorch does.
  at::Tensor Forward(const at::Tensor& input);

  void Train(bool on) { training_ = on; }
  bool training() const { return training_; }
  // Moves parameters and buffers in place (their identity, and so an optimizer's hold on them,
  // is kept), and makes the graph's tensor factories (zeros, ...) create on `device`.
  void To(const at::Device& device);
  void SetGenerator(std::optional<at::Generator> generator) { generator_ = std::move(generator); }

  // By the module's own names ("fc.weight", "bn.running_mean"), in the program's order.
  const std::vector<std::pair<std::string, at::Tensor>>& named_parameters() const {
    return parameters_;
  }
  const std::vector<std::pair<std::string, at::Tensor>>& named_buffers() const { return buffers_; }
  const ExportedProgramInfo& info() const { return info_; }

  // The archive it was loaded from with every weight record replaced by the current values (on
  // the CPU, contiguous), so that torch.export.load of it gives the trained program. Throws
  // c10::Error.
  std::string SaveArchive() const;

 private:
  struct Impl;
  ExportedProgram();
  std::unique_ptr<Impl> impl_;
  ExportedProgramInfo info_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  std::vector<std::pair<std::string, at::Tensor>> buffers_;
  std::optional<at::Generator> generator_;
  bool training_ = true;
};

}  // namespace trainerd::engine
