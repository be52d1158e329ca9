#include "server/running_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::server {

absl::StatusOr<std::unique_ptr<RunningServer>> RunningServer::Start(const ServedPlan& served,
                                                                    const ServerOptions& options) {
  std::unique_ptr<RunningServer> running(new RunningServer());
  running->service_ = std::make_unique<InferenceService>(served);

  // Both are process-wide settings read when a builder is made, so they come first.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen.ToString(), grpc::InsecureServerCredentials(), &port);
  // gRPC sets SO_REUSEPORT by default, which lets a second server bind a port that is already served
  // and split its traffic; a port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(running->service_.get());
  running->server_ = builder.BuildAndStart();
  // On failure `running` shuts down what did start as it goes out of scope.
  if (running->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", options.listen.ToString(), " (port in use?)"));
  }
  running->grpc_address_ = ListenAddress{options.listen.host, port};

  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Start(options.metrics_listen);
  if (!metrics.ok()) return metrics.status();
  running->metrics_ = *std::move(metrics);
  running->metrics_->RecordPlan(served.plan);

  // The plan is made before the server starts, so the service is ready as soon as it is reachable.
  // When weights are loaded after start-up, this is where readiness will be announced instead.
  grpc::HealthCheckServiceInterface* health = running->server_->GetHealthCheckService();
  health->SetServingStatus(v1::InferenceService::service_full_name(), true);
  health->SetServingStatus("", true);
  return running;
}

RunningServer::~RunningServer() { Shutdown(); }

void RunningServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    // Health first, so that load balancers watching it stop sending calls before the port closes.
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) health->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
  metrics_.reset();
}

}  // namespace strata::server
