#include "server/inference_service.h"

#include <string>

namespace strata::server {

v1::GetDeviceMapResponse DeviceMapResponse(const ServedPlan& served) {
  const planner::Plan& plan = served.plan;
  v1::GetDeviceMapResponse response;
  auto& device_map = *response.mutable_device_map();
  for (const auto& [module, device] : plan.device_map) {
    device_map[module] = device.ToString();
  }
  response.set_strategy(std::string(planner::StrategyName(plan.strategy)));
  for (const planner::DeviceUsage& usage : plan.devices) {
    v1::DeviceUsage& out = *response.add_devices();
    out.set_device(usage.device.ToString());
    out.set_budget_bytes(usage.budget_bytes);
    out.set_planned_bytes(usage.planned_bytes);
    out.set_kv_cache_bytes(usage.kv_cache_bytes);
  }
  for (const planner::Stage& stage : plan.stages) {
    v1::Stage& out = *response.add_stages();
    out.set_device(stage.device.ToString());
    for (const std::string& module : stage.modules) out.add_modules(module);
  }
  response.set_architecture(served.spec.architecture);
  response.set_dtype(std::string(planner::DTypeName(served.spec.dtype)));
  response.set_kv_cache_tokens(served.kv_cache_tokens);
  return response;
}

InferenceService::InferenceService(const ServedPlan& served) : device_map_(DeviceMapResponse(served)) {}

grpc::ServerUnaryReactor* InferenceService::GetDeviceMap(grpc::CallbackServerContext* context,
                                                         const v1::GetDeviceMapRequest* /*request*/,
                                                         v1::GetDeviceMapResponse* response) {
  *response = device_map_;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace strata::server
