// An exported program at run time: loaded from a checked archive, its graph run node by node
// through LibTorch's dispatcher, its trained weights saved back into the archive
// (exported_program.h).
#include "server/engine/training/exported_program.h"

#include <ATen/core/stack.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/training/exported_archive.h"

namespace trainerd::engine {

using exported_archive::Builtin;
using exported_archive::ModeSwitch;
using exported_archive::Node;
using exported_archive::OpenZip;
using exported_archive::Parsed;
using exported_archive::ReadProgram;
using exported_archive::ReadRecord;
using exported_archive::Slot;
using exported_archive::WeightMeta;

struct ExportedProgram::Impl {
  std::string archive;  // the bytes it was loaded from (SaveArchive replaces the weights)
  Parsed parsed;
  at::Device device = at::kCPU;
  std::vector<c10::IValue> env;
};

ExportedProgram::ExportedProgram() : impl_(std::make_unique<Impl>()) {}
ExportedProgram::~ExportedProgram() = default;

absl::StatusOr<std::shared_ptr<ExportedProgram>> ExportedProgram::Load(
    std::string_view archive, std::optional<at::Generator> generator) {
  std::shared_ptr<ExportedProgram> program(new ExportedProgram());
  Impl& impl = *program->impl_;
  impl.archive = std::string(archive);
  try {
    auto zip = OpenZip(impl.archive);
    absl::Status status = ReadProgram(*zip, impl.parsed);
    if (!status.ok()) return status;
    if (zip->hasRecord("byteorder") && ReadRecord(*zip, "byteorder") != "little") {
      return absl::InvalidArgumentError("the exported program's weights are not little-endian");
    }
    for (const WeightMeta& w : impl.parsed.weights) {
      auto [data, size] = zip->getRecord(w.record);
      at::Tensor storage = at::empty({w.storage_elements}, at::TensorOptions(w.dtype));
      std::memcpy(storage.data_ptr(), data.get(), size);
      at::Tensor value =
          storage.as_strided(w.sizes, w.strides, w.storage_offset).contiguous().clone();
      if (w.is_param) {
        value.set_requires_grad(true);
        program->parameters_.emplace_back(w.name, value);
      } else {
        program->buffers_.emplace_back(w.name, value);
      }
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    return absl::InvalidArgumentError(absl::StrCat("the exported program cannot be read: ", what));
  }
  program->info_ = impl.parsed.info;
  program->generator_ = std::move(generator);
  return program;
}

void ExportedProgram::To(const at::Device& device) {
  impl_->device = device;
  at::NoGradGuard no_grad;
  for (auto& [name, p] : parameters_) p.set_data(p.to(device));
  for (auto& [name, b] : buffers_) b.set_data(b.to(device));
}

at::Tensor ExportedProgram::Forward(const at::Tensor& input) {
  Impl& impl = *impl_;
  const Parsed& parsed = impl.parsed;
  const auto& shape = parsed.info.input_shape;
  if (input.dim() != static_cast<int64_t>(shape.size()) + 1 ||
      !std::equal(shape.begin(), shape.end(), input.sizes().begin() + 1)) {
    throw std::runtime_error(absl::StrCat("the exported program takes rows shaped [",
                                          absl::StrJoin(shape, ", "), "]; a batch is shaped [",
                                          absl::StrJoin(input.sizes(), ", "), "]"));
  }
  std::vector<c10::IValue>& env = impl.env;
  env.assign(parsed.value_count, c10::IValue());
  size_t p = 0, b = 0;
  for (size_t i = 0; i < parsed.weights.size(); ++i) {
    env[parsed.weight_slot[i]] =
        parsed.weights[i].is_param ? parameters_[p++].second : buffers_[b++].second;
  }
  env[parsed.batch_slot] = input;
  torch::jit::Stack stack;
  for (const Node& node : parsed.nodes) {
    if (node.builtin != Builtin::kNone) {
      auto value = [&](const Slot& s) {
        return s.kind == Slot::kValue ? env[s.value].toInt() : s.constant.toInt();
      };
      const int64_t a = value(node.arguments[0]);
      const int64_t c = value(node.arguments[1]);
      int64_t r = 0;
      switch (node.builtin) {
        case Builtin::kMul:
          r = a * c;
          break;
        case Builtin::kAdd:
          r = a + c;
          break;
        case Builtin::kSub:
          r = a - c;
          break;
        case Builtin::kFloorDiv:
          if (c == 0) throw std::runtime_error("integer division by zero");
          r = a / c - ((a % c != 0) && ((a < 0) != (c < 0)) ? 1 : 0);
          break;
        default:
          break;
      }
      env[node.outputs[0]] = r;
      continue;
    }
    if (!training_ && node.mutates_buffer) {
      // nn.Module.eval(): no buffer update (batch norm's num_batches_tracked).
      env[node.outputs[0]] = env[node.arguments[0].value];
      continue;
    }
    if (node.is_dropout && training_) {
      // x * mask / (1 - p), mask ~ Bernoulli(1 - p) from the job's generator (as the job's
      // spec-built dropout), rather than LibTorch's default generator.
      const at::Tensor x = env[node.arguments[0].value].toTensor();
      const double rate = node.arguments[1].constant.toDouble();
      at::Tensor out;
      if (rate == 0.0) {
        out = x;
      } else if (rate == 1.0) {
        out = x * at::zeros_like(x);
      } else {
        const double keep = 1.0 - rate;
        at::Tensor mask = at::empty_like(x).bernoulli_(keep, generator_);
        out = x * mask.div_(keep);
      }
      env[node.outputs[0]] = out;
      continue;
    }
    stack.clear();
    for (const Slot& slot : node.arguments) {
      switch (slot.kind) {
        case Slot::kConstant:
          stack.push_back(slot.constant);
          break;
        case Slot::kValue:
          stack.push_back(env[slot.value]);
          break;
        case Slot::kDevice:
          stack.push_back(impl.device);
          break;
        case Slot::kValueList: {
          c10::List<at::Tensor> list;
          for (int v : slot.values) list.push_back(env[v].toTensor());
          stack.push_back(list);
          break;
        }
        case Slot::kOptionalValueList: {
          c10::List<std::optional<at::Tensor>> list;
          for (int v : slot.values) {
            list.push_back(v < 0 ? std::optional<at::Tensor>() : env[v].toTensor());
          }
          stack.push_back(list);
          break;
        }
        case Slot::kIntList: {
          std::vector<int64_t> ints = slot.ints;
          for (size_t i = 0; i < ints.size(); ++i) {
            if (slot.values[i] >= 0) ints[i] = env[slot.values[i]].toInt();
          }
          stack.push_back(ints);
          break;
        }
      }
    }
    if (!training_) {
      for (const ModeSwitch& mode : node.modes) stack[mode.position] = mode.eval;
    }
    node.op->callBoxed(stack);
    if (node.list_output) {
      const c10::List<at::Tensor> list = stack.at(0).toTensorList();
      if (list.size() != node.outputs.size()) {
        throw std::runtime_error(absl::StrCat("node '", node.name, "' returned ", list.size(),
                                              " tensors, not ", node.outputs.size()));
      }
      for (size_t i = 0; i < list.size(); ++i) env[node.outputs[i]] = list.get(i);
    } else {
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        if (node.outputs[i] >= 0) env[node.outputs[i]] = std::move(stack.at(i));
      }
    }
  }
  at::Tensor output = env[parsed.output_slot].toTensor();
  env.clear();
  return output;
}

std::string ExportedProgram::SaveArchive() const {
  const Impl& impl = *impl_;
  auto zip = OpenZip(impl.archive);
  std::map<std::string, at::Tensor> by_record;
  nlohmann::json config = exported_archive::ParseJson(ReadRecord(*zip, exported_archive::kWeightsConfig),
                                                      exported_archive::kWeightsConfig);
  size_t p = 0, b = 0;
  for (const WeightMeta& w : impl.parsed.weights) {
    at::Tensor value = (w.is_param ? parameters_[p++].second : buffers_[b++].second)
                           .detach()
                           .to(at::kCPU)
                           .contiguous();
    by_record[w.record] = value;
    nlohmann::json& meta = config["config"][w.name]["tensor_meta"];
    meta["dtype"] = exported_archive::ExportScalarTypeCode(value.scalar_type());
    nlohmann::json sizes = nlohmann::json::array(), strides = nlohmann::json::array();
    for (int64_t s : value.sizes()) sizes.push_back({{"as_int", s}});
    for (int64_t s : value.strides()) strides.push_back({{"as_int", s}});
    meta["sizes"] = sizes;
    meta["strides"] = strides;
    meta["storage_offset"] = {{"as_int", 0}};
  }
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t size) -> size_t {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  const std::string config_text = config.dump();
  for (const std::string& name : zip->getAllRecords()) {
    // The writer adds its own version, byte order and serialization id.
    if (name == ".data/version" || name == "byteorder" || name == ".data/serialization_id" ||
        name == "version") {
      continue;
    }
    if (name == exported_archive::kWeightsConfig) {
      writer.writeRecord(name, config_text.data(), config_text.size());
    } else if (auto it = by_record.find(name); it != by_record.end()) {
      writer.writeRecord(name, it->second.data_ptr(), it->second.nbytes());
    } else {
      auto [data, size] = zip->getRecord(name);
      writer.writeRecord(name, data.get(), size);
    }
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace trainerd::engine
