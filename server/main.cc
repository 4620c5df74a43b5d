// trainerd: keeps uploaded datasets resident on a device and trains jobs submitted over gRPC.
// Flags go into ServerOptions; Server::BuildAndStart does the rest; SIGINT/SIGTERM stop it.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/flags_from_env.h"
#include "common/memory_size.h"
#include "common/version.h"
#include "server/engine/log.h"
#include "server/engine/torchscript/sandbox_policy.h"
#include "server/service/server.h"

ABSL_FLAG(bool, flags_reference, false,
          "print every flag of trainerd as a Markdown table (flag, default, meaning) and exit: the "
          "table of docs/CONFIGURATION.md, which docs/generate.py writes from it");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve gRPC on (port 0 picks a free port, printed at start), or unix:PATH "
          "for a Unix socket (mode 0660); an address other machines can reach needs "
          "--auth_token_file or mutual TLS, or --insecure");
ABSL_FLAG(std::string, data_dir, "./trainerd-data",
          "folder where uploaded datasets are kept across restarts");
ABSL_FLAG(std::string, device, "auto",
          "default device and where datasets are resident: auto (first CUDA device, else cpu), "
          "cpu, cuda or cuda:N");
ABSL_FLAG(int64_t, max_dataset_bytes, int64_t{16} << 30,
          "largest dataset payload accepted, in bytes; 0 for no limit");
ABSL_FLAG(int64_t, max_datasets, 4096,
          "most datasets the daemon keeps, all tenants together: a resident CPU dataset holds "
          "two file descriptors, and the daemon raises its open-file limit to the hard limit at "
          "start and warns when that is short; 0 for no bound");
ABSL_FLAG(int64_t, max_datasets_per_caller, 0,
          "quota: datasets one caller (not an admin) may own; 0 (the default): a fair share, a "
          "quarter of --max_datasets, so that no tenant takes every place");
ABSL_FLAG(absl::Duration, peer_copy_retention, absl::Hours(24),
          "delete a dataset a leader daemon copied here for its jobs' ranks or sweep members once "
          "no job has used it for this long (the clock survives restarts: the file's mtime); 0 "
          "keeps copies until deleted");
ABSL_FLAG(std::string, device_memory_budget, "0",
          "memory of the default device that resident datasets and running jobs' estimated "
          "working sets may use together: bytes (12GiB, 500MB) or a share of the device (80%; "
          "host RAM for the CPU); idle datasets are evicted to make room; 0 for no budget");
ABSL_FLAG(bool, preload, false,
          "load every dataset kept on disk at start (in the background, while they fit the "
          "budget) instead of when a job first needs it");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9400",
          "host:port to serve Prometheus metrics on (/metrics); port 0 picks a free port; empty "
          "turns the endpoint off");
ABSL_FLAG(std::string, console_listen, "",
          "host:port to serve the web console on (its page and the JSON API it reads); port 0 "
          "picks a free port; empty (the default) turns it off. With --tls_cert_file it serves "
          "HTTPS, and with --tls_client_ca_file it asks browsers for a client certificate, as the "
          "API does. An address other machines can reach needs --auth_token_file (the page asks "
          "for a token), --tls_client_ca_file or --insecure");
ABSL_FLAG(absl::Duration, metrics_job_series_ttl, absl::Minutes(5),
          "how long a job's own series (trainerd_job_*) stay after it ends");
ABSL_FLAG(bool, diagnose_at_start, true,
          "measure every device at start (matrix-product peak, launch and sync costs) so that "
          "job reports can say what bounds a job; takes a few seconds in the background");
ABSL_FLAG(std::string, nvml_library, "libnvidia-ml.so.1",
          "NVML library loaded at run time for GPU metrics; empty for none");
// Who may call (docs/SECURITY.md).
ABSL_FLAG(std::string, auth_token_file, "",
          "file of bearer tokens, one per line, optionally NAME:TOKEN, optionally followed by "
          "' admin'; every RPC but health checks must send 'authorization: Bearer <token>'; "
          "re-read when it changes (an empty or missing file revokes every token)");
ABSL_FLAG(std::vector<std::string>, admin, {},
          "comma-separated callers (token names or client certificate subjects) that see and "
          "manage every tenant's datasets and jobs; the others see their own");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate (chain) to serve gRPC over TLS; re-read every --tls_reload_interval");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificate(s): require client certificates signed by it (mutual TLS); a "
          "certificate's subject names its caller");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "how often the TLS files are re-read, so that certificates rotate without a restart");
ABSL_FLAG(bool, insecure, false,
          "serve an address other machines can reach without a token or mutual TLS");
ABSL_FLAG(std::string, metrics_auth_token_file, "",
          "file holding the bearer token that /metrics requires (Prometheus' authorization "
          "setting); empty: no token");
// Bounds on what requests may cost.
ABSL_FLAG(int64_t, min_upload_bytes_per_second, int64_t{64} << 10,
          "an upload that sends less than this per second, averaged over --upload_idle_timeout, "
          "is ended and discarded; 0 for no minimum");
ABSL_FLAG(int, max_uploads_per_caller, 8,
          "dataset uploads one caller may have in progress at once; 0 for no limit");
ABSL_FLAG(int, max_watches_per_caller, 64,
          "WatchJob streams one caller may hold open at once; 0 for no limit");
ABSL_FLAG(int, max_diagnose_per_caller, 2,
          "Diagnose calls one caller may have waiting or running at once; 0 for no limit");
ABSL_FLAG(int, max_health_watches_per_address, 16,
          "health Watch streams (which need no credentials) one client address may hold open at "
          "once; 0 for no limit");
ABSL_FLAG(int, max_health_watches, 1024,
          "health Watch streams all clients together may hold open at once; 0 for no limit");
ABSL_FLAG(int64_t, max_jobs_per_caller, 0,
          "quota: queued and running jobs one caller (not an admin) may have; 0 (the default): a "
          "fair share, a quarter of --max_queued_jobs, so that no tenant fills the queue");
ABSL_FLAG(int64_t, max_dataset_bytes_per_caller, 0,
          "quota: bytes of datasets one caller (not an admin) may own; 0 for none");
ABSL_FLAG(int64_t, max_disk_bytes_per_caller, 0,
          "quota: bytes under --data_dir one caller's (not an admin's) datasets, modules, "
          "checkpoints and models may hold; past it its uploads and jobs are refused and its "
          "jobs' checkpoints skipped; 0 for none");
ABSL_FLAG(absl::Duration, diagnose_min_interval, absl::Seconds(30),
          "Diagnose --refresh measures again only when the figures are older than this");
ABSL_FLAG(int64_t, max_upload_bytes_in_flight, int64_t{8} << 30,
          "most host memory all uploads in progress may stage together, in bytes; 0 for no bound");
ABSL_FLAG(absl::Duration, upload_idle_timeout, absl::Seconds(60),
          "an upload stream that sends nothing for this long is ended and discarded");
ABSL_FLAG(int64_t, max_queued_jobs, 1000,
          "most jobs waiting in the queues at once; 0 for no bound");
ABSL_FLAG(bool, allow_torchscript, true,
          "accept TorchScript modules with jobs (each is checked as code before it runs)");
ABSL_FLAG(std::string, module_checker, "",
          "the trainerd-module-check program that first loads and tries submitted modules; empty: "
          "the one next to this executable");
ABSL_FLAG(int32_t, max_concurrent_jobs, 0,
          "jobs each device runs at once, each on its own worker (and CUDA stream); 0: as many as "
          "--cpu_cores on the CPU (each job takes the intra-op threads its size asks for from "
          "them, and waits its turn when they are taken), 4 on a GPU; at most 1024");
ABSL_FLAG(int32_t, cpu_cores, 0,
          "cores the CPU jobs share (their intra-op threads together, and the CPU's jobs at once); "
          "0: the usable cores (this process's affinity and its cgroup's CPU quota); at most 1024");
ABSL_FLAG(
    int32_t, intra_op_threads, 0,
    "LibTorch intra-op threads of each CPU job; 0: chosen per job from its FLOPs per step "
    "(one thread for a small model, whose operators are too small to share), at most the usable "
    "cores; the running "
    "CPU jobs never hold more threads than the usable cores either way");
ABSL_FLAG(bool, flush_denormal, true,
          "jobs flush subnormal floats (below 1.2e-38) to zero on their threads: x86 computes "
          "them up to 100x slower, and a job whose values decay towards zero meets many");
ABSL_FLAG(int32_t, cpu_training_nice, 10,
          "the nice value (0-19) CPU jobs train at: when training and the threads that answer "
          "RPCs both want the cores, the RPCs come first, so a node busy training still answers "
          "quickly (a node that only trains loses nothing); 0: the daemon's own priority");
// Job records (docs/ARCHITECTURE.md, "Job records").
ABSL_FLAG(absl::Duration, shutdown_timeout, absl::Seconds(60),
          "at SIGTERM or SIGINT, how long running jobs may take to finish their epoch and write a "
          "checkpoint; past it they stop at a step boundary (a TorchScript job's worker that has "
          "not stopped gets --worker_grace more, then is killed) and resume from their last "
          "checkpoint at the next start");
ABSL_FLAG(int32_t, keep_checkpoints, 0,
          "keep only each job's last N checkpoints (older files are deleted as new ones are "
          "written); 0 keeps all");
ABSL_FLAG(int64_t, max_finished_jobs, 0,
          "keep the records, models and checkpoints of at most this many ended jobs, deleting "
          "the oldest; 0 for no bound");
ABSL_FLAG(absl::Duration, job_retention, absl::ZeroDuration(),
          "delete ended jobs (record, model, checkpoints) this long after they ended, e.g. 720h; "
          "0 keeps them");
ABSL_FLAG(absl::Duration, torchscript_check_timeout, absl::Seconds(30),
          "how long a submitted module's load and trial forward may take");
ABSL_FLAG(std::string, worker, "",
          "the trainerd-worker program in which TorchScript jobs train (untrusted code never runs "
          "in the daemon); empty: the one next to this executable");
ABSL_FLAG(std::string, worker_sandbox_may_lack, "",
          "required parts of the sandbox of the processes that run submitted TorchScript (the "
          "module checker and the workers) that this daemon runs such code without: any of "
          "landlock,seccomp,no_new_privileges,not_dumpable. Empty (the default): a process short "
          "of any of them is sent no code, and its job is refused with the part and the fix "
          "(docs/SECURITY.md); trainctl diagnose shows what the processes get");
ABSL_FLAG(absl::Duration, max_job_time, absl::Hours(24),
          "a TorchScript job's time limit when it gives none (trainctl submit --max-job-time): "
          "its worker is killed and the job FAILED once it has run this long; 0 for none");
// Data-parallel jobs (docs/ARCHITECTURE.md, "The cluster layer").
ABSL_FLAG(int32_t, max_replicas, 8,
          "the most ranks one job may ask for (trainctl submit --replicas); on the CPU they are "
          "threads of this daemon and share its cores");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(60),
          "how long a data-parallel job's ranks may take to meet, and one collective may wait for "
          "the other ranks, before the job fails naming the rank that did not come; a peer whose "
          "rank then does not answer within a few seconds more (stopped, hung, cut off) counts as "
          "lost, as a killed one does");
ABSL_FLAG(std::string, peers, "",
          "other trainerd daemons this one may place a job's ranks on (trainctl submit --nodes) "
          "and runs ranks for: host:port,... or dns:NAME:PORT for every address NAME resolves to "
          "(a Kubernetes headless Service), looked up again as jobs ask; empty: none");
ABSL_FLAG(std::string, peer_token_file, "",
          "the bearer token (first line; a NAME: prefix is dropped) this daemon presents to its "
          "peers; it must be an admin token of theirs. A file that does not exist is logged and "
          "the daemon serves without it (its jobs cannot use peers); one that holds no token "
          "stops it");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "PEM CA that the peers' server certificates are checked against (turns TLS on for calls "
          "to peers)");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM client certificate this daemon presents to its peers (mutual TLS; with "
          "--peer_tls_key)");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM key of --peer_tls_cert");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1",
          "the address a data-parallel job's rendezvous store listens on and its ranks' transport "
          "binds, which the peers must reach (this node's address on their network); ranks on "
          "this daemon alone need only loopback");
ABSL_FLAG(std::string, rendezvous_ports, "0-0",
          "the port range of data-parallel jobs' rendezvous stores (open it between peers, e.g. "
          "29500-29599); 0-0: any free port");
ABSL_FLAG(bool, cluster_env, true,
          "honour a cluster manager's MASTER_ADDR and MASTER_PORT (or Kubeflow's PET_ forms) with "
          "a node count and rank, read from node-level variables only (PET_NNODES and "
          "PET_NODE_RANK, torchrun's GROUP_WORLD_SIZE and GROUP_RANK, or WORLD_SIZE and RANK "
          "where they do not count processes): this daemon is that node, node 0 hosts the "
          "group's directory on MASTER_PORT, and the other nodes are peers (docs/DEPLOY.md); "
          "false ignores them");
ABSL_FLAG(std::string, node_name, "",
          "this daemon's name in a data-parallel job's rank placements (Job.ranks); empty: the "
          "host name");
ABSL_FLAG(absl::Duration, worker_grace, absl::Seconds(5),
          "how long a TorchScript job's worker may take to stop after a cancel or a shutdown "
          "asked it to, before it is killed");
ABSL_FLAG(
    int32_t, worker_pool, 1,
    "TorchScript workers kept started and warm per device (LibTorch loaded, sandbox applied), "
    "so that a job's worker is ready when it starts, and with them one module checker; "
    "each serves one job or one check; 0: none");
ABSL_FLAG(int64_t, worker_memory_limit_bytes, int64_t{8} << 30,
          "a TorchScript job's worker's memory beyond its libraries and datasets, in bytes: its "
          "address space on the CPU; on a GPU (whose driver reserves address space far beyond its "
          "use) its heap and its device memory; 0 for none");

namespace {

// --flags_reference: the flags defined in this file, sorted by name, as Markdown table rows. Their
// help strings are the reference; docs/CONFIGURATION.md holds this output (docs/generate.py
// writes it, the docs_generated test checks it).
void PrintFlagsReference(std::ostream& out) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "server/main.cc")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](const absl::CommandLineFlag* a,
                                           const absl::CommandLineFlag* b) {
    return a->Name() < b->Name();
  });
  out << "| flag | default | meaning |\n|---|---|---|\n";
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string value = flag->DefaultValue();
    out << "| `--" << flag->Name() << "` | " << (value.empty() ? "(empty)" : absl::StrCat("`", value, "`"))
        << " | " << absl::StrReplaceAll(flag->Help(),
                                       {{"|", "\\|"}, {"<", "&lt;"}, {">", "&gt;"}, {"\n", " "}}) << " |\n";
  }
}

// The directory of this executable, where trainerd-module-check is installed beside it.
std::string ExecutableDirectory() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  const std::string self(path, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}

// This host's first IPv4 address that is not loopback (its name's, as a pod's /etc/hosts gives
// it), or "" when it has none.
std::string HostAddress() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0 || found == nullptr) return "";
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
    if (std::string(text).rfind("127.", 0) != 0) out = text;
  }
  ::freeaddrinfo(found);
  return out;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

namespace {

// Raises the soft open-file limit to the hard one, as servers do (a default soft limit of 1,024
// would run out at about 500 resident CPU datasets, two descriptors each, and then every upload,
// download and connection fails), and says so when even the hard limit is short of what
// --max_datasets may take (two per dataset, plus 1,024 for connections, files and LibTorch).
void RaiseOpenFileLimit(int64_t max_datasets) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    struct rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  // Capped so that a huge --max_datasets cannot wrap the sum around to a small need.
  const uint64_t datasets =
      static_cast<uint64_t>(std::clamp<int64_t>(max_datasets, 0, int64_t{1} << 40));
  const uint64_t need = 2 * datasets + 1024;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < need) {
    trainerd::engine::LogWarning(absl::StrCat(
        "the open-file limit is ", limit.rlim_cur, ", short of the ", need,
        " that --max_datasets=", max_datasets,
        " may take (two per resident CPU dataset, and 1,024 for the rest): raise it "
        "(systemd LimitNOFILE=, docker --ulimit nofile=, ulimit -n) or lower --max_datasets; "
        "past it, calls fail RESOURCE_EXHAUSTED until datasets are deleted"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Not dumpable, first thing: a process of the daemon's own user (a worker whose sandbox failed
  // it, anything else that user runs) cannot open its /proc files (mem, environ, fd) or trace it,
  // and it leaves no core dump holding tokens or datasets.
  prctl(PR_SET_DUMPABLE, 0);
  // Block the stop signals before any thread starts, so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A peer or client that goes away mid-write is an error of that write (EPIPE), never the
  // daemon's end: gRPC sends with MSG_NOSIGNAL, Gloo's transport does not.
  std::signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "trainerd: a training daemon that keeps datasets resident on the GPU.\n"
      "Usage: trainerd [--listen=HOST:PORT|unix:PATH] [--data_dir=DIR] "
      "[--device=auto|cpu|cuda[:N]]\n"
      "                [--auth_token_file=FILE] [--tls_cert_file=FILE --tls_key_file=FILE\n"
      "                [--tls_client_ca_file=FILE]] [--metrics_listen=HOST:PORT]\n"
      "                [--console_listen=HOST:PORT]\n"
      "                [--flagfile=FILE]   (see docs/CONFIGURATION.md and docs/SECURITY.md)\n"
      "Every flag may also come from the environment: TRAINERD_DATA_DIR=/data is "
      "--data_dir=/data;\nthe command line wins.");
  {
    // --version: "trainerd 0.1.0 (LibTorch 2.11.0, CUDA 13.0)", then exit 0 (Abseil's
    // ParseCommandLine handles the flag).
    absl::FlagsUsageConfig usage;  // only the version: the other fields keep their defaults
    usage.version_string = [] {
      const std::string cuda = trainerd::engine::CudaVersionString();
      return absl::StrCat("trainerd ", trainerd::TrainerdVersion(), " (LibTorch ",
                          trainerd::engine::LibTorchVersionString(),
                          cuda.empty() ? ", CPU only" : absl::StrCat(", CUDA ", cuda), ")\n");
    };
    absl::SetFlagsUsageConfig(usage);
  }
  // Settings from TRAINERD_<FLAG> variables first (as a container's environment passes them),
  // then the command line, which wins.
  {
    std::vector<std::string> unknown;
    const absl::Status from_env = trainerd::ApplyFlagsFromEnvironment(
        "TRAINERD_", trainerd::ProcessEnvironment(),
        // What trainctl, the tests and the build scripts read: not the daemon's settings.
        {"TRAINERD_ADDR", "TRAINERD_TOKEN", "TRAINERD_CONTEXT", "TRAINERD_PYTHON",
         "TRAINERD_TORCH_VENV", "TRAINERD_TORCH_VERSION", "TRAINERD_LOAD_CLIENTS",
         "TRAINERD_LOAD_SECONDS", "TRAINERD_LOAD_REPORT"},
        &unknown);
    if (!from_env.ok()) {
      std::cerr << "trainerd: " << from_env.message() << std::endl;
      return 2;
    }
    for (const std::string& name : unknown) {
      std::cerr << "trainerd: ignoring $" << name << ": trainerd has no such setting" << std::endl;
    }
  }
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_flags_reference)) {
    PrintFlagsReference(std::cout);
    return 0;
  }

  trainerd::service::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.engine.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.engine.device = absl::GetFlag(FLAGS_device);
  options.engine.max_dataset_bytes = absl::GetFlag(FLAGS_max_dataset_bytes);
  options.engine.max_datasets = absl::GetFlag(FLAGS_max_datasets);
  options.engine.max_datasets_per_caller = absl::GetFlag(FLAGS_max_datasets_per_caller);
  options.engine.peer_copy_retention = absl::GetFlag(FLAGS_peer_copy_retention);
  if (options.engine.peer_copy_retention < absl::ZeroDuration()) {
    std::cerr << "trainerd: --peer_copy_retention must not be negative\n";
    return 2;
  }
  {
    absl::StatusOr<trainerd::MemorySize> budget =
        trainerd::ParseMemorySize(absl::GetFlag(FLAGS_device_memory_budget));
    if (!budget.ok()) {
      std::cerr << "trainerd: --device_memory_budget: " << budget.status().message() << std::endl;
      return 2;
    }
    options.engine.device_memory_budget = *budget;
  }
  options.engine.preload = absl::GetFlag(FLAGS_preload);
  options.engine.diagnose_at_start = absl::GetFlag(FLAGS_diagnose_at_start);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.console_listen = absl::GetFlag(FLAGS_console_listen);
  options.metrics.job_series_ttl = absl::GetFlag(FLAGS_metrics_job_series_ttl);
  options.metrics.version = trainerd::TrainerdVersion();
  options.metrics.libtorch_version = trainerd::engine::LibTorchVersionString();
  options.metrics.cuda_version = trainerd::engine::CudaVersionString();
  options.nvml_library = absl::GetFlag(FLAGS_nvml_library);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.admins = absl::GetFlag(FLAGS_admin);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.tls.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.metrics_token_file = absl::GetFlag(FLAGS_metrics_auth_token_file);
  options.upload_idle_timeout = absl::GetFlag(FLAGS_upload_idle_timeout);
  options.min_upload_bytes_per_second = absl::GetFlag(FLAGS_min_upload_bytes_per_second);
  options.max_uploads_per_caller = absl::GetFlag(FLAGS_max_uploads_per_caller);
  options.max_watches_per_caller = absl::GetFlag(FLAGS_max_watches_per_caller);
  options.max_diagnose_per_caller = absl::GetFlag(FLAGS_max_diagnose_per_caller);
  options.health.max_watches_per_address = absl::GetFlag(FLAGS_max_health_watches_per_address);
  options.health.max_watches = absl::GetFlag(FLAGS_max_health_watches);
  options.engine.diagnose_min_interval = absl::GetFlag(FLAGS_diagnose_min_interval);
  options.engine.max_jobs_per_caller = absl::GetFlag(FLAGS_max_jobs_per_caller);
  options.engine.max_dataset_bytes_per_caller = absl::GetFlag(FLAGS_max_dataset_bytes_per_caller);
  options.engine.max_disk_bytes_per_caller = absl::GetFlag(FLAGS_max_disk_bytes_per_caller);
  options.engine.max_upload_bytes_in_flight = absl::GetFlag(FLAGS_max_upload_bytes_in_flight);
  options.engine.jobs.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  // A shared node's defaults: no tenant may take more than a quarter of the queue or of the
  // dataset places (admins, and every caller of a daemon without authentication, are exempt).
  // A bound of the node's own size lifts it.
  if (options.engine.max_jobs_per_caller == 0 && options.engine.jobs.max_queued_jobs > 0) {
    options.engine.max_jobs_per_caller = std::max<int64_t>(1, options.engine.jobs.max_queued_jobs / 4);
  }
  if (options.engine.max_datasets_per_caller == 0 && options.engine.max_datasets > 0) {
    options.engine.max_datasets_per_caller = std::max<int64_t>(1, options.engine.max_datasets / 4);
  }
  options.engine.jobs.max_concurrent_jobs = absl::GetFlag(FLAGS_max_concurrent_jobs);
  options.engine.jobs.cpu_cores = absl::GetFlag(FLAGS_cpu_cores);
  options.engine.jobs.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  options.engine.jobs.flush_denormal = absl::GetFlag(FLAGS_flush_denormal);
  options.engine.jobs.cpu_training_nice = absl::GetFlag(FLAGS_cpu_training_nice);
  if (options.engine.jobs.cpu_training_nice < 0 || options.engine.jobs.cpu_training_nice > 19) {
    std::cerr << "trainerd: --cpu_training_nice must be from 0 to 19, not "
              << options.engine.jobs.cpu_training_nice << "\n";
    return 2;
  }
  // Each worker is a thread, made when its device gets its first job: a mistyped value must not
  // start a million of them.
  constexpr int32_t kMaxWorkers = 1024;
  if (options.engine.jobs.cpu_cores > kMaxWorkers ||
      options.engine.jobs.max_concurrent_jobs > kMaxWorkers) {
    std::cerr << "trainerd: --cpu_cores and --max_concurrent_jobs must be at most " << kMaxWorkers
              << " (each job at once is a worker thread); got " << options.engine.jobs.cpu_cores
              << " and " << options.engine.jobs.max_concurrent_jobs << "\n";
    return 2;
  }
  options.engine.jobs.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.engine.jobs.max_finished_jobs = absl::GetFlag(FLAGS_max_finished_jobs);
  options.engine.jobs.job_retention = absl::GetFlag(FLAGS_job_retention);
  if (options.engine.jobs.keep_checkpoints < 0 || options.engine.jobs.max_finished_jobs < 0 ||
      options.engine.jobs.max_concurrent_jobs < 0 || options.engine.jobs.intra_op_threads < 0 ||
      options.engine.jobs.cpu_cores < 0 ||
      options.engine.jobs.job_retention < absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_shutdown_timeout) < absl::ZeroDuration()) {
    std::cerr
        << "trainerd: --keep_checkpoints, --max_finished_jobs, --max_concurrent_jobs, "
           "--cpu_cores, --intra_op_threads, --job_retention and --shutdown_timeout must not be "
           "negative\n";
    return 2;
  }
  if (options.min_upload_bytes_per_second < 0 || options.max_uploads_per_caller < 0 ||
      options.max_watches_per_caller < 0 || options.max_diagnose_per_caller < 0 ||
      options.health.max_watches_per_address < 0 || options.health.max_watches < 0 ||
      options.engine.diagnose_min_interval < absl::ZeroDuration() ||
      options.engine.max_jobs_per_caller < 0 || options.engine.max_dataset_bytes_per_caller < 0 ||
      options.engine.max_disk_bytes_per_caller < 0 || options.engine.max_datasets < 0 ||
      options.engine.max_datasets_per_caller < 0) {
    std::cerr << "trainerd: --min_upload_bytes_per_second, --max_uploads_per_caller, "
                 "--max_watches_per_caller, --max_diagnose_per_caller, "
                 "--max_health_watches_per_address, --max_health_watches, "
                 "--diagnose_min_interval, "
                 "--max_jobs_per_caller, --max_dataset_bytes_per_caller, "
                 "--max_disk_bytes_per_caller, --max_datasets and --max_datasets_per_caller must "
                 "not be negative\n";
    return 2;
  }
  RaiseOpenFileLimit(options.engine.max_datasets);
  options.engine.allow_torchscript = absl::GetFlag(FLAGS_allow_torchscript);
  options.engine.module_checker.program = absl::GetFlag(FLAGS_module_checker);
  if (options.engine.module_checker.program.empty()) {
    options.engine.module_checker.program = ExecutableDirectory() + "/trainerd-module-check";
  }
  options.engine.module_checker.timeout = absl::GetFlag(FLAGS_torchscript_check_timeout);
  if (options.engine.allow_torchscript &&
      access(options.engine.module_checker.program.c_str(), X_OK) != 0) {
    std::cerr << "trainerd: the module checker '" << options.engine.module_checker.program
              << "' cannot be run; install trainerd-module-check beside trainerd, give "
                 "--module_checker, or start with --allow_torchscript=false"
              << std::endl;
    return 1;
  }

  options.engine.jobs.worker.program = absl::GetFlag(FLAGS_worker);
  if (options.engine.jobs.worker.program.empty()) {
    options.engine.jobs.worker.program = ExecutableDirectory() + "/trainerd-worker";
  }
  options.engine.jobs.worker.grace = absl::GetFlag(FLAGS_worker_grace);
  options.engine.jobs.worker.pool = std::max(0, absl::GetFlag(FLAGS_worker_pool));
  // The module checker's warm process follows the workers' setting (one, or none).
  options.engine.module_checker.pool = options.engine.jobs.worker.pool > 0 ? 1 : 0;
  options.engine.jobs.worker.memory_limit_bytes = absl::GetFlag(FLAGS_worker_memory_limit_bytes);
  options.engine.measure_sandbox_at_start = options.engine.allow_torchscript;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_worker_sandbox_may_lack), ',', absl::SkipWhitespace())) {
    const std::string name(absl::StripAsciiWhitespace(part));
    const std::vector<std::string>& parts = trainerd::engine::RequiredSandboxParts();
    if (std::find(parts.begin(), parts.end(), name) == parts.end()) {
      std::cerr << "trainerd: --worker_sandbox_may_lack: '" << name
                << "' is not a required part of the sandbox (landlock, seccomp, "
                   "no_new_privileges, not_dumpable)\n";
      return 2;
    }
    options.engine.worker_sandbox_may_lack.push_back(name);
  }
  options.engine.jobs.max_job_time = absl::GetFlag(FLAGS_max_job_time);
  options.engine.max_replicas = absl::GetFlag(FLAGS_max_replicas);
  options.engine.jobs.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  options.engine.jobs.node_name = absl::GetFlag(FLAGS_node_name);
  options.engine.jobs.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  {
    const std::string ports = absl::GetFlag(FLAGS_rendezvous_ports);
    const std::vector<std::string> range = absl::StrSplit(ports, '-');
    int low = -1;
    int high = -1;
    if (range.size() != 2 || !absl::SimpleAtoi(range[0], &low) ||
        !absl::SimpleAtoi(range[1], &high) || low < 0 || high > 65535 || low > high) {
      std::cerr << "trainerd: --rendezvous_ports must be LOW-HIGH within 0-65535, got '" << ports
                << "'\n";
      return 2;
    }
    options.engine.jobs.rendezvous_port_min = low;
    options.engine.jobs.rendezvous_port_max = high;
  }
  if (absl::GetFlag(FLAGS_cluster_env)) {
    // A cluster manager's group of daemons: its other nodes are peers (cluster_directory.h).
    absl::StatusOr<std::optional<trainerd::engine::ClusterOptions>> cluster =
        trainerd::engine::ClusterFromEnvironment(trainerd::ProcessEnvironment());
    if (!cluster.ok()) {
      std::cerr << "trainerd: " << cluster.status().message()
                << " (--cluster_env=false ignores these variables)\n";
      return 2;
    }
    if (cluster->has_value()) {
      // The others must reach this daemon: loopback will not do across machines. Unless set, the
      // address is the host name's, as a pod's is.
      if (options.engine.jobs.advertise_host == "127.0.0.1" &&
          !IsLoopbackHost((*cluster)->master_addr)) {
        options.engine.jobs.advertise_host = HostAddress();
        if (options.engine.jobs.advertise_host.empty()) {
          std::cerr << "trainerd: node " << (*cluster)->node_rank << " of a group of "
                    << (*cluster)->nodes
                    << " has no address but loopback: set --advertise_host to this node's "
                       "address on the group's network\n";
          return 2;
        }
      }
      options.cluster = **cluster;
      trainerd::engine::LogInfo(absl::StrCat(
          "node ", (*cluster)->node_rank, " of ", (*cluster)->nodes, " (from ",
          (*cluster)->counted_by, "): the group's directory is at ", (*cluster)->master_addr, ":",
          (*cluster)->master_port, (*cluster)->node_rank == 0 ? ", hosted here" : ""));
    }
  }
  {
    options.peers.peers = absl::GetFlag(FLAGS_peers);
    // This daemon as its peers see it (a headless Service's names list it too).
    options.peers.self = absl::StrCat(options.engine.jobs.advertise_host, ":",
                                      options.listen.substr(options.listen.rfind(':') + 1));
    const std::string token_file = absl::GetFlag(FLAGS_peer_token_file);
    struct stat token_stat {};
    if (!token_file.empty() && ::stat(token_file.c_str(), &token_stat) != 0 && errno == ENOENT) {
      // Not there: a daemon that needs no peers serves on (a Kubernetes Secret made with its
      // `token` key only mounts no peer-token file); calls to peers are refused here, naming the
      // file, until it is there and the daemon restarted.
      options.peers.missing_token_file = token_file;
      trainerd::engine::LogWarning(absl::StrCat(
          "--peer_token_file '", token_file,
          "' does not exist: this daemon serves, and runs ranks for peers that present their "
          "token, but cannot place ranks or members on its peers until the file is there and the "
          "daemon restarted (docs/DEPLOY.md)"));
    } else if (!token_file.empty()) {
      // The first line that is not a comment, as trainctl reads --token-file; a line of a
      // daemon's token file ("NAME:TOKEN admin") works too: its first word, less "NAME:".
      std::ifstream in(token_file);
      std::string line;
      while (in && std::getline(in, line)) {
        const std::vector<std::string> words =
            absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
        if (words.empty() || words[0][0] == '#') continue;
        const size_t colon = words[0].find(':');
        options.peers.token = colon == std::string::npos ? words[0] : words[0].substr(colon + 1);
        break;
      }
      if (options.peers.token.empty()) {
        std::cerr << "trainerd: --peer_token_file: '" << token_file << "' holds no token\n";
        return 2;
      }
    }
    options.peers.tls_ca_file = absl::GetFlag(FLAGS_peer_tls_ca);
    options.peers.tls_cert_file = absl::GetFlag(FLAGS_peer_tls_cert);
    options.peers.tls_key_file = absl::GetFlag(FLAGS_peer_tls_key);
  }
  if (options.engine.max_replicas < 1 ||
      options.engine.jobs.collective_timeout <= absl::ZeroDuration()) {
    std::cerr << "trainerd: --max_replicas must be at least 1 and --collective_timeout positive\n";
    return 2;
  }
  if (options.engine.jobs.worker.grace < absl::ZeroDuration() ||
      options.engine.jobs.max_job_time < absl::ZeroDuration() ||
      options.engine.jobs.worker.memory_limit_bytes < 0) {
    std::cerr << "trainerd: --worker_grace, --max_job_time and --worker_memory_limit_bytes must "
                 "not be negative\n";
    return 2;
  }
  if (options.engine.allow_torchscript &&
      access(options.engine.jobs.worker.program.c_str(), X_OK) != 0) {
    std::cerr << "trainerd: the worker '" << options.engine.jobs.worker.program
              << "' cannot be run; install trainerd-worker beside trainerd, give --worker, or "
                 "start with --allow_torchscript=false"
              << std::endl;
    return 1;
  }

  auto server = trainerd::service::Server::BuildAndStart(options);
  if (!server.ok()) {
    std::cerr << "trainerd: " << server.status().message() << std::endl;
    return 1;
  }
  // One line on stdout that scripts can wait for (the port matters when --listen used port 0).
  std::cout << "trainerd listening on " << (*server)->address() << " (device "
            << (*server)->engine()->default_device() << ")" << std::endl;
  if (!(*server)->metrics_address().empty()) {
    std::cout << "trainerd metrics on http://" << (*server)->metrics_address() << "/metrics"
              << std::endl;
  }
  if (!(*server)->console_address().empty()) {
    std::cout << "trainerd console on " << (*server)->console_url() << std::endl;
  }

  int signal = 0;
  sigwait(&stop_signals, &signal);
  trainerd::engine::LogInfo(absl::StrCat("received ", strsignal(signal), "; shutting down"));
  // Drain: running jobs finish their epoch and checkpoint, then resume at the next start.
  (*server)->Drain(absl::GetFlag(FLAGS_shutdown_timeout), absl::Seconds(5));
  server->reset();
  return 0;
}
