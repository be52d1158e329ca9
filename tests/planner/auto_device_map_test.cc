// Behaviours of the automatic strategies that the parity suite (tests/parity) checks against
// transformers at scale; here each is pinned on a tiny model so a regression names the rule it broke.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "planner/manual_device_map.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

ModelSpec TinyLlama(bool tied, int layers = 8, DType dtype = DType::kFloat32) {
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", 64},
                           {"intermediate_size", 128},
                           {"num_hidden_layers", layers},
                           {"num_attention_heads", 4},
                           {"num_key_value_heads", 2},
                           {"vocab_size", 100},
                           {"tie_word_embeddings", tied}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, dtype);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

Plan MustPlan(const ModelSpec& spec, const std::string& strategy, const std::string& max_memory,
              int64_t kv_tokens = 0) {
  PlanRequest request;
  request.device_map = *ParseDeviceMapChoice(strategy);
  request.max_memory = *ParseMaxMemory(max_memory);
  request.kv_cache_tokens = kv_tokens;
  request.explain = true;
  absl::StatusOr<Plan> plan = PlaceSpec(spec, request);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

int64_t Planned(const Plan& plan, Device device) {
  for (const DeviceUsage& d : plan.devices)
    if (d.device == device) return d.planned_bytes;
  return 0;
}

TEST(AutoDeviceMap, WholeModelOnOneDeviceCleansToTheRoot) {
  Plan plan = MustPlan(TinyLlama(false), "sequential", "0=1GiB,cpu=1GiB");
  ASSERT_EQ(plan.device_map.size(), 1u);
  EXPECT_EQ(plan.device_map[0].first, "");
  EXPECT_EQ(plan.device_map[0].second, Device::Gpu(0));
  EXPECT_EQ(plan.stages.size(), 1u);
}

TEST(AutoDeviceMap, BalancedLow0KeepsGpu0Minimal) {
  ModelSpec spec = TinyLlama(false);
  Plan low0 = MustPlan(spec, "balanced_low_0", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB");
  Plan balanced = MustPlan(spec, "balanced", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB");
  // GPUs 1 and 2 can hold everything, so GPU 0 is given nothing to hold.
  EXPECT_EQ(Planned(low0, Device::Gpu(0)), 0);
  EXPECT_GT(Planned(low0, Device::Gpu(1)), 0);
  EXPECT_GT(Planned(low0, Device::Gpu(2)), 0);
  EXPECT_GT(Planned(balanced, Device::Gpu(0)), 0);
  EXPECT_EQ(low0.devices[0].budget_bytes, 0.0);
}

TEST(AutoDeviceMap, BalancedSpreadsLayersOverGpus) {
  Plan plan = MustPlan(TinyLlama(false), "balanced", "0=1GiB,1=1GiB,cpu=1GiB");
  int64_t gpu0 = Planned(plan, Device::Gpu(0)), gpu1 = Planned(plan, Device::Gpu(1));
  EXPECT_GT(gpu0, 0);
  EXPECT_GT(gpu1, 0);
  EXPECT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.stages.front().modules.front(), "model.embed_tokens");
  EXPECT_EQ(plan.stages.back().modules.back(), "lm_head");
}

TEST(AutoDeviceMap, TiedEmbeddingAndHeadShareADevice) {
  ModelSpec spec = TinyLlama(true);
  for (const char* strategy : {"auto", "balanced", "balanced_low_0", "sequential"}) {
    Plan plan = MustPlan(spec, strategy, "0=300KB,1=400KB,cpu=400KB");
    internal::DeviceResolver resolver(plan.device_map);
    auto head = resolver.Find("lm_head.weight");
    auto embed = resolver.Find("model.embed_tokens.weight");
    ASSERT_TRUE(head && embed) << strategy;
    EXPECT_EQ(head->second, embed->second) << strategy;
  }
}

TEST(AutoDeviceMap, OffloadsToCpuThenDisk) {
  Plan plan = MustPlan(TinyLlama(false), "sequential", "0=400KB,cpu=400KB");
  std::map<Device, int> count;
  for (const auto& [name, device] : plan.device_map) ++count[device];
  EXPECT_GT(count[Device::Gpu(0)], 0);
  EXPECT_GT(count[Device::Cpu()], 0);
  EXPECT_GT(count[Device::Disk()], 0);
  // Disk is always there, without a budget.
  EXPECT_TRUE(std::isinf(plan.devices.back().budget_bytes));
  EXPECT_EQ(plan.devices.back().device, Device::Disk());
}

TEST(AutoDeviceMap, GpuBudgetsHoldWhatIsPlanned) {
  ModelSpec spec = TinyLlama(false);
  for (const char* strategy : {"auto", "balanced", "balanced_low_0", "sequential"}) {
    Plan plan = MustPlan(spec, strategy, "0=400KB,1=500KB,2=350KB,cpu=600KB");
    for (const DeviceUsage& d : plan.devices) {
      if (d.device.kind == Device::Kind::kDisk) continue;
      EXPECT_LE(static_cast<double>(d.planned_bytes), d.budget_bytes) << strategy << " " << d.device.ToString();
    }
  }
}

TEST(AutoDeviceMap, KvCacheTokensReserveCacheOnEachGpu) {
  ModelSpec spec = TinyLlama(false);
  Plan without = MustPlan(spec, "sequential", "0=600KB,1=600KB,cpu=10MB");
  Plan with = MustPlan(spec, "sequential", "0=600KB,1=600KB,cpu=10MB", /*kv_tokens=*/64);
  // K and V, 2 KV heads x 16 head_dim x 4 bytes x 64 tokens per layer.
  const int64_t per_layer = 2 * 2 * 16 * 4 * 64;
  int64_t gpu_bytes_without = 0, gpu_bytes_with = 0;
  for (const DeviceUsage& d : with.devices) {
    if (!d.device.is_gpu()) continue;
    EXPECT_EQ(d.kv_cache_bytes % per_layer, 0);
    // Weights plus the cache fit the device's max_memory.
    EXPECT_LE(static_cast<double>(d.planned_bytes + d.kv_cache_bytes), 600000.0);
    gpu_bytes_with += d.planned_bytes;
  }
  for (const DeviceUsage& d : without.devices)
    if (d.device.is_gpu()) gpu_bytes_without += d.planned_bytes;
  EXPECT_GT(with.devices[0].kv_cache_bytes, 0);
  EXPECT_LT(gpu_bytes_with, gpu_bytes_without);
}

TEST(AutoDeviceMap, KvCapacityIsTheRoomEachGpuLeavesAndThePlansIsTheTightest) {
  ModelSpec spec = TinyLlama(false);
  Plan plan = MustPlan(spec, "sequential", "0=600KB,1=600KB,cpu=10MB");
  // K and V of one token in one layer: 2 KV heads x 16 head_dim x 4 bytes, twice.
  const int64_t per_layer_token = 2 * 2 * 16 * 4;
  std::map<Device, int> layers;
  internal::DeviceResolver resolver(plan.device_map);
  for (int l = 0; l < 8; ++l) {
    const Device device = resolver.Find("model.layers." + std::to_string(l))->second;
    ++layers[device.is_gpu() ? device : Device::Gpu(0)];  // cpu and disk layers keep their cache on GPU 0
  }
  ASSERT_TRUE(plan.kv_capacity.has_value());
  int64_t tightest = std::numeric_limits<int64_t>::max();
  for (const DeviceUsage& d : plan.devices) {
    if (!d.device.is_gpu() || layers[d.device] == 0) {
      EXPECT_EQ(d.kv_capacity_tokens, -1) << d.device.ToString();
      continue;
    }
    const int64_t expected = (600000 - d.planned_bytes) / (layers[d.device] * per_layer_token);
    EXPECT_EQ(d.kv_capacity_tokens, expected) << d.device.ToString();
    tightest = std::min(tightest, expected);
  }
  EXPECT_EQ(plan.kv_capacity->tokens, tightest);
  const nlohmann::ordered_json json = PlanToJson(plan);
  EXPECT_EQ(json["kv_capacity"]["tokens"], tightest);
  EXPECT_EQ(json["kv_capacity"]["limited_by"], plan.kv_capacity->limited_by.ToString());
  EXPECT_NE(PlanToTable(spec, plan).find("kv cache: room for " + std::to_string(tightest) + " tokens"),
            std::string::npos);
  // A plan with a KV reserve leaves room for at least what it reserved.
  Plan reserved = MustPlan(spec, "sequential", "0=600KB,1=600KB,cpu=10MB", /*kv_tokens=*/64);
  ASSERT_TRUE(reserved.kv_capacity.has_value());
  EXPECT_GE(reserved.kv_capacity->tokens, 64);
  // Without GPUs, nothing to say.
  EXPECT_FALSE(MustPlan(spec, "sequential", "cpu=10MB").kv_capacity.has_value());
}

TEST(AutoDeviceMap, ExplainSaysWhyEachModuleWentWhere) {
  Plan plan = MustPlan(TinyLlama(false), "balanced_low_0", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB");
  ASSERT_FALSE(plan.explanation.empty());
  bool mentions_layer = false, mentions_balance = false;
  for (const std::string& line : plan.explanation) {
    mentions_layer = mentions_layer || line.find("model.layers.0 -> ") != std::string::npos;
    mentions_balance = mentions_balance || line.find("GPU 0") != std::string::npos;
  }
  EXPECT_TRUE(mentions_layer);
  EXPECT_TRUE(mentions_balance);
}

TEST(AutoDeviceMap, JsonHasHfDeviceMapValues) {
  Plan plan = MustPlan(TinyLlama(false), "sequential", "0=400KB,cpu=400KB");
  nlohmann::ordered_json json = PlanToJson(plan);
  for (const auto& [name, value] : json["device_map"].items()) {
    EXPECT_TRUE(value.is_number_integer() || value == "cpu" || value == "disk") << name << ": " << value;
  }
  EXPECT_EQ(json["devices"].back()["device"], "disk");
  EXPECT_TRUE(json["devices"].back()["budget_bytes"].is_null());
}

}  // namespace
}  // namespace strata::planner
