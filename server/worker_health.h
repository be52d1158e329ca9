#pragma once
// A group worker's health port (issue 24): strata-server --rank N serves no Generate, but Kubernetes probes its
// pod like the leader's. The gRPC health service alone, on --listen: "" and strata.v1.InferenceService are
// NOT_SERVING until the worker has loaded its stages, SERVING while it serves them, NOT_SERVING once its group
// ended (the process then exits).

#include <memory>

#include "absl/status/statusor.h"
#include "server/flags.h"

namespace grpc {
class Server;
}

namespace strata::server {

class WorkerHealth {
 public:
  // Errors: the port cannot be bound (UNAVAILABLE naming it).
  static absl::StatusOr<std::unique_ptr<WorkerHealth>> Start(const ServerOptions& options);
  ~WorkerHealth();
  void SetServing(bool serving);
  ListenAddress address() const { return address_; }

 private:
  WorkerHealth() = default;
  std::unique_ptr<grpc::Server> server_;
  ListenAddress address_;
};

}  // namespace strata::server
