#pragma once
// A started strata-server: the gRPC server (InferenceService, health checking, reflection) and the
// /metrics endpoint, for one ServedPlan.

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/statusor.h"
#include "server/flags.h"
#include "server/inference_service.h"
#include "server/metrics.h"
#include "server/served_plan.h"

namespace strata::server {

class RunningServer {
 public:
  // Binds both addresses and starts serving `served` (which must outlive the server). Unavailable when
  // an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<RunningServer>> Start(const ServedPlan& served, const ServerOptions& options);

  ~RunningServer();  // Shuts down if Shutdown was not called.

  // Marks every service NOT_SERVING, finishes in-flight calls (waiting a few seconds at most) and
  // stops /metrics. Idempotent.
  void Shutdown();

  // The bound addresses, with the ports the system picked where port 0 was asked for.
  const ListenAddress& grpc_address() const { return grpc_address_; }
  const ListenAddress& metrics_address() const { return metrics_->address(); }

 private:
  RunningServer() = default;

  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Metrics> metrics_;
  ListenAddress grpc_address_;
  bool shut_down_ = false;
};

}  // namespace strata::server
