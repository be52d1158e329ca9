#pragma once
// strata.v1.InferenceService: the gRPC face of the server (callback API).

#include <grpcpp/grpcpp.h>

#include "server/served_plan.h"
#include "strata/v1/strata.grpc.pb.h"

namespace strata::server {

// The plan as the wire carries it.
v1::GetDeviceMapResponse DeviceMapResponse(const ServedPlan& served);

class InferenceService final : public v1::InferenceService::CallbackService {
 public:
  explicit InferenceService(const ServedPlan& served);

  grpc::ServerUnaryReactor* GetDeviceMap(grpc::CallbackServerContext* context, const v1::GetDeviceMapRequest* request,
                                         v1::GetDeviceMapResponse* response) override;

 private:
  // Built once: the plan does not change while the server runs.
  const v1::GetDeviceMapResponse device_map_;
};

}  // namespace strata::server
