// A stand-in for trainerd-worker that does what a worker whose module escaped its interpreter
// could do, for hostile_worker_e2e_test.cc (the daemon is started with --worker pointing here). It
// confines itself exactly as the real worker does (EnterNamespaces, LockDown), says so (kReady),
// takes the job, then, chosen by the job's seed:
//   101  tries to write and resize its dataset's shared memory: reopens its descriptor through
//        /proc/self/fd read-write, writes, maps for writing, truncates; reports what each gave
//   102  sends checkpoints the job's schedule does not have (20 of 1 MiB, one per epoch)
//   103  reports success with a model that is no sound archive
//   104  fails with an error full of terminal controls and a forged line
// Usage (by the daemon only): hostile_worker --socket_fd=3 --device=cpu
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/torchscript/worker_protocol.h"
#include "server/worker/sandbox.h"

namespace {

using trainerd::engine::WorkerFrame;

int g_socket = 3;

void Send(WorkerFrame type, const std::string& payload) {
  (void)trainerd::engine::SendFrame(g_socket, type, payload);
}

void Fail(const std::string& error) {
  trainerd::engine::TrainingOutcome outcome;
  outcome.state = trainerd::engine::JobState::kFailed;
  outcome.error = error;
  Send(WorkerFrame::kOutcome, trainerd::engine::EncodeWorkerOutcome(outcome));
}

std::string Result(const char* what, bool done) {
  return absl::StrCat(what, done ? "=done" : absl::StrCat("=refused(", std::strerror(errno), ")"));
}

// Every way to change the bytes or the size of the dataset behind `fd`.
std::string AttackDataset(int fd, int64_t size) {
  std::vector<std::string> results;
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const int rw = ::open(path.c_str(), O_RDWR);
  results.push_back(Result("reopen", rw >= 0));
  const int target = rw >= 0 ? rw : fd;
  const char junk[16] = {'J', 'J', 'J', 'J', 'J', 'J', 'J', 'J',
                         'J', 'J', 'J', 'J', 'J', 'J', 'J', 'J'};
  results.push_back(Result("write", ::pwrite(target, junk, sizeof(junk), 0) == sizeof(junk)));
  void* mapped = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED,
                        target, 0);
  if (mapped != MAP_FAILED) std::memset(mapped, 'J', 16);
  results.push_back(Result("map", mapped != MAP_FAILED));
  results.push_back(Result("truncate", ::ftruncate(target, 0) == 0));
  return absl::StrJoin(results, " ");
}

}  // namespace

int main(int argc, char** argv) {
  trainerd::SandboxReport report;
  report.program = "trainerd-worker";
  std::vector<std::string> applied = trainerd::worker::EnterNamespaces(&report);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (absl::StartsWith(arg, "--socket_fd=")) (void)absl::SimpleAtoi(arg.substr(12), &g_socket);
  }
  absl::StatusOr<std::vector<std::string>> locked =
      trainerd::worker::LockDown(trainerd::worker::SandboxOptions{}, &report);
  if (!locked.ok()) return 1;
  trainerd::engine::WorkerReady ready;
  ready.sandbox = report;
  ready.applied = "hostile stand-in";
  Send(WorkerFrame::kReady, trainerd::engine::EncodeWorkerReady(ready));

  WorkerFrame type;
  std::string payload;
  std::vector<int> fds;
  if (!trainerd::engine::ReceiveFrame(g_socket, size_t{1} << 30, &type, &payload, &fds).ok() ||
      type != WorkerFrame::kStart) {
    return 1;
  }
  absl::StatusOr<trainerd::engine::WorkerJob> job = trainerd::engine::DecodeWorkerJob(payload);
  if (!job.ok() || fds.size() < 2) return 1;
  const uint64_t attack = job->spec.seed.value_or(0);
  if (attack == 101) {
    Fail(absl::StrCat("features: ", AttackDataset(fds[0], job->dataset.features_region_bytes),
                      "; targets: ", AttackDataset(fds[1], job->dataset.targets_region_bytes)));
  } else if (attack == 102) {
    for (int epoch = 1; epoch <= 20; ++epoch) {
      trainerd::engine::WorkerCheckpoint checkpoint{epoch, std::string(1 << 20, 'C')};
      Send(WorkerFrame::kCheckpoint, trainerd::engine::EncodeWorkerCheckpoint(checkpoint));
    }
    Fail("sent 20 checkpoints");
  } else if (attack == 103) {
    trainerd::engine::TrainingOutcome outcome;
    outcome.state = trainerd::engine::JobState::kSucceeded;
    outcome.epochs_done = 0;
    // The start of a zip archive, then what no loader should be handed.
    outcome.model_archive = std::string("PK\x03\x04", 4) + std::string(4096, '\xff');
    Send(WorkerFrame::kOutcome, trainerd::engine::EncodeWorkerOutcome(outcome));
  } else if (attack == 104) {
    Fail("\x1b]0;owned\x07\x1b[2J\x1b[H\rjob-000000000000  SUCCEEDED\n\xc2\x9b" "31m\xff");
  } else {
    Fail("the stand-in knows no such attack");
  }
  return 0;
}
