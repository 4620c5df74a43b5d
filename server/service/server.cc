#include "server/service/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/log.h"

namespace trainerd::service {

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server());
  TRAINERD_ASSIGN_OR_RETURN(server->engine_, engine::Engine::Create(options.engine));
  server->dataset_service_ = std::make_unique<DatasetServiceImpl>(server->engine_.get());
  server->job_service_ = std::make_unique<JobServiceImpl>(server->engine_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->dataset_service_.get());
  builder.RegisterService(server->job_service_.get());
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
  return server;
}

Server::~Server() { Shutdown(absl::Seconds(5)); }

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
