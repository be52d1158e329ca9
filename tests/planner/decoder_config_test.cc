// ModelSpec::decoder: the config.json fields the forward pass reads, read with the tree. Every one
// type-checked and bounded, defaults as transformers 5.23's config classes, errors naming the field.
// (Issue 10: a null use_sliding_window threw nlohmann's type_error; a negative max_window_layers wrote out
// of bounds.) The settings the runtime does not implement are the runtime's errors: the planner places
// such a model all the same.
#include "planner/decoder_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/model_spec.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The sizes every config below shares: hidden 64, 4 heads (of 16), 2 KV heads, vocab 256.
json Sized(json config) {
  config["hidden_size"] = 64;
  config["intermediate_size"] = 128;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["vocab_size"] = 256;
  return config;
}

absl::StatusOr<DecoderConfig> Decoder(const json& config) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  if (!spec.ok()) return spec.status();
  return spec->decoder;
}

// What loading the config reports: the planner's error, else the forward pass's.
std::string ErrorOf(const json& config) {
  absl::StatusOr<DecoderConfig> parsed = Decoder(config);
  EXPECT_FALSE(parsed.ok());
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

json Qwen2() {
  return Sized({{"architectures", {"Qwen2ForCausalLM"}},
                {"num_hidden_layers", 4},
                {"use_sliding_window", true},
                {"sliding_window", 16},
                {"max_window_layers", 2}});
}

TEST(DecoderConfig, Qwen2SlidingLayersFromMaxWindowLayers) {
  absl::StatusOr<DecoderConfig> parsed = Decoder(Qwen2());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(parsed->num_layers, 4);
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{0, 0, 16, 16}));
}

TEST(DecoderConfig, NegativeMaxWindowLayersIsAnErrorNotAnOutOfBoundsWrite) {
  json config = Qwen2();
  config["max_window_layers"] = -3;
  EXPECT_THAT(ErrorOf(config), HasSubstr("max_window_layers"));
}

TEST(DecoderConfig, WrongTypedSlidingWindowFieldsNameTheField) {
  for (const json& bad : {json("yes"), json(1)}) {
    json config = Qwen2();
    config["use_sliding_window"] = bad;
    EXPECT_THAT(ErrorOf(config), HasSubstr("use_sliding_window"));
  }
  for (const json& bad : {json("2"), json(2.5), json::array()}) {
    json config = Qwen2();
    config["max_window_layers"] = bad;
    EXPECT_THAT(ErrorOf(config), HasSubstr("max_window_layers"));
  }
  json config = Qwen2();
  config["layer_types"] = {"sliding_attention", 3, "full_attention", "full_attention"};
  EXPECT_THAT(ErrorOf(config), HasSubstr("layer_types[1]"));
}

TEST(DecoderConfig, NullSlidingWindowFieldsTakeTheDefaults) {
  json config = Qwen2();
  config["use_sliding_window"] = nullptr;
  config["max_window_layers"] = nullptr;
  absl::StatusOr<DecoderConfig> parsed = Decoder(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(DecoderConfig, ValuesThatCannotMakeAModelAreRefusedNamingTheField) {
  // Before: accepted, and the model streamed token 0 with NaN logprobs under status OK.
  for (double eps : {0.0, -1e-6}) {
    json config = Qwen2();
    config["rms_norm_eps"] = eps;
    EXPECT_THAT(ErrorOf(config), HasSubstr("rms_norm_eps")) << eps;
  }
  for (double theta : {0.0, -10000.0}) {
    json config = Qwen2();
    config["rope_theta"] = theta;
    EXPECT_THAT(ErrorOf(config), HasSubstr("rope_theta")) << theta;
    config.erase("rope_theta");
    config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
    EXPECT_THAT(ErrorOf(config), HasSubstr("rope_parameters.rope_theta")) << theta;
  }
}

TEST(DecoderConfig, Llama3RopeTakesTheOriginalLengthFromMaxPositionEmbeddings) {
  json config = Sized({{"architectures", {"LlamaForCausalLM"}},
                       {"num_hidden_layers", 2},
                       {"max_position_embeddings", 131072},
                       {"rms_norm_eps", 1e-5},
                       {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 500000.0}}}});
  absl::StatusOr<DecoderConfig> parsed = Decoder(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rope.type, RopeConfig::Type::kLlama3);
  EXPECT_EQ(parsed->rope.theta, 500000.0);
  EXPECT_EQ(parsed->rope.factor, 8.0);
  EXPECT_EQ(parsed->rope.original_max_positions, 131072);
  EXPECT_EQ(parsed->rms_norm_eps, 1e-5);
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{0, 0}));  // Llama has none
}

TEST(DecoderConfig, WhatOnlyTheRuntimeRefusesIsPlacedAllTheSame) {
  // strata-plan plans any RoPE type and activation transformers knows; the runtime runs fewer.
  json config = Sized({{"architectures", {"LlamaForCausalLM"}}, {"num_hidden_layers", 2}, {"hidden_act", "gelu"}});
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->decoder.status().message(), HasSubstr("config.json: hidden_act \"gelu\" is not supported"));
  config.erase("hidden_act");
  config["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  spec = ModelSpecFromConfig(config, DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->decoder.status().message(),
              HasSubstr("config.json: rope_parameters.rope_type \"yarn\" is not supported by the runtime"));
}

TEST(DecoderConfig, ModelTypeAloneNamesTheArchitecture) {
  json config = Qwen2();
  config.erase("architectures");
  config["model_type"] = "qwen2";
  absl::StatusOr<DecoderConfig> parsed = Decoder(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->architecture, "Qwen2ForCausalLM");
}

TEST(DecoderConfig, MoeRoutingAndQkNormsComeWithTheirLayers) {
  json qwen3_moe = Sized({{"architectures", {"Qwen3MoeForCausalLM"}},
                          {"num_hidden_layers", 4},
                          {"num_experts", 4},
                          {"num_experts_per_tok", 2},
                          {"moe_intermediate_size", 32},
                          {"decoder_sparse_step", 2},
                          {"mlp_only_layers", {3}},
                          {"norm_topk_prob", true},
                          {"use_sliding_window", true},
                          {"sliding_window", 6}});
  absl::StatusOr<DecoderConfig> parsed = Decoder(qwen3_moe);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->qk_norm);
  EXPECT_EQ(parsed->moe.num_experts, 4);
  EXPECT_EQ(parsed->moe.top_k, 2);
  EXPECT_TRUE(parsed->moe.norm_topk_prob);
  EXPECT_FALSE(parsed->moe.weights_in_float32);
  EXPECT_THAT(parsed->moe.sparse, ElementsAre(false, true, false, false));
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{6, 6, 6, 6}));  // every layer, no layer_types

  json mixtral = Sized({{"architectures", {"MixtralForCausalLM"}}, {"num_hidden_layers", 2}, {"sliding_window", 5}});
  parsed = Decoder(mixtral);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->qk_norm);
  EXPECT_EQ(parsed->moe.num_experts, 8);
  EXPECT_EQ(parsed->moe.top_k, 2);
  EXPECT_TRUE(parsed->moe.norm_topk_prob);
  EXPECT_TRUE(parsed->moe.weights_in_float32);
  EXPECT_THAT(parsed->moe.sparse, ElementsAre(true, true));
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{5, 5}));

  parsed = Decoder(Sized({{"architectures", {"Qwen3ForCausalLM"}}, {"num_hidden_layers", 2}, {"head_dim", 16}}));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->qk_norm);
  EXPECT_EQ(parsed->moe.num_experts, 0);
}

TEST(DecoderConfig, Gemma2DefaultsAlternateSlidingAndGlobalWithBothSoftCaps) {
  absl::StatusOr<DecoderConfig> c =
      Decoder(Sized({{"architectures", {"Gemma2ForCausalLM"}}, {"num_hidden_layers", 4}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, (std::vector<int64_t>{4096, 0, 4096, 0}));
  EXPECT_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_EQ(c->query_pre_attn_scalar, 256.0);
  EXPECT_FALSE(c->sliding_rope.has_value());
}

TEST(DecoderConfig, Gemma3RopePerLayerTypeFromLegacyFields) {
  absl::StatusOr<DecoderConfig> c = Decoder(Sized({{"architectures", {"Gemma3ForCausalLM"}},
                                                   {"num_hidden_layers", 7},
                                                   {"sliding_window", 512},
                                                   {"rope_theta", 1000000.0},
                                                   {"rope_local_base_freq", 10000.0},
                                                   {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
                                                   {"attn_logit_softcapping", 50.0}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, (std::vector<int64_t>{512, 512, 512, 512, 512, 0, 512}));
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kLinear);
  EXPECT_EQ(c->rope.theta, 1000000.0);
  EXPECT_EQ(c->rope.factor, 8.0);
  ASSERT_TRUE(c->sliding_rope.has_value());
  EXPECT_EQ(c->sliding_rope->type, RopeConfig::Type::kDefault);
  EXPECT_EQ(c->sliding_rope->theta, 10000.0);
  EXPECT_EQ(c->attn_logit_softcapping, 0.0);  // not applied by Gemma3Attention
  EXPECT_EQ(c->final_logit_softcapping, 0.0);
}

TEST(DecoderConfig, GemmaBadFieldsAreNamed) {
  const json base = Sized({{"architectures", {"Gemma2ForCausalLM"}}, {"num_hidden_layers", 2}});
  auto with = [&](const char* key, json value) {
    json c = base;
    c[key] = std::move(value);
    return c;
  };
  EXPECT_THAT(ErrorOf(with("final_logit_softcapping", -1.0)), HasSubstr("final_logit_softcapping"));
  EXPECT_THAT(ErrorOf(with("attn_logit_softcapping", "50")), HasSubstr("attn_logit_softcapping"));
  EXPECT_THAT(ErrorOf(with("query_pre_attn_scalar", 0)), HasSubstr("query_pre_attn_scalar"));
  EXPECT_THAT(ErrorOf(with("layer_types", {"sliding_attention"})), HasSubstr("layer_types"));
  EXPECT_THAT(ErrorOf(with("sliding_window", nullptr)), HasSubstr("sliding_window"));
  EXPECT_THAT(ErrorOf(with("hidden_activation", "relu")), HasSubstr("hidden_activation"));
  EXPECT_THAT(ErrorOf(with("use_bidirectional_attention", true)), HasSubstr("use_bidirectional_attention"));
  EXPECT_THAT(ErrorOf(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}})), HasSubstr("rope_type"));
  EXPECT_THAT(ErrorOf(with("num_hidden_layers", 0)), HasSubstr("num_hidden_layers"));
}

json Phi3Long() {
  return Sized({{"architectures", {"Phi3ForCausalLM"}},
                {"num_hidden_layers", 2},
                {"pad_token_id", 0},
                {"max_position_embeddings", 131072},
                {"original_max_position_embeddings", 4096},
                {"rope_scaling",
                 {{"type", "longrope"},
                  {"short_factor", {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
                  {"long_factor", {2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0}}}}});
}

TEST(DecoderConfig, Phi3LongropeAttentionFactorFromTheContextRatio) {
  absl::StatusOr<DecoderConfig> c = Decoder(Phi3Long());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kLongRope);
  EXPECT_EQ(c->rope.original_max_positions, 4096);
  EXPECT_DOUBLE_EQ(c->rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_EQ(c->rope.short_factor, std::vector<double>(8, 1.0));
  EXPECT_EQ(c->rope.long_factor, std::vector<double>(8, 2.0));
  EXPECT_EQ(c->rotary_dim, 0);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);  // Phi3Config's default
  EXPECT_EQ(c->sliding_window, (std::vector<int64_t>{0, 0}));
}

TEST(DecoderConfig, Phi3SuIsLongropeWithTheTopLevelOriginalLength) {
  json c = Phi3Long();
  c["rope_scaling"]["type"] = "su";
  // Required in the dict by Phi3Config's validation, then overridden by the top-level field (transformers'
  // _compute_longrope_parameters standardizes again once the type reads "longrope").
  c["rope_scaling"]["original_max_position_embeddings"] = 8192;
  absl::StatusOr<DecoderConfig> parsed = Decoder(c);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rope.type, RopeConfig::Type::kLongRope);
  EXPECT_EQ(parsed->rope.original_max_positions, 4096);
  EXPECT_DOUBLE_EQ(parsed->rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
}

TEST(DecoderConfig, Phi3BadFieldsAreNamed) {
  json c = Phi3Long();
  c["rope_scaling"]["long_factor"] = {1.0, 2.0};
  EXPECT_THAT(ErrorOf(c), HasSubstr("rope_scaling.long_factor"));
  c = Phi3Long();
  c["rope_scaling"]["type"] = "dynamic";
  EXPECT_THAT(ErrorOf(c), HasSubstr("rope_scaling.rope_type"));
  c = Phi3Long();
  c["rope_scaling"]["type"] = "su";  // the old name needs original_max_position_embeddings in the dict
  EXPECT_THAT(ErrorOf(c), HasSubstr("rope_scaling.original_max_position_embeddings"));
  c = Phi3Long();
  c["partial_rotary_factor"] = 1.5;
  EXPECT_THAT(ErrorOf(c), HasSubstr("partial_rotary_factor"));
  c = Phi3Long();
  c["sliding_window"] = -1;
  EXPECT_THAT(ErrorOf(c), HasSubstr("sliding_window"));
}

// The runtime picks its unit runner by the family model_registry.cc names, never by the architecture's name.
TEST(DecoderConfig, EachArchitectureHasItsRegistryFamily) {
  const std::vector<std::pair<json, ModelFamily>> cases{
      {Sized({{"architectures", {"LlamaForCausalLM"}}, {"num_hidden_layers", 2}}), ModelFamily::kLlama},
      {Sized({{"architectures", {"Qwen2ForCausalLM"}}, {"num_hidden_layers", 2}}), ModelFamily::kLlama},
      {Sized({{"architectures", {"Qwen3ForCausalLM"}}, {"num_hidden_layers", 2}}), ModelFamily::kQwen3},
      {Sized({{"architectures", {"MixtralForCausalLM"}}, {"num_hidden_layers", 2}}), ModelFamily::kMixtral},
      {Sized({{"architectures", {"Gemma2ForCausalLM"}}, {"num_hidden_layers", 2}}), ModelFamily::kGemma2},
      {Sized({{"architectures", {"Gemma3ForCausalLM"}}, {"num_hidden_layers", 2}}), ModelFamily::kGemma3},
      {Phi3Long(), ModelFamily::kPhi3}};
  for (const auto& [config, family] : cases) {
    absl::StatusOr<DecoderConfig> parsed = Decoder(config);
    ASSERT_TRUE(parsed.ok()) << config["architectures"] << ": " << parsed.status();
    EXPECT_EQ(parsed->family, family) << config["architectures"];
  }
}

TEST(DecoderConfig, ModuleTreesHaveNone) {
  absl::StatusOr<ModelSpec> spec =
      ModelSpecFromModuleTree({{"format", "strata.module_tree.v1"}, {"root", {{"class", "Tiny"}}}}, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->decoder.status().message(), HasSubstr("a module tree cannot be loaded"));
  EXPECT_FALSE(spec->eos_token_ids.has_value());
}

TEST(EosTokenIds, ReadWithTheSpecAndReportedWhereUsed) {
  json config = Qwen2();
  EXPECT_FALSE(ModelSpecFromConfig(config, DType::kFloat32)->eos_token_ids.has_value());
  for (const auto& [value, ids] : std::vector<std::pair<json, std::vector<int32_t>>>{
           {json(2), {2}}, {json({7, 8}), {7, 8}}, {json(nullptr), {}}}) {
    config["eos_token_id"] = value;
    absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_TRUE(spec->eos_token_ids.has_value()) << value;
    ASSERT_TRUE(spec->eos_token_ids->ok()) << spec->eos_token_ids->status();
    EXPECT_EQ(**spec->eos_token_ids, ids) << value;
  }
  // A bad id does not stop the plan: generation_config.json may name the ids instead.
  for (const json& bad : {json(-1), json(2.5), json({1, "2"}), json(int64_t{1} << 31)}) {
    config["eos_token_id"] = bad;
    absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_TRUE(spec->eos_token_ids.has_value());
    EXPECT_THAT(spec->eos_token_ids->status().message(), HasSubstr("config.json: eos_token_id must be")) << bad;
  }
}

}  // namespace
}  // namespace strata::planner
