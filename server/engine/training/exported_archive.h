// The reading and checking of an exported program's archive (.pt2), shared by its checker
// (exported_archive.cc: CheckExportedProgram, IsExportedProgramArchive, the allow-list) and its
// runtime (exported_program.cc: Load, Forward, SaveArchive). Internal to the training library;
// exported_program.h is the interface and says what is checked.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/training/exported_program.h"

namespace trainerd::engine::exported_archive {

inline constexpr char kWeightsConfig[] = "data/weights/model_weights_config.json";

// Python's integer operators on symbolic sizes, which the interpreter computes itself.
enum class Builtin { kNone, kMul, kAdd, kSub, kFloorDiv, kGetItem };

// A weight's checked metadata.
struct WeightMeta {
  std::string name;    // the state_dict name
  std::string record;  // "data/weights/weight_0"
  bool is_param = false;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;
  int64_t storage_elements = 0;  // the record's length in elements
  bool requires_grad = false;
};

// An argument of a node, resolved when the graph is read.
struct Slot {
  enum Kind {
    kConstant,
    kValue,
    kValueList,
    kOptionalValueList,
    kIntList,
    kDevice
  } kind = kConstant;
  c10::IValue constant;
  int value = -1;             // kValue
  std::vector<int> values;    // kValueList/kOptionalValueList (-1: None)/kIntList (-1: const)
  std::vector<int64_t> ints;  // kIntList's constants
};

// An argument whose value depends on the mode: its value in training and in evaluation.
struct ModeSwitch {
  size_t position = 0;
  c10::IValue train, eval;
};

struct Node {
  std::string name;    // its first output's name, for messages
  std::string target;  // as written
  Builtin builtin = Builtin::kNone;
  std::optional<c10::OperatorHandle> op;
  std::vector<Slot> arguments;    // one per schema argument (or the builtin's two)
  std::vector<ModeSwitch> modes;  // applied in evaluation mode
  bool is_dropout = false;        // aten.dropout: drawn from the job's generator
  bool mutates_buffer = false;    // an in-place operator on a buffer: skipped in evaluation mode
  std::vector<int> outputs;       // value slots; -1 for an output nothing uses
  bool list_output = false;       // one output that is a list of tensors
};

struct Parsed {
  std::string prefix;  // the archive's top folder with "/"
  std::vector<WeightMeta> weights;
  std::vector<Node> nodes;
  int value_count = 0;
  std::vector<int> input_slots;  // per graph input (weights in `weights` order, then the batch)
  std::vector<int> weight_slot;  // per weight
  int batch_slot = -1;
  int output_slot = -1;
  ExportedProgramInfo info;
};

// The archive's zip, read within its bytes (BoundedReadAdapter).
std::unique_ptr<caffe2::serialize::PyTorchStreamReader> OpenZip(std::string_view archive);

// A record's bytes. Throws on a missing record: call it for records ReadProgram has seen.
std::string ReadRecord(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name);

// The JSON of `text` (record `record`), its nesting checked first. Throws on malformed JSON: call
// it for records ReadProgram has read.
nlohmann::json ParseJson(std::string_view text, const std::string& record);

// torch.export's dtype code of `type` (7 for float32); throws for a type it has none for.
int64_t ExportScalarTypeCode(at::ScalarType type);

// Reads and checks the program in `zip` into `parsed` (its weights' metadata, its nodes with their
// operators resolved, its signature): INVALID_ARGUMENT or PERMISSION_DENIED naming what is wrong.
absl::Status ReadProgram(caffe2::serialize::PyTorchStreamReader& zip, Parsed& parsed);

}  // namespace trainerd::engine::exported_archive
