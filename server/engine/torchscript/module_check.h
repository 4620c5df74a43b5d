// TorchScript modules are code: what a module submitted with a job may contain.
//
// TorchScript can do more than tensor arithmetic (torch.from_file reads and writes files, custom
// operators run native code, a class's __setstate__ runs while the archive is loaded), so a module
// is accepted only when (1) its archive passes CheckTorchScriptArchive before anything in it runs,
// and (2) every node of every function it holds is an operator on trainerd's allow-list of tensor
// operations (CheckModuleOperators). Both refuse with PERMISSION_DENIED naming what they found.
// docs/SECURITY.md describes the threat model.
#pragma once

#include <torch/script.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace trainerd::engine {

// Reads the archive's table of contents and its code and pickle records without loading
// anything: INVALID_ARGUMENT when it is not a TorchScript archive or its records would expand to
// more than 4 x kMaxTorchScriptBytes; PERMISSION_DENIED when any class defines __setstate__ (which
// torch::jit::load runs while unpickling) or when it refers to a custom class (torch.classes.*,
// native code registered in the process). Never throws.
absl::Status CheckTorchScriptArchive(std::string_view archive);

// Walks every function of the module's compilation unit (methods of every submodule, forward
// hooks, free functions) and every nested block. PERMISSION_DENIED naming the first operator that
// is not on the allow-list and the function it is in: anything outside the aten and prim
// namespaces (custom operators), and aten/prim operators that touch files, processes, the network,
// the Python runtime, raw memory or global state. Never throws.
absl::Status CheckModuleOperators(const torch::jit::Module& module);

// The same walk over one graph; `where` names it in the error. Iterative, so a deeply nested
// graph cannot overflow the stack.
absl::Status CheckGraphOperators(const torch::jit::Graph& graph, std::string_view where);

// Whether a qualified operator name ("aten::linear", "prim::If") is on the allow-list.
bool IsAllowedOperator(std::string_view qualified_name);

// Whether an interned operator symbol is on the allow-list. The graph check uses this one: it
// compares the whole interned name, including any byte after a NUL.
bool IsAllowedOperator(c10::Symbol kind);

}  // namespace trainerd::engine
