// Quantized checkpoints: quantization_config parsing (every refusal named), the module tree under the two
// sizings, the quantized linears' stored tensors and the safetensors header check against them (tiny fake
// checkpoints written into a temporary directory, as checkpoint_check_test.cc does).

#include "planner/quantization.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/inventory.h"
#include "planner/model_spec.h"
#include "planner/quantized_spec.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Two layers, hidden 256, 4 heads of 64, 2 KV heads, intermediate 320, vocab 1000: 128-blocks leave partial
// blocks on the intermediate side.
json LlamaConfig(const json& quantization) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 256},
          {"intermediate_size", 320},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 1000},
          {"torch_dtype", "bfloat16"},
          {"quantization_config", quantization}};
}

json Fp8(const json& extra = json::object()) {
  json q = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
  q.update(extra);
  return q;
}

const ModuleSpec* FindModule(const ModuleSpec& m, const std::string& name) {
  if (m.name == name) return &m;
  for (const ModuleSpec& c : m.children) {
    if (const ModuleSpec* found = FindModule(c, name)) return found;
  }
  return nullptr;
}

std::string Describe(const ModuleSpec& m) {
  std::string out;
  for (const TensorSpec& t : m.parameters) {
    out += t.name + "[";
    for (size_t i = 0; i < t.shape.size(); ++i) out += (i ? "," : "") + std::to_string(t.shape[i]);
    out += "]" + std::string(DTypeName(t.dtype)) + " ";
  }
  return out;
}

absl::Status ParseError(const json& q) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed = ParseQuantizationConfig(json{{"quantization_config", q}});
  return parsed.status();
}

TEST(QuantizationConfigTest, NoQuantizationConfigIsDense) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed = ParseQuantizationConfig(json::object());
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->has_value());
  parsed = ParseQuantizationConfig(json{{"quantization_config", nullptr}});
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->has_value());
}

TEST(QuantizationConfigTest, Fp8Defaults) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed =
      ParseQuantizationConfig(json{{"quantization_config", {{"quant_method", "fp8"}}}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const QuantizationConfig& q = **parsed;
  EXPECT_EQ(q.method, QuantMethod::kFp8);
  EXPECT_EQ(q.block_n, 128);
  EXPECT_EQ(q.block_k, 128);
  EXPECT_TRUE(q.default_skips);
  EXPECT_FALSE(q.scale_ue8m0);
  EXPECT_FALSE(q.dequantize);
}

TEST(QuantizationConfigTest, Fp8FieldsRead) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed =
      ParseQuantizationConfig(json{{"quantization_config", Fp8({{"weight_block_size", {64, 32}},
                                                                {"scale_fmt", "ue8m0"},
                                                                {"modules_to_not_convert", {"lm_head"}},
                                                                {"dequantize", true},
                                                                {"fmt", "e4m3"}})}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const QuantizationConfig& q = **parsed;
  EXPECT_EQ(q.block_n, 64);
  EXPECT_EQ(q.block_k, 32);
  EXPECT_TRUE(q.scale_ue8m0);
  EXPECT_TRUE(q.dequantize);
  EXPECT_FALSE(q.default_skips);
  EXPECT_THAT(q.not_converted, ::testing::ElementsAre("lm_head"));
}

TEST(QuantizationConfigTest, Fp8IgnoredLayersIsTheSkipList) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed =
      ParseQuantizationConfig(json{{"quantization_config", Fp8({{"ignored_layers", {"model.layers.0.mlp"}}})}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE((*parsed)->default_skips);
  EXPECT_THAT((*parsed)->not_converted, ::testing::ElementsAre("model.layers.0.mlp"));
}

TEST(QuantizationConfigTest, RefusalsNameTheField) {
  struct Case {
    json q;
    std::string message;
  };
  const std::vector<Case> cases = {
      {json("fp8"), "config.json: quantization_config: must be an object"},
      {json::object(), "quantization_config.quant_method: is missing"},
      {{{"quant_method", "bitsandbytes"}},
       "quantization_config.quant_method: \"bitsandbytes\" is not supported (supported: fp8, compressed-tensors, awq, "
       "gptq, mxfp4)"},
      {{{"quant_method", 8}}, "quantization_config.quant_method: must be a string"},
      {Fp8({{"activation_scheme", "static"}}), "quantization_config.activation_scheme: \"static\""},
      {Fp8({{"activation_scheme", "weird"}}), "quantization_config.activation_scheme: \"weird\" is not supported"},
      {Fp8({{"weight_block_size", {128}}}), "quantization_config.weight_block_size: must be a list of two"},
      {Fp8({{"weight_block_size", {128, 0}}}), "quantization_config.weight_block_size[1]: must be an integer"},
      {Fp8({{"weight_block_size", nullptr}}), "quantization_config.weight_block_size: null"},
      {Fp8({{"scale_fmt", "e5m2"}}),
       "quantization_config.scale_fmt: \"e5m2\" is not supported (supported: float, ue8m0)"},
      {Fp8({{"fmt", "e5m2"}}), "quantization_config.fmt: \"e5m2\" is not supported (supported: e4m3)"},
      {Fp8({{"expert_dtype", "fp4"}}), "quantization_config.expert_dtype: \"fp4\" is not supported"},
      {Fp8({{"modules_to_not_convert", "lm_head"}}), "quantization_config.modules_to_not_convert: must be a list"},
      {Fp8({{"modules_to_not_convert", {1}}}), "quantization_config.modules_to_not_convert[0]: must be a string"},
      {Fp8({{"modules_to_convert", {"model.embed_tokens"}}}), "quantization_config.modules_to_convert: FP8 embeddings"},
      {Fp8({{"dequantize", "yes"}}), "quantization_config.dequantize: must be true or false"},
  };
  for (const Case& c : cases) {
    absl::Status s = ParseError(c.q);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.q.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.q.dump();
  }
}

TEST(QuantizedSizingTest, Parses) {
  EXPECT_EQ(*ParseQuantizedSizing("packed"), QuantizedSizing::kPacked);
  EXPECT_EQ(*ParseQuantizedSizing("transformers"), QuantizedSizing::kTransformers);
  EXPECT_THAT(std::string(ParseQuantizedSizing("hf").status().message()), HasSubstr("packed or transformers"));
}

TEST(QuantizedSpecTest, Fp8PackedTreeHoldsWhatTheFilesHold) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(LlamaConfig(Fp8()), DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->quantization.has_value());
  // 7 linears per layer; lm_head is a default skip.
  EXPECT_EQ(spec->quantization->linears.size(), 14u);
  EXPECT_FALSE(spec->quantization->linears.contains("lm_head.weight"));
  const QuantizedLinear& gate = spec->quantization->linears.at("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.module, "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(gate.layout, QuantLayout::kFp8Block);
  EXPECT_EQ(gate.out_features, 320);
  EXPECT_EQ(gate.in_features, 256);
  EXPECT_EQ(gate.weight, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.scale, "model.layers.0.mlp.gate_proj.weight_scale_inv");
  EXPECT_EQ(gate.scale_dtype, DType::kFloat32);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.gate_proj")),
            "weight[320,256]float8_e4m3fn weight_scale_inv[3,2]float32 ");
  EXPECT_EQ(Describe(*FindModule(spec->root, "lm_head")), "weight[1000,256]bfloat16 ");
  EXPECT_EQ(spec->quantization->sizing, QuantizedSizing::kPacked);
}

TEST(QuantizedSpecTest, Fp8TransformersSizingDependsOnTheMachine) {
  json config = LlamaConfig(Fp8());
  config["attention_bias"] = true;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/true);
  // FP8Linear: weight, bias (nn.Linear's slots), weight_scale_inv float32.
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.1.self_attn.k_proj")),
            "weight[128,256]float8_e4m3fn bias[128]bfloat16 weight_scale_inv[1,2]float32 ");
  EXPECT_FALSE(spec->quantization->planned_dense);
  // Without a GPU of compute capability 8.9, transformers dequantizes: the dense bf16 model.
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/false);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.1.self_attn.k_proj")),
            "weight[128,256]bfloat16 bias[128]bfloat16 ");
  EXPECT_TRUE(spec->quantization->planned_dense);
  EXPECT_THAT(QuantizationSummary(*spec), HasSubstr("planned dense in bfloat16"));
  // And back.
  SizeQuantizedSpec(*spec, QuantizedSizing::kPacked, /*keeps_fp8=*/false);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.1.self_attn.k_proj")),
            "bias[128]bfloat16 weight[128,256]float8_e4m3fn weight_scale_inv[1,2]float32 ");
}

TEST(QuantizedSpecTest, Fp8DequantizeInTheConfigPlansDense) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(LlamaConfig(Fp8({{"dequantize", true}})), DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/true);
  EXPECT_TRUE(spec->quantization->planned_dense);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.up_proj")), "weight[320,256]bfloat16 ");
}

TEST(QuantizedSpecTest, Fp8SkipListsMatchAsTransformersMatches) {
  // A list replaces the default skips: lm_head is converted.
  absl::StatusOr<ModelSpec> spec =
      ModelSpecFromConfig(LlamaConfig(Fp8({{"modules_to_not_convert", json::array()}})), DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->quantization->linears.contains("lm_head.weight"));
  // Prefix to a module boundary, as a regex, or a plain suffix.
  spec = ModelSpecFromConfig(LlamaConfig(Fp8({{"modules_to_not_convert",
                                               {"model.layers.1", "model.layers.*.k_proj", "down_proj", "mlp.gate"}}})),
                             DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto& linears = spec->quantization->linears;
  EXPECT_FALSE(linears.contains("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_FALSE(linears.contains("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_FALSE(linears.contains("model.layers.0.mlp.down_proj.weight"));
  EXPECT_TRUE(linears.contains("model.layers.0.mlp.gate_proj.weight"));  // "mlp.gate" stops at a boundary
  EXPECT_TRUE(linears.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(linears.contains("lm_head.weight"));
  EXPECT_EQ(linears.size(), 6u);  // layer 0: q, v, o, gate, up; lm_head
}

TEST(QuantizedSpecTest, Fp8MoeExpertsAreStoredPerExpert) {
  json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                 {"model_type", "qwen3_moe"},
                 {"hidden_size", 256},
                 {"intermediate_size", 320},
                 {"moe_intermediate_size", 192},
                 {"num_hidden_layers", 1},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"head_dim", 64},
                 {"num_experts", 3},
                 {"num_experts_per_tok", 2},
                 {"vocab_size", 1000},
                 {"torch_dtype", "bfloat16"},
                 {"quantization_config", Fp8()}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto& linears = spec->quantization->linears;
  EXPECT_EQ(linears.size(), 4u + 9u);  // q, k, v, o and 3 x (gate, up, down)
  const QuantizedLinear& down = linears.at("model.layers.0.mlp.experts.2.down_proj.weight");
  EXPECT_EQ(down.scale, "model.layers.0.mlp.experts.2.down_proj.weight_scale_inv");
  EXPECT_EQ(down.out_features, 256);
  EXPECT_EQ(down.in_features, 192);
  // Packed: what the files hold expert by expert (gate's and up's grids apiece: 2 x 2 rows, not 3).
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.experts")),
            "gate_up_proj_weight[3,2,192,256]float8_e4m3fn gate_up_proj_weight_scale_inv[3,2,2,2]float32 "
            "down_proj_weight[3,256,192]float8_e4m3fn down_proj_weight_scale_inv[3,2,2]float32 ");
  // FP8Experts: the fused gate_up grid is ceil(2I / 128) rows.
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/true);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.experts")),
            "gate_up_proj[3,384,256]float8_e4m3fn gate_up_proj_scale_inv[3,3,2]float32 "
            "down_proj[3,256,192]float8_e4m3fn down_proj_scale_inv[3,2,2]float32 ");
  const std::map<std::string, ExpectedTensor> stored = CheckpointTensors(*spec);
  EXPECT_EQ(stored.at("model.layers.0.mlp.experts.1.gate_proj.weight").stored_dtypes,
            std::vector<std::string>{"F8_E4M3"});
  EXPECT_EQ(stored.at("model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_FALSE(stored.contains("model.layers.0.mlp.experts.gate_up_proj_scale_inv"));
  EXPECT_FALSE(stored.contains("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(stored.contains("model.layers.0.mlp.gate.weight"));
}

json CtWeights(const json& extra = json::object()) {
  json w = {{"num_bits", 4},     {"type", "int"},    {"symmetric", true},   {"strategy", "group"},
            {"group_size", 128}, {"dynamic", false}, {"actorder", nullptr}, {"observer", "minmax"}};
  w.update(extra);
  return w;
}

json Ct(const json& weights, const std::string& format, const json& input_activations = nullptr,
        const json& ignore = {"lm_head"}) {
  return {{"quant_method", "compressed-tensors"},
          {"format", format},
          {"quantization_status", "compressed"},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", input_activations},
              {"output_activations", nullptr}}}}}};
}

json Fp8Token() {
  return {{"dynamic", true}, {"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"symmetric", true}};
}

TEST(QuantizationConfigTest, CompressedTensorsW4A16) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed =
      ParseQuantizationConfig(json{{"quantization_config", Ct(CtWeights(), "pack-quantized")}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const QuantizationConfig& q = **parsed;
  EXPECT_EQ(q.method, QuantMethod::kCompressedTensors);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_TRUE(q.symmetric);
  EXPECT_FALSE(q.float_weights);
  EXPECT_EQ(q.strategy, "group");
  EXPECT_THAT(q.targets, ::testing::ElementsAre("Linear"));
  EXPECT_THAT(q.not_converted, ::testing::ElementsAre("lm_head"));
}

TEST(QuantizationConfigTest, CompressedTensorsFp8Dynamic) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed = ParseQuantizationConfig(
      json{{"quantization_config", Ct(CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}),
                                      "float-quantized", Fp8Token())}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE((*parsed)->float_weights);
  EXPECT_EQ((*parsed)->strategy, "channel");
  // run_compressed false is dequantize.
  json q = Ct(CtWeights(), "pack-quantized");
  q["run_compressed"] = false;
  parsed = ParseQuantizationConfig(json{{"quantization_config", q}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE((*parsed)->dequantize);
}

TEST(QuantizationConfigTest, CompressedTensorsRefusalsNameTheField) {
  const std::string w = "quantization_config.config_groups.group_0.weights.";
  auto with = [](json q, const std::string& key, const json& value) {
    q[key] = value;
    return q;
  };
  json two_groups = Ct(CtWeights(), "pack-quantized");
  two_groups["config_groups"]["group_1"] = two_groups["config_groups"]["group_0"];
  json static_input = Ct(CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}), "float-quantized",
                         json{{"dynamic", false}, {"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}});
  json int_input = Ct(CtWeights({{"num_bits", 8}, {"strategy", "channel"}}), "pack-quantized",
                      json{{"dynamic", true}, {"num_bits", 8}, {"type", "int"}, {"strategy", "token"}});
  json no_weights = Ct(CtWeights(), "pack-quantized");
  no_weights["config_groups"]["group_0"].erase("weights");
  const std::vector<std::pair<json, std::string>> cases = {
      {Ct(CtWeights({{"num_bits", 3}}), "pack-quantized"), w + "num_bits: \"3\" is not supported (supported: 4, 8)"},
      {Ct(CtWeights({{"num_bits", 4}, {"type", "float"}, {"strategy", "channel"}}), "float-quantized"),
       w + "num_bits: \"4\" is not supported (supported: 8)"},
      {Ct(CtWeights({{"type", "nf4"}}), "pack-quantized"),
       w + "type: \"nf4\" is not supported (supported: int, float)"},
      {Ct(CtWeights({{"strategy", "tensor"}}), "pack-quantized"),
       w + "strategy: \"tensor\" is not supported (supported: group, channel)"},
      {Ct(CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "group"}}), "float-quantized"),
       w + "strategy: \"group\" is not supported (supported: channel, tensor, block)"},
      {Ct(CtWeights({{"group_size", nullptr}}), "pack-quantized"), w + "group_size: is missing"},
      {Ct(CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}}), "float-quantized"),
       w + "block_structure: must be [block_n, block_k]"},
      {Ct(CtWeights({{"actorder", "group"}}), "pack-quantized"), w + "actorder: \"group\" is not supported"},
      {Ct(CtWeights({{"dynamic", true}}), "pack-quantized"), w + "dynamic: weights must be stored quantized"},
      {Ct(CtWeights({{"scale_dtype", "torch.float32"}}), "pack-quantized"), w + "scale_dtype: is not supported"},
      {Ct(CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", false}}),
          "float-quantized"),
       w + "symmetric: false is not supported for float"},
      {Ct(CtWeights(), "marlin-24"),
       "quantization_config.format: \"marlin-24\" is not supported (supported: pack-quantized, float-quantized)"},
      {Ct(CtWeights(), "float-quantized"),
       "quantization_config.format: \"float-quantized\" does not store int weights (expected \"pack-quantized\")"},
      {static_input, "quantization_config.config_groups.group_0.input_activations.dynamic: false (static activation"},
      {int_input, "quantization_config.config_groups.group_0.input_activations: quantized activations are supported"},
      {no_weights, "quantization_config.config_groups.group_0.weights: is missing"},
      {two_groups, "quantization_config.config_groups: has 2 groups"},
      {with(Ct(CtWeights(), "pack-quantized"), "kv_cache_scheme", json{{"num_bits", 8}}),
       "quantization_config.kv_cache_scheme: a quantized KV cache is not supported"},
      {with(Ct(CtWeights(), "pack-quantized"), "quantization_status", "frozen"),
       "quantization_config.quantization_status: \"frozen\" is not supported (supported: compressed)"},
      {with(Ct(CtWeights(), "pack-quantized"), "sparsity_config", json{{"format", "sparse-24-bitmask"}}),
       "quantization_config.sparsity_config: sparse checkpoints are not supported"},
      {with(Ct(CtWeights(), "pack-quantized"), "config_groups", nullptr),
       "quantization_config.config_groups: is missing"},
      {with(Ct(CtWeights(), "pack-quantized"), "ignore", "lm_head"), "quantization_config.ignore: must be a list"},
  };
  for (const auto& [q, message] : cases) {
    absl::Status s = ParseError(q);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << q.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr(message)) << q.dump();
  }
}

TEST(QuantizedSpecTest, CompressedTensorsPackedAndTransformersTrees) {
  json config = LlamaConfig(Ct(CtWeights({{"group_size", 64}, {"symmetric", false}}), "pack-quantized"));
  config["attention_bias"] = true;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.size(), 14u);  // lm_head ignored
  const QuantizedLinear& down = spec->quantization->linears.at("model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(down.layout, QuantLayout::kCompressedPacked);
  EXPECT_EQ(down.weight, "model.layers.0.mlp.down_proj.weight_packed");
  EXPECT_EQ(down.zero_point, "model.layers.0.mlp.down_proj.weight_zero_point");
  EXPECT_EQ(down.shape, "model.layers.0.mlp.down_proj.weight_shape");
  EXPECT_EQ(down.group_size, 64);
  EXPECT_FALSE(down.symmetric);
  // Packed: the zero points packed along N, as the files hold them.
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.self_attn.k_proj")),
            "bias[128]bfloat16 weight_packed[128,32]int32 weight_scale[128,4]bfloat16 "
            "weight_zero_point[16,4]int32 weight_shape[2]int64 ");
  // transformers: compressed-tensors registers one int8 zero point per row and group.
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/false);
  EXPECT_FALSE(spec->quantization->planned_dense);  // no machine dependence
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.self_attn.k_proj")),
            "bias[128]bfloat16 weight_scale[128,4]bfloat16 weight_zero_point[128,4]int8 weight_packed[128,32]int32 "
            "weight_shape[2]int64 ");
  // Channel-wise: one group of K.
  spec = ModelSpecFromConfig(LlamaConfig(Ct(CtWeights({{"num_bits", 8}, {"strategy", "channel"}}), "pack-quantized")),
                             DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.down_proj")),
            "weight_packed[256,80]int32 weight_scale[256,1]bfloat16 weight_shape[2]int64 ");
}

TEST(QuantizedSpecTest, CompressedTensorsFp8Strategies) {
  const std::vector<std::pair<json, std::string>> cases = {
      {CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}),
       "weight[256,320]float8_e4m3fn weight_scale[256,1]bfloat16 "},
      {CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}}),
       "weight[256,320]float8_e4m3fn weight_scale[1]bfloat16 "},
      {CtWeights({{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}, {"block_structure", {128, 128}}}),
       "weight[256,320]float8_e4m3fn weight_scale[2,3]bfloat16 "},
  };
  for (const auto& [weights, tree] : cases) {
    absl::StatusOr<ModelSpec> spec =
        ModelSpecFromConfig(LlamaConfig(Ct(weights, "float-quantized", Fp8Token())), DType::kBFloat16);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.1.mlp.down_proj")), tree) << weights.dump();
    EXPECT_EQ(spec->quantization->linears.at("model.layers.1.mlp.down_proj.weight").scale,
              "model.layers.1.mlp.down_proj.weight_scale");
  }
}

TEST(QuantizedSpecTest, CompressedTensorsMatchesTargetsAndIgnoreAsItsLibrary) {
  // Exact names, "re:" prefixes matched from the start (no boundary), class names.
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(
      LlamaConfig(Ct(CtWeights(), "pack-quantized", nullptr,
                     {"lm_head", "re:model.layers.1", "model.layers.0.mlp.up_proj", "mlp.gate_proj"})),
      DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto& linears = spec->quantization->linears;
  EXPECT_EQ(linears.size(), 6u);  // layer 0 minus up_proj ("mlp.gate_proj" names no module exactly)
  EXPECT_TRUE(linears.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(linears.contains("model.layers.0.mlp.up_proj.weight"));
  // Qwen3-MoE: each expert's projections as the checkpoint stores them; the router is not a Linear.
  json moe = {{"architectures", {"Qwen3MoeForCausalLM"}},
              {"model_type", "qwen3_moe"},
              {"hidden_size", 256},
              {"intermediate_size", 320},
              {"moe_intermediate_size", 128},
              {"num_hidden_layers", 1},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 64},
              {"num_experts", 2},
              {"num_experts_per_tok", 1},
              {"vocab_size", 1000},
              {"torch_dtype", "bfloat16"},
              {"quantization_config", Ct(CtWeights(), "pack-quantized", nullptr, {"lm_head", "re:.*mlp.gate$"})}};
  spec = ModelSpecFromConfig(moe, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.at("model.layers.0.mlp.experts.1.up_proj.weight").weight,
            "model.layers.0.mlp.experts.1.up_proj.weight_packed");
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.experts")),
            "gate_up_proj_weight_packed[2,2,128,32]int32 gate_up_proj_weight_scale[2,2,128,2]bfloat16 "
            "gate_up_proj_weight_shape[2,2,2]int64 down_proj_weight_packed[2,256,16]int32 "
            "down_proj_weight_scale[2,256,1]bfloat16 down_proj_weight_shape[2,2]int64 ");
  // transformers leaves fused experts dense for compressed-tensors.
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/true);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.experts")),
            "gate_up_proj[2,256,256]bfloat16 down_proj[2,256,128]bfloat16 ");
  // Some experts quantized and some not: refused.
  moe["quantization_config"]["ignore"] = {"lm_head", "model.layers.0.mlp.experts.1.up_proj"};
  EXPECT_THAT(std::string(ModelSpecFromConfig(moe, DType::kBFloat16).status().message()),
              HasSubstr("quantizes 5 of the 6 expert projections of model.layers.0.mlp.experts"));
}

json Awq(const json& extra = json::object()) {
  json q = {{"quant_method", "awq"}, {"bits", 4},         {"group_size", 128},
            {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
  q.update(extra);
  return q;
}

json Gptq(const json& extra = json::object()) {
  json q = {{"quant_method", "gptq"},
            {"bits", 4},
            {"group_size", 128},
            {"desc_act", false},
            {"sym", true},
            {"damp_percent", 0.01},
            {"checkpoint_format", "gptq"},
            {"true_sequential", true}};
  q.update(extra);
  return q;
}

TEST(QuantizationConfigTest, AwqAndGptqFields) {
  absl::StatusOr<std::optional<QuantizationConfig>> awq = ParseQuantizationConfig(json{{"quantization_config", Awq()}});
  ASSERT_TRUE(awq.ok()) << awq.status();
  EXPECT_EQ((*awq)->method, QuantMethod::kAwq);
  EXPECT_EQ((*awq)->bits, 4);
  EXPECT_EQ((*awq)->group_size, 128);
  EXPECT_FALSE((*awq)->symmetric);
  EXPECT_TRUE((*awq)->default_skips);
  absl::StatusOr<std::optional<QuantizationConfig>> gptq = ParseQuantizationConfig(
      json{{"quantization_config", Gptq({{"desc_act", true}, {"group_size", -1}, {"bits", 8}})}});
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ((*gptq)->method, QuantMethod::kGptq);
  EXPECT_EQ((*gptq)->bits, 8);
  EXPECT_EQ((*gptq)->group_size, -1);
  EXPECT_TRUE((*gptq)->desc_act);
  EXPECT_EQ((*gptq)->block_name, "model.layers");
}

TEST(QuantizationConfigTest, AwqAndGptqRefusalsNameTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {Awq({{"version", "gemv"}}), "quantization_config.version: \"gemv\" is not supported (supported: gemm)"},
      {Awq({{"version", nullptr}, {"format", "exllama"}}), "quantization_config.format: \"exllama\" is not supported"},
      {Awq({{"bits", 8}}), "quantization_config.bits: \"8\" is not supported (supported: 4)"},
      {Awq({{"zero_point", false}}), "quantization_config.zero_point: false (symmetric AWQ) is not supported"},
      {Awq({{"group_size", -1}}), "quantization_config.group_size: must be a positive integer for AWQ"},
      {Awq({{"modules_to_not_convert", "lm_head"}}), "quantization_config.modules_to_not_convert: must be a list"},
      {Gptq({{"checkpoint_format", "gptq_v2"}}),
       "quantization_config.checkpoint_format: \"gptq_v2\" is not supported (supported: gptq)"},
      {Gptq({{"checkpoint_format", nullptr}, {"format", "marlin"}}),
       "quantization_config.format: \"marlin\" is not supported (supported: gptq)"},
      {Gptq({{"bits", 3}}), "quantization_config.bits: \"3\" is not supported (supported: 4, 8)"},
      {Gptq({{"bits", 4.0}}), "quantization_config.bits: must be an integer"},
      {Gptq({{"group_size", 0}}), "quantization_config.group_size: must be a positive integer or -1"},
      {Gptq({{"desc_act", 1}}), "quantization_config.desc_act: must be true or false"},
      {Gptq({{"dynamic", {{"-:.*lm_head", json::object()}}}}),
       "quantization_config.dynamic: per-module overrides are not supported"},
      {Gptq({{"modules_in_block_to_quantize", {"self_attn.q_proj"}}}),
       "quantization_config.modules_in_block_to_quantize: must be a list of lists"},
  };
  for (const auto& [q, message] : cases) {
    absl::Status s = ParseError(q);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << q.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr(message)) << q.dump();
  }
}

TEST(QuantizedSpecTest, AwqTrees) {
  json config = LlamaConfig(Awq({{"group_size", 64}}));
  config["attention_bias"] = true;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Default skips: lm_head stays dense.
  EXPECT_EQ(spec->quantization->linears.size(), 14u);
  const QuantizedLinear& k = spec->quantization->linears.at("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.layout, QuantLayout::kAwqGemm);
  EXPECT_EQ(k.weight, "model.layers.0.self_attn.k_proj.qweight");
  EXPECT_EQ(k.zero_point, "model.layers.0.self_attn.k_proj.qzeros");
  EXPECT_EQ(k.scale, "model.layers.0.self_attn.k_proj.scales");
  EXPECT_TRUE(k.has_bias);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.self_attn.k_proj")),
            "bias[128]bfloat16 qweight[256,16]int32 qzeros[4,16]int32 scales[4,128]float16 ");
  // transformers: gptqmodel's AWQuantLinear registers buffers, scales and bias float16.
  SizeQuantizedSpec(*spec, QuantizedSizing::kTransformers, /*keeps_fp8=*/false);
  const ModuleSpec& m = *FindModule(spec->root, "model.layers.0.self_attn.k_proj");
  EXPECT_TRUE(m.parameters.empty());
  ASSERT_EQ(m.buffers.size(), 4u);
  EXPECT_EQ(m.buffers[0].name, "qweight");
  EXPECT_EQ(m.buffers[0].shape, (std::vector<int64_t>{256, 16}));
  EXPECT_EQ(m.buffers[3].name, "bias");
  EXPECT_EQ(m.buffers[3].dtype, DType::kFloat16);
  // And back to packed: the buffers go.
  SizeQuantizedSpec(*spec, QuantizedSizing::kPacked, /*keeps_fp8=*/false);
  EXPECT_TRUE(FindModule(spec->root, "model.layers.0.self_attn.k_proj")->buffers.empty());
}

TEST(QuantizedSpecTest, GptqConvertsTheBlocksOnly) {
  absl::StatusOr<ModelSpec> spec =
      ModelSpecFromConfig(LlamaConfig(Gptq({{"group_size", -1}, {"desc_act", true}})), DType::kFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.size(), 14u);  // lm_head is outside model.layers
  const QuantizedLinear& down = spec->quantization->linears.at("model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(down.layout, QuantLayout::kGptqV1);
  EXPECT_EQ(down.group_size, 320);  // -1: one group per row
  EXPECT_EQ(down.g_idx, "model.layers.1.mlp.down_proj.g_idx");
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.1.mlp.down_proj")),
            "qweight[40,256]int32 qzeros[1,32]int32 scales[1,256]float16 g_idx[320]int32 ");
  // modules_in_block_to_quantize narrows the layers by name suffix.
  spec = ModelSpecFromConfig(LlamaConfig(Gptq({{"modules_in_block_to_quantize",
                                                {{"self_attn.k_proj", "self_attn.v_proj"}, {"mlp.up_proj"}}}})),
                             DType::kFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.size(), 6u);
  EXPECT_TRUE(spec->quantization->linears.contains("model.layers.1.mlp.up_proj.weight"));
  EXPECT_FALSE(spec->quantization->linears.contains("model.layers.1.mlp.gate_proj.weight"));
}

TEST(InventoryComputeCapabilityTest, ParsedFromTheInventory) {
  absl::StatusOr<MachineInventory> inventory = ParseInventory("0=80GiB@8.9,1=80GiB,cpu=100GiB");
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  EXPECT_EQ(inventory->gpus[0].compute_capability_major, 8);
  EXPECT_EQ(inventory->gpus[0].compute_capability_minor, 9);
  EXPECT_EQ(inventory->gpus[1].compute_capability_major, 0);
  EXPECT_TRUE(TransformersKeepsFp8(*inventory));
  EXPECT_FALSE(TransformersKeepsFp8(*ParseInventory("0=80GiB@8.6,cpu=100GiB")));
  EXPECT_TRUE(TransformersKeepsFp8(*ParseInventory("0=80GiB@9.0,cpu=100GiB")));
  EXPECT_FALSE(TransformersKeepsFp8(*ParseInventory("0=80GiB,cpu=100GiB")));  // unknown: dequantized
  EXPECT_FALSE(TransformersKeepsFp8(*ParseInventory("cpu=100GiB")));
  EXPECT_THAT(std::string(ParseInventory("0=80GiB@89,cpu=1GiB").status().message()),
              HasSubstr("compute capability \"89\" is not MAJOR.MINOR"));
  EXPECT_THAT(std::string(ParseInventory("0=80GiB,cpu=1GiB@8.9").status().message()),
              HasSubstr("only GPUs have a compute capability"));
}

// --- The header check of a quantized checkpoint.

struct FakeTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
};

int64_t ElementSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 1;
}

class QuantizedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("strata_quantized_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const json& config, const std::vector<FakeTensor>& tensors) {
    std::ofstream(dir_ / "config.json") << config.dump(2);
    json header = json::object();
    uint64_t offset = 0;
    for (const FakeTensor& t : tensors) {
      uint64_t bytes = ElementSize(t.dtype);
      for (int64_t d : t.shape) bytes *= d;
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    const std::string text = header.dump();
    std::ofstream out(dir_ / "model.safetensors", std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((text.size() >> (8 * i)) & 0xff));
    out << text << std::string(offset, '\0');
  }

  // Every tensor of LlamaConfig's checkpoint in FP8 with `scale_dtype` scales; `edit` changes one.
  std::vector<FakeTensor> Fp8Tensors(const std::string& scale_dtype) {
    std::vector<FakeTensor> t = {{"model.embed_tokens.weight", {1000, 256}, "BF16"},
                                 {"model.norm.weight", {256}, "BF16"},
                                 {"lm_head.weight", {1000, 256}, "BF16"}};
    for (int i = 0; i < 2; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      t.push_back({p + "input_layernorm.weight", {256}, "BF16"});
      t.push_back({p + "post_attention_layernorm.weight", {256}, "BF16"});
      const std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
          {"self_attn.q_proj", 256, 256}, {"self_attn.k_proj", 128, 256}, {"self_attn.v_proj", 128, 256},
          {"self_attn.o_proj", 256, 256}, {"mlp.gate_proj", 320, 256},    {"mlp.up_proj", 320, 256},
          {"mlp.down_proj", 256, 320}};
      for (const auto& [name, n, k] : linears) {
        t.push_back({p + name + ".weight", {n, k}, "F8_E4M3"});
        t.push_back({p + name + ".weight_scale_inv", {(n + 127) / 128, (k + 127) / 128}, scale_dtype});
      }
    }
    return t;
  }

  // LlamaConfig's checkpoint as compressed-tensors W4 group-64 asymmetric writes it.
  std::vector<FakeTensor> CtTensors() {
    std::vector<FakeTensor> t = {{"model.embed_tokens.weight", {1000, 256}, "BF16"},
                                 {"model.norm.weight", {256}, "BF16"},
                                 {"lm_head.weight", {1000, 256}, "BF16"}};
    for (int i = 0; i < 2; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      t.push_back({p + "input_layernorm.weight", {256}, "BF16"});
      t.push_back({p + "post_attention_layernorm.weight", {256}, "BF16"});
      const std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
          {"self_attn.q_proj", 256, 256}, {"self_attn.k_proj", 128, 256}, {"self_attn.v_proj", 128, 256},
          {"self_attn.o_proj", 256, 256}, {"mlp.gate_proj", 320, 256},    {"mlp.up_proj", 320, 256},
          {"mlp.down_proj", 256, 320}};
      for (const auto& [name, n, k] : linears) {
        t.push_back({p + name + ".weight_packed", {n, k / 8}, "I32"});
        t.push_back({p + name + ".weight_scale", {n, (k + 63) / 64}, "F16"});
        t.push_back({p + name + ".weight_zero_point", {n / 8, (k + 63) / 64}, "I32"});
        t.push_back({p + name + ".weight_shape", {2}, "I64"});
      }
    }
    return t;
  }

  std::filesystem::path dir_;
};

TEST_F(QuantizedCheckpointTest, Fp8CheckpointLoadsAndTakesItsScaleDType) {
  Write(LlamaConfig(Fp8()), Fp8Tensors("BF16"));
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.at("model.layers.1.mlp.down_proj.weight").scale_dtype, DType::kBFloat16);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.1.mlp.down_proj")),
            "weight[256,320]float8_e4m3fn weight_scale_inv[2,3]bfloat16 ");
  Write(LlamaConfig(Fp8()), Fp8Tensors("F32"));
  spec = LoadModelSpec(dir_, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.at("model.layers.1.mlp.down_proj.weight").scale_dtype, DType::kFloat32);
}

TEST_F(QuantizedCheckpointTest, Fp8MismatchesAreNamed) {
  struct Case {
    std::string tensor;
    std::vector<int64_t> shape;  // empty: drop the tensor
    std::string dtype;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"model.layers.0.mlp.up_proj.weight_scale_inv",
       {3, 3},
       "F32",
       "tensor model.layers.0.mlp.up_proj.weight_scale_inv has shape [3, 3] in model.safetensors, expected [3, 2]"},
      {"model.layers.0.mlp.up_proj.weight",
       {320, 256},
       "BF16",
       "tensor model.layers.0.mlp.up_proj.weight has dtype BF16 in model.safetensors, expected F8_E4M3"},
      {"model.layers.0.mlp.up_proj.weight_scale_inv",
       {3, 2},
       "U8",
       "tensor model.layers.0.mlp.up_proj.weight_scale_inv has dtype U8 in model.safetensors, expected F32 or BF16"},
      {"model.layers.1.self_attn.o_proj.weight_scale_inv",
       {},
       "",
       "tensor model.layers.1.self_attn.o_proj.weight_scale_inv [2, 2] is missing from model.safetensors"},
  };
  for (const Case& c : cases) {
    std::vector<FakeTensor> tensors;
    for (FakeTensor t : Fp8Tensors("F32")) {
      if (t.name == c.tensor) {
        if (c.shape.empty()) continue;
        t.shape = c.shape;
        t.dtype = c.dtype;
      }
      tensors.push_back(t);
    }
    Write(LlamaConfig(Fp8()), tensors);
    absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
    ASSERT_FALSE(spec.ok()) << c.tensor;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("quantization_config: fp8"));
  }
  // A dense checkpoint under an FP8 config: the scales are missing.
  std::vector<FakeTensor> tensors = {{"extra.weight_scale_inv", {1}, "F32"}};
  for (const FakeTensor& t : Fp8Tensors("F32")) tensors.push_back(t);
  Write(LlamaConfig(Fp8()), tensors);
  EXPECT_THAT(std::string(LoadModelSpec(dir_, std::nullopt).status().message()),
              HasSubstr("unexpected tensor extra.weight_scale_inv"));
}

TEST_F(QuantizedCheckpointTest, Fp8Ue8m0ScalesAreBytes) {
  std::vector<FakeTensor> tensors = Fp8Tensors("U8");
  Write(LlamaConfig(Fp8({{"scale_fmt", "ue8m0"}})), tensors);
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.at("model.layers.0.mlp.up_proj.weight").scale_dtype, DType::kUInt8);
  EXPECT_EQ(Describe(*FindModule(spec->root, "model.layers.0.mlp.up_proj")),
            "weight[320,256]float8_e4m3fn weight_scale_inv[3,2]uint8 ");
}

TEST_F(QuantizedCheckpointTest, CompressedTensorsCheckpointIsChecked) {
  const json config =
      LlamaConfig(Ct(CtWeights({{"group_size", 64}, {"symmetric", false}}), "pack-quantized", nullptr, {"lm_head"}));
  Write(config, CtTensors());
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->quantization->linears.at("model.layers.0.mlp.up_proj.weight").scale_dtype, DType::kFloat16);
  const std::vector<std::pair<FakeTensor, std::string>> cases = {
      {{"model.layers.1.mlp.up_proj.weight_zero_point", {320, 4}, "I32"},
       "tensor model.layers.1.mlp.up_proj.weight_zero_point has shape [320, 4] in model.safetensors, expected [40, 4]"},
      {{"model.layers.1.mlp.up_proj.weight_packed", {320, 32}, "U8"},
       "tensor model.layers.1.mlp.up_proj.weight_packed has dtype U8 in model.safetensors, expected I32"},
      {{"model.layers.0.self_attn.o_proj.weight_scale", {256, 3}, "BF16"},
       "tensor model.layers.0.self_attn.o_proj.weight_scale has shape [256, 3] in model.safetensors, expected [256, "
       "4]"},
  };
  for (const auto& [edit, message] : cases) {
    std::vector<FakeTensor> tensors = CtTensors();
    for (FakeTensor& t : tensors) {
      if (t.name == edit.name) t = edit;
    }
    Write(config, tensors);
    EXPECT_THAT(std::string(LoadModelSpec(dir_, std::nullopt).status().message()), HasSubstr(message));
  }
  // A symmetric config over an asymmetric checkpoint: the zero points are unexpected.
  Write(LlamaConfig(Ct(CtWeights({{"group_size", 64}}), "pack-quantized", nullptr, {"lm_head"})), CtTensors());
  EXPECT_THAT(std::string(LoadModelSpec(dir_, std::nullopt).status().message()),
              HasSubstr("unexpected tensor model.layers.0.mlp.down_proj.weight_zero_point"));
}

TEST_F(QuantizedCheckpointTest, GptqCheckpointIsChecked) {
  const json config = LlamaConfig(Gptq());
  std::vector<FakeTensor> tensors = {{"model.embed_tokens.weight", {1000, 256}, "F16"},
                                     {"model.norm.weight", {256}, "F16"},
                                     {"lm_head.weight", {1000, 256}, "F16"}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    tensors.push_back({p + "input_layernorm.weight", {256}, "F16"});
    tensors.push_back({p + "post_attention_layernorm.weight", {256}, "F16"});
    const std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
        {"self_attn.q_proj", 256, 256}, {"self_attn.k_proj", 128, 256}, {"self_attn.v_proj", 128, 256},
        {"self_attn.o_proj", 256, 256}, {"mlp.gate_proj", 320, 256},    {"mlp.up_proj", 320, 256},
        {"mlp.down_proj", 256, 320}};
    for (const auto& [name, n, k] : linears) {
      tensors.push_back({p + name + ".qweight", {k / 8, n}, "I32"});
      tensors.push_back({p + name + ".qzeros", {(k + 127) / 128, n / 8}, "I32"});
      tensors.push_back({p + name + ".scales", {(k + 127) / 128, n}, "F16"});
      tensors.push_back({p + name + ".g_idx", {k}, "I32"});
    }
  }
  Write(config, tensors);
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (FakeTensor& t : tensors) {
    if (t.name == "model.layers.1.mlp.down_proj.g_idx") t.shape = {256};
  }
  Write(config, tensors);
  EXPECT_THAT(std::string(LoadModelSpec(dir_, std::nullopt).status().message()),
              HasSubstr("tensor model.layers.1.mlp.down_proj.g_idx has shape [256] in model.safetensors, expected "
                        "[320] (quantization_config: gptq v1 (int4, group 128, symmetric))"));
}

}  // namespace
}  // namespace strata::planner

namespace strata::planner {
namespace {

TEST(QuantizedSpecTest, SkipPatternsMatchInLinearTime) {
  // A pattern that takes a backtracking engine exponential time on a name of ~30 characters ends at once here.
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(
      LlamaConfig(Fp8({{"modules_to_not_convert", json::array({"(m|m|mo|mod)*(x|y)", "((a+)+)+b"})}})),
      DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->quantization->linears.contains("model.layers.0.self_attn.q_proj.weight"));
}

TEST(QuantizedSpecTest, APatternRe2CannotMatchIsAnErrorNamingTheField) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(
      LlamaConfig(Fp8({{"modules_to_not_convert", json::array({"lm_head", "layers\\.(?=1)"})}})), DType::kBFloat16);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), testing::HasSubstr("quantization_config.modules_to_not_convert"));
  EXPECT_THAT(spec.status().message(), testing::HasSubstr("layers\\.(?=1)"));
}

}  // namespace
}  // namespace strata::planner

namespace strata::planner {
namespace {

TEST(QuantizedSpecTest, APackedTiedHeadIsRefusedNamingIt) {
  // compressed-tensors with no ignore list packs every Linear, lm_head too: its tie would name no parameter.
  json config = LlamaConfig(
      {{"quant_method", "compressed-tensors"},
       {"format", "pack-quantized"},
       {"config_groups",
        {{"group_0",
          {{"targets", {"Linear"}},
           {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "channel"}}}}}}}});
  config["tie_word_embeddings"] = true;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), testing::HasSubstr("would quantize lm_head"));
  EXPECT_THAT(std::string(spec.status().message()), testing::HasSubstr("model.embed_tokens.weight"));
  // FP8 keeps the head's `weight`: planned as transformers plans it.
  config = LlamaConfig(Fp8({{"modules_to_not_convert", json::array()}}));
  config["tie_word_embeddings"] = true;
  EXPECT_TRUE(ModelSpecFromConfig(config, DType::kBFloat16).ok());
}

}  // namespace
}  // namespace strata::planner
