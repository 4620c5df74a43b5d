// trainerd: keeps uploaded datasets resident on a device and trains jobs submitted over gRPC.
// Flags go into ServerOptions; Server::BuildAndStart does the rest; SIGINT/SIGTERM stop it.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/engine/log.h"
#include "server/service/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve gRPC on; port 0 picks a free port (printed at start)");
ABSL_FLAG(std::string, data_dir, "./trainerd-data",
          "folder where uploaded datasets are kept across restarts");
ABSL_FLAG(std::string, device, "auto",
          "default device and where datasets are resident: auto (first CUDA device, else cpu), "
          "cpu, cuda or cuda:N");
ABSL_FLAG(int64_t, max_dataset_bytes, int64_t{16} << 30,
          "largest dataset payload accepted, in bytes; 0 for no limit");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9400",
          "host:port to serve Prometheus metrics on (/metrics); port 0 picks a free port; empty "
          "turns the endpoint off");
ABSL_FLAG(absl::Duration, metrics_job_series_ttl, absl::Minutes(5),
          "how long a job's own series (trainerd_job_*) stay after it ends");
ABSL_FLAG(bool, diagnose_at_start, true,
          "measure every device at start (matrix-product peak, launch and sync costs) so that "
          "job reports can say what bounds a job; takes a few seconds in the background");
ABSL_FLAG(std::string, nvml_library, "libnvidia-ml.so.1",
          "NVML library loaded at run time for GPU metrics; empty for none");

int main(int argc, char** argv) {
  // Block the stop signals before any thread starts, so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::SetProgramUsageMessage(
      "trainerd: a training daemon that keeps datasets resident on the GPU.\n"
      "Usage: trainerd [--listen=HOST:PORT] [--data_dir=DIR] [--device=auto|cpu|cuda[:N]]\n"
      "                [--metrics_listen=HOST:PORT] [--diagnose_at_start=true|false]");
  absl::ParseCommandLine(argc, argv);

  trainerd::service::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.engine.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.engine.device = absl::GetFlag(FLAGS_device);
  options.engine.max_dataset_bytes = absl::GetFlag(FLAGS_max_dataset_bytes);
  options.engine.diagnose_at_start = absl::GetFlag(FLAGS_diagnose_at_start);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.metrics.job_series_ttl = absl::GetFlag(FLAGS_metrics_job_series_ttl);
  options.metrics.version = TRAINERD_VERSION;
  options.metrics.libtorch_version = trainerd::engine::LibTorchVersionString();
  options.metrics.cuda_version = trainerd::engine::CudaVersionString();
  options.nvml_library = absl::GetFlag(FLAGS_nvml_library);

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

  int signal = 0;
  sigwait(&stop_signals, &signal);
  trainerd::engine::LogInfo(absl::StrCat("received ", strsignal(signal), "; shutting down"));
  (*server)->Shutdown(absl::Seconds(5));
  server->reset();
  return 0;
}
