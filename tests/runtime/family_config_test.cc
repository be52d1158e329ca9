// config.json fields the Gemma 2 / Gemma 3 text / Phi-3 forward passes read (gemma_config.cc,
// phi3_config.cc): defaults as transformers 5.23's config classes, errors naming the field.
#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const nlohmann::json& config) {
  absl::StatusOr<DecoderConfig> parsed = DecoderConfigFromJson(config);
  EXPECT_FALSE(parsed.ok());
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(FamilyConfig, Gemma2DefaultsAlternateSlidingAndGlobalWithBothSoftCaps) {
  absl::StatusOr<DecoderConfig> c =
      DecoderConfigFromJson({{"architectures", {"Gemma2ForCausalLM"}}, {"num_hidden_layers", 4}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, (std::vector<int64_t>{4096, 0, 4096, 0}));
  EXPECT_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_EQ(c->query_pre_attn_scalar, 256.0);
  EXPECT_FALSE(c->sliding_rope.has_value());
}

TEST(FamilyConfig, Gemma3RopePerLayerTypeFromLegacyFields) {
  absl::StatusOr<DecoderConfig> c = DecoderConfigFromJson({{"architectures", {"Gemma3ForCausalLM"}},
                                                           {"num_hidden_layers", 7},
                                                           {"sliding_window", 512},
                                                           {"rope_theta", 1000000.0},
                                                           {"rope_local_base_freq", 10000.0},
                                                           {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
                                                           {"attn_logit_softcapping", 50.0}});
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

TEST(FamilyConfig, GemmaBadFieldsAreNamed) {
  const nlohmann::json base = {{"architectures", {"Gemma2ForCausalLM"}}, {"num_hidden_layers", 2}};
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json c = base;
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

nlohmann::json Phi3Long() {
  return {{"architectures", {"Phi3ForCausalLM"}},
          {"num_hidden_layers", 2},
          {"hidden_size", 64},
          {"num_attention_heads", 4},
          {"max_position_embeddings", 131072},
          {"original_max_position_embeddings", 4096},
          {"rope_scaling",
           {{"type", "longrope"},
            {"short_factor", {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
            {"long_factor", {2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0}}}}};
}

TEST(FamilyConfig, Phi3LongropeAttentionFactorFromTheContextRatio) {
  absl::StatusOr<DecoderConfig> c = DecoderConfigFromJson(Phi3Long());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kLongRope);
  EXPECT_EQ(c->rope.original_max_positions, 4096);
  EXPECT_DOUBLE_EQ(c->rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_EQ(c->rotary_dim, 0);
  EXPECT_EQ(c->sliding_window, (std::vector<int64_t>{0, 0}));
}

TEST(FamilyConfig, Phi3SuIsLongropeWithTheTopLevelOriginalLength) {
  nlohmann::json c = Phi3Long();
  c["rope_scaling"]["type"] = "su";
  // Required in the dict by Phi3Config's validation, then overridden by the top-level field (transformers'
  // _compute_longrope_parameters standardizes again once the type reads "longrope").
  c["rope_scaling"]["original_max_position_embeddings"] = 8192;
  absl::StatusOr<DecoderConfig> parsed = DecoderConfigFromJson(c);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rope.type, RopeConfig::Type::kLongRope);
  EXPECT_EQ(parsed->rope.original_max_positions, 4096);
  EXPECT_DOUBLE_EQ(parsed->rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
}

TEST(FamilyConfig, Phi3BadFieldsAreNamed) {
  nlohmann::json c = Phi3Long();
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

}  // namespace
}  // namespace strata::runtime
