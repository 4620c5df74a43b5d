// The archive's records and model.json follow torch.export.save of the pinned torch: the graph in
// the training IR (aten.linear, aten.conv2d, aten.batch_norm with training=False, ...), the
// batch dimension one symbol "s0", the parameters and buffers as placeholders named as torch
// names them ("p_0_weight", "b_1_running_mean"), arguments equal to an operator's defaults left
// out as torch leaves them out.
#include "server/engine/training/sequential_pt2.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cstdint>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "server/engine/training/exported_archive.h"

namespace trainerd::engine {
namespace {

using json = nlohmann::json;

constexpr char kBatch[] = "s0";
constexpr int64_t kExampleRows = 2;  // the example input's rows (and the batch symbol's hint)

std::string Metadata(const SafetensorsFile& file, const std::string& key) {
  for (const auto& [k, v] : file.metadata) {
    if (k == key) return v;
  }
  return "";
}

// "[1, 28, 28]" (state_dict.cc's ShapeText) as numbers.
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text) {
  absl::string_view inner = text;
  if (!absl::ConsumePrefix(&inner, "[") || !absl::ConsumeSuffix(&inner, "]")) {
    return absl::DataLossError(absl::StrCat("the state_dict's row shape '", text, "' is damaged"));
  }
  std::vector<int64_t> shape;
  if (absl::StripAsciiWhitespace(inner).empty()) return shape;
  for (absl::string_view part : absl::StrSplit(inner, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 1) {
      return absl::DataLossError(
          absl::StrCat("the state_dict's row shape '", text, "' is damaged"));
    }
    shape.push_back(d);
  }
  return shape;
}

at::ScalarType TypeOf(const std::string& dtype) {
  if (dtype == "F64") return at::kDouble;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "I64") return at::kLong;
  return at::kFloat;
}

json Int(int64_t v) { return {{"as_int", v}}; }

json Ints(const std::vector<int64_t>& v) { return {{"as_ints", v}}; }

json TensorRef(const std::string& name) { return {{"as_tensor", {{"name", name}}}}; }

// A tensor's metadata; `batched`: a leading batch dimension of kBatch rows before `shape`.
json TensorMeta(at::ScalarType type, const std::vector<int64_t>& shape, bool batched,
                bool requires_grad) {
  json sizes = json::array(), strides = json::array();
  if (batched) {
    sizes.push_back({{"as_expr", {{"expr_str", kBatch}, {"hint", Int(kExampleRows)}}}});
  }
  for (int64_t d : shape) sizes.push_back(Int(d));
  std::vector<int64_t> contiguous(shape.size() + (batched ? 1 : 0), 1);
  for (size_t i = contiguous.size(); i-- > 1;) {
    contiguous[i - 1] = contiguous[i] * shape[i - (batched ? 1 : 0)];
  }
  for (int64_t s : contiguous) strides.push_back(Int(s));
  return {{"dtype", exported_archive::ExportScalarTypeCode(type)},
          {"sizes", sizes},
          {"requires_grad", requires_grad},
          {"device", {{"type", "cpu"}, {"index", nullptr}}},
          {"strides", strides},
          {"storage_offset", Int(0)},
          {"layout", 7}};  // torch.strided
}

struct Weight {
  std::string name;         // "0.weight"
  std::string placeholder;  // "p_0_weight"
  bool is_param = false;
  const SafetensorsEntry* entry = nullptr;
};

// Builds model.json, the weights' config and their records.
class Writer {
 public:
  Writer(std::string_view file, const SafetensorsFile& parsed) : file_(file) {
    for (const SafetensorsEntry& e : parsed.tensors) entries_[e.name] = &e;
  }

  // Layer `index`'s tensor `what` ("weight", "running_mean"), checked against `shape`.
  absl::StatusOr<std::string> Use(size_t index, const std::string& what,
                                  const std::vector<int64_t>& shape, bool is_param) {
    const std::string name = absl::StrCat(index, ".", what);
    auto it = entries_.find(name);
    if (it == entries_.end() || it->second->shape != shape) {
      return absl::DataLossError(absl::StrCat(
          "the state_dict has no tensor '", name, "' of the shape its model spec gives"));
    }
    Weight w{name, absl::StrCat(is_param ? "p_" : "b_", index, "_", what), is_param, it->second};
    (is_param ? params_ : buffers_).push_back(w);
    return w.placeholder;
  }

  // A node calling `target` on `inputs`, giving a tensor of one row's shape `shape`.
  std::string Node(const std::string& op, const std::string& overload,
                   std::vector<std::pair<std::string, json>> inputs,
                   const std::vector<int64_t>& shape) {
    const int n = uses_[op]++;
    const std::string name = n == 0 ? op : absl::StrCat(op, "_", n);
    json args = json::array();
    for (auto& [arg_name, arg] : inputs) {
      args.push_back({{"name", arg_name}, {"arg", std::move(arg)}, {"kind", 1}});
    }
    nodes_.push_back({{"target", absl::StrCat("torch.ops.aten.", op, ".", overload)},
                      {"inputs", std::move(args)},
                      {"outputs", json::array({TensorRef(name)})},
                      {"metadata", json::object()},
                      {"name", name}});
    values_[name] = TensorMeta(type_, shape, /*batched=*/true, /*requires_grad=*/false);
    return name;
  }

  void SetType(at::ScalarType type) { type_ = type; }
  at::ScalarType Type() const { return type_; }

  // model.json, for a graph from the user input "input" (one row shaped `row`) to `output`.
  json Model(const std::vector<int64_t>& row, const std::string& output, size_t layers) {
    json inputs = json::array(), specs = json::array();
    for (const std::vector<Weight>* list : {&params_, &buffers_}) {
      for (const Weight& w : *list) {
        inputs.push_back(TensorRef(w.placeholder));
        values_[w.placeholder] =
            TensorMeta(TypeOf(w.entry->dtype), w.entry->shape, false, w.is_param);
        if (w.is_param) {
          specs.push_back({{"parameter",
                            {{"arg", {{"name", w.placeholder}}}, {"parameter_name", w.name}}}});
        } else {
          specs.push_back({{"buffer",
                            {{"arg", {{"name", w.placeholder}}},
                             {"buffer_name", w.name},
                             {"persistent", true}}}});
        }
      }
    }
    inputs.push_back(TensorRef("input"));
    values_["input"] = TensorMeta(type_, row, /*batched=*/true, /*requires_grad=*/false);
    specs.push_back({{"user_input", {{"arg", TensorRef("input")}}}});
    json call_graph = json::array();
    // The pytree specs of ((input,), {}) and of one tensor, as torch.utils._pytree writes them.
    call_graph.push_back(
        {{"fqn", ""},
         {"signature",
          {{"inputs", json::array()},
           {"outputs", json::array()},
           {"in_spec",
            R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": )"
            R"("builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": )"
            R"(null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[]", )"
            R"("children_spec": []}]}])"},
           {"out_spec", R"([1, {"type": null, "context": null, "children_spec": []}])"},
           {"forward_arg_names", json::array({"input"})}}}});
    for (size_t i = 0; i < layers; ++i) {
      call_graph.push_back({{"fqn", std::to_string(i)}, {"signature", nullptr}});
    }
    json graph = {{"inputs", std::move(inputs)},
                  {"outputs", json::array({TensorRef(output)})},
                  {"nodes", std::move(nodes_)},
                  {"tensor_values", std::move(values_)},
                  {"sym_int_values", json::object()},
                  {"sym_bool_values", json::object()},
                  {"is_single_tensor_return", false},
                  {"custom_obj_values", json::object()},
                  {"sym_float_values", json::object()}};
    json signature = {
        {"input_specs", std::move(specs)},
        {"output_specs", json::array({{{"user_output", {{"arg", TensorRef(output)}}}}})}};
    return {{"graph_module",
             {{"graph", std::move(graph)},
              {"signature", std::move(signature)},
              {"module_call_graph", std::move(call_graph)},
              {"metadata", json::object()},
              {"treespec_namedtuple_fields", json::object()}}},
            {"opset_version", {{"aten", kPt2AtenOpset}}},
            {"range_constraints", {{kBatch, {{"min_val", 0}, {"max_val", nullptr}}}}},
            {"schema_version", {{"major", kPt2SchemaMajor}, {"minor", kPt2SchemaMinor}}},
            {"verifiers", json::array({"TRAINING"})},
            {"torch_version", TORCH_VERSION},
            {"guards_code", json::array()}};
  }

  // The weights' config and records ("weight_0", ...), parameters first, as torch writes them.
  json WeightsConfig(std::vector<std::pair<std::string, std::string_view>>* records) const {
    json config = json::object();
    int next = 0;
    for (const std::vector<Weight>* list : {&params_, &buffers_}) {
      for (const Weight& w : *list) {
        const std::string record = absl::StrCat("weight_", next++);
        config[w.name] = {
            {"path_name", record},
            {"is_param", w.is_param},
            {"use_pickle", false},
            {"tensor_meta", TensorMeta(TypeOf(w.entry->dtype), w.entry->shape, false, w.is_param)}};
        records->emplace_back(absl::StrCat("data/weights/", record),
                              file_.substr(static_cast<size_t>(w.entry->offset),
                                           static_cast<size_t>(w.entry->size)));
      }
    }
    return {{"config", std::move(config)}};
  }

 private:
  std::string_view file_;
  std::map<std::string, const SafetensorsEntry*> entries_;
  std::vector<Weight> params_, buffers_;
  json nodes_ = json::array();
  json values_ = json::object();
  std::map<std::string, int> uses_;
  at::ScalarType type_ = at::kFloat;
};

// A pickle (protocol 2) of ((tensor,), {}) whose tensor is storage "0" of `type` shaped `shape`,
// contiguous: what torch.save writes for torch.export's example inputs, using only the globals
// torch.load(weights_only=True) allows (torch::pickle_save tags the empty dict with a type, which
// it does not).
std::string ExamplePickle(at::ScalarType type, const std::vector<int64_t>& shape, int64_t numel) {
  std::string out = "\x80\x02";
  auto text = [&out](std::string_view v) {  // BINUNICODE
    out.push_back('X');
    const uint32_t n = static_cast<uint32_t>(v.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
    out.append(v);
  };
  auto integer = [&out](int64_t v) {  // LONG1 of 8 bytes: any value
    out += "\x8a\x08";
    for (int i = 0; i < 8; ++i) {
      out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF));
    }
  };
  auto ints = [&](const std::vector<int64_t>& v) {
    out.push_back('(');
    for (int64_t x : v) integer(x);
    out.push_back('t');
  };
  const char* storage = type == at::kDouble     ? "DoubleStorage"
                        : type == at::kHalf     ? "HalfStorage"
                        : type == at::kBFloat16 ? "BFloat16Storage"
                                                : "FloatStorage";
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  out += "ctorch._utils\n_rebuild_tensor_v2\n";
  out += "((";  // the arguments; the persistent id
  text("storage");
  out += absl::StrCat("ctorch\n", storage, "\n");
  text("0");
  text("cpu");
  integer(numel);
  out += "tQ";  // the storage
  integer(0);   // its offset
  ints(shape);
  ints(strides);
  out += "\x89";  // requires_grad False
  out += "ccollections\nOrderedDict\n)R";  // backward hooks
  out += "tR";                              // the tensor
  out += "\x85}\x86.";                      // ((tensor,), {})
  return out;
}

// torch.save's zip of ExamplePickle and the tensor's bytes (zeros).
std::string ExampleInputs(at::ScalarType type, const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;  // a row's shape is within the job's limits
  const std::string zeros(static_cast<size_t>(numel) * c10::elementSize(type), '\0');
  const std::string pickle = ExamplePickle(type, shape, numel);
  std::string file;
  caffe2::serialize::PyTorchStreamWriter writer([&file](const void* data, size_t size) {
    file.append(static_cast<const char*>(data), size);
    return size;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeRecord(".format_version", "1", 1);
  writer.writeRecord(".storage_alignment", "64", 2);
  writer.writeRecord("data/0", zeros.data(), zeros.size());
  writer.writeEndOfFile();
  return file;
}

json Float(double v) { return {{"as_float", v}}; }
json Bool(bool v) { return {{"as_bool", v}}; }

absl::StatusOr<std::string> Build(std::string_view file, bool training) {
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(file);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("the job's state_dict is damaged: ",
                                            parsed.status().message()));
  }
  const std::string model = Metadata(*parsed, "trainerd.model");
  if (model == "torchscript" || model == "exported") {
    return absl::FailedPreconditionError(absl::StrCat(
        "the state_dict is of ", model == "exported" ? "an exported program" : "a TorchScript module",
        ", not of a model spec"));
  }
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(model);
  if (!spec.ok()) {
    return absl::DataLossError(absl::StrCat("the state_dict's model spec '", model,
                                            "' does not parse: ", spec.status().message()));
  }
  absl::StatusOr<std::vector<int64_t>> row =
      ParseShape(Metadata(*parsed, "trainerd.feature_shape"));
  if (!row.ok()) return row.status();
  absl::StatusOr<std::vector<std::vector<int64_t>>> shapes = InferLayerShapes(*spec, *row);
  if (!shapes.ok()) {
    return absl::DataLossError(absl::StrCat("the state_dict's model spec does not take its rows: ",
                                            shapes.status().message()));
  }

  Writer w(file, *parsed);
  // The input's type is the parameters' (float32 unless the job kept them otherwise).
  for (const SafetensorsEntry& e : parsed->tensors) {
    if (e.dtype != "I64") {
      w.SetType(TypeOf(e.dtype));
      break;
    }
  }
  std::string x = "input";
  for (size_t i = 0; i < spec->layers.size(); ++i) {
    const LayerSpec& layer = spec->layers[i];
    const std::vector<int64_t>& in = (*shapes)[i];
    const std::vector<int64_t>& out = (*shapes)[i + 1];
    switch (layer.kind) {
      case LayerKind::kLinear: {
        TRAINERD_ASSIGN_OR_RETURN(std::string weight,
                                  w.Use(i, "weight", {layer.args[0], in.back()}, true));
        TRAINERD_ASSIGN_OR_RETURN(std::string bias, w.Use(i, "bias", {layer.args[0]}, true));
        x = w.Node("linear", "default",
                   {{"input", TensorRef(x)}, {"weight", TensorRef(weight)},
                    {"bias", TensorRef(bias)}},
                   out);
        break;
      }
      case LayerKind::kConv2d: {
        const int64_t kernel = layer.args[1];
        const int64_t stride = layer.args.size() > 2 ? layer.args[2] : 1;
        const int64_t padding = layer.args.size() > 3 ? layer.args[3] : 0;
        TRAINERD_ASSIGN_OR_RETURN(
            std::string weight, w.Use(i, "weight", {layer.args[0], in[0], kernel, kernel}, true));
        TRAINERD_ASSIGN_OR_RETURN(std::string bias, w.Use(i, "bias", {layer.args[0]}, true));
        std::vector<std::pair<std::string, json>> args = {
            {"input", TensorRef(x)}, {"weight", TensorRef(weight)}, {"bias", TensorRef(bias)},
            {"stride", Ints({stride, stride})}};
        if (padding != 0) args.emplace_back("padding", Ints({padding, padding}));
        x = w.Node("conv2d", "default", std::move(args), out);
        break;
      }
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d: {
        const int64_t k = layer.args[0];
        x = w.Node(layer.kind == LayerKind::kMaxPool2d ? "max_pool2d" : "avg_pool2d", "default",
                   {{"self", TensorRef(x)}, {"kernel_size", Ints({k, k})}, {"stride", Ints({k, k})}},
                   out);
        break;
      }
      case LayerKind::kFlatten:
        x = w.Node("flatten", "using_ints", {{"self", TensorRef(x)}, {"start_dim", Int(1)}}, out);
        break;
      case LayerKind::kDropout:  // in evaluation the identity, kept as torch.export keeps it
        x = w.Node("dropout", "default",
                   {{"input", TensorRef(x)}, {"p", Float(layer.rate)}, {"train", Bool(training)}},
                   out);
        break;
      case LayerKind::kBatchNorm: {
        TRAINERD_ASSIGN_OR_RETURN(std::string weight, w.Use(i, "weight", {in[0]}, true));
        TRAINERD_ASSIGN_OR_RETURN(std::string bias, w.Use(i, "bias", {in[0]}, true));
        TRAINERD_ASSIGN_OR_RETURN(std::string mean, w.Use(i, "running_mean", {in[0]}, false));
        TRAINERD_ASSIGN_OR_RETURN(std::string var, w.Use(i, "running_var", {in[0]}, false));
        TRAINERD_ASSIGN_OR_RETURN(std::string count, w.Use(i, "num_batches_tracked", {}, false));
        (void)count;  // a placeholder the graph does not use, as in torch's export
        x = w.Node("batch_norm", "default",
                   {{"input", TensorRef(x)},
                    {"weight", TensorRef(weight)},
                    {"bias", TensorRef(bias)},
                    {"running_mean", TensorRef(mean)},
                    {"running_var", TensorRef(var)},
                    {"training", Bool(training)},
                    {"momentum", Float(0.1)},
                    {"eps", Float(1e-5)},
                    {"cudnn_enabled", Bool(false)}},
                   out);
        break;
      }
      case LayerKind::kLayerNorm: {
        TRAINERD_ASSIGN_OR_RETURN(std::string weight, w.Use(i, "weight", in, true));
        TRAINERD_ASSIGN_OR_RETURN(std::string bias, w.Use(i, "bias", in, true));
        x = w.Node("layer_norm", "default",
                   {{"input", TensorRef(x)},
                    {"normalized_shape", Ints(in)},
                    {"weight", TensorRef(weight)},
                    {"bias", TensorRef(bias)},
                    {"eps", Float(1e-5)},
                    {"cudnn_enable", Bool(false)}},
                   out);
        break;
      }
      case LayerKind::kRelu:
        x = w.Node("relu", "default", {{"self", TensorRef(x)}}, out);
        break;
      case LayerKind::kGelu:
        x = w.Node("gelu", "default", {{"self", TensorRef(x)}}, out);
        break;
      case LayerKind::kTanh:
        x = w.Node("tanh", "default", {{"self", TensorRef(x)}}, out);
        break;
      case LayerKind::kSigmoid:
        x = w.Node("sigmoid", "default", {{"self", TensorRef(x)}}, out);
        break;
      case LayerKind::kSoftmax:
        x = w.Node("softmax", "int", {{"self", TensorRef(x)}, {"dim", Int(1)}}, out);
        break;
      case LayerKind::kLogSoftmax:
        x = w.Node("log_softmax", "int", {{"self", TensorRef(x)}, {"dim", Int(1)}}, out);
        break;
    }
  }
  if (x == "input") {
    // A graph whose output is its input is not a module torch.export makes.
    return absl::FailedPreconditionError("the model spec has no layer that computes");
  }

  const std::string model_json = w.Model(*row, x, spec->layers.size()).dump();
  std::vector<std::pair<std::string, std::string_view>> weights;
  const std::string config = w.WeightsConfig(&weights).dump();
  // The example input torch.export keeps (ExportedProgram.example_inputs, which AOTInductor
  // compiles with): ((zeros of kExampleRows rows,), {}), as torch.save writes it.
  std::vector<int64_t> example_shape = {kExampleRows};
  example_shape.insert(example_shape.end(), row->begin(), row->end());
  const std::string sample = ExampleInputs(w.Type(), example_shape);

  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  auto put = [&writer](const std::string& name, std::string_view bytes) {
    writer.writeRecord(name, bytes.data(), bytes.size());
  };
  put("archive_format", "pt2");
  put("archive_version", "0");
  put("models/model.json", model_json);
  put(exported_archive::kWeightsConfig, config);
  for (const auto& [name, bytes] : weights) put(name, bytes);
  put("data/constants/model_constants_config.json", R"({"config": {}})");
  put("data/sample_inputs/model.pt", sample);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

absl::StatusOr<std::string> SequentialPt2(std::string_view safetensors, Pt2Mode mode) {
  try {
    return Build(safetensors, mode == Pt2Mode::kTraining);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot write the model's .pt2: ", e.what()));
  }
}

}  // namespace trainerd::engine
