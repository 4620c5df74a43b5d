// The archive check and the operator allow-list for submitted TorchScript modules.
#include "server/engine/torchscript/module_check.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/function_impl.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_limits.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/pickle_check.h"
#include "server/engine/training/bounded_read_adapter.h"

namespace trainerd::engine {
namespace {

// The operators a submitted module may use: tensor arithmetic, the layers of torch.nn, shape and
// indexing operations, tensor creation, the random samplers of the global generator, and the
// Python builtins TorchScript compiles to aten/prim operators (int/float/str/list/dict
// operations, control flow). Left out on purpose, among others: aten::from_file (reads and maps
// files), anything that views raw memory with caller-chosen strides or offsets (as_strided,
// set_, _unsafe_view, empty_strided), reseeding or changing global state (manual_seed,
// _set_grad_enabled), quantized and sparse constructors that trust their arguments, prim::Print
// and aten::warn (they write to the log: a module could forge the daemon's lines), allocations
// that leave memory uninitialised (empty, empty_like, new_empty: a module could copy whatever
// the allocator last held into its parameters and out with the trained model; zeros and
// zeros_like do the same job) and every operator outside the aten and prim namespaces (custom
// operators are native code).
constexpr std::string_view kAllowedOperators[] = {
    "aten::Bool",
    "aten::Float",
    "aten::Int",
    "aten::IntImplicit",
    "aten::FloatImplicit",
    "aten::ScalarImplicit",
    "aten::__and__",
    "aten::__contains__",
    "aten::__derive_index",
    "aten::__getitem__",
    "aten::__interpolate",
    "aten::__is__",
    "aten::__isnot__",
    "aten::__not__",
    "aten::__or__",
    "aten::__range_length",
    "aten::__round_to_zero_floordiv",
    "aten::__upsample",
    "aten::__upsample_bilinear",
    "aten::__xor__",
    "aten::_native_multi_head_attention",
    "aten::_set_item",
    "aten::_transformer_encoder_layer_fwd",
    "aten::_upsample_bicubic2d_aa",
    "aten::_upsample_bilinear2d_aa",
    "aten::_upsample_nearest_exact1d",
    "aten::_upsample_nearest_exact2d",
    "aten::_upsample_nearest_exact3d",
    "aten::abs",
    "aten::abs_",
    "aten::acos",
    "aten::acosh",
    "aten::adaptive_avg_pool1d",
    "aten::adaptive_avg_pool2d",
    "aten::adaptive_avg_pool3d",
    "aten::adaptive_max_pool1d",
    "aten::adaptive_max_pool2d",
    "aten::adaptive_max_pool3d",
    "aten::add",
    "aten::add_",
    "aten::addbmm",
    "aten::addcdiv",
    "aten::addcmul",
    "aten::addmm",
    "aten::addmv",
    "aten::alpha_dropout",
    "aten::all",
    "aten::amax",
    "aten::amin",
    "aten::any",
    "aten::append",
    "aten::arange",
    "aten::argmax",
    "aten::argmin",
    "aten::argsort",
    "aten::asin",
    "aten::asinh",
    "aten::atan",
    "aten::atan2",
    "aten::atanh",
    "aten::avg_pool1d",
    "aten::avg_pool2d",
    "aten::avg_pool3d",
    "aten::baddbmm",
    "aten::batch_norm",
    "aten::bernoulli",
    "aten::bilinear",
    "aten::binary_cross_entropy",
    "aten::binary_cross_entropy_with_logits",
    "aten::bitwise_and",
    "aten::bitwise_not",
    "aten::bitwise_or",
    "aten::bitwise_xor",
    "aten::bmm",
    "aten::broadcast_tensors",
    "aten::broadcast_to",
    "aten::cat",
    "aten::ceil",
    "aten::celu",
    "aten::chunk",
    "aten::clamp",
    "aten::clamp_",
    "aten::clamp_max",
    "aten::clamp_min",
    "aten::clear",
    "aten::clip",
    "aten::clone",
    "aten::concat",
    "aten::constant_pad_nd",
    "aten::contiguous",
    "aten::conv1d",
    "aten::conv2d",
    "aten::conv3d",
    "aten::conv_transpose1d",
    "aten::conv_transpose2d",
    "aten::conv_transpose3d",
    "aten::copy_",
    "aten::cos",
    "aten::cosh",
    "aten::cosine_similarity",
    "aten::cross_entropy_loss",
    "aten::cumprod",
    "aten::cumsum",
    "aten::detach",
    "aten::diag",
    "aten::diag_embed",
    "aten::diagonal",
    "aten::dict",
    "aten::dim",
    "aten::div",
    "aten::div_",
    "aten::dot",
    "aten::dropout",
    "aten::dropout_",
    "aten::einsum",
    "aten::elu",
    "aten::elu_",
    "aten::embedding",
    "aten::embedding_bag",
    "aten::eq",
    "aten::equal",
    "aten::erf",
    "aten::erfc",
    "aten::exp",
    "aten::exp_",
    "aten::expand",
    "aten::expand_as",
    "aten::expm1",
    "aten::extend",
    "aten::eye",
    "aten::feature_alpha_dropout",
    "aten::feature_dropout",
    "aten::feature_dropout_",
    "aten::fill_",
    "aten::flatten",
    "aten::flip",
    "aten::floor",
    "aten::floor_divide",
    "aten::floordiv",
    "aten::fmod",
    "aten::format",
    "aten::frac",
    "aten::frobenius_norm",
    "aten::full",
    "aten::full_like",
    "aten::gather",
    "aten::ge",
    "aten::gelu",
    "aten::get",
    "aten::glu",
    "aten::group_norm",
    "aten::gru",
    "aten::gru_cell",
    "aten::gt",
    "aten::hardshrink",
    "aten::hardsigmoid",
    "aten::hardsigmoid_",
    "aten::hardswish",
    "aten::hardswish_",
    "aten::hardtanh",
    "aten::hardtanh_",
    "aten::huber_loss",
    "aten::index",
    "aten::index_add",
    "aten::index_copy",
    "aten::index_fill",
    "aten::index_put",
    "aten::index_put_",
    "aten::index_select",
    "aten::insert",
    "aten::instance_norm",
    "aten::is_autocast_enabled",
    "aten::is_floating_point",
    "aten::is_grad_enabled",
    "aten::isfinite",
    "aten::isinf",
    "aten::isnan",
    "aten::item",
    "aten::items",
    "aten::keys",
    "aten::kl_div",
    "aten::l1_loss",
    "aten::layer_norm",
    "aten::le",
    "aten::leaky_relu",
    "aten::leaky_relu_",
    "aten::len",
    "aten::lerp",
    "aten::linalg_matrix_norm",
    "aten::linalg_norm",
    "aten::linalg_vector_norm",
    "aten::linear",
    "aten::linspace",
    "aten::list",
    "aten::log",
    "aten::log10",
    "aten::log1p",
    "aten::log2",
    "aten::log_sigmoid",
    "aten::log_softmax",
    "aten::logaddexp",
    "aten::logical_and",
    "aten::logical_not",
    "aten::logical_or",
    "aten::logical_xor",
    "aten::logit",
    "aten::logsumexp",
    "aten::lstm",
    "aten::lstm_cell",
    "aten::lt",
    "aten::masked_fill",
    "aten::masked_fill_",
    "aten::masked_select",
    "aten::matmul",
    "aten::max",
    "aten::max_pool1d",
    "aten::max_pool2d",
    "aten::max_pool3d",
    "aten::maximum",
    "aten::mean",
    "aten::median",
    "aten::min",
    "aten::minimum",
    "aten::mish",
    "aten::mish_",
    "aten::mm",
    "aten::mse_loss",
    "aten::mul",
    "aten::mul_",
    "aten::multinomial",
    "aten::mv",
    "aten::nan_to_num",
    "aten::nanmean",
    "aten::nansum",
    "aten::narrow",
    "aten::ne",
    "aten::neg",
    "aten::nll_loss",
    "aten::nll_loss_nd",
    "aten::nonzero",
    "aten::norm",
    "aten::normal",
    "aten::nuclear_norm",
    "aten::numel",
    "aten::one_hot",
    "aten::ones",
    "aten::ones_like",
    "aten::pad",
    "aten::pairwise_distance",
    "aten::permute",
    "aten::pixel_shuffle",
    "aten::pixel_unshuffle",
    "aten::pop",
    "aten::pow",
    "aten::prelu",
    "aten::prod",
    "aten::rand",
    "aten::rand_like",
    "aten::randint",
    "aten::randn",
    "aten::randn_like",
    "aten::randperm",
    "aten::reciprocal",
    "aten::relu",
    "aten::relu6",
    "aten::relu_",
    "aten::remainder",
    "aten::repeat",
    "aten::repeat_interleave",
    "aten::reshape",
    "aten::reshape_as",
    "aten::reverse",
    "aten::rnn_relu",
    "aten::rnn_tanh",
    "aten::roll",
    "aten::round",
    "aten::rrelu",
    "aten::rsqrt",
    "aten::rsub",
    "aten::scaled_dot_product_attention",
    "aten::scatter",
    "aten::scatter_add",
    "aten::select",
    "aten::selu",
    "aten::sigmoid",
    "aten::sigmoid_",
    "aten::sign",
    "aten::silu",
    "aten::silu_",
    "aten::sin",
    "aten::sinh",
    "aten::size",
    "aten::slice",
    "aten::smooth_l1_loss",
    "aten::softmax",
    "aten::softplus",
    "aten::softshrink",
    "aten::sort",
    "aten::split",
    "aten::split_with_sizes",
    "aten::sqrt",
    "aten::square",
    "aten::squeeze",
    "aten::squeeze_",
    "aten::stack",
    "aten::std",
    "aten::str",
    "aten::sub",
    "aten::sub_",
    "aten::sum",
    "aten::t",
    "aten::tan",
    "aten::tanh",
    "aten::tanh_",
    "aten::tensor",
    "aten::tensor_split",
    "aten::tile",
    "aten::to",
    "aten::topk",
    "aten::transpose",
    "aten::tril",
    "aten::triu",
    "aten::true_divide",
    "aten::trunc",
    "aten::type_as",
    "aten::unbind",
    "aten::unflatten",
    "aten::unfold",
    "aten::unsqueeze",
    "aten::unsqueeze_",
    "aten::upsample_bicubic2d",
    "aten::upsample_bilinear2d",
    "aten::upsample_linear1d",
    "aten::upsample_nearest1d",
    "aten::upsample_nearest2d",
    "aten::upsample_nearest3d",
    "aten::upsample_trilinear3d",
    "aten::values",
    "aten::var",
    "aten::view",
    "aten::view_as",
    "aten::where",
    "aten::zero_",
    "aten::zeros",
    "aten::zeros_like",
    "prim::BroadcastSizes",
    "prim::CallFunction",
    "prim::CallMethod",
    "prim::Constant",
    "prim::CreateObject",
    "prim::DictConstruct",
    "prim::DictIndex",
    "prim::Enter",
    "prim::Exit",
    "prim::GetAttr",
    "prim::If",
    "prim::ImplicitTensorToNum",
    "prim::ListConstruct",
    "prim::ListUnpack",
    "prim::Loop",
    "prim::NumToTensor",
    "prim::RaiseException",
    "prim::SetAttr",
    "prim::TupleConstruct",
    "prim::TupleIndex",
    "prim::TupleUnpack",
    "prim::Uninitialized",
    "prim::abs",
    "prim::data",
    "prim::device",
    "prim::dtype",
    "prim::is_cpu",
    "prim::is_cuda",
    "prim::is_nested",
    "prim::isinstance",
    "prim::layout",
    "prim::max",
    "prim::min",
    "prim::requires_grad",
    "prim::shape",
    "prim::type",
    "prim::unchecked_cast",
    "prim::unchecked_unwrap_optional",
};

// Qualified names of custom classes (torch.classes.*) start with this.
constexpr absl::string_view kCustomClassPrefix = "__torch__.torch.classes.";

// Debian's Abseil has its own absl::string_view (not std::string_view).
absl::string_view View(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

absl::Status Refused(std::string_view what, std::string_view where) {
  return absl::PermissionDeniedError(absl::StrCat(
      View(what), " (in ", View(where),
      ") is not allowed in a submitted TorchScript module: trainerd runs only modules made of "
      "tensor operations (see docs/SECURITY.md)"));
}

// The graph of a TorchScript function, or null for a native (builtin) one.
std::shared_ptr<torch::jit::Graph> GraphOf(torch::jit::Function& function) {
  torch::jit::GraphFunction* graph_function = torch::jit::tryToGraphFunction(function);
  return graph_function == nullptr ? nullptr : graph_function->graph();
}

}  // namespace

bool IsAllowedOperator(std::string_view qualified_name) {
  static const std::set<std::string_view>* const kAllowed =
      new std::set<std::string_view>(std::begin(kAllowedOperators), std::end(kAllowedOperators));
  return kAllowed->count(qualified_name) > 0;
}

bool IsAllowedOperator(c10::Symbol kind) {
  // Symbols, not their C strings: an interned name may hold a NUL byte ("aten::t\0..."), and its
  // toQualString() would read as the allowed "aten::t". Interning the allowed names gives each one
  // id, so a name that differs in any byte is a different symbol.
  static const std::unordered_set<c10::Symbol>* const kAllowedSymbols = [] {
    auto* symbols = new std::unordered_set<c10::Symbol>();
    for (std::string_view name : kAllowedOperators) {
      symbols->insert(c10::Symbol::fromQualString(std::string(name)));
    }
    return symbols;
  }();
  return kAllowedSymbols->count(kind) > 0;
}

absl::Status CheckGraphOperators(const torch::jit::Graph& graph, std::string_view where) {
  // An explicit stack of blocks (and of subgraphs held in node attributes): no recursion.
  std::vector<const torch::jit::Block*> blocks = {graph.block()};
  std::vector<std::shared_ptr<torch::jit::Graph>> subgraphs;  // keeps attribute graphs alive
  while (!blocks.empty()) {
    const torch::jit::Block* block = blocks.back();
    blocks.pop_back();
    for (const torch::jit::Node* node : block->nodes()) {
      if (!IsAllowedOperator(node->kind())) {
        return Refused(absl::StrCat("operator '", node->kind().toQualString(), "'"), where);
      }
      if (node->kind() == torch::jit::prim::CallMethod && node->inputs().size() > 0) {
        // A method of a custom class runs native code; a module's own methods are checked as
        // functions of the compilation unit.
        const std::string type = node->inputs()[0]->type()->str();
        if (absl::StartsWith(type, kCustomClassPrefix)) {
          return Refused(absl::StrCat("a method of the custom class '", type, "'"), where);
        }
      }
      for (const torch::jit::Block* nested : node->blocks()) blocks.push_back(nested);
      for (const torch::jit::Symbol name : node->attributeNames()) {
        if (node->kindOf(name) == torch::jit::AttributeKind::g) {
          subgraphs.push_back(node->g(name));
          blocks.push_back(subgraphs.back()->block());
        } else if (node->kindOf(name) == torch::jit::AttributeKind::gs) {
          for (const std::shared_ptr<torch::jit::Graph>& g : node->gs(name)) {
            subgraphs.push_back(g);
            blocks.push_back(g->block());
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckModuleOperators(const torch::jit::Module& module) {
  try {
    std::unordered_set<const torch::jit::Function*> seen;
    std::vector<torch::jit::Function*> functions =
        module._ivalue()->compilation_unit()->get_functions();
    // Every module type in the tree, for methods and hooks that a compilation unit might not list.
    for (const torch::jit::Module& sub : module.modules()) {
      const c10::ClassTypePtr& type = sub.type();
      if (absl::StartsWith(type->name() ? type->name()->qualifiedName() : "", kCustomClassPrefix)) {
        return Refused(absl::StrCat("the custom class '", type->name()->qualifiedName(), "'"),
                       "the module's attributes");
      }
      for (torch::jit::Function* f : type->methods()) functions.push_back(f);
      for (torch::jit::Function* f : type->getForwardHooks()) functions.push_back(f);
      for (torch::jit::Function* f : type->getForwardPreHooks()) functions.push_back(f);
      for (size_t i = 0; i < type->numAttributes(); ++i) {
        const std::string attribute_type = type->getAttribute(i)->str();
        if (absl::StrContains(attribute_type, kCustomClassPrefix)) {
          return Refused(absl::StrCat("an attribute of the custom class '", attribute_type, "'"),
                         type->name() ? type->name()->qualifiedName() : "the module");
        }
      }
    }
    for (torch::jit::Function* function : functions) {
      if (function == nullptr || !seen.insert(function).second) continue;
      std::shared_ptr<torch::jit::Graph> graph = GraphOf(*function);
      if (graph == nullptr) {
        return Refused(
            absl::StrCat("the native function '", function->qualname().qualifiedName(), "'"),
            "the module");
      }
      absl::Status status = CheckGraphOperators(*graph, function->qualname().qualifiedName());
      if (!status.ok()) return status;
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be inspected: ", FirstLineOf(e)));
  }
  return absl::OkStatus();
}

absl::Status CheckTorchScriptArchive(std::string_view archive) {
  try {
    auto reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<BoundedReadAdapter>(archive));
    const std::vector<std::string> records = reader->getAllRecords();
    // Stored (uncompressed) records are at most the archive's size; a record that claims to
    // expand far past it is a zip bomb, refused before anything reads it.
    const size_t limit = 4 * static_cast<size_t>(kMaxTorchScriptBytes);
    size_t total = 0;
    for (const std::string& name : records) {
      const size_t size = reader->getRecordSize(name);
      if (size > limit || total + size > limit) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the TorchScript archive's records would expand to more than ", limit, " bytes"));
      }
      total += size;
    }
    // The pickles' opcodes, globals and every tensor's metadata against its storage record, before
    // LibTorch (which trusts them) ever reads them.
    for (const std::string dir : {"data", "constants"}) {
      const std::string pickle_name = dir + ".pkl";
      if (!reader->hasRecord(pickle_name)) {
        if (dir == "data") {
          return absl::InvalidArgumentError(
              "the TorchScript archive has no data.pkl: it is not a module saved by "
              "torch.jit.save");
        }
        continue;
      }
      auto [data, size] = reader->getRecord(pickle_name);
      const StorageSizeLookup sizes = [&](std::string_view key) -> std::optional<int64_t> {
        const std::string name = absl::StrCat(dir, "/", View(key));
        if (!reader->hasRecord(name)) return std::nullopt;
        return static_cast<int64_t>(reader->getRecordSize(name));
      };
      const absl::Status pickle = CheckTorchScriptPickle(
          std::string_view(static_cast<const char*>(data.get()), size), pickle_name, sizes);
      if (!pickle.ok()) return pickle;
    }
    for (const std::string& name : records) {
      // Code (.py), its debug tables and the pickles (data.pkl, constants.pkl) name every class
      // the archive defines or refers to.
      if (!absl::EndsWith(name, ".py") && !absl::EndsWith(name, ".pkl")) continue;
      auto [data, size] = reader->getRecord(name);
      const std::string_view text(static_cast<const char*>(data.get()), size);
      if (text.find("__setstate__") != std::string_view::npos) {
        return absl::PermissionDeniedError(absl::StrCat(
            "the TorchScript archive defines __setstate__ (in '", name,
            "'), which would run while the module is loaded; submitted modules may not define "
            "it (see docs/SECURITY.md)"));
      }
      if (text.find("torch.classes") != std::string_view::npos) {
        return absl::PermissionDeniedError(absl::StrCat(
            "the TorchScript archive refers to a custom class (torch.classes, in '", name,
            "'), which is native code; submitted modules may not use custom classes (see "
            "docs/SECURITY.md)"));
      }
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TorchScript module cannot be loaded: ", FirstLineOf(e)));
  }
  return absl::OkStatus();
}

}  // namespace trainerd::engine
