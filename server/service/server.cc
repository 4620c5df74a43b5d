#include "server/service/server.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/job_limits.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "server/engine/log.h"
#include "server/service/metrics_interceptor.h"
#include "server/store/sqlite_job_store.h"

namespace trainerd::service {

namespace {

// The metrics endpoint's token: the first token of its file (ParseTokenFile's format; a name is
// allowed and ignored).
absl::StatusOr<std::string> ReadMetricsToken(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--metrics_auth_token_file: ", text.status().message()));
  }
  std::string token;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    token = std::string(colon == absl::string_view::npos ? line : line.substr(colon + 1));
    break;
  }
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_auth_token_file '", path,
                                                   "' needs a token of at least ", kMinTokenLength,
                                                   " characters"));
  }
  return token;
}

// Every method this server serves, as gRPC names them ("/trainerd.v1.JobService/SubmitJob"):
// the API's from its descriptors, the health service's and reflection's. A call to any other path
// is counted under one label, so that junk paths cannot grow the metrics.
std::set<std::string> KnownRpcMethods() {
  std::set<std::string> methods = {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
                                   "/grpc.health.v1.Health/List",
                                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"};
  for (const char* name :
       {v1::DatasetService::service_full_name(), v1::JobService::service_full_name(),
        v1::SystemService::service_full_name(), v1::PeerService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      methods.insert(absl::StrCat("/", service->full_name(), "/", service->method(i)->name()));
    }
  }
  return methods;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(const ServerOptions& options) {
  // Security first: nothing starts when the settings would leave the daemon open by accident.
  TRAINERD_RETURN_IF_ERROR(CheckTlsFiles(options.tls));
  const bool local = IsLocalAddress(options.listen);
  const bool authenticated = !options.auth_token_file.empty() || options.tls.mutual();
  if (!local && !authenticated && !options.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve on ", options.listen,
        ", which other machines can reach, without authentication: give --auth_token_file or "
        "mutual TLS (--tls_cert_file, --tls_key_file, --tls_client_ca_file), or --insecure to "
        "let anyone who can reach it train, read and delete"));
  }
  AuthOptions auth_options;
  auth_options.token_file = options.auth_token_file;
  auth_options.client_certificates = options.tls.mutual();
  auth_options.admins = options.admins;
  TRAINERD_ASSIGN_OR_RETURN(std::shared_ptr<Authenticator> authenticator,
                            Authenticator::Create(auth_options));
  http::HttpEndpointOptions metrics_http;
  if (!options.metrics_token_file.empty()) {
    TRAINERD_ASSIGN_OR_RETURN(metrics_http.bearer_token,
                              ReadMetricsToken(options.metrics_token_file));
  }
  if (!local && !options.tls.enabled() && !options.auth_token_file.empty()) {
    engine::LogWarning(absl::StrCat(
        "serving on ", options.listen,
        " without TLS: bearer tokens cross the network in clear text; give --tls_cert_file and "
        "--tls_key_file unless TLS ends in front of trainerd"));
  }
  if (!local && !authenticated) {
    engine::LogWarning(absl::StrCat("--insecure: anyone who can reach ", options.listen,
                                    " may train, read and delete"));
  }

  std::unique_ptr<Server> server(new Server());
  server->authenticator_ = authenticator;
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
  if (authenticator->required()) {
    // The metrics outlive nothing they read: the server detaches them before the authenticator
    // goes (~Server).
    server->metrics_->SetAuthRejections(
        [auth = authenticator.get()] { return auth->rejected_calls(); });
    if (!options.auth_token_file.empty()) {
      server->metrics_->SetAuthTokens(
          [auth = authenticator.get()] { return auth->valid_tokens(); });
    }
  }
  engine::EngineOptions engine_options = options.engine;
  if (options.keep_job_records && engine_options.job_store == nullptr) {
    std::error_code ec;
    std::filesystem::create_directories(engine_options.data_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create the data folder '", engine_options.data_dir, "': ", ec.message()));
    }
    std::string set_aside;
    TRAINERD_ASSIGN_OR_RETURN(
        std::unique_ptr<store::SqliteJobStore> job_store,
        store::SqliteJobStore::OpenOrSetAside(engine_options.data_dir + "/jobs.db", &set_aside));
    if (!set_aside.empty()) engine::LogWarning(set_aside);
    engine_options.job_store = std::move(job_store);
  }
  PeerClientOptions peers = options.peers;
  peers.trainerd_version = TrainerdVersion();
  peers.libtorch_version = engine::LibTorchVersionString();
  // Where node 0 of a group serves the group's directory: MASTER_PORT on --listen's host (on a
  // Unix socket, every interface), with the same credentials.
  std::string group_listen;
  if (options.cluster) {
    engine::ClusterOptions cluster = *options.cluster;
    cluster.self = peers.self;
    engine::GroupJoin join;
    if (cluster.node_rank == 0) {
      const std::string host = absl::StartsWith(options.listen, "unix:")
                                   ? std::string("0.0.0.0")
                                   : options.listen.substr(0, options.listen.rfind(':'));
      group_listen = absl::StrCat(host, ":", cluster.master_port);
      if (group_listen == options.listen) group_listen.clear();  // served there already
      if (!group_listen.empty() && !IsLocalAddress(group_listen) && !authenticated &&
          !options.insecure) {
        return absl::FailedPreconditionError(absl::StrCat(
            "refusing to serve the group of daemons on ", group_listen,
            " ($MASTER_PORT), which other machines can reach, without authentication: give "
            "--auth_token_file or mutual TLS, or --insecure"));
      }
    } else {
      TRAINERD_ASSIGN_OR_RETURN(
          join, MakeGroupJoin(peers, absl::StrCat(cluster.master_addr, ":", cluster.master_port),
                              cluster.interval));
    }
    // Shared with the peer client, which asks it at every look, and the peer service.
    TRAINERD_ASSIGN_OR_RETURN(server->group_,
                              engine::ClusterDirectory::Start(std::move(cluster), std::move(join)));
    peers.discovered = [directory = server->group_] { return directory->peers(); };
  }
  if (!absl::StripAsciiWhitespace(peers.peers).empty() || peers.discovered) {
    TRAINERD_ASSIGN_OR_RETURN(engine_options.peers, MakePeerClient(std::move(peers)));
  }
  engine_options.observer = server->metrics_->job_observer();
  engine_options.sampler = server->sampler_.get();
  TRAINERD_ASSIGN_OR_RETURN(server->engine_, engine::Engine::Create(engine_options));
  server->metrics_->SetEngine(server->engine_.get());
  server->blocking_ = std::make_unique<BlockingCalls>(BlockingCalls::Options{});
  DatasetServiceOptions dataset_options;
  dataset_options.blocking = server->blocking_.get();
  dataset_options.upload_idle_timeout = options.upload_idle_timeout;
  dataset_options.min_upload_bytes_per_second = options.min_upload_bytes_per_second;
  dataset_options.max_uploads_per_caller = options.max_uploads_per_caller;
  server->dataset_service_ = std::make_unique<DatasetServiceImpl>(
      server->engine_.get(), authenticator.get(), dataset_options);
  server->job_service_ =
      std::make_unique<JobServiceImpl>(server->engine_.get(), authenticator.get(),
                                       options.max_watches_per_caller, server->blocking_.get());
  v1::VersionInfo version;
  version.set_trainerd_version(TrainerdVersion());
  version.set_libtorch_version(engine::LibTorchVersionString());
  version.set_cuda_version(engine::CudaVersionString());
  if (server->sampler_ != nullptr) version.set_driver_version(server->sampler_->driver_version());
  server->system_service_ =
      std::make_unique<SystemServiceImpl>(server->engine_.get(), std::move(version),
                                          authenticator.get(), options.max_diagnose_per_caller);
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<int> port = server->metrics_->Serve(options.metrics_listen, metrics_http);
    if (!port.ok()) return port.status();
    const std::string host = options.metrics_listen.substr(0, options.metrics_listen.rfind(':'));
    server->metrics_address_ = absl::StrCat(host, ":", *port);
  }

  // trainerd's own health service, not gRPC's default one (whose Watch streams have no bound).
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  server->health_ = std::make_unique<HealthService>(options.health);
  grpc::ServerBuilder builder;
  // A port another process listens on is refused, not shared: gRPC turns SO_REUSEPORT on by
  // default, and a second trainerd (or anything else) started on the same port would then take
  // half the calls meant for the first, each answering for its own datasets and jobs.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, MakeServerCredentials(options.tls, authenticator),
                           &server->port_);
  builder.RegisterService(server->health_.get());
  builder.RegisterService(server->dataset_service_.get());
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->system_service_.get());
  int group_port = 0;
  if (!group_listen.empty()) {
    builder.AddListeningPort(group_listen, MakeServerCredentials(options.tls, authenticator),
                             &group_port);
  }
  server->peer_service_ = std::make_unique<PeerServiceImpl>(
      server->engine_.get(), authenticator.get(), server->group_.get());
  builder.RegisterService(server->peer_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MetricsInterceptorFactory(server->metrics_.get(), KnownRpcMethods()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // A SubmitJobRequest may carry a TorchScript module (bring your own model) of up to
  // kMaxTorchScriptBytes in one message; dataset chunks are 1 MiB. Larger modules wait for a
  // streaming upload.
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxRequestMessageBytes));
  server->server_ = builder.BuildAndStart();
  const bool unix_socket = absl::StartsWith(options.listen, "unix:");
  if (server->server_ == nullptr || (server->port_ == 0 && !unix_socket)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen, "' (address in use or not valid)"));
  }
  if (!group_listen.empty() && group_port == 0) {
    return absl::UnavailableError(absl::StrCat("node 0 cannot serve the group of daemons on ",
                                               group_listen, " ($", options.cluster->source,
                                               "MASTER_PORT): address in use or not valid"));
  }
  if (unix_socket) {
    // The owner and its group may connect; nobody else (gRPC creates it with the umask's mode).
    const std::string path = options.listen.substr(5);
    if (::chmod(path.c_str(), 0660) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot make the socket '", path, "' mode 0660: ", std::strerror(errno)));
    }
    server->address_ = options.listen;
  } else {
    const std::string host = options.listen.substr(0, options.listen.rfind(':'));
    server->address_ = absl::StrCat(host, ":", server->port_);
  }
  if (!options.console_listen.empty()) {
    if (!IsLocalAddress(options.console_listen) && !authenticated && !options.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to serve the console on ", options.console_listen,
          ", which other machines can reach, without authentication: give --auth_token_file, "
          "--tls_client_ca_file, or --insecure"));
    }
    if (!IsLocalAddress(options.console_listen) && !options.tls.enabled() &&
        !options.auth_token_file.empty()) {
      engine::LogWarning(absl::StrCat(
          "serving the console on ", options.console_listen,
          " without TLS: bearer tokens cross the network in clear text; give --tls_cert_file and "
          "--tls_key_file unless TLS ends in front of trainerd"));
    }
    console::ConsoleOptions console = options.console;
    // The console serves TLS as the API does, with the same files, and mutual TLS with the same
    // client CA: one way to authenticate for both doors.
    console.tls.cert_file = options.tls.cert_file;
    console.tls.key_file = options.tls.key_file;
    console.tls.client_ca_file = options.tls.client_ca_file;
    console.tls.reload_interval = options.tls.reload_interval;
    console.warn = [](absl::string_view message) { engine::LogWarning(std::string(message)); };
    if (authenticator->required()) {
      // The in-process channel skips the server's authentication: the console asks first, and
      // vouches for the certificate it verified (the channel has no TLS of its own).
      console.authenticate =
          [authenticator](absl::string_view authorization,
                          absl::string_view subject) -> absl::StatusOr<console::CallMetadata> {
        std::vector<absl::string_view> values;
        if (!authorization.empty()) values.push_back(authorization);
        TRAINERD_RETURN_IF_ERROR(
            authenticator->Authenticate("/trainerd.v1.console/", values, subject).status());
        console::CallMetadata caller;
        if (!authorization.empty())
          caller.emplace_back("authorization", std::string(authorization));
        if (!subject.empty()) {
          for (auto& pair : authenticator->VouchForCertificate(subject)) {
            caller.push_back(std::move(pair));
          }
        }
        return caller;
      };
    }
    TRAINERD_ASSIGN_OR_RETURN(
        server->console_,
        console::ConsoleServer::Start(options.console_listen, console, server->InProcessChannel()));
    const std::string host = options.console_listen.substr(0, options.console_listen.rfind(':'));
    server->console_address_ = absl::StrCat(host, ":", server->console_->port());
    server->console_url_ =
        absl::StrCat(server->console_->scheme(), "://", server->console_address_, "/");
  }
  // Only now that the server is up does it report SERVING.
  HealthService* health = server->health_.get();
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
    metrics_->SetAuthRejections(nullptr);
    metrics_->SetAuthTokens(nullptr);
  }
  // The services before the engine they use (Diagnose's threads are joined here).
  system_service_.reset();
  // The ranks run for peers have stopped (the engine's Shutdown told them); their threads answer
  // their calls, then go, while the gRPC server still exists.
  peer_service_.reset();
  server_.reset();
  health_.reset();    // after the server: no call of it is left
  blocking_.reset();  // nothing is queued once the server is down; joins the pool
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
  console_.reset();  // its watches end; its pages' calls get connection errors
  health_->Shutdown();
  engine_->Shutdown();
  // Watch streams never end by themselves: end them (they saw NOT_SERVING) rather than let the
  // server wait `deadline` for them.
  health_->EndWatches();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  engine::LogInfo("server stopped");
}

void Server::Drain(absl::Duration drain_timeout, absl::Duration deadline) {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shut_down_ || server_ == nullptr) return;
    // Load balancers and Kubernetes stop sending work; the API still answers meanwhile.
    health_->Shutdown();
  }
  engine::LogInfo(absl::StrCat("draining: running jobs finish their epoch and checkpoint (at most ",
                               absl::FormatDuration(drain_timeout), ")"));
  engine_->Drain(drain_timeout);
  Shutdown(deadline);
}

void Server::Wait() { server_->Wait(); }

}  // namespace trainerd::service
