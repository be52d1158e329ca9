#include "server/inference_service.h"

#include <gtest/gtest.h>

namespace strata::server {
namespace {

using planner::Device;

ServedPlan TwoGpuPlan() {
  ServedPlan served;
  served.spec.architecture = "LlamaForCausalLM";
  served.spec.dtype = planner::DType::kBFloat16;
  served.kv_cache_tokens = 128;
  planner::Plan& plan = served.plan;
  plan.strategy = planner::Strategy::kBalancedLow0;
  plan.device_map = {{"model.embed_tokens", Device::Gpu(0)},
                     {"model.layers.0", Device::Gpu(1)},
                     {"model.norm", Device::Gpu(1)},
                     {"lm_head", Device::Cpu()}};
  plan.devices = {
      {Device::Gpu(0), 1000.5, 400, 0, {}}, {Device::Gpu(1), 2000, 1500, 64, {}}, {Device::Cpu(), 9000, 400, 0, {}}};
  plan.stages = {{Device::Gpu(0), {"model.embed_tokens"}},
                 {Device::Gpu(1), {"model.layers.0", "model.norm"}},
                 {Device::Cpu(), {"lm_head"}}};
  return served;
}

TEST(DeviceMapResponse, CarriesEveryPartOfThePlan) {
  const v1::GetDeviceMapResponse response = DeviceMapResponse(TwoGpuPlan());
  EXPECT_EQ(response.strategy(), "balanced_low_0");
  ASSERT_EQ(response.device_map().size(), 4);
  EXPECT_EQ(response.device_map().at("model.embed_tokens"), "0");
  EXPECT_EQ(response.device_map().at("model.norm"), "1");
  EXPECT_EQ(response.device_map().at("lm_head"), "cpu");
  ASSERT_EQ(response.devices_size(), 3);
  EXPECT_EQ(response.devices(0).device(), "0");
  EXPECT_EQ(response.devices(0).budget_bytes(), 1000.5);  // budgets keep their fraction
  EXPECT_EQ(response.devices(1).planned_bytes(), 1500);
  EXPECT_EQ(response.devices(1).kv_cache_bytes(), 64);
  EXPECT_EQ(response.devices(2).device(), "cpu");
  ASSERT_EQ(response.stages_size(), 3);
  EXPECT_EQ(response.stages(1).device(), "1");
  ASSERT_EQ(response.stages(1).modules_size(), 2);
  EXPECT_EQ(response.stages(1).modules(1), "model.norm");
  EXPECT_EQ(response.architecture(), "LlamaForCausalLM");
  EXPECT_EQ(response.dtype(), "bfloat16");
  EXPECT_EQ(response.kv_cache_tokens(), 128);
}

}  // namespace
}  // namespace strata::server
