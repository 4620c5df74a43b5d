// The exported-program reader, checker and interpreter (exported_program.h) against eager
// PyTorch: fixtures made at build time by make_exported_fixtures.py with the project's torch.
#include "server/engine/training/exported_program.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainerd::engine {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Fixture(const std::string& name) {
  return std::string(TRAINERD_EXPORTED_FIXTURES) + "/" + name;
}

torch::Tensor FromJson(const nlohmann::json& j) {
  std::vector<int64_t> shape = j["shape"].get<std::vector<int64_t>>();
  std::vector<double> values = j["values"].get<std::vector<double>>();
  return torch::tensor(values, torch::kFloat64).reshape(shape).to(torch::kFloat32);
}

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff =
      (got.detach().to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>();
  EXPECT_LT(diff, 1e-5) << what << ": largest difference " << diff;
}

// The interpreter rests on this: an operator called through the dispatcher, boxed, on a tensor
// that requires grad records autograd as an eager call does.
TEST(ExportedProgramTest, ADispatcherCallRecordsAutogradAsAnEagerCall) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({4, 3});
  torch::Tensor w = torch::randn({2, 3}).requires_grad_(true);
  torch::Tensor b = torch::randn({2}).requires_grad_(true);
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::linear", "");
  torch::jit::Stack stack{x, w, b};
  op.callBoxed(stack);
  torch::Tensor y = stack.at(0).toTensor();
  ASSERT_NE(y.grad_fn(), nullptr);
  y.pow(2).sum().backward();

  torch::Tensor w2 = w.detach().clone().requires_grad_(true);
  torch::Tensor b2 = b.detach().clone().requires_grad_(true);
  torch::nn::functional::linear(x, w2, b2).pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), w2.grad()));
  EXPECT_TRUE(torch::equal(b.grad(), b2.grad()));
}

class ExportedModelTest : public ::testing::TestWithParam<std::string> {};

// Training mode: the output, every parameter's gradient and the buffers after one forward equal
// eager PyTorch's; evaluation mode: the output equals module.eval()'s.
TEST_P(ExportedModelTest, ForwardAndGradientsEqualEagerPyTorch) {
  const std::string name = GetParam();
  const std::string archive = ReadFile(Fixture(name + ".pt2"));
  const nlohmann::json ref = nlohmann::json::parse(ReadFile(Fixture(name + ".json")));
  absl::StatusOr<ExportedProgramInfo> info = CheckExportedProgram(archive);
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<std::shared_ptr<ExportedProgram>> program = ExportedProgram::Load(archive);
  ASSERT_TRUE(program.ok()) << program.status();
  const torch::Tensor x = FromJson(ref["input"]);
  EXPECT_EQ(info->input_shape, std::vector<int64_t>(x.sizes().begin() + 1, x.sizes().end()));
  if (ref.contains("train")) {
    (*program)->Train(true);
    torch::Tensor out = (*program)->Forward(x);
    ExpectClose(out, FromJson(ref["train"]), name + " training output");
    EXPECT_EQ(info->output_shape, std::vector<int64_t>(out.sizes().begin() + 1, out.sizes().end()));
    out.sum().backward();
    ASSERT_EQ((*program)->named_parameters().size(), ref["grads"].size());
    for (const auto& [pname, p] : (*program)->named_parameters()) {
      ASSERT_TRUE(ref["grads"].contains(pname)) << pname;
      ASSERT_TRUE(p.grad().defined()) << pname;
      ExpectClose(p.grad(), FromJson(ref["grads"][pname]), name + " gradient of " + pname);
    }
    for (const auto& [bname, b] : (*program)->named_buffers()) {
      ExpectClose(b.to(torch::kFloat32), FromJson(ref["buffers"][bname]),
                  name + " buffer " + bname);
    }
  }
  (*program)->Train(false);
  torch::NoGradGuard no_grad;
  if (!ref.contains("train")) {
    // The eval reference came from the weights as exported: reload them.
    program = ExportedProgram::Load(archive);
    (*program)->Train(false);
  }
  const std::vector<std::pair<std::string, torch::Tensor>> before = (*program)->named_buffers();
  std::vector<torch::Tensor> copies;
  for (const auto& [bname, b] : before) copies.push_back(b.clone());
  ExpectClose((*program)->Forward(x), FromJson(ref["eval"]), name + " evaluation output");
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(torch::equal(copies[i], (*program)->named_buffers()[i].second))
        << "evaluation mode changed " << before[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ExportedModelTest,
                         ::testing::Values("mlp_p0", "cnn_p0", "lstm", "transformer_p0", "residual",
                                           "mlp", "cnn", "transformer"));

TEST(ExportedProgramTest, DropoutInTrainingDrawsFromTheGivenGenerator) {
  const std::string archive = ReadFile(Fixture("mlp.pt2"));
  auto run = [&](uint64_t seed) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    auto program = ExportedProgram::Load(archive, gen);
    EXPECT_TRUE(program.ok());
    torch::NoGradGuard no_grad;
    return (*program)->Forward(torch::ones({64, 8}));
  };
  EXPECT_TRUE(torch::equal(run(7), run(7)));
  EXPECT_FALSE(torch::equal(run(7), run(8)));
}

TEST(ExportedProgramTest, SaveArchiveWritesTheCurrentWeights) {
  const std::string archive = ReadFile(Fixture("residual.pt2"));
  auto program = ExportedProgram::Load(archive);
  ASSERT_TRUE(program.ok());
  {
    torch::NoGradGuard no_grad;
    for (const auto& [pname, p] : (*program)->named_parameters()) p.add_(1.0);
  }
  const std::string saved = (*program)->SaveArchive();
  ASSERT_TRUE(IsExportedProgramArchive(saved));
  auto reloaded = ExportedProgram::Load(saved);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  ASSERT_EQ((*reloaded)->named_parameters().size(), (*program)->named_parameters().size());
  for (size_t i = 0; i < (*program)->named_parameters().size(); ++i) {
    EXPECT_EQ((*reloaded)->named_parameters()[i].first, (*program)->named_parameters()[i].first);
    EXPECT_TRUE(torch::equal((*reloaded)->named_parameters()[i].second,
                             (*program)->named_parameters()[i].second));
  }
}

TEST(ExportedProgramTest, ATorchScriptArchiveIsNotAnExportedProgram) {
  EXPECT_FALSE(IsExportedProgramArchive("PK\x03\x04 not really"));
  EXPECT_FALSE(IsExportedProgramArchive(""));
  EXPECT_TRUE(IsExportedProgramArchive(ReadFile(Fixture("lstm.pt2"))));
}

// docs/MODELS.md is where users look for the list: it must be the list.
TEST(ExportedProgramTest, TheDocumentedOperatorsAreTheAllowList) {
  const std::string doc = ReadFile(std::string(TRAINERD_SOURCE_DIR) + "/docs/MODELS.md");
  ASSERT_FALSE(doc.empty());
  for (const std::string& op : ExportedOperatorList()) {
    EXPECT_NE(doc.find("`" + op + "`"), std::string::npos) << op << " is not in docs/MODELS.md";
    EXPECT_TRUE(ExportedOperatorAllowed(
        absl::StrCat(absl::StartsWith(op, "aten.") ? "torch.ops." : "", op)))
        << op;
  }
  EXPECT_FALSE(ExportedOperatorAllowed("torch.ops.aten.from_file.default"));
  EXPECT_FALSE(ExportedOperatorAllowed("torch.ops.higher_order.cond"));
  EXPECT_FALSE(ExportedOperatorAllowed("torch.ops.my_lib.custom.default"));
  EXPECT_FALSE(ExportedOperatorAllowed("builtins.print"));
}

}  // namespace
}  // namespace trainerd::engine
