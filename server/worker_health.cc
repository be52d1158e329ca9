#include "server/worker_health.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "strata/v1/strata.grpc.pb.h"

namespace strata::server {

absl::StatusOr<std::unique_ptr<WorkerHealth>> WorkerHealth::Start(const ServerOptions& options) {
  std::unique_ptr<WorkerHealth> health(new WorkerHealth());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  // Plaintext: probes speak no TLS, and nothing but health answers here.
  builder.AddListeningPort(options.endpoints.listen.ToString(), grpc::InsecureServerCredentials(), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  health->server_ = builder.BuildAndStart();
  if (health->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve health checks on ", options.endpoints.listen.ToString(), " (port in use?)"));
  }
  health->address_ = ListenAddress{options.endpoints.listen.host, port};
  health->SetServing(false);
  return health;
}

WorkerHealth::~WorkerHealth() {
  if (server_ != nullptr) server_->Shutdown();
}

void WorkerHealth::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", serving);
  health->SetServingStatus(v1::InferenceService::service_full_name(), serving);
}

}  // namespace strata::server
