#include "server/service/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/log.h"
#include "server/service/metrics_interceptor.h"

namespace trainerd::service {

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server());
  monitor::DeviceSampler::Options sampler_options;
  sampler_options.interval = options.sample_interval;
  sampler_options.nvml_library = options.nvml_library;
  server->sampler_ = std::make_unique<monitor::DeviceSampler>(sampler_options);
  if (!server->sampler_->nvml_status().ok() && !options.nvml_library.empty()) {
    engine::LogInfo(absl::StrCat("no GPU metrics: ", server->sampler_->nvml_status().message()));
  }
  server->sampler_->Start();
  server->metrics_ = std::make_unique<metrics::Metrics>(options.metrics);
  server->metrics_->SetSampler(server->sampler_.get());
  engine::EngineOptions engine_options = options.engine;
  engine_options.observer = server->metrics_->job_observer();
  engine_options.sampler = server->sampler_.get();
  TRAINERD_ASSIGN_OR_RETURN(server->engine_, engine::Engine::Create(engine_options));
  server->metrics_->SetEngine(server->engine_.get());
  server->dataset_service_ = std::make_unique<DatasetServiceImpl>(server->engine_.get());
  server->job_service_ = std::make_unique<JobServiceImpl>(server->engine_.get());
  server->system_service_ = std::make_unique<SystemServiceImpl>(server->engine_.get());
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<int> port = server->metrics_->Serve(options.metrics_listen);
    if (!port.ok()) return port.status();
    const std::string host = options.metrics_listen.substr(0, options.metrics_listen.rfind(':'));
    server->metrics_address_ = absl::StrCat(host, ":", *port);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->dataset_service_.get());
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->system_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MetricsInterceptorFactory(server->metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // A SubmitJobRequest may carry a TorchScript module (bring your own model) of up to 64 MiB in
  // one message; dataset chunks are 1 MiB. Larger modules wait for a streaming upload.
  builder.SetMaxReceiveMessageSize(64 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options.listen,
                                               "' (address in use or not valid)"));
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  server->address_ = absl::StrCat(host, ":", server->port_);
  // Only now that the server is up does it report SERVING.
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(v1::DatasetService::service_full_name(), true);
  health->SetServingStatus(v1::JobService::service_full_name(), true);
  health->SetServingStatus(v1::SystemService::service_full_name(), true);
  return server;
}

Server::~Server() {
  Shutdown(absl::Seconds(5));
  // A scrape may still come in until the metrics go; it must not reach a destroyed engine.
  if (metrics_ != nullptr) {
    metrics_->SetEngine(nullptr);
    metrics_->SetSampler(nullptr);
  }
  // The services before the engine they use (Diagnose's threads are joined here).
  system_service_.reset();
  server_.reset();
  engine_.reset();
  if (sampler_ != nullptr) sampler_->Stop();
}

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void Server::Shutdown(absl::Duration deadline) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->Shutdown();
  engine_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  engine::LogInfo("server stopped");
}

void Server::Wait() { server_->Wait(); }

}  // namespace trainerd::service
