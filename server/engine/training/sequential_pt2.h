// A spec-built job's trained model as torch.export's archive (.pt2), made from the job's kept
// state_dict: what `torch.export.save(torch.export.export(nn.Sequential(...).eval(), (x,),
// dynamic_shapes=batch))` writes for the same layers and weights, so that `torch.export.load`
// gives a program that runs the model as evaluation does (dropout off, batch norm on its running
// statistics) on any batch size, and AOTInductor or ExecuTorch can take it from there.
//
// Written here rather than by PyTorch's Python because the daemon has no Python: the layers of a
// spec are few (common/model_spec.h), each one ATen operator in torch.export's training IR, and
// the archive is JSON, raw weights and one small pickle (the example input, torch::pickle_save).
// The schema version written is the pinned torch's (kPt2SchemaVersion); the Python tests load
// the archive with that torch and compare it with torch's own export.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace trainerd::engine {

// torch._export.serde.schema.SCHEMA_VERSION and the aten opset of the torch trainerd builds
// against.
inline constexpr int kPt2SchemaMajor = 8;
inline constexpr int kPt2SchemaMinor = 17;
inline constexpr int kPt2AtenOpset = 10;

// kEvaluation: the graph of `model.eval()`, for deployment (what a download gives).
// kTraining: the graph of `model.train()`, whose batch norm and dropout follow the module's mode:
// what trainerd's own runtime for exported programs takes (it refuses an evaluation graph, which
// it could not switch), to train the weights further as a user's model.
enum class Pt2Mode { kEvaluation, kTraining };

// The .pt2 of the model whose state_dict is `safetensors` (SequentialSafetensors' file: its
// metadata names the spec and one row's shape). FAILED_PRECONDITION for the state_dict of a
// TorchScript or exported module (their .pt2 is the user's to make, or the job's own archive);
// DATA_LOSS when the file's tensors are not the spec's; never throws.
absl::StatusOr<std::string> SequentialPt2(std::string_view safetensors,
                                          Pt2Mode mode = Pt2Mode::kEvaluation);

}  // namespace trainerd::engine
