// Tests for TorchScript modules as code: the operator allow-list and the graph walk
// (server/engine/module_check.h), the archive check, the checker process with its time limit
// (server/engine/module_sandbox.h), and Submit's use of them through the Engine. Modules are built
// in C++ with define(), as a user's scripted module would be saved.
#include "server/engine/torchscript/module_check.h"

#include <torch/script.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/torchscript/module_sandbox.h"
#include "server/engine/torchscript/reaper.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using ::testing::HasSubstr;

// A module "Net" with parameters w [1, 1] and b [1] and the given methods (TorchScript source).
torch::jit::Module MakeModule(const std::string& source) {
  torch::jit::Module m("Net");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::ones({1, 1}), /*is_buffer=*/false);
  m.register_parameter("b", torch::zeros({1}), /*is_buffer=*/false);
  m.define(source);
  return m;
}

std::string Save(const torch::jit::Module& m) {
  std::ostringstream out;
  m.save(out);
  return out.str();
}

const char kLinearForward[] =
    "def forward(self, x):\n"
    "  return torch.linear(x, self.w, self.b)\n";

// Reads a file through torch.from_file: the attack of the issue.
const char kFromFileForward[] =
    "def forward(self, x):\n"
    "  t = torch.from_file('/etc/hostname', False, 1)\n"
    "  return torch.linear(x, self.w, self.b) + t.sum()\n";

// The same call hidden in a helper method that forward calls.
const char kHelperFromFile[] =
    "def leak(self) -> Tensor:\n"
    "  return torch.from_file('/etc/hostname', False, 1)\n"
    "def forward(self, x):\n"
    "  return torch.linear(x, self.w, self.b) + self.leak().sum()\n";

// Never returns.
const char kHangingForward[] =
    "def forward(self, x):\n"
    "  i = 0\n"
    "  while i >= 0:\n"
    "    i = i + 1\n"
    "  return torch.linear(x, self.w, self.b)\n";

// __setstate__ runs while torch::jit::load unpickles the module.
const char kSetstate[] =
    "def __getstate__(self) -> Tuple[Tensor, Tensor, bool]:\n"
    "  return (self.w, self.b, self.training)\n"
    "def __setstate__(self, state: Tuple[Tensor, Tensor, bool]) -> None:\n"
    "  self.w = state[0]\n"
    "  self.b = state[1]\n"
    "  self.training = state[2]\n"
    "def forward(self, x):\n"
    "  return torch.linear(x, self.w, self.b)\n";

// ---- The allow-list and the graph walk ------------------------------------------------------

TEST(AllowListTest, TensorOperationsAreAllowedAndFileAccessIsNot) {
  EXPECT_TRUE(IsAllowedOperator("aten::linear"));
  EXPECT_TRUE(IsAllowedOperator("aten::conv2d"));
  EXPECT_TRUE(IsAllowedOperator("prim::If"));
  EXPECT_TRUE(IsAllowedOperator("prim::GetAttr"));
  EXPECT_FALSE(IsAllowedOperator("aten::from_file"));
  EXPECT_FALSE(IsAllowedOperator("aten::as_strided"));
  EXPECT_FALSE(IsAllowedOperator("aten::set_"));
  EXPECT_FALSE(IsAllowedOperator("aten::manual_seed"));
  EXPECT_FALSE(IsAllowedOperator("prim::Print"));
  EXPECT_FALSE(IsAllowedOperator("prim::PythonOp"));
  EXPECT_FALSE(IsAllowedOperator("my_ops::anything"));
}

TEST(AllowListTest, LogWritesAndUninitialisedAllocationsAreNot) {
  EXPECT_FALSE(IsAllowedOperator("aten::warn"));
  EXPECT_FALSE(IsAllowedOperator("aten::empty"));
  EXPECT_FALSE(IsAllowedOperator("aten::empty_like"));
  EXPECT_FALSE(IsAllowedOperator("aten::new_empty"));
  EXPECT_TRUE(IsAllowedOperator("aten::zeros"));
  EXPECT_TRUE(IsAllowedOperator("aten::zeros_like"));
}

TEST(CheckModuleOperatorsTest, UninitialisedMemoryAndForgedLogLinesAreRefused) {
  // Only in training mode, where the checker's trial forward never goes: the walk sees it anyway.
  const torch::jit::Module leaks = MakeModule(
      "def forward(self, x):\n"
      "  if self.training:\n"
      "    x = x + 0.0 * torch.empty_like(x)\n"
      "  return torch.linear(x, self.w, self.b)\n");
  absl::Status status = CheckModuleOperators(leaks);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("aten::empty_like"));
  const torch::jit::Module forges = MakeModule(
      "def forward(self, x):\n"
      "  if self.training:\n"
      "    torch.warn('I1202 trainerd] job SUCCEEDED')\n"
      "  return torch.linear(x, self.w, self.b)\n");
  status = CheckModuleOperators(forges);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("aten::warn"));
}

TEST(CheckGraphOperatorsTest, CustomOperatorIsRefusedByName) {
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::Value* x = graph->addInput("x");
  torch::jit::Node* custom =
      graph->create(c10::Symbol::fromQualString("my_ops::exfiltrate"), {x}, /*num_outputs=*/1);
  graph->appendNode(custom);
  graph->registerOutput(custom->output());
  const absl::Status status = CheckGraphOperators(*graph, "Net.forward");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("operator 'my_ops::exfiltrate' (in Net.forward)"));
}

// An operator name with a NUL byte after an allowed one ("aten::t" then "\0x") reads as the
// allowed name through its C string; the check compares interned symbols, so it is refused. (The
// module-check fuzzer found this: its harness's verdict and the check's differed.)
TEST(CheckGraphOperatorsTest, NameWithANulByteAfterAnAllowedOneIsRefused) {
  auto graph = std::make_shared<torch::jit::Graph>();
  const std::string forged("aten::t\0x", 9);
  ASSERT_STREQ(c10::Symbol::fromQualString(forged).toQualString(), "aten::t");
  graph->appendNode(graph->create(c10::Symbol::fromQualString(forged), 0));
  const absl::Status status = CheckGraphOperators(*graph, "Net.forward");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(IsAllowedOperator(c10::Symbol::fromQualString(forged)));
  EXPECT_TRUE(IsAllowedOperator(c10::Symbol::fromQualString("aten::t")));
  // The real one still passes.
  auto allowed = std::make_shared<torch::jit::Graph>();
  allowed->appendNode(allowed->create(c10::Symbol::fromQualString("aten::t"), 0));
  EXPECT_TRUE(CheckGraphOperators(*allowed, "Net.forward").ok());
}

// A refused operator deep inside nested blocks is found, and the walk does not recurse (10,000
// levels would overflow a recursive walker's stack).
TEST(CheckGraphOperatorsTest, RefusedOperatorInDeeplyNestedBlocksIsFound) {
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::Value* condition = graph->addInput("c");
  torch::jit::Block* block = graph->block();
  for (int depth = 0; depth < 10000; ++depth) {
    torch::jit::Node* branch = graph->create(torch::jit::prim::If, {condition}, 0);
    block->appendNode(branch);
    branch->addBlock();
    branch->addBlock();
    block = branch->blocks()[0];
  }
  block->appendNode(graph->create(c10::Symbol::fromQualString("aten::from_file"), 0));
  const absl::Status status = CheckGraphOperators(*graph, "deep");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("aten::from_file"));
}

TEST(CheckModuleOperatorsTest, ALinearModuleIsAllowed) {
  EXPECT_TRUE(CheckModuleOperators(MakeModule(kLinearForward)).ok());
}

TEST(CheckModuleOperatorsTest, FromFileInForwardIsRefused) {
  const absl::Status status = CheckModuleOperators(MakeModule(kFromFileForward));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("operator 'aten::from_file' (in __torch__.Net.forward)"));
}

TEST(CheckModuleOperatorsTest, FromFileInAHelperMethodIsRefused) {
  const absl::Status status = CheckModuleOperators(MakeModule(kHelperFromFile));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("aten::from_file"));
}

TEST(CheckModuleOperatorsTest, PrintIsRefused) {
  const absl::Status status = CheckModuleOperators(
      MakeModule("def forward(self, x):\n  print(x)\n  return torch.linear(x, self.w, self.b)\n"));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("prim::Print"));
}

// ---- The archive check ----------------------------------------------------------------------

TEST(CheckTorchScriptArchiveTest, ASavedModuleIsAccepted) {
  EXPECT_TRUE(CheckTorchScriptArchive(Save(MakeModule(kLinearForward))).ok());
}

TEST(CheckTorchScriptArchiveTest, SetstateIsRefusedBeforeAnythingLoads) {
  const absl::Status status = CheckTorchScriptArchive(Save(MakeModule(kSetstate)));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("__setstate__"));
}

TEST(CheckTorchScriptArchiveTest, BytesThatAreNoArchiveAreInvalid) {
  EXPECT_EQ(CheckTorchScriptArchive("not a zip archive").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTorchScriptArchive("").code(), absl::StatusCode::kInvalidArgument);
}

// ---- The checker's protocol -------------------------------------------------------------------

TEST(ModuleProbeTest, EncodedResultsDecodeToThemselves) {
  ModuleProbe probe;
  probe.parameter_count = 12;
  probe.output_shape = {3, 4};
  const absl::StatusOr<ModuleProbe> back = DecodeModuleProbe(EncodeModuleProbe(probe));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->parameter_count, 12);
  EXPECT_EQ(back->output_shape, (std::vector<int64_t>{3, 4}));

  ModuleProbe scalar;
  scalar.parameter_count = 1;
  const absl::StatusOr<ModuleProbe> scalar_back = DecodeModuleProbe(EncodeModuleProbe(scalar));
  ASSERT_TRUE(scalar_back.ok()) << scalar_back.status();
  EXPECT_TRUE(scalar_back->output_shape.empty());

  const absl::StatusOr<ModuleProbe> refused =
      DecodeModuleProbe(EncodeModuleProbe(absl::PermissionDeniedError("operator 'x'\nis refused")));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.status().message(), "operator 'x' is refused");
}

TEST(ModuleProbeTest, MalformedOrUnexpectedOutputIsInternal) {
  EXPECT_EQ(DecodeModuleProbe("").status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(DecodeModuleProbe("ok\nparameters -1\noutput\n").status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(DecodeModuleProbe("ok\nparameters 1\noutput x\n").status().code(),
            absl::StatusCode::kInternal);
  // Only a check's verdicts pass through; OK or NOT_FOUND from the checker is its failure.
  EXPECT_EQ(DecodeModuleProbe("error 5\nmissing\n").status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(DecodeModuleProbe("error 0\nfine\n").status().code(), absl::StatusCode::kInternal);
}

// ---- The checker process --------------------------------------------------------------------

// A child that has answered but lingers (here: one that only sleeps) is ended and reaped at once,
// without the caller waiting for it: no zombie, no reaping thread held.
TEST(EndAndReapTest, ALingeringChildIsEndedAndReapedWithoutWaiting) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  const absl::Time start = absl::Now();
  EndAndReap(pid);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));  // returns without waiting
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = ::kill(pid, 0) != 0 && errno == ESRCH;  // reaped: not even a zombie is left
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone);
  EndAndReap(pid);  // one already reaped: nothing (and no signal to a stranger)
  EndAndReap(-1);
}

ModuleCheckerOptions Checker(absl::Duration timeout = absl::Seconds(30)) {
  ModuleCheckerOptions options;
  options.program = TRAINERD_MODULE_CHECKER;
  options.timeout = timeout;
  return options;
}

TEST(RunModuleCheckerTest, AGoodModuleReportsItsParametersAndOutputShape) {
  const absl::StatusOr<ModuleProbe> probe = RunModuleChecker(
      Checker(), Save(MakeModule(kLinearForward)), {1}, "seed", absl::InfiniteFuture());
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->parameter_count, 2);
  EXPECT_EQ(probe->output_shape, (std::vector<int64_t>{1}));
}

TEST(RunModuleCheckerTest, ARefusedOperatorIsPermissionDenied) {
  const absl::StatusOr<ModuleProbe> probe = RunModuleChecker(
      Checker(), Save(MakeModule(kFromFileForward)), {1}, "seed", absl::InfiniteFuture());
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(probe.status().message(), HasSubstr("aten::from_file"));
}

TEST(RunModuleCheckerTest, AModuleThatHangsIsKilledAtTheTimeout) {
  const absl::Time start = absl::Now();
  const absl::StatusOr<ModuleProbe> probe =
      RunModuleChecker(Checker(absl::Seconds(2)), Save(MakeModule(kHangingForward)), {1}, "seed",
                       absl::InfiniteFuture());
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(probe.status().message(), HasSubstr("did not finish within 2 s"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(RunModuleCheckerTest, TheCallersDeadlineShortensTheTimeout) {
  const absl::StatusOr<ModuleProbe> probe =
      RunModuleChecker(Checker(absl::Seconds(60)), Save(MakeModule(kHangingForward)), {1}, "seed",
                       absl::Now() + absl::Seconds(1));
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(RunModuleCheckerTest, StopEndsTheCheckWithUnavailable) {
  std::atomic<bool> stop{false};
  std::thread stopper([&stop] {
    absl::SleepFor(absl::Milliseconds(300));
    stop.store(true);
  });
  const absl::StatusOr<ModuleProbe> probe = RunModuleChecker(
      Checker(absl::Seconds(60)), Save(MakeModule(kHangingForward)), {1}, "seed",
      absl::InfiniteFuture(),
      [&stop] { return stop.load() ? absl::UnavailableError("stopping") : absl::OkStatus(); });
  stopper.join();
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(probe.status().message(), "stopping");
}

TEST(RunModuleCheckerTest, AModuleThatAllocatesWithoutBoundFailsInsideItsLimit) {
  ModuleCheckerOptions options = Checker();
  options.memory_limit_bytes = int64_t{1} << 30;
  const absl::StatusOr<ModuleProbe> probe =
      RunModuleChecker(options,
                       Save(MakeModule("def forward(self, x):\n"
                                       "  big = torch.ones([1 << 34])\n"
                                       "  return torch.linear(x, self.w, self.b) + big.sum()\n")),
                       {1}, "seed", absl::InfiniteFuture());
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RunModuleCheckerTest, WithoutACheckerModulesCannotBeAccepted) {
  ModuleCheckerOptions none;
  EXPECT_EQ(RunModuleChecker(none, "x", {1}, "seed", absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ModuleCheckerOptions missing;
  missing.program = "/nonexistent/trainerd-module-check";
  EXPECT_EQ(RunModuleChecker(missing, "x", {1}, "seed", absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInternal);
}

// ---- Submit -----------------------------------------------------------------------------------

class SubmitModuleTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
  JobSpec ModuleSpec(const std::string& bytes) const {
    JobSpec spec = SeedSpec("seed");
    spec.model = "";
    spec.torchscript = bytes;
    return spec;
  }
};

TEST_F(SubmitModuleTest, AModuleThatReadsFilesIsRefusedNamingTheOperator) {
  const absl::StatusOr<JobSnapshot> job =
      engine_->SubmitJob(ModuleSpec(Save(MakeModule(kFromFileForward))));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(job.status().message(), HasSubstr("aten::from_file"));
  EXPECT_TRUE(engine_->ListJobs()->jobs.empty());
}

TEST_F(SubmitModuleTest, AModuleWithSetstateIsRefused) {
  const absl::StatusOr<JobSnapshot> job =
      engine_->SubmitJob(ModuleSpec(Save(MakeModule(kSetstate))));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(job.status().message(), HasSubstr("__setstate__"));
}

TEST_F(SubmitModuleTest, ModulesCanBeTurnedOff) {
  EngineOptions options = Options();
  options.allow_torchscript = false;
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  const absl::StatusOr<JobSnapshot> job =
      engine_->SubmitJob(ModuleSpec(Save(MakeModule(kLinearForward))));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(job.status().message(), HasSubstr("--allow_torchscript=false"));
}

TEST_F(SubmitModuleTest, TheCallerIsRecordedOnTheJob) {
  CallContext caller;
  caller.owner = "alice";
  JobSpec spec = ModuleSpec(Save(MakeModule(kLinearForward)));
  spec.dataset = "/seed";  // the dataset without an owner, as a caller with a name names it
  const absl::StatusOr<JobSnapshot> job = engine_->SubmitJob(spec, caller);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->owner, "alice");
  EXPECT_EQ(job->spec.model,
            absl::StrCat("torchscript (", Save(MakeModule(kLinearForward)).size(), " bytes)"));
  ASSERT_TRUE(engine_->CancelJob(job->id).ok());
}

// A module whose check hangs holds no lock that other requests need: while it runs, a spec-built
// job is submitted and a dataset deleted at once; the module is then refused DEADLINE_EXCEEDED.
TEST_F(SubmitModuleTest, AHangingModuleTimesOutWithoutHoldingUpOtherRequests) {
  EngineOptions options = Options();
  options.module_checker.timeout = absl::Seconds(3);
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);  // "seed" came back from the folder
  ASSERT_TRUE(Upload(*engine_, "other", SeedTable()).ok());
  std::promise<absl::StatusOr<JobSnapshot>> hung;
  engine_->SubmitJobAsync(ModuleSpec(Save(MakeModule(kHangingForward))), CallContext(),
                          [&hung](absl::StatusOr<JobSnapshot> job) { hung.set_value(job); });
  const absl::Time start = absl::Now();
  const absl::StatusOr<JobSnapshot> plain = engine_->SubmitJob(SeedSpec("seed"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(engine_->DeleteDataset("other").ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  const absl::StatusOr<JobSnapshot> refused = hung.get_future().get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(test_support::WaitForEnd(*engine_, plain->id).ok());
}

// A caller's share of the module checks: at most four running and waiting together, the next
// free thread to the caller with the fewest running, and a call that goes away ends its check.
TEST_F(SubmitModuleTest, OneCallersSlowModulesTakeItsShareNotTheNodes) {
  EngineOptions options = Options();
  options.module_checker.timeout = absl::Seconds(3);
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  // Admins (so that both may train on the dataset without an owner, "/seed"): the share binds
  // every caller, admins too.
  CallContext mallory;
  mallory.owner = "mallory";
  CallContext alice;
  alice.owner = "alice";
  auto spec = [this](const char* forward) {
    JobSpec s = ModuleSpec(Save(MakeModule(forward)));
    s.dataset = "/seed";
    return s;
  };
  std::mutex mu;
  std::vector<std::string> ended;  // who, in the order the checks ended
  std::vector<absl::Status> mallorys;
  std::promise<absl::StatusOr<JobSnapshot>> alices;
  for (int i = 0; i < 4; ++i) {
    engine_->SubmitJobAsync(spec(kHangingForward), mallory, [&](absl::StatusOr<JobSnapshot> job) {
      std::lock_guard<std::mutex> lock(mu);
      ended.push_back("mallory");
      mallorys.push_back(job.status());
    });
  }
  // A fifth is beyond her share; it says so at once.
  std::promise<absl::StatusOr<JobSnapshot>> fifth;
  engine_->SubmitJobAsync(spec(kHangingForward), mallory,
                          [&](absl::StatusOr<JobSnapshot> job) { fifth.set_value(job); });
  const absl::StatusOr<JobSnapshot> refused = fifth.get_future().get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("you have 4 TorchScript module checks"));
  // Alice's module comes before mallory's third and fourth, which waited longer.
  engine_->SubmitJobAsync(spec(kLinearForward), alice, [&](absl::StatusOr<JobSnapshot> job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ended.push_back("alice");
    }
    alices.set_value(job);
  });
  const absl::StatusOr<JobSnapshot> hers = alices.get_future().get();
  ASSERT_TRUE(hers.ok()) << hers.status();
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto at = std::find(ended.begin(), ended.end(), "alice") - ended.begin();
    EXPECT_LE(at, 2) << "alice's check waited behind more than mallory's first two";
  }
  ASSERT_TRUE(engine_->CancelJob(hers->id).ok());
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (mallorys.size() == 4) break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(mallorys.size(), 4u);
  for (const absl::Status& s : mallorys) EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(SubmitModuleTest, ACallThatGoesAwayEndsItsCheck) {
  EngineOptions options = Options();
  options.module_checker.timeout = absl::Seconds(60);
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  auto gone = std::make_shared<std::atomic<bool>>(false);
  CallContext caller;
  caller.owner = "bob";  // an admin, who may train on "/seed"
  caller.cancelled = [gone] {
    return gone->load() ? absl::CancelledError("the submit call was cancelled") : absl::OkStatus();
  };
  std::promise<absl::StatusOr<JobSnapshot>> result;
  JobSpec hanging = ModuleSpec(Save(MakeModule(kHangingForward)));
  hanging.dataset = "/seed";
  engine_->SubmitJobAsync(hanging, caller,
                          [&](absl::StatusOr<JobSnapshot> job) { result.set_value(job); });
  absl::SleepFor(absl::Milliseconds(500));
  gone->store(true);
  const absl::StatusOr<JobSnapshot> ended = result.get_future().get();
  // Ended by the cancel, not by the 60 s timeout.
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kCancelled) << ended.status();
  // Its share is free again: four more fit.
  for (int i = 0; i < 4; ++i) {
    std::promise<absl::StatusOr<JobSnapshot>> next;
    engine_->SubmitJobAsync(hanging, caller,
                            [&](absl::StatusOr<JobSnapshot> job) { next.set_value(job); });
    EXPECT_EQ(next.get_future().get().status().code(), absl::StatusCode::kCancelled);
  }
}

}  // namespace
}  // namespace trainerd::engine
