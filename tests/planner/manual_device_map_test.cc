// Manual maps: each way a hand-written hf_device_map can be wrong is an error naming what is wrong.
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "planner/plan.h"

namespace strata::planner {
namespace {

ModelSpec TinyLlama(bool tied) {
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"hidden_size", 64},
                           {"intermediate_size", 128},
                           {"num_hidden_layers", 2},
                           {"num_attention_heads", 4},
                           {"vocab_size", 1000},
                           {"tie_word_embeddings", tied}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

absl::StatusOr<Plan> PlanManual(const ModelSpec& spec, const std::string& map, const std::string& max_memory = "") {
  PlanRequest request;
  absl::StatusOr<DeviceMapChoice> choice = ParseDeviceMapChoice(map);
  if (!choice.ok()) return choice.status();
  request.device_map = *choice;
  if (!max_memory.empty()) request.max_memory = *ParseMaxMemory(max_memory);
  return PlaceSpec(spec, request);
}

void ExpectError(const absl::StatusOr<Plan>& plan, const std::string& mentions) {
  ASSERT_FALSE(plan.ok()) << "expected an error mentioning " << mentions;
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find(mentions), std::string::npos) << plan.status();
}

constexpr char kTwoStages[] =
    R"({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
        "model.rotary_emb": 1, "lm_head": 1})";

TEST(ManualDeviceMap, ValidMapKeepsItsEntriesAndOrder) {
  absl::StatusOr<Plan> plan = PlanManual(TinyLlama(false), kTwoStages, "0=1GiB,1=1GiB,cpu=1GiB");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->device_map.size(), 6u);
  EXPECT_EQ(plan->device_map[0].first, "model.embed_tokens");
  EXPECT_EQ(plan->device_map[5].first, "lm_head");
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[1].device, Device::Gpu(1));
}

TEST(ManualDeviceMap, WholeModelOnOneDevice) {
  absl::StatusOr<Plan> gpu = PlanManual(TinyLlama(false), R"({"": 0})");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->stages.size(), 1u);
  absl::StatusOr<Plan> cpu = PlanManual(TinyLlama(false), R"({"": "cpu"})");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->stages[0].device, Device::Cpu());
}

TEST(ManualDeviceMap, UncoveredParameterIsNamed) {
  ExpectError(PlanManual(TinyLlama(false), R"({"model": 0})"), "lm_head.weight is not covered");
}

TEST(ManualDeviceMap, ParameterCoveredTwiceIsNamed) {
  ExpectError(PlanManual(TinyLlama(false), R"({"model": 0, "model.layers.1": 1, "lm_head": 0})"),
              "\"model.layers.1\" is covered by two entries");
  ExpectError(PlanManual(TinyLlama(false), R"({"": 0, "lm_head": 1})"), "covered by two entries");
}

TEST(ManualDeviceMap, DuplicateKeyIsNamed) {
  ExpectError(PlanManual(TinyLlama(false), R"({"model": 0, "model": 1, "lm_head": 0})"),
              "module \"model\" is given twice");
}

TEST(ManualDeviceMap, UnknownModuleIsNamed) {
  ExpectError(PlanManual(TinyLlama(false), R"({"model": 0, "lm_head": 0, "model.layers.7": 1})"),
              "unknown module \"model.layers.7\"");
}

TEST(ManualDeviceMap, UnknownDeviceIsNamed) {
  ExpectError(PlanManual(TinyLlama(false), R"({"model": "tpu", "lm_head": 0})"), "\"tpu\"");
  ExpectError(PlanManual(TinyLlama(false), R"({"model": 0, "lm_head": 3})", "0=1GiB,1=1GiB,cpu=1GiB"),
              "unknown device 3");
}

TEST(ManualDeviceMap, TiedWeightsSplitAcrossDevicesAreNamed) {
  ExpectError(PlanManual(TinyLlama(true), kTwoStages, "0=1GiB,1=1GiB,cpu=1GiB"), "tied weights lm_head.weight (on 1");
}

TEST(ManualDeviceMap, DeviceOverItsMaxMemoryIsNamed) {
  ExpectError(PlanManual(TinyLlama(false), kTwoStages, "0=100KB,1=1GiB,cpu=1GiB"), "device 0 is over its max_memory");
}

TEST(ManualDeviceMap, NotAnObjectOrBadJson) {
  ExpectError(PlanManual(TinyLlama(false), R"({"model": 0,)"), "not valid JSON");
  ExpectError(PlanManual(TinyLlama(false), "gready"), "unknown strategy \"gready\"");
  ExpectError(PlanManual(TinyLlama(false), "@/nonexistent/map.json"), "/nonexistent/map.json: cannot open");
}

}  // namespace
}  // namespace strata::planner
