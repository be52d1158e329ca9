#pragma once
// absl::Status to gRPC's status: the two share the canonical code numbers, so the code carries over as it is
// and the message names what was wrong, as every strata error does.

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace strata::server {

inline grpc::StatusCode ToGrpc(absl::StatusCode code) { return static_cast<grpc::StatusCode>(static_cast<int>(code)); }

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(ToGrpc(status.code()), std::string(status.message()));
}

}  // namespace strata::server
