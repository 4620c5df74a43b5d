// libFuzzer target: the operator check of submitted TorchScript modules. The input describes a
// graph (nodes of allowed, refused and made-up operators, nested blocks, subgraph attributes);
// the check must refuse it exactly when some node's operator is not on the allow-list, naming
// one, and must not recurse (deep nesting is part of the input space).
#include <fuzzer/FuzzedDataProvider.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "server/engine/torchscript/module_check.h"

namespace {

// Operators the input picks from: allowed ones, refused ones, and other namespaces.
const char* const kOperators[] = {
    "aten::linear",  "aten::relu",    "aten::add",      "prim::Constant", "prim::ListConstruct",
    "prim::GetAttr", "aten::matmul",  "aten::from_file", "aten::as_strided", "prim::Print",
    "prim::PythonOp", "my_ops::evil", "quantized::add", "aten::set_",     "aten::softmax",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  auto graph = std::make_shared<torch::jit::Graph>();
  std::vector<torch::jit::Block*> open = {graph->block()};
  std::vector<std::shared_ptr<torch::jit::Graph>> subgraphs;
  bool refused = false;
  int nodes = 0;
  while (input.remaining_bytes() > 0 && nodes < 20000) {
    ++nodes;
    switch (input.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: {  // a node of a known operator
        const char* name = kOperators[input.ConsumeIntegralInRange<size_t>(
            0, sizeof(kOperators) / sizeof(kOperators[0]) - 1)];
        open.back()->appendNode(graph->create(c10::Symbol::fromQualString(name), 0));
        refused = refused || !trainerd::engine::IsAllowedOperator(name);
        break;
      }
      case 1: {  // a node of a made-up operator (its namespace may be aten or prim)
        std::string ns = input.ConsumeBool() ? "aten" : input.ConsumeBool() ? "prim" : "x";
        std::string name = input.ConsumeRandomLengthString(24);
        if (name.empty() || name.find(':') != std::string::npos) name = "op";
        const std::string qualified = ns + "::" + name;
        open.back()->appendNode(graph->create(c10::Symbol::fromQualString(qualified), 0));
        refused = refused || !trainerd::engine::IsAllowedOperator(qualified);
        break;
      }
      case 2: {  // an If with two blocks; the next nodes go into its first
        torch::jit::Node* branch = graph->create(torch::jit::prim::If, 0);
        open.back()->appendNode(branch);
        branch->addBlock();
        branch->addBlock();
        open.push_back(branch->blocks()[input.ConsumeBool() ? 0 : 1]);
        break;
      }
      case 3:  // close the innermost block
        if (open.size() > 1) open.pop_back();
        break;
      default: {  // a node carrying a subgraph attribute with one node in it
        auto sub = std::make_shared<torch::jit::Graph>();
        const bool bad = input.ConsumeBool();
        sub->block()->appendNode(sub->create(
            c10::Symbol::fromQualString(bad ? "aten::from_file" : "aten::relu"), 0));
        torch::jit::Node* holder = graph->create(c10::Symbol::fromQualString("prim::Constant"), 0);
        holder->g_(c10::Symbol::attr("Subgraph"), sub);
        open.back()->appendNode(holder);
        refused = refused || bad;
        subgraphs.push_back(sub);
        break;
      }
    }
  }
  const absl::Status status = trainerd::engine::CheckGraphOperators(*graph, "fuzz");
  if (status.ok() == refused) std::abort();
  if (!status.ok() && status.code() != absl::StatusCode::kPermissionDenied) std::abort();
  return 0;
}
