// Tests for TorchScript jobs in worker processes: the protocol's codecs against hostile bytes
// (server/engine/worker_protocol.h), the shared memory the datasets travel in
// (server/engine/shared_memory.h), and RunTrainingInWorker with the real trainerd-worker
// (server/engine/worker_launcher.h): the same losses as in the daemon, bit for bit, and modules
// that loop, allocate or crash only in training mode, which the checker's trial forward (eval
// mode) cannot see, ending their jobs alone.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/jit.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/datasets/shared_memory.h"
#include "server/engine/engine.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/torchscript_module.h"
#include "server/engine/torchscript/worker_launcher.h"
#include "server/engine/torchscript/worker_protocol.h"
#include "server/worker/under_asan.h"
#include "tests/engine/engine_test_support.h"

namespace trainerd::engine {
namespace {

using test_support::EngineFixture;
using test_support::Losses;
using test_support::SeedSpec;
using test_support::SeedTable;
using test_support::Upload;
using test_support::WaitForEnd;
using ::testing::HasSubstr;

// ---- The protocol --------------------------------------------------------------------------

WorkerJob SampleJob() {
  WorkerJob job;
  job.job_id = "job-1";
  job.spec = SeedSpec("seed");
  job.spec.weight_decay = 0.25;
  job.spec.validation_fraction = 0.125;
  job.spec.max_job_seconds = 3.5;
  job.spec.precision = Precision::kBf16;
  job.spec.class_weights = {0.5, 2.0, 1.0 / 3.0};
  job.spec.ignore_index = -100;
  job.spec.early_stop_patience = 4;
  job.spec.early_stop_min_delta = 0.0625;
  job.spec.early_stop_metric = EarlyStopMetric::kValidationAccuracy;
  job.spec.gradient_accumulation_steps = 3;
  job.spec.drop_last = true;
  job.spec.model_from = ModelFrom::kBest;
  job.device = "cpu";
  job.intra_op_threads = 2;
  job.cpu_nice = 10;
  job.checkpoints = true;
  job.dataset.meta.name = "seed";
  job.dataset.meta.feature_shape = {1, 28, 28};
  job.dataset.meta.target_shape = {};
  job.dataset.meta.target_dtype = TargetDType::kInt64;
  job.dataset.meta.rows = 10;
  job.dataset.meta.size_bytes = 10 * 784 * 4 + 80;
  job.dataset.meta.feature_bytes = 10 * 784 * 4;
  job.dataset.features_region_bytes = 10 * 784 * 4;
  job.dataset.targets_region_bytes = 80;
  job.module = std::string("PK\x03\x04 module bytes", 18);
  job.resume_checkpoint = "checkpoint";
  job.memory_limit_bytes = 1 << 30;
  job.cpu_seconds = 100;
  return job;
}

// Every optimizer option crosses to the worker: a TorchScript job trains there with them.
TEST(WorkerProtocolTest, OptimizerOptionsCross) {
  WorkerJob job = SampleJob();
  job.spec.optimizer = OptimizerKind::kAdagrad;
  job.spec.amsgrad = true;
  job.spec.centered = true;
  job.spec.momentum_decay = 0.01;
  job.spec.decoupled_weight_decay = true;
  job.spec.lr_decay = 0.5;
  job.spec.initial_accumulator_value = 0.125;
  job.spec.weight_decay_exclude_bias_and_norm = true;
  absl::StatusOr<WorkerJob> back = DecodeWorkerJob(EncodeWorkerJob(job));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->spec.optimizer, OptimizerKind::kAdagrad);
  EXPECT_TRUE(back->spec.amsgrad);
  EXPECT_TRUE(back->spec.centered);
  EXPECT_EQ(back->spec.momentum_decay, 0.01);
  EXPECT_TRUE(back->spec.decoupled_weight_decay);
  EXPECT_EQ(back->spec.lr_decay, 0.5);
  EXPECT_EQ(back->spec.initial_accumulator_value, 0.125);
  EXPECT_TRUE(back->spec.weight_decay_exclude_bias_and_norm);
  absl::StatusOr<WorkerJob> plain = DecodeWorkerJob(EncodeWorkerJob(SampleJob()));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->spec.momentum_decay.has_value());
  EXPECT_FALSE(plain->spec.lr_decay.has_value());
  EXPECT_FALSE(plain->spec.weight_decay_exclude_bias_and_norm);
}

TEST(WorkerProtocolTest, AJobCrossesExactly) {
  const WorkerJob job = SampleJob();
  absl::StatusOr<WorkerJob> back = DecodeWorkerJob(EncodeWorkerJob(job));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job_id, "job-1");
  EXPECT_EQ(back->spec.learning_rate, job.spec.learning_rate);
  EXPECT_EQ(back->spec.weight_decay, 0.25);
  EXPECT_FALSE(back->spec.beta1.has_value());
  EXPECT_EQ(back->spec.seed, job.spec.seed);
  EXPECT_EQ(back->spec.validation_fraction, 0.125);
  EXPECT_EQ(back->spec.max_job_seconds, 3.5);
  EXPECT_EQ(back->spec.precision, Precision::kBf16);
  EXPECT_EQ(back->spec.class_weights, job.spec.class_weights);  // each value's bits
  EXPECT_EQ(back->spec.ignore_index, std::optional<int64_t>(-100));
  EXPECT_TRUE(back->spec.pos_weight.empty());
  EXPECT_EQ(back->spec.early_stop_patience, 4);
  EXPECT_EQ(back->spec.early_stop_min_delta, 0.0625);
  EXPECT_EQ(back->spec.early_stop_metric, EarlyStopMetric::kValidationAccuracy);
  EXPECT_EQ(back->spec.gradient_accumulation_steps, 3);
  EXPECT_TRUE(back->spec.drop_last);
  EXPECT_EQ(back->spec.model_from, ModelFrom::kBest);
  EXPECT_EQ(back->intra_op_threads, 2);
  EXPECT_EQ(back->cpu_nice, 10);
  EXPECT_EQ(back->dataset.meta.feature_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(back->dataset.meta.target_dtype, TargetDType::kInt64);
  EXPECT_EQ(back->module, job.module);
  EXPECT_EQ(back->resume_checkpoint, "checkpoint");
  EXPECT_EQ(back->cpu_seconds, 100);
}

TEST(WorkerProtocolTest, EveryScheduleOptionCrossesExactly) {
  WorkerJob job = SampleJob();
  ScheduleSpec& s = job.spec.schedule;
  s.kind = ScheduleKind::kCosineWarmRestarts;
  s.gamma = 0.25;
  s.min_learning_rate = 0.001;
  s.per_step = true;
  s.warmup_steps = 7;
  s.milestones = {3, 9, 9};
  s.t_0 = 4;
  s.t_mult = 2;
  s.pct_start = 0.4;
  s.anneal_strategy = "linear";
  s.div_factor = 12.5;
  s.final_div_factor = 300;
  s.three_phase = true;
  s.factor = 0.3;
  s.patience = 0;
  s.threshold = 0.02;
  s.cooldown = 5;
  absl::StatusOr<WorkerJob> back = DecodeWorkerJob(EncodeWorkerJob(job));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->spec.schedule == s);
  // Unset optionals stay unset (PyTorch's defaults apply in the worker as in the daemon).
  job.spec.schedule = ScheduleSpec();
  job.spec.schedule.kind = ScheduleKind::kPlateau;
  back = DecodeWorkerJob(EncodeWorkerJob(job));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->spec.schedule.patience.has_value());
  EXPECT_FALSE(back->spec.schedule.t_mult.has_value());
  EXPECT_TRUE(back->spec.schedule == job.spec.schedule);
}

TEST(WorkerProtocolTest, EveryCutOfAnOutcomeIsRefusedNeverReadPast) {
  TrainingOutcome outcome;
  outcome.state = JobState::kSucceeded;
  outcome.error = "";
  outcome.steps = 700;
  outcome.epochs_done = 7;
  outcome.final_loss = 0.0123456789;
  outcome.model_epoch = 4;
  outcome.best_epoch = 4;
  outcome.parameters.push_back(ParameterValues{"w", {1, 1}, {2.5f}});
  outcome.model_archive = "PK model";
  outcome.state_dict = "safetensors bytes";
  const std::string bytes = EncodeWorkerOutcome(outcome);
  absl::StatusOr<TrainingOutcome> whole = DecodeWorkerOutcome(bytes, /*max_epochs=*/7);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->final_loss, 0.0123456789);
  EXPECT_EQ(whole->model_epoch, 4);
  EXPECT_EQ(whole->best_epoch, 4);
  EXPECT_EQ(whole->parameters.at(0).values, std::vector<float>{2.5f});
  EXPECT_EQ(whole->model_archive, "PK model");
  EXPECT_EQ(whole->state_dict, "safetensors bytes");
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(DecodeWorkerOutcome(bytes.substr(0, cut), 7).ok()) << "cut at " << cut;
  }
  EXPECT_FALSE(DecodeWorkerOutcome(bytes + "x", 7).ok());
  // More epochs than the job has, or a state out of range, are lies.
  EXPECT_FALSE(DecodeWorkerOutcome(bytes, /*max_epochs=*/6).ok());
  std::string bad_state = bytes;
  bad_state[0] = 9;
  EXPECT_FALSE(DecodeWorkerOutcome(bad_state, 7).ok());
}

TEST(WorkerProtocolTest, DeclaredLengthsBeyondThePayloadAreRefusedBeforeAllocating) {
  WireWriter w;
  w.I64(int64_t{1} << 60);  // a string's length: an exabyte
  WireReader r(w.bytes());
  absl::StatusOr<std::string> s = r.Str(size_t{1} << 62);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("declares a string of"));
  WireWriter list;
  list.I64(-1);
  WireReader lr(list.bytes());
  EXPECT_FALSE(lr.I64s(64).ok());
}

TEST(WorkerProtocolTest, AFrameOverTheBoundIsRefusedAtItsHeader) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_TRUE(SendFrame(pair[1], WorkerFrame::kEpoch, std::string(1000, 'x')).ok());
  FrameAssembler frames(/*max_payload=*/100);
  bool closed = false;
  absl::Status read = frames.ReadAvailable(pair[0], &closed);
  EXPECT_FALSE(read.ok());
  EXPECT_THAT(read.message(), HasSubstr("at most 100"));
  close(pair[1]);
  close(pair[0]);
  // Bytes that are no frame at all.
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_EQ(write(pair[1], "GET / HTTP/1.1\r\n\r\n", 18), 18);
  FrameAssembler junk(100);
  EXPECT_FALSE(junk.ReadAvailable(pair[0], &closed).ok());
  close(pair[1]);
  close(pair[0]);
}

TEST(WorkerProtocolTest, FramesArriveWholeWhateverTheReadsCut) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  WorkerEpoch epoch;
  epoch.epoch.epoch = 3;
  epoch.epoch.loss = 0.5;
  epoch.steps = 30;
  const std::string payload = EncodeWorkerEpoch(epoch);
  ASSERT_TRUE(SendFrame(pair[1], WorkerFrame::kEpoch, payload).ok());
  ASSERT_TRUE(SendFrame(pair[1], WorkerFrame::kReady, "sandbox").ok());
  close(pair[1]);
  FrameAssembler frames(1 << 20);
  bool closed = false;
  while (!closed) ASSERT_TRUE(frames.ReadAvailable(pair[0], &closed).ok());
  WorkerFrame type;
  std::string got;
  ASSERT_TRUE(frames.Next(&type, &got));
  EXPECT_EQ(type, WorkerFrame::kEpoch);
  absl::StatusOr<WorkerEpoch> back = DecodeWorkerEpoch(got);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->epoch.epoch, 3);
  EXPECT_EQ(back->steps, 30);
  ASSERT_TRUE(frames.Next(&type, &got));
  EXPECT_EQ(type, WorkerFrame::kReady);
  EXPECT_EQ(got, "sandbox");
  EXPECT_FALSE(frames.Next(&type, &got));
  close(pair[0]);
}

// Many tiny frames cost time linear in their bytes: 300,000 of them (the stream a worker could
// send to keep the daemon's thread busy) are taken in one pass, in order. (Erasing the buffer's
// front per frame made this quadratic: minutes.)
TEST(WorkerProtocolTest, ManyTinyFramesAreTakenInOnePass) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  constexpr int kFrames = 300000;
  std::thread writer([fd = pair[1]] {
    for (int i = 0; i < kFrames; ++i) {
      const char byte = static_cast<char>(i % 251);
      if (!SendFrame(fd, WorkerFrame::kEpoch, std::string_view(&byte, 1)).ok()) break;
    }
    close(fd);
  });
  FrameAssembler frames(1 << 20);
  bool closed = false;
  int taken = 0;
  bool in_order = true;
  while (!closed) {
    pollfd p{pair[0], POLLIN, 0};
    poll(&p, 1, 1000);
    ASSERT_TRUE(frames.ReadAvailable(pair[0], &closed).ok());
    WorkerFrame type;
    std::string got;
    while (frames.Next(&type, &got)) {
      in_order = in_order && got.size() == 1 && got[0] == static_cast<char>(taken % 251);
      ++taken;
    }
  }
  writer.join();
  close(pair[0]);
  EXPECT_EQ(taken, kFrames);
  EXPECT_TRUE(in_order);
  EXPECT_TRUE(frames.status().ok());
}

// A bad header after good frames stops the frames there, with the reason, however it arrived.
TEST(WorkerProtocolTest, ABadHeaderAfterGoodFramesStopsThem) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_TRUE(SendFrame(pair[1], WorkerFrame::kEpoch, "a").ok());
  ASSERT_EQ(write(pair[1], "GARBAGE-GARBAGE-GARBAGE", 23), 23);
  close(pair[1]);
  FrameAssembler frames(100);
  bool closed = false;
  ASSERT_TRUE(frames.ReadAvailable(pair[0], &closed).ok());
  WorkerFrame type;
  std::string got;
  ASSERT_TRUE(frames.Next(&type, &got));
  EXPECT_EQ(got, "a");
  EXPECT_FALSE(frames.Next(&type, &got));
  EXPECT_FALSE(frames.status().ok());
  EXPECT_FALSE(frames.ReadAvailable(pair[0], &closed).ok());
  close(pair[0]);
}

TEST(WorkerProtocolTest, TheReadyMessageCarriesTheSandboxAndIsChecked) {
  WorkerReady ready;
  ready.sandbox.program = "trainerd-worker";
  ready.sandbox.landlock = true;
  ready.sandbox.landlock_abi = 5;
  ready.applied = "network namespace; user nobody";
  absl::StatusOr<WorkerReady> back = DecodeWorkerReady(EncodeWorkerReady(ready));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->sandbox.landlock);
  EXPECT_EQ(back->sandbox.landlock_abi, 5);
  EXPECT_EQ(back->applied, "network namespace; user nobody");
  EXPECT_FALSE(DecodeWorkerReady("sandbox").ok());
  EXPECT_FALSE(DecodeWorkerReady(EncodeWorkerReady(ready) + "x").ok());
}

// A worker's words become text: its error and its parameters' names lose their control bytes.
TEST(WorkerProtocolTest, AWorkersTextIsDecodedWithItsControlsEscaped) {
  TrainingOutcome outcome;
  outcome.state = JobState::kFailed;
  outcome.error = "\x1b[2J\rjob SUCCEEDED\n";
  ParameterValues p;
  p.name = "w\x1b]0;t\x07";
  p.shape = {1};
  p.values = {1.0f};
  outcome.parameters.push_back(p);
  absl::StatusOr<TrainingOutcome> back = DecodeWorkerOutcome(EncodeWorkerOutcome(outcome), 10);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->error, "\\x1b[2J job SUCCEEDED ");
  EXPECT_EQ(back->parameters[0].name, "w\\x1b]0;t\\x07");
}

// The TorchScript interpreter's error keeps the line that names its cause.
TEST(FirstLineOfTest, AnInterpreterErrorKeepsItsCause) {
  const std::runtime_error interpreter(
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript (most recent call last):\n"
      "  File \"code/__torch__.py\", line 9, in forward\n"
      "    _0 = torch.zeros([1000000000000])\n"
      "         ~~~~~~~~~~~ <--- HERE\n"
      "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
      "memory: you tried to allocate 4000000000000 bytes.\n");
  EXPECT_EQ(FirstLineOf(interpreter),
            "The following operation failed in the TorchScript interpreter: RuntimeError: "
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
            "you tried to allocate 4000000000000 bytes.");
  EXPECT_EQ(FirstLineOf(std::runtime_error("one line\nException raised from x")), "one line");
}

// A real interpreter's shape error keeps the line that names the shapes; a raise of the module's
// own keeps its exception's name and its whole message; LibTorch's backtrace stays out.
TEST(FirstLineOfTest, AShapeMismatchInTorchScriptKeepsTheShapes) {
  const std::shared_ptr<torch::jit::CompilationUnit> unit = torch::jit::compile(R"JIT(
def forward(x: Tensor):
    h = torch.relu(x)
    return torch.mm(h, torch.ones([5, 2]))
)JIT");
  try {
    unit->get_function("forward")({torch::ones({10, 4})});
    ADD_FAILURE() << "a batch of 10x4 times 5x2 did not fail";
  } catch (const std::exception& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("<--- HERE")) << e.what();
    EXPECT_EQ(FirstLineOf(e),
              "The following operation failed in the TorchScript interpreter: RuntimeError: mat1 "
              "and mat2 shapes cannot be multiplied (10x4 and 5x2)");
  }
  // What the interpreter says for `raise Exception("a batch of 10 rows;\nat most 2")` in a
  // scripted module (as torch.jit.script's functions report it).
  EXPECT_EQ(FirstLineOf(std::runtime_error(
                "The following operation failed in the TorchScript interpreter.\n"
                "Traceback of TorchScript (most recent call last):\n"
                "  File \"code/__torch__.py\", line 6, in forward\n"
                "def forward(self, x: Tensor) -> Tensor:\n"
                "    if x.size(0) > 2:\n"
                "        raise Exception(\"a batch of \" + str(x.size(0)) + \" rows\")\n"
                "        ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE\n"
                "    return x\n"
                "builtins.Exception: a batch of 10 rows;\n"
                "at most 2\n")),
            "The following operation failed in the TorchScript interpreter: builtins.Exception: "
            "a batch of 10 rows; at most 2");
  EXPECT_EQ(FirstLineOf(std::runtime_error(
                "The following operation failed in the TorchScript interpreter.\n"
                "Traceback of TorchScript (most recent call last):\n"
                "    return torch.mm(h, w)\n"
                "RuntimeError: mat1 and mat2 shapes cannot be multiplied (10x4 and 5x2)\n"
                "Exception raised from meta at /pytorch/aten/src/ATen/native/LinearAlgebra.cpp\n"
                "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96\n")),
            "The following operation failed in the TorchScript interpreter: RuntimeError: mat1 "
            "and mat2 shapes cannot be multiplied (10x4 and 5x2)");
}

// ---- Shared memory -------------------------------------------------------------------------

TEST(SharedMemoryTest, TheWorkersDescriptorCanNeitherWriteNorMapForWriting) {
  absl::StatusOr<torch::Tensor> bytes = AllocateSharedHostBytes(4096, "test");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  bytes->fill_(7);
  std::optional<SharedRegion> region = FindSharedRegion(bytes->data_ptr(), 4096);
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(region->offset, 0);
  const int fd = ReadOnlyDescriptor(*region);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  EXPECT_LT(write(fd, "x", 1), 0);
  absl::StatusOr<torch::Tensor> mapped = MapReadOnly(fd, 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->data_ptr<uint8_t>()[100], 7);
  // The same pages: a write in the daemon is seen through the mapping, no copy was made.
  bytes->data_ptr<uint8_t>()[100] = 9;
  EXPECT_EQ(mapped->data_ptr<uint8_t>()[100], 9);
  EXPECT_NE(mapped->data_ptr(), bytes->data_ptr());
  // A view into the region is found with its offset; a range past it is not.
  ASSERT_TRUE(FindSharedRegion(bytes->data_ptr<uint8_t>() + 1000, 100).has_value());
  EXPECT_EQ(FindSharedRegion(bytes->data_ptr<uint8_t>() + 1000, 100)->offset, 1000);
  EXPECT_FALSE(FindSharedRegion(bytes->data_ptr<uint8_t>() + 4000, 200).has_value());
  const void* base = bytes->data_ptr();
  *bytes = torch::Tensor();
  EXPECT_FALSE(FindSharedRegion(base, 1).has_value());
}

// What a worker would try with its dataset's descriptor if it escaped its interpreter: reopen the
// file for writing (as a process of the daemon's user, which is the worker's user where the daemon
// does not run as root: here root, whom the mode does not stop), write it, map it for writing,
// shrink it (which turned the daemon's next read of the pages into SIGBUS), grow it, or take the
// seals off; and, as another user, reopen it at all. Each is refused, and the daemon's bytes and
// its own mapping are as they were.
TEST(SharedMemoryTest, NoReopeningOfTheWorkersDescriptorCanWriteOrResizeTheDataset) {
  absl::StatusOr<torch::Tensor> bytes = AllocateSharedHostBytes(8192, "sealed");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  bytes->fill_(5);
  std::optional<SharedRegion> region = FindSharedRegion(bytes->data_ptr(), 8192);
  ASSERT_TRUE(region.has_value());
  const int fd = ReadOnlyDescriptor(*region);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u);
  // A second descriptor of the same region is another read-only open of the sealed file.
  const int again = ReadOnlyDescriptor(*region);
  ASSERT_GE(again, 0);
  close(again);

  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(report[0]);
    auto say = [&](const char* what, bool refused) {
      char line[128];
      const int n = snprintf(line, sizeof(line), "%s %s\n", what, refused ? "refused" : "ALLOWED");
      (void)!write(report[1], line, static_cast<size_t>(n));
    };
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const int rw = open(path.c_str(), O_RDWR);
    // Root passes the mode (CAP_DAC_OVERRIDE): the seals below must hold on this descriptor.
    if (geteuid() != 0) say("reopen-rw-as-the-owner", rw < 0);
    const int target = rw >= 0 ? rw : fd;
    say("pwrite", pwrite(target, "x", 1, 0) != 1);
    say("mmap-write",
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, target, 0) == MAP_FAILED);
    say("ftruncate-shrink", ftruncate(target, 0) != 0);
    say("ftruncate-grow", ftruncate(target, 1 << 20) != 0);
    say("fallocate-grow", fallocate(target, 0, 0, 1 << 20) != 0);
    say("unseal", fcntl(target, F_ADD_SEALS, F_SEAL_WRITE) != 0);
    if (geteuid() == 0 && setresgid(65534, 65534, 65534) == 0 &&
        setresuid(65534, 65534, 65534) == 0) {
      const int other = open(path.c_str(), O_RDWR);
      say("reopen-rw-as-another-user", other < 0);
      const int other_ro = open(path.c_str(), O_RDONLY);
      say("reopen-ro-as-another-user", other_ro < 0);
    }
    _exit(0);
  }
  close(report[1]);
  std::string said;
  char buffer[512];
  ssize_t n;
  while ((n = read(report[0], buffer, sizeof(buffer))) > 0) said.append(buffer, n);
  close(report[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << said;
  EXPECT_THAT(said, ::testing::Not(HasSubstr("ALLOWED"))) << said;
  for (const char* what :
       {"pwrite", "mmap-write", "ftruncate-shrink", "ftruncate-grow", "fallocate-grow", "unseal"}) {
    EXPECT_THAT(said, HasSubstr(std::string(what) + " refused")) << said;
  }
  if (geteuid() == 0) {
    EXPECT_THAT(said, HasSubstr("reopen-rw-as-another-user refused"));
    EXPECT_THAT(said, HasSubstr("reopen-ro-as-another-user refused"));
  }
  // The daemon's bytes are intact and its mapping still reads (no SIGBUS) and writes.
  EXPECT_EQ(bytes->sum().item<int64_t>(), int64_t{5} * 8192);
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 8192);
  bytes->data_ptr<uint8_t>()[8191] = 6;
  EXPECT_EQ(bytes->data_ptr<uint8_t>()[8191], 6);
  close(fd);
}

// ---- RunTrainingInWorker ------------------------------------------------------------------

// "Net": torch.linear(x, w, b) with w [1, 1] and b [1], and `extra` TorchScript run before the
// linear layer in training mode only (the checker tries the module in eval mode).
std::string ModuleBytes(const std::string& training_only = "") {
  return test_support::ScriptedLinearModule(training_only);
}

constexpr char kLoopsInTraining[] =
    "    i = 0\n"
    "    while i >= 0:\n"
    "      i = i + 1\n";

constexpr char kAllocatesInTraining[] =
    "    z = torch.ones([1000000, 1000000])\n"
    "    x = x + z.sum()\n";

// The seed data, y = 2x + 1 on 200 rows, in the daemon's shared memory (as the registry holds a
// CPU dataset) or in ordinary memory.
std::shared_ptr<const Dataset> SeedDataset(bool shared) {
  const int64_t rows = 200;
  torch::Tensor x = torch::linspace(-1, 1, rows).view({rows, 1});
  torch::Tensor y = 2 * x + 1;
  auto dataset = std::make_shared<Dataset>();
  dataset->meta.name = "seed";
  dataset->meta.feature_shape = {1};
  dataset->meta.target_shape = {1};
  dataset->meta.rows = rows;
  dataset->meta.feature_bytes = rows * 4;
  dataset->meta.size_bytes = rows * 8;
  if (shared) {
    torch::Tensor fb = *AllocateSharedHostBytes(rows * 4, "f");
    torch::Tensor tb = *AllocateSharedHostBytes(rows * 4, "t");
    dataset->features = fb.view(torch::kFloat32).view({rows, 1});
    dataset->targets = tb.view(torch::kFloat32).view({rows, 1});
    dataset->features.copy_(x);
    dataset->targets.copy_(y);
  } else {
    dataset->features = x;
    dataset->targets = y;
  }
  return dataset;
}

TrainingRun ModuleRun(bool shared) {
  TrainingRun run;
  run.spec = SeedSpec("seed");
  run.spec.model = "torchscript";
  run.spec.epochs = 20;
  run.spec.seed = 7;
  run.dataset = SeedDataset(shared);
  run.intra_op_threads = 1;
  return run;
}

WorkerOptions WorkerSettings(int pool = 0) {
  WorkerOptions options;
  options.program = TRAINERD_WORKER;
  options.grace = absl::Seconds(2);
  options.pool = pool;
  return options;
}

// Fresh workers for each job (the pool's own test below keeps one warm).
WorkerPool& Worker() {
  static auto* pool = new WorkerPool(WorkerSettings());
  return *pool;
}

struct Recorded {
  std::vector<double> losses;
  std::vector<int64_t> syncs;
};

TEST(RunTrainingInWorkerTest, GivesTheInProcessLossesBitForBit) {
  const std::string bytes = ModuleBytes();
  TrainingRun in_process = ModuleRun(/*shared=*/false);
  Recorded here;
  in_process.on_epoch = [&](const EpochResult& e, int64_t, int64_t syncs) {
    here.losses.push_back(e.loss);
    here.syncs.push_back(syncs);
  };
  absl::StatusOr<std::shared_ptr<torch::jit::Module>> module = LoadCheckedModule(bytes);
  ASSERT_TRUE(module.ok()) << module.status();
  in_process.torchscript = *module;
  const TrainingOutcome expected = RunTraining(in_process);
  ASSERT_EQ(expected.state, JobState::kSucceeded) << expected.error;

  for (bool shared : {true, false}) {
    TrainingRun run = ModuleRun(shared);
    Recorded there;
    run.on_epoch = [&](const EpochResult& e, int64_t, int64_t syncs) {
      there.losses.push_back(e.loss);
      there.syncs.push_back(syncs);
    };
    double started = -1;
    const TrainingOutcome outcome = RunTrainingInWorker(
        run, "job-test", TorchScriptJob{bytes, 2, true}, absl::ZeroDuration(), Worker(), &started);
    ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
    EXPECT_EQ(there.losses, here.losses) << "shared " << shared;  // exactly, not nearly
    EXPECT_EQ(there.syncs, here.syncs);  // one transfer per epoch, as in the daemon
    EXPECT_EQ(outcome.host_syncs, expected.host_syncs);
    EXPECT_EQ(outcome.final_loss, expected.final_loss);
    ASSERT_EQ(outcome.parameters.size(), expected.parameters.size());
    EXPECT_EQ(outcome.parameters[0].values, expected.parameters[0].values);
    EXPECT_EQ(outcome.model_archive.substr(0, 2), "PK");
    // The state_dict crossed too, whole, with the values the daemon's own run has.
    const absl::StatusOr<SafetensorsFile> state = ParseSafetensors(outcome.state_dict);
    ASSERT_TRUE(state.ok()) << state.status();
    ASSERT_FALSE(state->tensors.empty());
    EXPECT_EQ(state->tensors[0].name, expected.parameters[0].name);
    EXPECT_EQ(state->tensors[0].size,
              static_cast<int64_t>(expected.parameters[0].values.size() * sizeof(float)));
    EXPECT_EQ(std::memcmp(outcome.state_dict.data() + state->tensors[0].offset,
                          expected.parameters[0].values.data(),
                          static_cast<size_t>(state->tensors[0].size)),
              0);
    EXPECT_GT(started, 0.0);
  }
}

TEST(RunTrainingInWorkerTest, ALoopInTrainingModeIsKilledAtTheTimeLimit) {
  TrainingRun run = ModuleRun(true);
  const auto start = std::chrono::steady_clock::now();
  const TrainingOutcome outcome =
      RunTrainingInWorker(run, "job-loop", TorchScriptJob{ModuleBytes(kLoopsInTraining), 2, true},
                          absl::Seconds(2), Worker(), nullptr);
  EXPECT_EQ(outcome.state, JobState::kFailed);
  EXPECT_THAT(outcome.error, HasSubstr("ran past its time limit of 2s"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(RunTrainingInWorkerTest, ACancelThatTheLoopNeverSeesKillsTheWorkerAfterTheGrace) {
  // A cancel that comes before the worker was given the job (its start is slow under load, or
  // under AddressSanitizer) ends it there instead: then again, cancelling later.
  TrainingOutcome outcome;
  for (const int delay_ms : {1500, 6000}) {
    TrainingRun run = ModuleRun(true);
    std::atomic<bool> cancel{false};
    run.cancel = &cancel;
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      cancel.store(true);
    });
    outcome =
        RunTrainingInWorker(run, "job-loop", TorchScriptJob{ModuleBytes(kLoopsInTraining), 2, true},
                            absl::ZeroDuration(), Worker(), nullptr);
    canceller.join();
    if (outcome.error != "cancelled before its worker was given the job") break;
  }
  EXPECT_EQ(outcome.state, JobState::kCancelled);
  // Inside the loop the worker never looks at the flag and is killed after the grace; a cancel
  // that arrived before its first step ends it at that step instead.
  if (!outcome.error.empty()) {
    EXPECT_THAT(outcome.error, HasSubstr("did not stop within 2s and was killed"));
  }
}

TEST(RunTrainingInWorkerTest, AnInterruptThatTheLoopNeverSeesLeavesTheJobToResume) {
  TrainingRun run = ModuleRun(true);
  std::atomic<bool> interrupt{true};
  run.interrupt = &interrupt;
  const TrainingOutcome outcome =
      RunTrainingInWorker(run, "job-loop", TorchScriptJob{ModuleBytes(kLoopsInTraining), 2, true},
                          absl::ZeroDuration(), Worker(), nullptr);
  EXPECT_TRUE(outcome.interrupted);
}

TEST(RunTrainingInWorkerTest, AHugeAllocationInTrainingModeFailsTheJobAlone) {
  TrainingRun run = ModuleRun(true);
  const TrainingOutcome outcome = RunTrainingInWorker(
      run, "job-alloc", TorchScriptJob{ModuleBytes(kAllocatesInTraining), 2, true},
      absl::ZeroDuration(), Worker(), nullptr);
  EXPECT_EQ(outcome.state, JobState::kFailed);
  // The cause, not the interpreter's opening sentence alone, nor a protocol failure.
  EXPECT_THAT(outcome.error, HasSubstr("allocate")) << outcome.error;
  EXPECT_THAT(outcome.error, ::testing::Not(HasSubstr("protocol")));
  // The next job runs at once.
  TrainingRun next = ModuleRun(true);
  EXPECT_EQ(RunTrainingInWorker(next, "job-next", TorchScriptJob{ModuleBytes(), 2, true},
                                absl::ZeroDuration(), Worker(), nullptr)
                .state,
            JobState::kSucceeded);
}

// A module that needs more than its memory limit (--worker_memory_limit_bytes) in training mode:
// the job fails saying what the allocator said, not that the worker broke the protocol.
constexpr char kAllocatesPastTheLimit[] =
    "    z = torch.ones([16384, 16384])\n"
    "    x = x + z.sum()\n";

TEST(RunTrainingInWorkerTest, AModuleStoppedByItsMemoryLimitSaysSo) {
#ifdef TRAINERD_UNDER_ASAN
  GTEST_SKIP() << "the worker takes no address-space limit under AddressSanitizer";
#endif
  WorkerOptions options = WorkerSettings();
  options.memory_limit_bytes = int64_t{512} << 20;  // a 1 GiB tensor does not fit
  WorkerPool pool(options);
  TrainingRun run = ModuleRun(true);
  const TrainingOutcome outcome = RunTrainingInWorker(
      run, "job-limit", TorchScriptJob{ModuleBytes(kAllocatesPastTheLimit), 2, true},
      absl::ZeroDuration(), pool, nullptr);
  EXPECT_EQ(outcome.state, JobState::kFailed);
  EXPECT_THAT(outcome.error, HasSubstr("allocate")) << outcome.error;
  EXPECT_THAT(outcome.error, ::testing::Not(HasSubstr("protocol"))) << outcome.error;
}

TEST(RunTrainingInWorkerTest, AWorkerThatCannotStartFailsTheJobNamingIt) {
  TrainingRun run = ModuleRun(true);
  WorkerOptions options = WorkerSettings();
  options.program = "/nonexistent/trainerd-worker";
  WorkerPool pool(options);
  const TrainingOutcome outcome = RunTrainingInWorker(
      run, "job-x", TorchScriptJob{ModuleBytes(), 2, true}, absl::ZeroDuration(), pool, nullptr);
  EXPECT_EQ(outcome.state, JobState::kFailed);
  EXPECT_THAT(outcome.error, HasSubstr("/nonexistent/trainerd-worker"));
}

TEST(WorkerPoolTest, AWarmWorkerServesOneJobAndAFreshOneWaitsForTheNext) {
  WorkerPool pool(WorkerSettings(/*pool=*/1));
  const std::string bytes = ModuleBytes();
  std::vector<double> first_losses;
  for (int i = 0; i < 3; ++i) {
    TrainingRun run = ModuleRun(true);
    std::vector<double> losses;
    run.on_epoch = [&](const EpochResult& e, int64_t, int64_t) { losses.push_back(e.loss); };
    double started = -1;
    const TrainingOutcome outcome = RunTrainingInWorker(
        run, "job-pool", TorchScriptJob{bytes, 2, true}, absl::ZeroDuration(), pool, &started);
    ASSERT_EQ(outcome.state, JobState::kSucceeded) << outcome.error;
    if (i == 0) first_losses = losses;
    // Each job gets a process of its own, warm or not: the same losses every time.
    EXPECT_EQ(losses, first_losses);
    EXPECT_GE(started, 0.0);
  }
}

// ---- Through the engine --------------------------------------------------------------------

class WorkerJobsTest : public EngineFixture {
 protected:
  void SetUp() override {
    EngineFixture::SetUp();
    ASSERT_TRUE(Upload(*engine_, "seed", SeedTable()).ok());
  }
  JobSpec Spec(const std::string& training_only = "") const {
    JobSpec spec = SeedSpec("seed");
    spec.model = "";
    spec.epochs = 5;
    spec.torchscript = ModuleBytes(training_only);
    return spec;
  }
};

TEST_F(WorkerJobsTest, ALoopingJobIsCancelledAndTheNextJobRuns) {
  absl::StatusOr<JobSnapshot> looping = engine_->SubmitJob(Spec(kLoopsInTraining));
  ASSERT_TRUE(looping.ok()) << looping.status();
  // Wait until it runs, then cancel: the worker never reads the flag, so it is killed.
  for (int i = 0; i < 600; ++i) {
    absl::StatusOr<JobSnapshot> now = engine_->GetJob(looping->id);
    ASSERT_TRUE(now.ok());
    if (now->state == JobState::kRunning) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  absl::StatusOr<JobSnapshot> cancelled = engine_->CancelJob(looping->id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_TRUE(cancelled->cancel_requested);
  absl::StatusOr<JobSnapshot> ended = WaitForEnd(*engine_, looping->id);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state, JobState::kCancelled);
  absl::StatusOr<JobSnapshot> next = test_support::RunJob(*engine_, Spec());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->state, JobState::kSucceeded) << next->error;
  EXPECT_EQ(next->report.engine, "libtorch-worker");
  EXPECT_GT(next->report.worker_start_seconds, 0.0);
}

TEST_F(WorkerJobsTest, ASpecTimeLimitEndsTheJobFailedWithTheReason) {
  JobSpec spec = Spec(kLoopsInTraining);
  spec.max_job_seconds = 1;
  absl::StatusOr<JobSnapshot> job = test_support::RunJob(*engine_, spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_THAT(job->error, HasSubstr("time limit of 1s"));
}

// A caller's own time limit may only be shorter than the operator's: a longer one is refused
// before its module is checked, naming the daemon's.
TEST_F(WorkerJobsTest, AJobsTimeLimitMayNotExceedTheDaemons) {
  EngineOptions options = Options();
  options.jobs.max_job_time = absl::Hours(1);
  engine_.reset();
  engine_ = StartEngine(options);
  ASSERT_NE(engine_, nullptr);
  JobSpec spec = Spec();
  spec.max_job_seconds = 1e12;
  const absl::StatusOr<JobSnapshot> refused = engine_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("over this daemon's --max_job_time of 1h"));
  spec.max_job_seconds = 3600;
  const absl::StatusOr<JobSnapshot> allowed = engine_->SubmitJob(spec);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_TRUE(engine_->CancelJob(allowed->id).ok());
}

// A job's report says what its worker's sandbox held.
TEST_F(WorkerJobsTest, TheJobsReportCarriesItsWorkersSandbox) {
  absl::StatusOr<JobSnapshot> job = test_support::RunJob(*engine_, Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state, JobState::kSucceeded) << job->error;
  ASSERT_TRUE(job->report.worker_sandbox.has_value());
  EXPECT_EQ(job->report.worker_sandbox->program, "trainerd-worker");
  EXPECT_TRUE(job->report.worker_sandbox->seccomp);
  EXPECT_TRUE(job->report.worker_sandbox->not_dumpable);
  EXPECT_TRUE(job->report.worker_sandbox->no_new_privileges);
  // ... and the engine's listing has the same program's.
  bool listed = false;
  for (const WorkerSandboxStatus& s : engine_->WorkerSandboxes()) {
    listed = listed || s.report.program == "trainerd-worker";
  }
  EXPECT_TRUE(listed);
}

}  // namespace
}  // namespace trainerd::engine
