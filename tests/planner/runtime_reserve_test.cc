// The runtime reserve (planner/runtime_reserve.h): its flag, its terms per GPU, and the placement that keeps it.
// What the runtime allocates against these terms is measured in tests/runtime/runtime_reserve_test.cc.
#include "planner/runtime_reserve.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "planner/plan.h"

namespace strata::planner {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 256, kInter = 512, kHeads = 8, kKvHeads = 2, kVocab = 32000, kLayers = 8;

ModelSpec Llama(DType dtype = DType::kBFloat16) {
  nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},        {"hidden_size", kHidden},
      {"intermediate_size", kInter},           {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads},
      {"num_key_value_heads", kKvHeads},       {"vocab_size", kVocab}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, dtype);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

DeviceMap Map(const std::string& json) {
  absl::StatusOr<DeviceMap> map = ParseDeviceMap(json);
  EXPECT_TRUE(map.ok()) << map.status();
  return *map;
}

RuntimeReserve Auto(ServingLimits limits) {
  RuntimeReserve reserve;
  reserve.kind = RuntimeReserve::Kind::kAuto;
  reserve.limits = limits;
  return reserve;
}

constexpr ServingLimits kLimits{
    .max_batch = 16, .max_context = 2048, .max_batch_tokens = 512, .micro_batches = 2, .prompt_logprobs = true};

TEST(RuntimeReserveFlag, ReadsAutoNoneAndSizes) {
  EXPECT_EQ(ParseRuntimeReserve("auto")->kind, RuntimeReserve::Kind::kAuto);
  EXPECT_EQ(ParseRuntimeReserve("none")->kind, RuntimeReserve::Kind::kNone);
  absl::StatusOr<RuntimeReserve> two = ParseRuntimeReserve("2GiB");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->kind, RuntimeReserve::Kind::kFixed);
  EXPECT_EQ(two->bytes, int64_t{2} << 30);
  EXPECT_EQ(ParseRuntimeReserve("0")->bytes, 0);
  for (const char* bad : {"", "lots", "-1GiB", "2 parsecs", "auto2"}) {
    absl::StatusOr<RuntimeReserve> r = ParseRuntimeReserve(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(absl::StrCat("\"", bad, "\""))) << bad;
  }
}

TEST(RuntimeReserveTerms, EachGpuRunningAStageKeepsItsWorkAndTheLastOneTheSampler) {
  const ModelSpec spec = Llama();
  const DeviceMap map = Map(R"({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1,
      "model.layers.3": 1, "model.layers.4": 1, "model.layers.5": 1, "model.layers.6": 1, "model.layers.7": 1,
      "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1})");
  const std::map<Device, RuntimeReserveParts> reserve = RuntimeReserveBytes(spec, map, Auto(kLimits));
  ASSERT_EQ(reserve.size(), 2u);
  const RuntimeReserveParts& gpu0 = reserve.at(Device::Gpu(0));
  const RuntimeReserveParts& gpu1 = reserve.at(Device::Gpu(1));
  // One stage each, and the device's own stream.
  EXPECT_EQ(gpu0.workspaces, 2 * kWorkspaceBytesPerStream);
  EXPECT_EQ(gpu1.workspaces, 2 * kWorkspaceBytesPerStream);
  // The widest layer's activations for 512 tokens (bf16), plus the micro-batches in flight between the stages.
  const int64_t head_dim = kHidden / kHeads;
  const int64_t outs = kHeads * head_dim + 2 * kKvHeads * head_dim + kHidden + 2 * kInter + kHidden;
  const int64_t per_token = (2 * kHidden + outs + kInter) * 2 + 2 * kHidden * 4;
  EXPECT_EQ(LayerActivationBytesPerToken(spec, *NoSplitModules(spec).front()), per_token);
  const int64_t between = 2 * kLimits.micro_batches * 512 * kHidden * 2;
  EXPECT_EQ(gpu0.activations, 512 * per_token + between);
  EXPECT_EQ(gpu1.activations, gpu0.activations);
  // Attention: 16 sequences' keys and values over 2048 positions, expanded to the 8 query heads, and the
  // micro-batch's masks and float32 scores.
  EXPECT_EQ(gpu0.attention, 2 * 16 * 2048 * kHeads * head_dim * 2 + 512 * 2048 * (1 + 2 + 2 * kHeads * 4));
  // The sampler lives where lm_head runs.
  EXPECT_EQ(gpu0.sampler, 0);
  EXPECT_EQ(gpu1.sampler, 512 * kVocab * 2 + std::max(SamplerWorkBytes(16, kVocab, 17), ScoreWorkBytes(512, kVocab)));
  EXPECT_EQ(gpu1.total(), gpu1.workspaces + gpu1.activations + gpu1.attention + gpu1.sampler);
  EXPECT_THAT(gpu1.Describe(), HasSubstr("sampler"));
  EXPECT_THAT(gpu0.Describe(), ::testing::Not(HasSubstr("sampler")));
}

TEST(RuntimeReserveTerms, WithoutPromptLogprobsTheLogitsAreTheSampledRowsOnly) {
  ServingLimits limits = kLimits;
  limits.prompt_logprobs = false;
  const RuntimeReserveParts parts = RuntimeReserveBytes(Llama(), Map(R"({"": 0})"), Auto(limits)).at(Device::Gpu(0));
  EXPECT_EQ(parts.sampler, 16 * kVocab * 2 + SamplerWorkBytes(16, kVocab, 17));
  // One stage: nothing waits between stages.
  EXPECT_EQ(parts.activations, 512 * LayerActivationBytesPerToken(Llama(), *NoSplitModules(Llama()).front()));
}

TEST(RuntimeReserveTerms, OffloadedEntriesRunOnTheLowestGpuOfTheMap) {
  const DeviceMap map = Map(R"({"model.embed_tokens": 2, "model.layers.0": 2, "model.layers.1": 3,
      "model.layers.2": "cpu", "model.layers.3": "cpu", "model.layers.4": "cpu", "model.layers.5": "disk",
      "model.layers.6": "disk", "model.layers.7": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu",
      "lm_head": "cpu"})");
  const std::map<Device, RuntimeReserveParts> reserve = RuntimeReserveBytes(Llama(), map, Auto(kLimits));
  ASSERT_EQ(reserve.size(), 2u);
  // GPU 2 runs the embedding and layer 0, then (after GPU 3's layer 1) the cpu and disk layers and lm_head: two
  // stages there, and the sampler.
  EXPECT_EQ(reserve.at(Device::Gpu(2)).workspaces, 3 * kWorkspaceBytesPerStream);
  EXPECT_GT(reserve.at(Device::Gpu(2)).sampler, 0);
  EXPECT_EQ(reserve.at(Device::Gpu(3)).sampler, 0);
  // Three offload stages (cpu layers 2-4, disk layers 5-7, cpu norm and head), two slots each, less the layer
  // transformers keeps free: five times the largest offloaded unit, lm_head's [32000, 256] bfloat16.
  EXPECT_EQ(reserve.at(Device::Gpu(2)).offload, 5 * kVocab * kHidden * 2);
  EXPECT_EQ(reserve.at(Device::Gpu(3)).offload, 0);
  EXPECT_THAT(reserve.at(Device::Gpu(2)).Describe(), HasSubstr("offload"));
  // Without offloaded entries, nothing.
  EXPECT_EQ(RuntimeReserveBytes(Llama(), Map(R"({"": 0})"), Auto(kLimits)).at(Device::Gpu(0)).offload, 0);
}

TEST(RuntimeReserveTerms, NoneNoGpuAndGpusRunOnTheCpuKeepNothing) {
  const ModelSpec spec = Llama();
  EXPECT_TRUE(RuntimeReserveBytes(spec, Map(R"({"": 0})"), RuntimeReserve{}).empty());
  EXPECT_TRUE(RuntimeReserveBytes(spec, Map(R"({"": "cpu"})"), Auto(kLimits)).empty());
  RuntimeReserve on_cpu = Auto(kLimits);
  on_cpu.runs_on_cpu = {0};
  const DeviceMap two = Map(R"({"model.embed_tokens": 0, "model.layers": 0, "model.norm": 1, "model.rotary_emb": 1,
      "lm_head": 1})");
  const std::map<Device, RuntimeReserveParts> reserve = RuntimeReserveBytes(spec, two, on_cpu);
  ASSERT_EQ(reserve.size(), 1u);
  EXPECT_TRUE(reserve.count(Device::Gpu(1)));
  // A size given by hand is kept on every GPU that runs a stage, whatever runs it.
  absl::StatusOr<RuntimeReserve> fixed = ParseRuntimeReserve("300MiB");
  fixed->runs_on_cpu = {0};
  const std::map<Device, RuntimeReserveParts> kept = RuntimeReserveBytes(spec, two, *fixed);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept.at(Device::Gpu(0)).total(), 300 << 20);
  EXPECT_EQ(kept.at(Device::Gpu(1)).fixed, 300 << 20);
}

TEST(RuntimeReserveTerms, HugeLimitsSaturateInsteadOfOverflowing) {
  const ServingLimits huge{.max_batch = int64_t{1} << 40, .max_context = int64_t{1} << 40, .max_batch_tokens = 0};
  const RuntimeReserveParts parts = RuntimeReserveBytes(Llama(), Map(R"({"": 0})"), Auto(huge)).at(Device::Gpu(0));
  EXPECT_EQ(parts.total(), std::numeric_limits<int64_t>::max());
}

TEST(RuntimeReserveTerms, MoeLayersRouteEachTokenThroughTopKExperts) {
  nlohmann::json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                           {"model_type", "qwen3_moe"},
                           {"hidden_size", 128},
                           {"intermediate_size", 256},
                           {"moe_intermediate_size", 64},
                           {"num_experts", 16},
                           {"num_experts_per_tok", 4},
                           {"num_hidden_layers", 2},
                           {"num_attention_heads", 4},
                           {"num_key_value_heads", 2},
                           {"head_dim", 32},
                           {"vocab_size", 1000}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModuleSpec& layer = *NoSplitModules(*spec).front();
  // Attention and router linears (q 128, k 64, v 64, o 128, gate 16; widest 128), the residual pair, float32 norms,
  // and 4 routed copies of (gate_up 128 + 128 in, down 128 out + 64 in), router float32 logits and weights.
  const int64_t dense = (2 * 128 + (128 + 64 + 64 + 128 + 16) + 128) * 2 + 2 * 128 * 4;
  EXPECT_EQ(LayerActivationBytesPerToken(*spec, layer), dense + 4 * (128 + 128 + 128 + 64) * 2 + 2 * 16 * 4 + 4 * 16);
}

PlanRequest Request(const std::string& strategy, const std::string& max_memory, RuntimeReserve reserve) {
  PlanRequest request;
  request.device_map = *ParseDeviceMapChoice(strategy);
  request.max_memory = *ParseMaxMemory(max_memory);
  request.runtime_reserve = reserve;
  return request;
}

TEST(RuntimeReservePlan, TheReserveComesOffTheBudgetsAndIsShown) {
  const ModelSpec spec = Llama(DType::kFloat32);  // 8 layers of 1.5 MiB, embedding and lm_head 31 MiB each
  const ServingLimits limits{.max_batch = 4, .max_context = 512, .max_batch_tokens = 128, .micro_batches = 2};
  // Budgets of each GPU's reserve (when the model spans both) and 70 MiB: the model (80 MiB) fits in them, not
  // with the reserves kept.
  const std::map<Device, RuntimeReserveParts> two =
      RuntimeReserveBytes(spec, Map(R"({"model.embed_tokens": 0, "model.layers": 1, "lm_head": 1})"), Auto(limits));
  const int64_t budget0 = two.at(Device::Gpu(0)).total() + (70 << 20);
  const int64_t budget1 = two.at(Device::Gpu(1)).total() + (70 << 20);
  const std::string budgets = absl::StrCat("0=", budget0, ",1=", budget1, ",cpu=4GiB");
  for (const char* strategy : {"balanced_low_0", "balanced", "sequential"}) {
    absl::StatusOr<Plan> plain = PlaceSpec(spec, Request(strategy, budgets, {}));
    absl::StatusOr<Plan> kept = PlaceSpec(spec, Request(strategy, budgets, Auto(limits)));
    ASSERT_TRUE(plain.ok() && kept.ok()) << plain.status() << kept.status();
    int64_t gpu_planned_plain = 0, gpu_planned_kept = 0;
    for (const DeviceUsage& d : plain->devices) {
      EXPECT_EQ(d.runtime_reserve.total(), 0);
      if (d.device.is_gpu()) gpu_planned_plain += d.planned_bytes;
    }
    for (const DeviceUsage& d : kept->devices) {
      if (!d.device.is_gpu()) continue;
      gpu_planned_kept += d.planned_bytes;
      // What is placed fits the budget left after the reserve (the budget shown is the one placed with).
      EXPECT_LE(static_cast<double>(d.planned_bytes), d.budget_bytes) << strategy << " GPU " << d.device.ToString();
      const int64_t budget = d.device.index == 0 ? budget0 : budget1;
      EXPECT_LE(d.planned_bytes, std::max<int64_t>(0, budget - d.runtime_reserve.total()))
          << strategy << " GPU " << d.device.ToString();
    }
    EXPECT_LT(gpu_planned_kept, gpu_planned_plain) << strategy;
    // Every GPU that runs a stage shows its reserve; where lm_head runs, the sampler's too.
    bool any = false;
    for (const DeviceUsage& d : kept->devices) any = any || d.runtime_reserve.total() > 0;
    EXPECT_TRUE(any) << strategy;
    const nlohmann::ordered_json json = PlanToJson(*kept);
    bool json_has = false;
    for (const auto& d : json["devices"]) json_has = json_has || d["runtime_reserve_bytes"].get<int64_t>() > 0;
    EXPECT_TRUE(json_has) << json.dump();
    EXPECT_THAT(PlanToTable(spec, *kept), HasSubstr("runtime"));
    bool explained = false;
    for (const std::string& line : kept->explanation) explained = explained || line.rfind("runtime reserve: ", 0) == 0;
    EXPECT_TRUE(explained) << strategy;
  }
}

TEST(RuntimeReservePlan, AManualMapIsCheckedAgainstTheBudgetLessTheReserve) {
  const ModelSpec spec = Llama(DType::kFloat32);
  PlanRequest request = Request("balanced", "0=200MiB,cpu=4GiB", Auto(kLimits));
  request.device_map = *ParseDeviceMapChoice(R"({"": 0})");
  // The whole model (about 86 MiB) fits 200 MiB, but not with the reserve kept.
  absl::StatusOr<Plan> plan = PlaceSpec(spec, request);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("0"));
  request.runtime_reserve = {};
  EXPECT_TRUE(PlaceSpec(spec, request).ok());
}

TEST(RuntimeReservePlan, AReserveThatLeavesNoLayerOnAGpuIsNamedInTheWarning) {
  const ModelSpec spec = Llama(DType::kFloat32);
  absl::StatusOr<RuntimeReserve> fixed = ParseRuntimeReserve("299MiB");
  absl::StatusOr<Plan> plan = PlaceSpec(spec, Request("sequential", "0=300MiB,cpu=4GiB", *fixed));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->warnings.empty());
  EXPECT_THAT(plan->warnings.front(), HasSubstr("runtime reserve"));
  EXPECT_THAT(plan->warnings.front(), HasSubstr("--runtime-reserve"));
}

}  // namespace
}  // namespace strata::planner
