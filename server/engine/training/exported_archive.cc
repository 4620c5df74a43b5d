// The exported program's archive: its records read without unpickling, its graph read into
// nodes and checked against the allow-list (exported_archive.h, exported_program.h).
#include "server/engine/training/exported_archive.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_size.h"
#include "common/job_limits.h"
#include "server/engine/training/bounded_read_adapter.h"

namespace trainerd::engine {
namespace exported_archive {
namespace {

using json = nlohmann::json;

constexpr char kModelJson[] = "models/model.json";
constexpr char kConstantsConfig[] = "data/constants/model_constants_config.json";
constexpr char kWeightsDir[] = "data/weights/";
constexpr char kListDoc[] = "docs/MODELS.md lists the operators an exported program may use";

// A malformed or refused archive, thrown inside the reader and turned into a status at its edge.
struct Refusal {
  absl::StatusCode code;
  std::string message;
};
[[noreturn]] void Malformed(std::string message) {
  throw Refusal{absl::StatusCode::kInvalidArgument,
                absl::StrCat("the exported program is not well formed: ", message)};
}
[[noreturn]] void Denied(std::string message) {
  throw Refusal{absl::StatusCode::kPermissionDenied, std::move(message)};
}
void Check(absl::Status status) {
  if (!status.ok()) throw Refusal{status.code(), std::string(status.message())};
}
template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Check(value.status());
  return *std::move(value);
}

// The allow-list: tensor arithmetic only. Mode-dependent operators are on it only where the
// interpreter switches them (ModeArgument below).
const std::set<std::string, std::less<>>& AllowedTargets() {
  static const auto* list = new std::set<std::string, std::less<>>{
      // layers
      "aten.linear.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
      "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv_transpose1d.default",
      "aten.conv_transpose2d.input", "aten.max_pool1d.default", "aten.max_pool2d.default",
      "aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.adaptive_avg_pool1d.default",
      "aten.adaptive_avg_pool2d.default", "aten.adaptive_max_pool2d.default",
      "aten.batch_norm.default", "aten.layer_norm.default", "aten.group_norm.default",
      "aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default",
      "aten.feature_alpha_dropout.default", "aten.lstm.input", "aten.gru.input",
      "aten.rnn_tanh.input", "aten.rnn_relu.input", "aten.scaled_dot_product_attention.default",
      // activations
      "aten.relu.default", "aten.relu_.default", "aten.gelu.default", "aten.silu.default",
      "aten.tanh.default", "aten.sigmoid.default", "aten.leaky_relu.default", "aten.elu.default",
      "aten.softplus.default", "aten.hardtanh.default", "aten.mish.default", "aten.softmax.int",
      "aten.log_softmax.int", "aten.hardswish.default", "aten.hardsigmoid.default",
      "aten.relu6.default",
      // arithmetic
      "aten.add.Tensor", "aten.add_.Tensor", "aten.add.Scalar", "aten.sub.Tensor",
      "aten.sub.Scalar", "aten.rsub.Scalar", "aten.mul.Tensor", "aten.mul.Scalar",
      "aten.div.Tensor", "aten.div.Scalar", "aten.neg.default", "aten.exp.default",
      "aten.log.default", "aten.sqrt.default", "aten.rsqrt.default", "aten.abs.default",
      "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.clamp.default",
      "aten.reciprocal.default", "aten.sin.default", "aten.cos.default", "aten.square.default",
      "aten.matmul.default", "aten.mm.default", "aten.bmm.default", "aten.addmm.default",
      "aten.baddbmm.default", "aten.einsum.default",
      // reductions
      "aten.mean.dim", "aten.mean.default", "aten.sum.dim_IntList", "aten.sum.default",
      "aten.amax.default", "aten.amin.default", "aten.max.dim", "aten.min.dim",
      "aten.var.correction", "aten.std.correction", "aten.norm.ScalarOpt_dim",
      "aten.logsumexp.default",
      // shapes and views
      "aten.view.default", "aten.reshape.default", "aten.flatten.using_ints", "aten.unflatten.int",
      "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.unsqueeze.default",
      "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.select.int",
      "aten.slice.Tensor", "aten.narrow.default", "aten.contiguous.default", "aten.expand.default",
      "aten.cat.default", "aten.stack.default", "aten.split.Tensor", "aten.chunk.default",
      "aten.clone.default", "aten.repeat.default", "aten.flip.default", "aten.sym_size.int",
      "aten.to.dtype", "aten.type_as.default",
      // factories (on the job's device)
      "aten.zeros.default", "aten.ones.default", "aten.zeros_like.default",
      "aten.ones_like.default", "aten.full.default", "aten.full_like.default",
      // Python's integer arithmetic on symbolic sizes
      "_operator.mul", "_operator.add", "_operator.sub", "_operator.floordiv", "_operator.getitem"};
  return *list;
}

Builtin BuiltinOf(std::string_view target) {
  if (target == "_operator.mul") return Builtin::kMul;
  if (target == "_operator.add") return Builtin::kAdd;
  if (target == "_operator.sub") return Builtin::kSub;
  if (target == "_operator.floordiv") return Builtin::kFloorDiv;
  if (target == "_operator.getitem") return Builtin::kGetItem;
  return Builtin::kNone;
}

at::ScalarType ScalarTypeOf(int64_t code, const std::string& what) {
  switch (code) {
    case 1:
      return at::kByte;
    case 2:
      return at::kChar;
    case 3:
      return at::kShort;
    case 4:
      return at::kInt;
    case 5:
      return at::kLong;
    case 6:
      return at::kHalf;
    case 7:
      return at::kFloat;
    case 8:
      return at::kDouble;
    case 12:
      return at::kBool;
    case 13:
      return at::kBFloat16;
    default:
      Malformed(absl::StrCat(what, " has dtype code ", code, ", which trainerd does not take"));
  }
}

// JSON access that refuses what is missing or of another type.
const json& Field(const json& object, const char* key, const std::string& where) {
  if (!object.is_object()) Malformed(absl::StrCat(where, " is not an object"));
  auto it = object.find(key);
  if (it == object.end()) Malformed(absl::StrCat(where, " has no '", key, "'"));
  return *it;
}
int64_t Int(const json& value, const std::string& where) {
  if (!value.is_number_integer()) Malformed(absl::StrCat(where, " is not an integer"));
  return value.get<int64_t>();
}
std::string String(const json& value, const std::string& where) {
  if (!value.is_string()) Malformed(absl::StrCat(where, " is not a string"));
  return value.get<std::string>();
}
const json& Array(const json& value, const std::string& where) {
  if (!value.is_array()) Malformed(absl::StrCat(where, " is not a list"));
  return value;
}
double Float(const json& value, const std::string& where) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  Malformed(absl::StrCat(where, " is not a number"));
}
// A union ({"as_int": 3}): its one key and value.
std::pair<std::string, const json*> Union(const json& value, const std::string& where) {
  if (!value.is_object() || value.size() != 1)
    Malformed(absl::StrCat(where, " is not an argument"));
  return {value.begin().key(), &value.begin().value()};
}

// The JSON's nesting, checked before it is parsed: a deep document cannot reach the parser.
void CheckJsonDepth(std::string_view text, const std::string& record) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') {
      if (++depth > 64) Malformed(absl::StrCat("'", record, "' nests deeper than 64 levels"));
    }
    if (c == ']' || c == '}') --depth;
  }
}

std::vector<int64_t> ConcreteInts(const json& list, const std::string& where) {
  std::vector<int64_t> out;
  for (const json& item : Array(list, where)) {
    auto [kind, value] = Union(item, where);
    if (kind != "as_int") Malformed(absl::StrCat(where, " is not a list of integers"));
    out.push_back(Int(*value, where));
  }
  return out;
}

// Which argument of a mode-dependent operator switches it, and to what in evaluation mode.
// Returns false for operators without a mode.
struct ModeRule {
  const char* argument;
  bool is_flag;  // a bool that is true in training; else scaled_dot_product_attention's dropout_p
};
std::optional<ModeRule> ModeRuleOf(std::string_view target) {
  static const std::map<std::string, ModeRule, std::less<>> rules = {
      {"aten.dropout.default", {"train", true}},
      {"aten.feature_dropout.default", {"train", true}},
      {"aten.alpha_dropout.default", {"train", true}},
      {"aten.feature_alpha_dropout.default", {"train", true}},
      {"aten.batch_norm.default", {"training", true}},
      {"aten.lstm.input", {"train", true}},
      {"aten.gru.input", {"train", true}},
      {"aten.rnn_tanh.input", {"train", true}},
      {"aten.rnn_relu.input", {"train", true}},
      {"aten.scaled_dot_product_attention.default", {"dropout_p", false}},
  };
  auto it = rules.find(target);
  if (it == rules.end()) return std::nullopt;
  return it->second;
}

class Reader {
 public:
  Reader(caffe2::serialize::PyTorchStreamReader& zip, Parsed& out) : zip_(zip), out_(out) {}

  void Run() {
    const std::vector<std::string> records = zip_.getAllRecords();
    const size_t limit = 4 * static_cast<size_t>(kMaxTorchScriptBytes);
    size_t total = 0;
    for (const std::string& name : records) {
      const size_t size = zip_.getRecordSize(name);
      if (size > limit || total + size > limit) {
        Malformed(absl::StrCat("its records would expand to more than ", limit, " bytes"));
      }
      total += size;
    }
    ReadWeights();
    const std::string constants =
        zip_.hasRecord(kConstantsConfig) ? ReadRecord(zip_, kConstantsConfig) : "{\"config\": {}}";
    const json constants_json = ParseJson(constants, kConstantsConfig);
    const json& constants_config = Field(constants_json, "config", kConstantsConfig);
    if (!constants_config.is_object() || !constants_config.empty()) {
      Denied(
          "the exported program has lifted tensor constants (data/constants), which trainerd "
          "does not take; register such tensors as buffers of the module");
    }
    const std::string model_text = ReadRecord(zip_, kModelJson);
    const json model = ParseJson(model_text, kModelJson);
    const json& gm = Field(model, "graph_module", kModelJson);
    const json& graph = Field(gm, "graph", "graph_module");
    if (gm.contains("graph") && graph.contains("custom_obj_values") &&
        !graph["custom_obj_values"].empty()) {
      Denied("the exported program holds custom objects (torch.classes), which are native code");
    }
    ReadSignature(Field(gm, "signature", "graph_module"), graph);
    ReadNodes(Array(Field(graph, "nodes", "the graph"), "the graph's nodes"));
    ReadOutputs(graph);
  }

 private:
  int NewValue(const std::string& name) {
    if (values_.count(name)) Malformed(absl::StrCat("the value '", name, "' is defined twice"));
    values_[name] = out_.value_count;
    return out_.value_count++;
  }
  int UseValue(const std::string& name, const std::string& where) {
    auto it = values_.find(name);
    if (it == values_.end()) {
      Malformed(absl::StrCat(where, " uses '", name, "' before it is defined"));
    }
    return it->second;
  }

  void ReadWeights() {
    const json config = ParseJson(ReadRecord(zip_, kWeightsConfig), kWeightsConfig);
    const json& entries = Field(config, "config", kWeightsConfig);
    if (!entries.is_object()) Malformed("the weights' config is not an object");
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      const std::string where = absl::StrCat("the weight '", it.key(), "'");
      const json& entry = it.value();
      WeightMeta w;
      w.name = it.key();
      const json& pickled = Field(entry, "use_pickle", where);
      if (!pickled.is_boolean() || pickled.get<bool>()) {
        Denied(absl::StrCat(where,
                            " is pickled (use_pickle); trainerd reads only raw weights and "
                            "never unpickles an archive (save a plain tensor)"));
      }
      const std::string path = String(Field(entry, "path_name", where), where);
      if (path.empty() || path.find('/') != std::string::npos ||
          path.find("..") != std::string::npos) {
        Malformed(absl::StrCat(where, " names the record '", path, "'"));
      }
      w.record = absl::StrCat(kWeightsDir, path);
      const json& is_param = Field(entry, "is_param", where);
      w.is_param = is_param.is_boolean() && is_param.get<bool>();
      const json& meta = Field(entry, "tensor_meta", where);
      w.dtype = ScalarTypeOf(Int(Field(meta, "dtype", where), where), where);
      w.sizes = ConcreteInts(Field(meta, "sizes", where), where + "'s sizes");
      w.strides = ConcreteInts(Field(meta, "strides", where), where + "'s strides");
      auto [kind, offset] = Union(Field(meta, "storage_offset", where), where);
      if (kind != "as_int") Malformed(absl::StrCat(where, "'s storage offset is not an integer"));
      w.storage_offset = Int(*offset, where);
      const json& layout = Field(meta, "layout", where);
      if (Int(layout, where) != 7) Malformed(absl::StrCat(where, " is not a strided tensor"));
      w.requires_grad = w.is_param;
      if (w.sizes.size() != w.strides.size() || w.sizes.size() > 8) {
        Malformed(absl::StrCat(where, " has ", w.sizes.size(), " sizes and ", w.strides.size(),
                               " strides (at most 8 dimensions)"));
      }
      // The last element's position, checked against the record before anything is allocated.
      const int64_t elements = Check(CheckedShapeElements(w.sizes, where));
      int64_t last = w.storage_offset;
      if (last < 0) Malformed(absl::StrCat(where, " has a negative storage offset"));
      for (size_t d = 0; d < w.sizes.size(); ++d) {
        if (w.strides[d] < 0) Malformed(absl::StrCat(where, " has a negative stride"));
        if (w.sizes[d] > 0) {
          last = Check(
              CheckedAdd(last, Check(CheckedMul(w.sizes[d] - 1, w.strides[d], where)), where));
        }
      }
      if (!zip_.hasRecord(w.record)) Malformed(absl::StrCat(where, "'s record is missing"));
      const int64_t item = static_cast<int64_t>(c10::elementSize(w.dtype));
      const int64_t record_bytes = static_cast<int64_t>(zip_.getRecordSize(w.record));
      if (record_bytes % item != 0) {
        Malformed(absl::StrCat(where, "'s record is not a whole number of values"));
      }
      w.storage_elements = record_bytes / item;
      if (elements > 0 && last >= w.storage_elements) {
        Malformed(absl::StrCat(where, " reaches element ", last, " of a record of ",
                               w.storage_elements, " values: it lies past its storage"));
      }
      if (w.is_param) {
        parameter_values_ = Check(CheckedAdd(parameter_values_, elements, "the parameters"));
        if (!at::isFloatingType(w.dtype)) {
          Malformed(absl::StrCat(where, " is a parameter of a dtype that cannot train"));
        }
      }
      by_name_[w.name] = out_.weights.size();
      out_.weights.push_back(std::move(w));
    }
    if (parameter_values_ > kMaxModelParameters) {
      throw Refusal{absl::StatusCode::kResourceExhausted,
                    absl::StrCat("the exported program has ", parameter_values_,
                                 " parameter values; at most ", kMaxModelParameters)};
    }
    out_.info.parameter_count = parameter_values_;
    out_.weight_slot.assign(out_.weights.size(), -1);
  }

  // Tensor metadata from tensor_values: per-row shape after a dynamic batch dimension.
  std::vector<int64_t> RowShape(const json& graph, const std::string& name, const char* what) {
    const json& values = Field(graph, "tensor_values", "the graph");
    const json& meta = Field(values, name.c_str(), "the graph's tensor_values");
    const json& sizes = Array(Field(meta, "sizes", what), what);
    if (sizes.empty()) Malformed(absl::StrCat(what, " is a scalar; it needs a batch dimension"));
    auto [first, first_value] = Union(sizes[0], what);
    if (first != "as_expr") {
      Malformed(absl::StrCat(what,
                             "'s batch dimension is fixed; export with a dynamic batch dimension "
                             "(dynamic_shapes=({0: torch.export.Dim(\"batch\")},))"));
    }
    std::vector<int64_t> shape;
    for (size_t i = 1; i < sizes.size(); ++i) {
      auto [kind, value] = Union(sizes[i], what);
      if (kind != "as_int") {
        Malformed(absl::StrCat(what, " has a dynamic dimension after the batch dimension"));
      }
      shape.push_back(Int(*value, what));
    }
    Check(CheckedShapeElements(shape, what));
    return shape;
  }

  void ReadSignature(const json& signature, const json& graph) {
    const json& inputs = Array(Field(graph, "inputs", "the graph"), "the graph's inputs");
    const json& specs = Array(Field(signature, "input_specs", "the signature"), "input_specs");
    if (inputs.size() != specs.size()) Malformed("the graph's inputs and its signature differ");
    std::set<size_t> seen;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto [kind, spec] = Union(specs[i], "an input spec");
      auto [input_kind, input] = Union(inputs[i], "a graph input");
      if (input_kind != "as_tensor") Malformed("a graph input is not a tensor");
      const std::string input_name = String(Field(*input, "name", "a graph input"), "an input");
      if (kind == "parameter" || kind == "buffer") {
        const std::string arg = String(Field(Field(*spec, "arg", kind), "name", kind), kind);
        const std::string state_name = String(
            Field(*spec, kind == "parameter" ? "parameter_name" : "buffer_name", kind), kind);
        if (arg != input_name) Malformed("the graph's inputs and its signature differ");
        auto it = by_name_.find(state_name);
        if (it == by_name_.end()) {
          Malformed(absl::StrCat("the ", kind, " '", state_name, "' has no weight record"));
        }
        if (!seen.insert(it->second).second) Malformed(absl::StrCat("'", state_name, "' is twice"));
        if (out_.weights[it->second].is_param != (kind == "parameter")) {
          Malformed(absl::StrCat("'", state_name, "' is a ", kind, " in the graph only"));
        }
        if (kind == "buffer" && spec->contains("persistent") &&
            !(*spec)["persistent"].get<bool>()) {
          Denied(absl::StrCat("the buffer '", state_name,
                              "' is not persistent; trainerd takes "
                              "only buffers saved with the program"));
        }
        out_.weight_slot[it->second] = NewValue(input_name);
      } else if (kind == "user_input") {
        if (out_.batch_slot >= 0) {
          Denied(
              "the exported program takes more than one input; trainerd feeds it one batch of "
              "features");
        }
        out_.batch_slot = NewValue(input_name);
        out_.info.input_shape = RowShape(graph, input_name, "the program's input");
      } else {
        Denied(absl::StrCat("the exported program has a '", kind,
                            "' input, which trainerd does "
                            "not take (only parameters, buffers and one batch)"));
      }
    }
    if (out_.batch_slot < 0) Malformed("the program takes no input");
    if (seen.size() != out_.weights.size()) Malformed("a weight record is not a graph input");
    // The module's own order (the signature's), not the config's.
    std::vector<size_t> order(seen.begin(), seen.end());
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return out_.weight_slot[a] < out_.weight_slot[b]; });
    std::vector<WeightMeta> weights;
    std::vector<int> slots;
    for (size_t i : order) {
      weights.push_back(std::move(out_.weights[i]));
      slots.push_back(out_.weight_slot[i]);
    }
    out_.weights = std::move(weights);
    out_.weight_slot = std::move(slots);
    const json& output_specs = Array(Field(signature, "output_specs", "the signature"), "outputs");
    if (output_specs.size() != 1 ||
        Union(output_specs[0], "an output spec").first != "user_output") {
      Denied(
          "the exported program must return one tensor and mutate no buffer outside its "
          "graph (export the module in training mode with torch.export.export)");
    }
  }

  void ReadOutputs(const json& graph) {
    const json& outputs = Array(Field(graph, "outputs", "the graph"), "the graph's outputs");
    if (outputs.size() != 1) Denied("the exported program must return one tensor");
    auto [kind, value] = Union(outputs[0], "the graph's output");
    if (kind != "as_tensor") Denied("the exported program must return one tensor");
    const std::string name = String(Field(*value, "name", "the output"), "the output");
    out_.output_slot = UseValue(name, "the graph's output");
    out_.info.output_shape = RowShape(graph, name, "the program's output");
  }

  Slot ReadArgument(const json& arg, const c10::Argument* schema, const std::string& where) {
    auto [kind, value] = Union(arg, where);
    Slot slot;
    if (kind == "as_none") {
      slot.constant = c10::IValue();
    } else if (kind == "as_tensor") {
      slot.kind = Slot::kValue;
      slot.value = UseValue(String(Field(*value, "name", where), where), where);
    } else if (kind == "as_tensors" || kind == "as_optional_tensors") {
      slot.kind = kind == "as_tensors" ? Slot::kValueList : Slot::kOptionalValueList;
      for (const json& item : Array(*value, where)) {
        if (kind == "as_tensors") {
          slot.values.push_back(UseValue(String(Field(item, "name", where), where), where));
        } else {
          auto [k, v] = Union(item, where);
          slot.values.push_back(
              k == "as_none" ? -1 : UseValue(String(Field(*v, "name", where), where), where));
        }
      }
    } else if (kind == "as_int") {
      slot.constant = Int(*value, where);
    } else if (kind == "as_ints") {
      std::vector<int64_t> ints;
      for (const json& i : Array(*value, where)) ints.push_back(Int(i, where));
      slot.constant = ints;
    } else if (kind == "as_float") {
      slot.constant = Float(*value, where);
    } else if (kind == "as_floats") {
      std::vector<double> floats;
      for (const json& f : Array(*value, where)) floats.push_back(Float(f, where));
      slot.constant = floats;
    } else if (kind == "as_bool") {
      if (!value->is_boolean()) Malformed(absl::StrCat(where, " is not a bool"));
      slot.constant = value->get<bool>();
    } else if (kind == "as_bools") {
      std::vector<bool> bools;
      for (const json& b : Array(*value, where)) {
        if (!b.is_boolean()) Malformed(absl::StrCat(where, " is not a list of bools"));
        bools.push_back(b.get<bool>());
      }
      c10::List<bool> list;
      for (bool b : bools) list.push_back(b);
      slot.constant = list;
    } else if (kind == "as_string") {
      slot.constant = String(*value, where);
    } else if (kind == "as_sym_int") {
      auto [k, v] = Union(*value, where);
      if (k == "as_int") {
        slot.constant = Int(*v, where);
      } else if (k == "as_name") {
        slot.kind = Slot::kValue;
        slot.value = UseValue(String(*v, where), where);
      } else {
        Malformed(absl::StrCat(where, " is not a symbolic integer"));
      }
    } else if (kind == "as_sym_ints") {
      slot.kind = Slot::kIntList;
      for (const json& item : Array(*value, where)) {
        auto [k, v] = Union(item, where);
        if (k == "as_int") {
          slot.values.push_back(-1);
          slot.ints.push_back(Int(*v, where));
        } else if (k == "as_name") {
          slot.values.push_back(UseValue(String(*v, where), where));
          slot.ints.push_back(0);
        } else {
          Malformed(absl::StrCat(where, " is not a list of symbolic integers"));
        }
      }
    } else if (kind == "as_scalar_type") {
      slot.constant = ScalarTypeOf(Int(*value, where), where);
    } else if (kind == "as_layout") {
      if (Int(*value, where) != 7) Denied(absl::StrCat(where, ": only strided tensors are taken"));
      slot.constant = at::kStrided;
    } else if (kind == "as_memory_format") {
      const int64_t format = Int(*value, where);
      static const at::MemoryFormat formats[] = {
          at::MemoryFormat::Contiguous, at::MemoryFormat::Contiguous,
          at::MemoryFormat::ChannelsLast, at::MemoryFormat::ChannelsLast3d,
          at::MemoryFormat::Preserve};
      if (format < 0 || format > 4) Malformed(absl::StrCat(where, " is not a memory format"));
      slot.constant = formats[format];
    } else if (kind == "as_device") {
      slot.kind = Slot::kDevice;  // the job's device, whatever the export saw
    } else if (kind == "as_graph" || kind == "as_operator" || kind == "as_custom_obj") {
      Denied(absl::StrCat(where, " carries code (", kind, "), which trainerd does not run"));
    } else {
      Denied(absl::StrCat(where, " is an argument of kind '", kind,
                          "', which trainerd does not "
                          "take"));
    }
    if (schema != nullptr && slot.kind == Slot::kConstant &&
        schema->real_type()->kind() == c10::TypeKind::TensorType &&
        (slot.constant.isInt() || slot.constant.isDouble() || slot.constant.isBool())) {
      // A Python number where the operator takes a tensor (add_.Tensor(other=1)): a wrapped
      // number, as PyTorch's Python binding makes it, so that type promotion treats it as a
      // scalar.
      at::Tensor wrapped = at::scalar_to_tensor(slot.constant.toScalar());
      wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
      slot.constant = wrapped;
    }
    if (schema != nullptr && slot.kind == Slot::kConstant && slot.constant.isInt()) {
      const c10::TypePtr& type = schema->real_type();
      const c10::TypePtr inner = type->kind() == c10::TypeKind::OptionalType
                                     ? type->castRaw<c10::OptionalType>()->getElementType()
                                     : type;
      if (inner->kind() == c10::TypeKind::FloatType)
        slot.constant = static_cast<double>(slot.constant.toInt());
    }
    return slot;
  }

  void ReadNodes(const json& nodes) {
    if (static_cast<int64_t>(nodes.size()) > kMaxExportedNodes) {
      throw Refusal{absl::StatusCode::kResourceExhausted,
                    absl::StrCat("the exported program has ", nodes.size(), " nodes; at most ",
                                 kMaxExportedNodes)};
    }
    out_.info.node_count = static_cast<int64_t>(nodes.size());
    std::set<int> buffer_slots;
    for (size_t i = 0; i < out_.weights.size(); ++i) {
      if (!out_.weights[i].is_param) buffer_slots.insert(out_.weight_slot[i]);
    }
    for (size_t n = 0; n < nodes.size(); ++n) {
      const json& node = nodes[n];
      Node compiled;
      compiled.target = String(Field(node, "target", "a node"), "a node's target");
      const json& outputs = Array(Field(node, "outputs", "a node"), "a node's outputs");
      compiled.name = node.contains("name") && node["name"].is_string()
                          ? node["name"].get<std::string>()
                          : absl::StrCat("#", n);
      const std::string where = absl::StrCat("node '", compiled.name, "' (", compiled.target, ")");
      if (!ExportedOperatorAllowed(compiled.target)) {
        std::string shown = compiled.target;
        if (absl::StartsWith(shown, "torch.ops.")) shown = shown.substr(10);
        Denied(absl::StrCat("node '", compiled.name, "' calls ", shown,
                            ", which is not on trainerd's list of operators (", kListDoc,
                            "); rewrite the module without it or ask for it to be added"));
      }
      const json& inputs = Array(Field(node, "inputs", where), where);
      compiled.builtin = BuiltinOf(compiled.target);
      if (compiled.builtin != Builtin::kNone) {
        if (inputs.size() != 2 || outputs.size() != 1)
          Malformed(absl::StrCat(where, " is malformed"));
        for (const json& input : inputs) {
          compiled.arguments.push_back(ReadArgument(Field(input, "arg", where), nullptr, where));
        }
        if (compiled.builtin == Builtin::kGetItem) {
          Denied(absl::StrCat(where, ": getitem on a value is not taken"));
        }
        auto [k, v] = Union(outputs[0], where);
        if (k != "as_sym_int") Malformed(absl::StrCat(where, " returns no integer"));
        auto [k2, v2] = Union(*v, where);
        if (k2 != "as_name") Malformed(absl::StrCat(where, " returns no named integer"));
        compiled.outputs.push_back(NewValue(String(*v2, where)));
        out_.nodes.push_back(std::move(compiled));
        continue;
      }
      // "torch.ops.aten.linear.default" -> aten::linear, overload "".
      const std::string rest = compiled.target.substr(std::strlen("torch.ops."));
      const std::string& op_target = rest;  // "aten.linear.default"
      const size_t dot1 = rest.find('.');
      const size_t dot2 = rest.rfind('.');
      const std::string name =
          absl::StrCat(rest.substr(0, dot1), "::", rest.substr(dot1 + 1, dot2 - dot1 - 1));
      std::string overload = rest.substr(dot2 + 1);
      if (overload == "default") overload.clear();
      std::optional<c10::OperatorHandle> op =
          c10::Dispatcher::singleton().findSchema({name, overload});
      if (!op.has_value()) Denied(absl::StrCat(where, " is not an operator of this LibTorch"));
      compiled.op = op;
      const c10::FunctionSchema& schema = op->schema();
      const auto& arguments = schema.arguments();
      std::vector<std::optional<Slot>> slots(arguments.size());
      for (const json& input : inputs) {
        const std::string arg_name = String(Field(input, "name", where), where);
        size_t index = arguments.size();
        for (size_t a = 0; a < arguments.size(); ++a) {
          if (arguments[a].name() == arg_name) index = a;
        }
        if (index == arguments.size()) {
          Malformed(absl::StrCat(where, " has an argument '", arg_name, "' its operator lacks"));
        }
        if (slots[index].has_value())
          Malformed(absl::StrCat(where, " gives '", arg_name, "' twice"));
        slots[index] = ReadArgument(Field(input, "arg", where), &arguments[index],
                                    absl::StrCat(where, "'s argument '", arg_name, "'"));
      }
      for (size_t a = 0; a < arguments.size(); ++a) {
        if (!slots[a].has_value()) {
          if (!arguments[a].default_value().has_value()) {
            Malformed(absl::StrCat(where, " lacks its argument '", arguments[a].name(), "'"));
          }
          Slot s;
          s.constant = *arguments[a].default_value();
          slots[a] = s;
        }
        compiled.arguments.push_back(*slots[a]);
      }
      // Mode switching.
      if (std::optional<ModeRule> rule = ModeRuleOf(op_target)) {
        size_t position = arguments.size();
        for (size_t a = 0; a < arguments.size(); ++a) {
          if (arguments[a].name() == rule->argument) position = a;
        }
        const Slot& slot = compiled.arguments.at(position);
        if (slot.kind != Slot::kConstant) Malformed(absl::StrCat(where, "'s mode is not constant"));
        if (rule->is_flag) {
          const bool train = slot.constant.isBool() && slot.constant.toBool();
          const bool has_stats = op_target != "aten.batch_norm.default" ||
                                 !(compiled.arguments[3].kind == Slot::kConstant &&
                                   compiled.arguments[3].constant.isNone());
          if (!train && has_stats) {
            Denied(absl::StrCat(where,
                                " runs in evaluation mode: export the module in training "
                                "mode (module.train()) so that trainerd can switch it"));
          }
          if (has_stats) compiled.modes.push_back({position, true, false});
        } else {
          compiled.modes.push_back({position, slot.constant, 0.0});
        }
      }
      compiled.is_dropout = op_target == "aten.dropout.default";
      if (schema.is_mutable() && !arguments.empty() && compiled.arguments[0].kind == Slot::kValue &&
          buffer_slots.count(compiled.arguments[0].value)) {
        compiled.mutates_buffer = true;
      }
      // Outputs.
      const auto& returns = schema.returns();
      if (outputs.size() == 1 && Union(outputs[0], where).first == "as_tensors") {
        if (returns.size() != 1)
          Malformed(absl::StrCat(where, "'s outputs do not fit its operator"));
        compiled.list_output = true;
        for (const json& item : Array(*Union(outputs[0], where).second, where)) {
          compiled.outputs.push_back(NewValue(String(Field(item, "name", where), where)));
        }
      } else {
        if (outputs.size() != returns.size()) {
          Malformed(absl::StrCat(where, " has ", outputs.size(), " outputs; its operator returns ",
                                 returns.size()));
        }
        for (const json& output : outputs) {
          auto [k, v] = Union(output, where);
          if (k == "as_tensor") {
            compiled.outputs.push_back(NewValue(String(Field(*v, "name", where), where)));
          } else if (k == "as_sym_int") {
            auto [k2, v2] = Union(*v, where);
            if (k2 != "as_name") Malformed(absl::StrCat(where, " returns no named integer"));
            compiled.outputs.push_back(NewValue(String(*v2, where)));
          } else if (k == "as_none") {
            compiled.outputs.push_back(-1);
          } else {
            Malformed(absl::StrCat(where, " has an output of kind '", k, "'"));
          }
        }
      }
      out_.nodes.push_back(std::move(compiled));
    }
  }

  caffe2::serialize::PyTorchStreamReader& zip_;
  Parsed& out_;
  std::unordered_map<std::string, int> values_;
  std::unordered_map<std::string, size_t> by_name_;
  int64_t parameter_values_ = 0;
};

}  // namespace

int64_t ExportScalarTypeCode(at::ScalarType type) {
  switch (type) {
    case at::kByte:
      return 1;
    case at::kChar:
      return 2;
    case at::kShort:
      return 3;
    case at::kInt:
      return 4;
    case at::kLong:
      return 5;
    case at::kHalf:
      return 6;
    case at::kFloat:
      return 7;
    case at::kDouble:
      return 8;
    case at::kBool:
      return 12;
    case at::kBFloat16:
      return 13;
    default:
      throw std::runtime_error("unexpected dtype");
  }
}

json ParseJson(std::string_view text, const std::string& record) {
  CheckJsonDepth(text, record);
  json parsed = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) Malformed(absl::StrCat("'", record, "' is not JSON"));
  return parsed;
}

std::unique_ptr<caffe2::serialize::PyTorchStreamReader> OpenZip(std::string_view archive) {
  return std::make_unique<caffe2::serialize::PyTorchStreamReader>(
      std::make_shared<BoundedReadAdapter>(archive));
}

std::string ReadRecord(caffe2::serialize::PyTorchStreamReader& zip, const std::string& name) {
  if (!zip.hasRecord(name)) Malformed(absl::StrCat("the archive has no '", name, "'"));
  auto [data, size] = zip.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

absl::Status ReadProgram(caffe2::serialize::PyTorchStreamReader& zip, Parsed& parsed) {
  try {
    Reader(zip, parsed).Run();
  } catch (const Refusal& refusal) {
    return absl::Status(refusal.code, refusal.message);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    return absl::InvalidArgumentError(absl::StrCat("the exported program cannot be read: ", what));
  }
  return absl::OkStatus();
}

}  // namespace exported_archive

using exported_archive::AllowedTargets;
using exported_archive::Builtin;
using exported_archive::BuiltinOf;
using exported_archive::kModelJson;
using exported_archive::OpenZip;
using exported_archive::Parsed;
using exported_archive::ReadProgram;

bool ExportedOperatorAllowed(std::string_view target) {
  if (target.substr(0, 15) == "torch.ops.aten.") {
    return AllowedTargets().count(target.substr(std::strlen("torch.ops."))) > 0;
  }
  return BuiltinOf(target) != Builtin::kNone && target != "_operator.getitem";
}

const std::vector<std::string>& ExportedOperatorList() {
  static const auto* list = [] {
    auto* out = new std::vector<std::string>;
    for (const std::string& t : AllowedTargets()) {
      if (t != "_operator.getitem") out->push_back(t);
    }
    return out;
  }();
  return *list;
}

bool IsExportedProgramArchive(std::string_view archive) {
  try {
    auto zip = OpenZip(archive);
    return zip->hasRecord(kModelJson);
  } catch (const std::exception&) {
    return false;
  }
}

absl::StatusOr<ExportedProgramInfo> CheckExportedProgram(std::string_view archive) {
  Parsed parsed;
  try {
    auto zip = OpenZip(archive);
    absl::Status status = ReadProgram(*zip, parsed);
    if (!status.ok()) return status;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    return absl::InvalidArgumentError(absl::StrCat("the exported program cannot be read: ", what));
  }
  return parsed.info;
}
}  // namespace trainerd::engine
