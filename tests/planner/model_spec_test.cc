// ModelSpec from config.json and from module tree JSON. The expected trees are what transformers 5.23 builds
// on the meta device (checked live by tests/parity); here they are pinned by hand-computed shapes and sizes.

#include "planner/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace strata::planner {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// hidden 8, 2 heads of 4, 1 KV head, intermediate 16, vocab 10, 2 layers.
json TinyLlamaConfig() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 8},
          {"intermediate_size", 16},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"vocab_size", 10}};
}

json TinyConfig(const std::string& architecture, const std::string& model_type) {
  json config = TinyLlamaConfig();
  config["architectures"] = {architecture};
  config["model_type"] = model_type;
  return config;
}

ModelSpec FromConfig(const json& config, DType dtype = DType::kBFloat16) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, dtype);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

const ModuleSpec* Find(const ModuleSpec& module, const std::string& name) {
  if (module.name == name) return &module;
  for (const ModuleSpec& child : module.children) {
    if (const ModuleSpec* found = Find(child, name)) return found;
  }
  return nullptr;
}

const TensorSpec* Parameter(const ModelSpec& spec, const std::string& module, const std::string& local) {
  const ModuleSpec* m = Find(spec.root, module);
  if (m == nullptr) return nullptr;
  for (const TensorSpec& p : m->parameters) {
    if (p.name == local) return &p;
  }
  return nullptr;
}

std::vector<int64_t> ShapeOf(const ModelSpec& spec, const std::string& module, const std::string& local = "weight") {
  const TensorSpec* p = Parameter(spec, module, local);
  return p == nullptr ? std::vector<int64_t>{-1} : p->shape;
}

std::vector<std::string> ChildNames(const ModuleSpec& module) {
  std::vector<std::string> names;
  for (const ModuleSpec& child : module.children) names.push_back(child.name);
  return names;
}

int64_t ParameterBytes(const ModuleSpec& module) {
  int64_t total = 0;
  for (const TensorSpec& p : module.parameters) total += p.bytes();
  for (const ModuleSpec& child : module.children) total += ParameterBytes(child);
  return total;
}

int64_t BufferBytes(const ModuleSpec& module) {
  int64_t total = 0;
  for (const TensorSpec& b : module.buffers) total += b.bytes();
  for (const ModuleSpec& child : module.children) total += BufferBytes(child);
  return total;
}

std::string ConfigError(const json& config) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  EXPECT_FALSE(spec.ok());
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(DTypeTest, NamesRoundTripAndSizes) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt64, DType::kInt32,
                  DType::kInt8, DType::kUInt8, DType::kBool}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8);
  EXPECT_EQ(DTypeSize(DType::kBool), 1);
}

TEST(DTypeTest, AcceptsTorchAliases) {
  EXPECT_EQ(*ParseDType("half"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("torch.bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("float"), DType::kFloat32);
}

TEST(DTypeTest, UnknownDTypeIsNamed) {
  absl::StatusOr<DType> d = ParseDType("float8");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("\"float8\""));
}

TEST(TensorSpecTest, ScalarHasOneElement) {
  TensorSpec scalar{"beta", {}, DType::kFloat32, false};
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.bytes(), 4);
  TensorSpec empty{"w", {3, 0}, DType::kFloat32, true};
  EXPECT_EQ(empty.bytes(), 0);
}

TEST(ModuleSpecTest, ChildNameJoinsWithDots) {
  ModuleSpec root;
  EXPECT_EQ(root.ChildName("model"), "model");
  ModuleSpec model{"model.layers.0", "LlamaDecoderLayer", {}, {}, {}};
  EXPECT_EQ(model.ChildName("mlp"), "model.layers.0.mlp");
}

TEST(ModelSpecFromConfigTest, TinyLlamaSizesMatchHandComputedBytes) {
  ModelSpec spec = FromConfig(TinyLlamaConfig(), DType::kBFloat16);
  // Per layer: q 8x8 + k 4x8 + v 4x8 + o 8x8 = 192, gate/up/down 3 x 8x16 = 384, two norms 16 -> 592.
  // embed 10x8 = 80, final norm 8, lm_head 10x8 = 80: 80 + 2*592 + 8 + 80 = 1352 elements, 2 bytes each.
  EXPECT_EQ(ParameterBytes(spec.root), 1352 * 2);
  // inv_freq and original_inv_freq: head_dim / 2 = 2 float32 each, whatever the serving dtype.
  EXPECT_EQ(BufferBytes(spec.root), 2 * 2 * 4);
  EXPECT_EQ(ParameterBytes(FromConfig(TinyLlamaConfig(), DType::kFloat32).root), 1352 * 4);
  EXPECT_EQ(spec.num_hidden_layers, 2);
  EXPECT_EQ(spec.num_key_value_heads, 1);
  EXPECT_EQ(spec.head_dim, 4);
  EXPECT_EQ(spec.dtype, DType::kBFloat16);
}

TEST(ModelSpecFromConfigTest, TinyLlamaTreeHasTransformersNamesClassesAndOrder) {
  ModelSpec spec = FromConfig(TinyLlamaConfig());
  EXPECT_EQ(spec.architecture, "LlamaForCausalLM");
  EXPECT_EQ(spec.root.name, "");
  EXPECT_EQ(spec.root.class_name, "LlamaForCausalLM");
  EXPECT_THAT(ChildNames(spec.root), ElementsAre("model", "lm_head"));
  const ModuleSpec& model = spec.root.children[0];
  EXPECT_EQ(model.class_name, "LlamaModel");
  EXPECT_THAT(ChildNames(model), ElementsAre("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb"));
  EXPECT_EQ(model.children[0].class_name, "Embedding");
  EXPECT_EQ(model.children[1].class_name, "ModuleList");
  EXPECT_THAT(ChildNames(model.children[1]), ElementsAre("model.layers.0", "model.layers.1"));
  const ModuleSpec& layer = model.children[1].children[1];
  EXPECT_EQ(layer.class_name, "LlamaDecoderLayer");
  EXPECT_THAT(ChildNames(layer),
              ElementsAre("model.layers.1.self_attn", "model.layers.1.mlp", "model.layers.1.input_layernorm",
                          "model.layers.1.post_attention_layernorm"));
  EXPECT_EQ(layer.children[0].class_name, "LlamaAttention");
  EXPECT_THAT(ChildNames(layer.children[0]),
              ElementsAre("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                          "model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.o_proj"));
  EXPECT_EQ(layer.children[1].class_name, "LlamaMLP");
  // The activation module has no parameters but is a child all the same.
  EXPECT_THAT(ChildNames(layer.children[1]), ElementsAre("model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
                                                         "model.layers.1.mlp.down_proj", "model.layers.1.mlp.act_fn"));
  EXPECT_EQ(layer.children[1].children[3].class_name, "SiLUActivation");
  EXPECT_EQ(layer.children[2].class_name, "LlamaRMSNorm");

  const ModuleSpec& rotary = model.children[3];
  EXPECT_EQ(rotary.class_name, "LlamaRotaryEmbedding");
  ASSERT_EQ(rotary.buffers.size(), 2u);
  EXPECT_EQ(rotary.buffers[0].name, "inv_freq");
  EXPECT_EQ(rotary.buffers[1].name, "original_inv_freq");
  for (const TensorSpec& b : rotary.buffers) {
    EXPECT_EQ(b.dtype, DType::kFloat32);
    EXPECT_FALSE(b.persistent);
    EXPECT_THAT(b.shape, ElementsAre(2));
  }
  EXPECT_THAT(spec.no_split_classes, ElementsAre("LlamaDecoderLayer"));
  EXPECT_TRUE(spec.tied_weights.empty());
  EXPECT_EQ(Parameter(spec, "model.norm", "weight")->dtype, DType::kBFloat16);
}

TEST(ModelSpecFromConfigTest, GqaShapesUseKeyValueHeads) {
  json config = TinyLlamaConfig();
  config["num_attention_heads"] = 4;  // head_dim 2
  config["num_key_value_heads"] = 2;
  ModelSpec spec = FromConfig(config);
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.q_proj"), ElementsAre(8, 8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.k_proj"), ElementsAre(4, 8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.v_proj"), ElementsAre(4, 8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.o_proj"), ElementsAre(8, 8));
  EXPECT_EQ(spec.num_key_value_heads, 2);
  EXPECT_EQ(spec.head_dim, 2);
}

TEST(ModelSpecFromConfigTest, KeyValueHeadsDefaultToAttentionHeadsForLlama) {
  json config = TinyLlamaConfig();
  config.erase("num_key_value_heads");
  EXPECT_EQ(FromConfig(config).num_key_value_heads, 2);
  config["num_key_value_heads"] = nullptr;
  EXPECT_EQ(FromConfig(config).num_key_value_heads, 2);
}

TEST(ModelSpecFromConfigTest, KeyValueHeadsDefaultIsTheConfigClassFieldDefault) {
  // MistralConfig declares num_key_value_heads = 8 and Qwen2Config = 32: a config that omits the field gets
  // those, not num_attention_heads.
  json mistral = TinyConfig("MistralForCausalLM", "mistral");
  mistral.erase("num_key_value_heads");
  ModelSpec m = FromConfig(mistral);
  EXPECT_EQ(m.num_key_value_heads, 8);
  EXPECT_THAT(ShapeOf(m, "model.layers.0.self_attn.k_proj"), ElementsAre(32, 8));

  json qwen = TinyConfig("Qwen2ForCausalLM", "qwen2");
  qwen.erase("num_key_value_heads");
  EXPECT_EQ(FromConfig(qwen).num_key_value_heads, 32);
  qwen["num_key_value_heads"] = nullptr;  // explicit null: __post_init__ copies num_attention_heads
  EXPECT_EQ(FromConfig(qwen).num_key_value_heads, 2);
}

TEST(ModelSpecFromConfigTest, ExplicitHeadDimOverridesHiddenOverHeads) {
  json config = TinyLlamaConfig();
  config["head_dim"] = 6;  // hidden 8 / 2 heads would be 4
  ModelSpec spec = FromConfig(config);
  EXPECT_EQ(spec.head_dim, 6);
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.q_proj"), ElementsAre(12, 8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.k_proj"), ElementsAre(6, 8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.o_proj"), ElementsAre(8, 12));
  const ModuleSpec* rotary = Find(spec.root, "model.rotary_emb");
  ASSERT_NE(rotary, nullptr);
  EXPECT_THAT(rotary->buffers[0].shape, ElementsAre(3));
}

TEST(ModelSpecFromConfigTest, NullHeadDimMeansHiddenOverHeads) {
  json config = TinyLlamaConfig();
  config["head_dim"] = nullptr;
  EXPECT_EQ(FromConfig(config).head_dim, 4);
}

TEST(ModelSpecFromConfigTest, Qwen2HasQkvBiasButNoOutputBias) {
  json config = TinyConfig("Qwen2ForCausalLM", "qwen2");
  config["attention_bias"] = false;  // not read by Qwen2Attention
  ModelSpec spec = FromConfig(config);
  EXPECT_EQ(spec.root.class_name, "Qwen2ForCausalLM");
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.q_proj", "bias"), ElementsAre(8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.k_proj", "bias"), ElementsAre(4));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.v_proj", "bias"), ElementsAre(4));
  EXPECT_EQ(Parameter(spec, "model.layers.0.self_attn.o_proj", "bias"), nullptr);
  EXPECT_EQ(Parameter(spec, "model.layers.0.mlp.up_proj", "bias"), nullptr);
  EXPECT_EQ(Find(spec.root, "model.layers.0.input_layernorm")->class_name, "Qwen2RMSNorm");
  EXPECT_THAT(spec.no_split_classes, ElementsAre("Qwen2DecoderLayer"));
}

TEST(ModelSpecFromConfigTest, LlamaAttentionAndMlpBiasFollowConfig) {
  json config = TinyLlamaConfig();
  config["attention_bias"] = true;
  config["mlp_bias"] = true;
  ModelSpec spec = FromConfig(config);
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.o_proj", "bias"), ElementsAre(8));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.self_attn.k_proj", "bias"), ElementsAre(4));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.mlp.gate_proj", "bias"), ElementsAre(16));
  EXPECT_THAT(ShapeOf(spec, "model.layers.0.mlp.down_proj", "bias"), ElementsAre(8));
  EXPECT_EQ(Parameter(spec, "lm_head", "bias"), nullptr);
}

TEST(ModelSpecFromConfigTest, MistralIgnoresLlamaBiasFlags) {
  json config = TinyConfig("MistralForCausalLM", "mistral");
  config["attention_bias"] = true;
  config["mlp_bias"] = true;
  ModelSpec spec = FromConfig(config);
  EXPECT_EQ(Parameter(spec, "model.layers.0.self_attn.q_proj", "bias"), nullptr);
  EXPECT_EQ(Parameter(spec, "model.layers.0.mlp.up_proj", "bias"), nullptr);
  EXPECT_EQ(Find(spec.root, "model.layers.0.self_attn")->class_name, "MistralAttention");
}

TEST(ModelSpecFromConfigTest, TieWordEmbeddingsRecordsTiedWeight) {
  json config = TinyLlamaConfig();
  config["tie_word_embeddings"] = true;
  ModelSpec spec = FromConfig(config);
  ASSERT_EQ(spec.tied_weights.size(), 1u);
  EXPECT_EQ(spec.tied_weights.at("lm_head.weight"), "model.embed_tokens.weight");
  // lm_head still shows the (shared) weight, as named_parameters(recurse=False) does.
  EXPECT_THAT(ShapeOf(spec, "lm_head"), ElementsAre(10, 8));
  EXPECT_FALSE(CheckpointTensors(spec).contains("lm_head.weight"));
}

TEST(ModelSpecFromConfigTest, EveryArchitectureDefaultsToUntiedEmbeddings) {
  for (const auto& [arch, type] : std::vector<std::pair<std::string, std::string>>{
           {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Qwen2ForCausalLM", "qwen2"}}) {
    EXPECT_TRUE(FromConfig(TinyConfig(arch, type)).tied_weights.empty()) << arch;
  }
}

TEST(ModelSpecFromConfigTest, ScaledRopeHonoursPartialRotaryFactor) {
  json config = TinyLlamaConfig();
  config["head_dim"] = 8;
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  config["partial_rotary_factor"] = 0.5;  // int(8 * 0.5) = 4 rotated dims -> 2 frequencies
  EXPECT_THAT(Find(FromConfig(config).root, "model.rotary_emb")->buffers[0].shape, ElementsAre(2));
}

TEST(ModelSpecFromConfigTest, DefaultRopeIgnoresPartialRotaryFactor) {
  json config = TinyLlamaConfig();
  config["head_dim"] = 8;
  config["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(Find(FromConfig(config).root, "model.rotary_emb")->buffers[0].shape, ElementsAre(4));
}

TEST(ModelSpecFromConfigTest, ArchitectureComesFromModelTypeWhenArchitecturesIsAbsent) {
  json config = TinyLlamaConfig();
  config.erase("architectures");
  config["model_type"] = "mistral";
  EXPECT_EQ(FromConfig(config).architecture, "MistralForCausalLM");
}

TEST(ModelSpecFromConfigTest, ActivationClassFollowsHiddenAct) {
  json config = TinyLlamaConfig();
  config["hidden_act"] = "gelu_pytorch_tanh";
  EXPECT_EQ(Find(FromConfig(config).root, "model.layers.0.mlp.act_fn")->class_name, "GELUTanh");
}

TEST(ModelSpecFromConfigTest, UnsupportedArchitectureSuggestsModuleTree) {
  json config = TinyLlamaConfig();
  config["architectures"] = {"GPT2LMHeadModel"};
  config["model_type"] = "gpt2";
  std::string message = ConfigError(config);
  EXPECT_THAT(message, HasSubstr("GPT2LMHeadModel"));
  EXPECT_THAT(message, HasSubstr("--module-tree"));
}

struct ConfigErrorCase {
  std::string name;
  std::function<void(json&)> mutate;
  std::string expected;
};

class ConfigErrorTest : public ::testing::TestWithParam<ConfigErrorCase> {};

TEST_P(ConfigErrorTest, NamesTheField) {
  json config = TinyLlamaConfig();
  GetParam().mutate(config);
  std::string message = ConfigError(config);
  EXPECT_THAT(message, HasSubstr(GetParam().expected));
  EXPECT_THAT(message, HasSubstr("config.json"));
}

INSTANTIATE_TEST_SUITE_P(
    AllFields, ConfigErrorTest,
    ::testing::Values(
        ConfigErrorCase{"MissingHiddenSize", [](json& c) { c.erase("hidden_size"); }, "hidden_size is missing"},
        ConfigErrorCase{"MissingIntermediateSize", [](json& c) { c.erase("intermediate_size"); }, "intermediate_size"},
        ConfigErrorCase{"MissingLayers", [](json& c) { c.erase("num_hidden_layers"); }, "num_hidden_layers"},
        ConfigErrorCase{"MissingHeads", [](json& c) { c.erase("num_attention_heads"); }, "num_attention_heads"},
        ConfigErrorCase{"MissingVocab", [](json& c) { c.erase("vocab_size"); }, "vocab_size"},
        ConfigErrorCase{"StringSize", [](json& c) { c["hidden_size"] = "8"; },
                        "hidden_size must be a positive integer"},
        ConfigErrorCase{"FloatSize", [](json& c) { c["hidden_size"] = 8.0; }, "hidden_size must be a positive integer"},
        ConfigErrorCase{"ZeroSize", [](json& c) { c["vocab_size"] = 0; }, "vocab_size must be a positive integer"},
        ConfigErrorCase{"NegativeSize", [](json& c) { c["intermediate_size"] = -1; }, "intermediate_size must be"},
        ConfigErrorCase{"HugeSize", [](json& c) { c["vocab_size"] = int64_t{1} << 40; }, "vocab_size must be"},
        ConfigErrorCase{"BadKvHeads", [](json& c) { c["num_key_value_heads"] = "one"; }, "num_key_value_heads"},
        ConfigErrorCase{"MistralNullKvHeads",
                        [](json& c) {
                          c["architectures"] = {"MistralForCausalLM"};
                          c["model_type"] = "mistral";
                          c["num_key_value_heads"] = nullptr;
                        },
                        "num_key_value_heads must be a positive integer, got null"},
        ConfigErrorCase{"BadHeadDim", [](json& c) { c["head_dim"] = 0; }, "head_dim must be a positive integer"},
        ConfigErrorCase{"Qwen2NullHeadDim",
                        [](json& c) {
                          c["architectures"] = {"Qwen2ForCausalLM"};
                          c["model_type"] = "qwen2";
                          c["head_dim"] = nullptr;
                        },
                        "head_dim must be a positive integer, got null"},
        ConfigErrorCase{"OddHeadDim", [](json& c) { c["head_dim"] = 7; }, "head_dim (7) must be even"},
        ConfigErrorCase{"HiddenNotMultipleOfHeads",
                        [](json& c) {
                          c["hidden_size"] = 9;
                          c["head_dim"] = 4;
                        },
                        "hidden_size (9) must be a multiple of num_attention_heads (2)"},
        ConfigErrorCase{"TieNotBool", [](json& c) { c["tie_word_embeddings"] = 1; },
                        "tie_word_embeddings must be true or false"},
        ConfigErrorCase{"AttentionBiasNotBool", [](json& c) { c["attention_bias"] = "yes"; }, "attention_bias"},
        ConfigErrorCase{"MlpBiasNotBool", [](json& c) { c["mlp_bias"] = nullptr; }, "mlp_bias"},
        ConfigErrorCase{"UnknownActivation", [](json& c) { c["hidden_act"] = "swiglu"; }, "hidden_act \"swiglu\""},
        ConfigErrorCase{"UnknownRopeType",
                        [](json& c) {
                          c["rope_scaling"] = {{"type", "ntk"}};
                        },
                        "rope_scaling.rope_type \"ntk\""},
        ConfigErrorCase{"RopeNotObject", [](json& c) { c["rope_parameters"] = 3; },
                        "rope_parameters must be an object"},
        ConfigErrorCase{"BadPartialRotaryFactor", [](json& c) { c["partial_rotary_factor"] = "half"; },
                        "partial_rotary_factor"},
        ConfigErrorCase{"LongropeWithoutShortFactor",
                        [](json& c) {
                          c["rope_parameters"] = {{"rope_type", "longrope"}};
                        },
                        "rope_parameters.short_factor"},
        ConfigErrorCase{"ArchitecturesNotArray", [](json& c) { c["architectures"] = "LlamaForCausalLM"; },
                        "architectures must be a non-empty array"},
        ConfigErrorCase{"NoArchitectureOrModelType",
                        [](json& c) {
                          c.erase("architectures");
                          c.erase("model_type");
                        },
                        "neither architectures nor model_type"},
        ConfigErrorCase{"UnknownModelType",
                        [](json& c) {
                          c.erase("architectures");
                          c["model_type"] = "gpt_neox";
                        },
                        "model_type \"gpt_neox\" is not supported"},
        ConfigErrorCase{"ContradictoryModelType", [](json& c) { c["model_type"] = "qwen2"; },
                        "but model_type is \"qwen2\""}),
    [](const ::testing::TestParamInfo<ConfigErrorCase>& info) { return info.param.name; });

TEST(ModelSpecFromConfigTest, NonObjectConfigIsRejected) {
  EXPECT_THAT(ConfigError(json::array()), HasSubstr("object"));
}

TEST(ConfigDTypeTest, ReadsDtypeThenTorchDtypeThenDefaultsToFloat32) {
  EXPECT_EQ(*ConfigDType({{"dtype", "bfloat16"}, {"torch_dtype", "float16"}}), DType::kBFloat16);
  EXPECT_EQ(*ConfigDType({{"torch_dtype", "float16"}}), DType::kFloat16);
  EXPECT_EQ(*ConfigDType({{"dtype", nullptr}, {"torch_dtype", "bfloat16"}}), DType::kBFloat16);
  EXPECT_EQ(*ConfigDType(json::object()), DType::kFloat32);
}

TEST(ConfigDTypeTest, UnknownDtypeIsNamed) {
  absl::StatusOr<DType> d = ConfigDType({{"torch_dtype", "float4"}});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("torch_dtype"));
  EXPECT_THAT(d.status().message(), HasSubstr("float4"));
  EXPECT_FALSE(ConfigDType({{"dtype", 16}}).ok());
}

TEST(CheckpointTensorsTest, ExcludesTiedKeysAndNonPersistentBuffers) {
  json config = TinyLlamaConfig();
  config["tie_word_embeddings"] = true;
  std::map<std::string, ExpectedTensor> tensors = CheckpointTensors(FromConfig(config));
  // 9 per layer (4 attention, 3 mlp, 2 norms) x 2 + embed + final norm; no lm_head, no rotary buffers.
  EXPECT_EQ(tensors.size(), 20u);
  EXPECT_TRUE(tensors.contains("model.embed_tokens.weight"));
  EXPECT_THAT(tensors.at("model.layers.1.mlp.down_proj.weight").shape, ElementsAre(8, 16));
  EXPECT_EQ(tensors.at("model.layers.1.mlp.down_proj.weight").dtype, DType::kBFloat16);
  EXPECT_FALSE(tensors.contains("model.rotary_emb.inv_freq"));

  ModelSpec spec;
  spec.root.buffers.push_back({"running_mean", {4}, DType::kFloat32, true});
  spec.root.buffers.push_back({"cache", {4}, DType::kFloat32, false});
  tensors = CheckpointTensors(spec);
  EXPECT_TRUE(tensors.contains("running_mean"));
  EXPECT_FALSE(tensors.contains("cache"));
}

// --- Module tree JSON ---

json ModuleTreeFor(const json& config, DType dtype = DType::kBFloat16) {
  return ModuleTreeToJson(FromConfig(config, dtype));
}

TEST(ModuleTreeTest, RoundTripPreservesTheSpec) {
  json config = TinyConfig("Qwen2ForCausalLM", "qwen2");
  config["tie_word_embeddings"] = true;
  ModelSpec spec = FromConfig(config);
  json tree = ModuleTreeToJson(spec);
  EXPECT_EQ(tree["format"], "strata.module_tree.v1");
  EXPECT_EQ(tree["architecture"], "Qwen2ForCausalLM");
  EXPECT_EQ(tree["dtype"], "bfloat16");
  EXPECT_EQ(tree["tied_weights"]["lm_head.weight"], "model.embed_tokens.weight");
  EXPECT_EQ(tree["kv_cache"]["num_key_value_heads"], 1);
  EXPECT_EQ(tree["root"]["children"][0]["name"], "model");
  EXPECT_FALSE(tree["root"].contains("name"));

  absl::StatusOr<ModelSpec> back = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ModuleTreeToJson(*back), tree);
  EXPECT_EQ(back->root.children[0].children[1].children[0].name, "model.layers.0");
  EXPECT_EQ(back->tied_weights, spec.tied_weights);
  EXPECT_EQ(back->no_split_classes, spec.no_split_classes);
  EXPECT_EQ(back->head_dim, spec.head_dim);
  EXPECT_EQ(back->num_hidden_layers, spec.num_hidden_layers);
  EXPECT_EQ(ParameterBytes(back->root), ParameterBytes(spec.root));
}

TEST(ModuleTreeTest, DtypeOverrideRetypesFloatingPointParametersOnly) {
  json tree = ModuleTreeFor(TinyLlamaConfig(), DType::kFloat32);
  tree["root"]["parameters"].push_back({{"name", "position_ids"}, {"shape", {4}}, {"dtype", "int64"}});
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, DType::kFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dtype, DType::kFloat16);
  EXPECT_EQ(Parameter(*spec, "model.layers.0.mlp.up_proj", "weight")->dtype, DType::kFloat16);
  EXPECT_EQ(Parameter(*spec, "", "position_ids")->dtype, DType::kInt64);
  EXPECT_EQ(Find(spec->root, "model.rotary_emb")->buffers[0].dtype, DType::kFloat32);

  absl::StatusOr<ModelSpec> as_exported = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_TRUE(as_exported.ok());
  EXPECT_EQ(as_exported->dtype, DType::kFloat32);
}

TEST(ModuleTreeTest, MinimalTreeNeedsOnlyFormatAndRoot) {
  json tree = {
      {"format", "strata.module_tree.v1"},
      {"root", {{"class", "Net"}, {"parameters", {{{"name", "w"}, {"shape", {2, 3}}, {"dtype", "float16"}}}}}}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->architecture, "Net");
  EXPECT_EQ(spec->dtype, DType::kFloat16);
  EXPECT_EQ(spec->num_hidden_layers, 0);
  EXPECT_EQ(ParameterBytes(spec->root), 12);
}

struct TreeErrorCase {
  std::string name;
  std::function<void(json&)> mutate;
  std::string expected;
};

class ModuleTreeErrorTest : public ::testing::TestWithParam<TreeErrorCase> {};

TEST_P(ModuleTreeErrorTest, NamesTheJsonPath) {
  json tree = ModuleTreeFor(TinyLlamaConfig());
  GetParam().mutate(tree);
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(GetParam().expected));
}

// root.children[0] is "model"; its children[1] is "layers"; layers.children[0] is layer 0, whose children[0]
// is self_attn, whose children[0] is q_proj.
#define Q_PROJ(tree) tree["root"]["children"][0]["children"][1]["children"][0]["children"][0]["children"][0]

INSTANTIATE_TEST_SUITE_P(
    AllPaths, ModuleTreeErrorTest,
    ::testing::Values(
        TreeErrorCase{"NotAnObject", [](json& t) { t = json::array(); }, "module tree: expected a JSON object"},
        TreeErrorCase{"MissingFormat", [](json& t) { t.erase("format"); }, "module tree: missing \"format\""},
        TreeErrorCase{"WrongFormat", [](json& t) { t["format"] = "strata.module_tree.v0"; },
                      "module tree: format: expected \"strata.module_tree.v1\""},
        TreeErrorCase{"MissingRoot", [](json& t) { t.erase("root"); }, "module tree: missing \"root\""},
        TreeErrorCase{"RootNotObject", [](json& t) { t["root"] = 1; }, "module tree: root: expected an object"},
        TreeErrorCase{"RootWithoutClass", [](json& t) { t["root"].erase("class"); },
                      "module tree: root: missing \"class\""},
        TreeErrorCase{"RootNamed", [](json& t) { t["root"]["name"] = "x"; }, "module tree: root.name"},
        TreeErrorCase{"ClassNotString", [](json& t) { t["root"]["children"][0]["class"] = 3; },
                      "module tree: root.children[0].class: expected a string"},
        TreeErrorCase{"ChildrenNotArray", [](json& t) { t["root"]["children"] = json::object(); },
                      "module tree: root.children: expected an array"},
        TreeErrorCase{"ChildNotObject", [](json& t) { t["root"]["children"][1] = "lm_head"; },
                      "module tree: root.children[1]: expected an object"},
        TreeErrorCase{"ChildWithoutName", [](json& t) { t["root"]["children"][1].erase("name"); },
                      "module tree: root.children[1]: missing \"name\""},
        TreeErrorCase{"ChildNameWithDot", [](json& t) { t["root"]["children"][1]["name"] = "lm.head"; },
                      "module tree: root.children[1].name: expected a non-empty local name without dots"},
        TreeErrorCase{"DuplicateChild", [](json& t) { t["root"]["children"][1]["name"] = "model"; },
                      "module tree: root.children[1].name: \"model\" is already a member"},
        TreeErrorCase{"ParametersNotArray",
                      [](json& t) {
                        Q_PROJ(t)["parameters"] = 5;
                      },
                      "root.children[0].children[1].children[0].children[0].children[0].parameters: expected an array"},
        TreeErrorCase{"ParameterNotObject", [](json& t) { t["root"]["children"][1]["parameters"][0] = 1; },
                      "module tree: root.children[1].parameters[0]: expected an object"},
        TreeErrorCase{"ParameterWithoutName", [](json& t) { t["root"]["children"][1]["parameters"][0].erase("name"); },
                      "module tree: root.children[1].parameters[0]: missing \"name\""},
        TreeErrorCase{"ParameterWithoutShape",
                      [](json& t) { t["root"]["children"][1]["parameters"][0].erase("shape"); },
                      "module tree: root.children[1].parameters[0]: missing \"shape\""},
        TreeErrorCase{"NegativeDimension",
                      [](json& t) {
                        t["root"]["children"][1]["parameters"][0]["shape"] = {10, -8};
                      },
                      "module tree: root.children[1].parameters[0].shape: expected an array of non-negative integers"},
        TreeErrorCase{"FloatDimension", [](json& t) { t["root"]["children"][1]["parameters"][0]["shape"] = {1.5}; },
                      "root.children[1].parameters[0].shape: expected an array of non-negative integers"},
        TreeErrorCase{"ShapeNotArray", [](json& t) { t["root"]["children"][1]["parameters"][0]["shape"] = 10; },
                      "root.children[1].parameters[0].shape: expected an array of non-negative integers"},
        TreeErrorCase{"HugeShape",
                      [](json& t) {
                        t["root"]["children"][1]["parameters"][0]["shape"] = {uint64_t{1} << 40, uint64_t{1} << 40};
                      },
                      "root.children[1].parameters[0].shape: tensor is too large"},
        TreeErrorCase{"UnknownDtype", [](json& t) { t["root"]["children"][1]["parameters"][0]["dtype"] = "float8"; },
                      "module tree: root.children[1].parameters[0].dtype: unknown dtype \"float8\""},
        TreeErrorCase{"MissingDtype", [](json& t) { t["root"]["children"][1]["parameters"][0].erase("dtype"); },
                      "module tree: root.children[1].parameters[0]: missing \"dtype\""},
        TreeErrorCase{"ParameterWithPersistentFlag",
                      [](json& t) { t["root"]["children"][1]["parameters"][0]["persistent"] = true; },
                      "root.children[1].parameters[0].persistent: only buffers"},
        TreeErrorCase{"PersistentNotBool",
                      [](json& t) { t["root"]["children"][0]["children"][3]["buffers"][0]["persistent"] = "no"; },
                      "module tree: root.children[0].children[3].buffers[0].persistent: expected true or false"},
        TreeErrorCase{"ParameterNamedLikeChild",
                      [](json& t) {
                        t["root"]["parameters"].push_back({{"name", "model"}, {"shape", {1}}, {"dtype", "float32"}});
                      },
                      "module tree: root.children[0].name: \"model\" is already a member of the root"},
        TreeErrorCase{"BadTopLevelDtype", [](json& t) { t["dtype"] = "fp8"; }, "module tree: dtype: unknown dtype"},
        TreeErrorCase{"ArchitectureNotString", [](json& t) { t["architecture"] = 1; },
                      "module tree: architecture: expected a non-empty string"},
        TreeErrorCase{"NoSplitNotArray", [](json& t) { t["no_split_modules"] = "LlamaDecoderLayer"; },
                      "module tree: no_split_modules: expected an array"},
        TreeErrorCase{"NoSplitEntryNotString", [](json& t) { t["no_split_modules"] = {1}; },
                      "module tree: no_split_modules[0]: expected a class name string"},
        TreeErrorCase{"TiedNotObject",
                      [](json& t) {
                        t["tied_weights"] = {1, 2};
                      },
                      "module tree: tied_weights: expected an object"},
        TreeErrorCase{"TiedTargetNotString", [](json& t) { t["tied_weights"]["lm_head.weight"] = 1; },
                      "module tree: tied_weights[\"lm_head.weight\"]: expected a parameter name string"},
        TreeErrorCase{"TiedToUnknownParameter",
                      [](json& t) { t["tied_weights"]["lm_head.weight"] = "model.embed.weight"; },
                      "tied_weights[\"lm_head.weight\"]: no parameter named model.embed.weight in the tree"},
        TreeErrorCase{"KvCacheNotObject", [](json& t) { t["kv_cache"] = 3; },
                      "module tree: kv_cache: expected an object"},
        TreeErrorCase{"KvCacheNegative", [](json& t) { t["kv_cache"]["head_dim"] = -1; },
                      "module tree: kv_cache.head_dim: expected a non-negative integer"},
        TreeErrorCase{"KvCacheMissingField", [](json& t) { t["kv_cache"].erase("num_hidden_layers"); },
                      "module tree: kv_cache: missing \"num_hidden_layers\""}),
    [](const ::testing::TestParamInfo<TreeErrorCase>& info) { return info.param.name; });

#undef Q_PROJ

TEST(ModuleTreeTest, DeepNestingIsRejected) {
  json node = {{"class", "Leaf"}};
  for (int i = 0; i < 100; ++i) node = {{"name", "c"}, {"class", "Wrap"}, {"children", {node}}};
  node.erase("name");
  json tree = {{"format", "strata.module_tree.v1"}, {"root", node}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("nest deeper"));
}

class LoadModuleTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("strata_module_tree_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }
  std::filesystem::path dir_;
};

TEST_F(LoadModuleTreeTest, ReadsTheFile) {
  std::filesystem::path file = Write("tree.json", ModuleTreeFor(TinyLlamaConfig()).dump(2));
  absl::StatusOr<ModelSpec> spec = LoadModuleTree(file, DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->architecture, "LlamaForCausalLM");
  EXPECT_EQ(ParameterBytes(spec->root), 1352 * 4);
}

TEST_F(LoadModuleTreeTest, MissingFileIsNamed) {
  absl::StatusOr<ModelSpec> spec = LoadModuleTree(dir_ / "absent.json", std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("absent.json"));
}

TEST_F(LoadModuleTreeTest, InvalidJsonIsNamed) {
  absl::StatusOr<ModelSpec> spec = LoadModuleTree(Write("bad.json", "{\"format\": "), std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("bad.json: not valid JSON"));
}

TEST_F(LoadModuleTreeTest, ContentErrorsNameFileAndPath) {
  json tree = ModuleTreeFor(TinyLlamaConfig());
  tree["root"]["children"][1]["parameters"][0]["shape"] = "big";
  absl::StatusOr<ModelSpec> spec = LoadModuleTree(Write("tree.json", tree.dump()), std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("tree.json: module tree: root.children[1].parameters[0].shape"));
}

}  // namespace
}  // namespace strata::planner
