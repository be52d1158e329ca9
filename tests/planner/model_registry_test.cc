// model_registry.cc: the one table of architectures. Each row resolves from model_type alone, from
// architectures alone and from both, builds a spec whose root class is its name and whose decoder names its
// family; contradictions and unknown names are errors that list the supported architectures.
#include "planner/model_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "nlohmann/json.hpp"
#include "planner/manual_device_map.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Sized() {
  return {{"hidden_size", 64},      {"intermediate_size", 128}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"num_hidden_layers", 2}, {"vocab_size", 256},        {"pad_token_id", 0}};
}

std::string Error(const json& config) {
  absl::StatusOr<const Architecture*> arch = ResolveArchitecture(config);
  return arch.ok() ? "resolved to " + std::string((*arch)->name) : std::string(arch.status().message());
}

TEST(ModelRegistry, NamesAndModelTypesAreUnique) {
  // A class may serve several model types (DeepseekV3ForCausalLM: deepseek_v3 and Kimi K2's kimi_k2), each with
  // the same family; a model type names one row.
  std::set<absl::string_view> model_types;
  std::map<absl::string_view, ModelFamily> families;
  for (const Architecture& a : Architectures()) {
    EXPECT_TRUE(model_types.insert(a.model_type).second) << a.model_type;
    auto [it, inserted] = families.emplace(a.name, a.family);
    EXPECT_EQ(it->second, a.family) << a.name;
  }
  EXPECT_EQ(families.size(), 13u);
  EXPECT_EQ(model_types.size(), 14u);
}

TEST(ModelRegistry, EveryRowResolvesAndBuilds) {
  for (const Architecture& a : Architectures()) {
    for (int form = 0; form < 3; ++form) {  // model_type alone, architectures alone, both
      json config = Sized();
      if (form != 1) config["model_type"] = std::string(a.model_type);
      if (form != 0) config["architectures"] = {std::string(a.name)};
      absl::StatusOr<const Architecture*> resolved = ResolveArchitecture(config);
      ASSERT_TRUE(resolved.ok()) << a.name << " form " << form << ": " << resolved.status();
      // architectures alone picks the class's first row (the model type transformers' config of it has).
      if (form != 1) {
        EXPECT_EQ(*resolved, &a);
      }
      EXPECT_EQ((*resolved)->name, a.name);
      absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
      ASSERT_TRUE(spec.ok()) << a.name << ": " << spec.status();
      EXPECT_EQ(spec->architecture, a.name);
      EXPECT_EQ(spec->root.class_name, a.name);
      ASSERT_TRUE(spec->decoder.ok()) << a.name << ": " << spec->decoder.status();
      EXPECT_EQ(spec->decoder->family, a.family) << a.name;
      EXPECT_EQ(spec->decoder->architecture, a.name);
    }
  }
}

TEST(ModelRegistry, ContradictionsAndUnknownNamesAreErrors) {
  json config = Sized();
  config["architectures"] = {"LlamaForCausalLM"};
  config["model_type"] = "gemma2";
  EXPECT_EQ(Error(config), "config.json: architectures[0] is \"LlamaForCausalLM\" but model_type is \"gemma2\"");
  config["architectures"] = {"Gemma2ForCausalLM"};
  config["model_type"] = "llama";
  EXPECT_EQ(Error(config), "config.json: architectures[0] is \"Gemma2ForCausalLM\" but model_type is \"llama\"");
  // AutoConfig refuses a model_type it does not know, whatever architectures says.
  config["model_type"] = "my_gemma";
  EXPECT_THAT(Error(config), HasSubstr("but model_type is \"my_gemma\""));
  config["model_type"] = 3;
  EXPECT_EQ(Error(config), "config.json: model_type must be a string, got 3");
  config["model_type"] = "gemma2";
  config["architectures"] = "Gemma2ForCausalLM";
  EXPECT_THAT(Error(config), HasSubstr("config.json: architectures must be a non-empty array of strings"));
  config["architectures"] = {"GPT2LMHeadModel"};
  const std::string unsupported = Error(config);
  EXPECT_THAT(unsupported, HasSubstr("architecture \"GPT2LMHeadModel\" is not supported"));
  for (const Architecture& a : Architectures()) EXPECT_THAT(unsupported, HasSubstr(std::string(a.name)));
  EXPECT_THAT(unsupported, HasSubstr("--module-tree"));
  config.erase("architectures");
  config["model_type"] = "gpt2";
  EXPECT_THAT(Error(config), HasSubstr("model_type \"gpt2\" is not supported"));
  config.erase("model_type");
  EXPECT_THAT(Error(config), HasSubstr("neither architectures nor model_type is set"));
}

}  // namespace
// DeepSeek-V3's multi-token-prediction layer (--speculative mtp): built beside the tree from num_nextn_predict_layers,
// kept in it only when asked (after the decoder layers, its head tied to lm_head, its per-layer settings at its
// index), placed with lm_head by every strategy, its KV counted; asked of a model without one, an error naming the
// field.
json TinyDeepseek() {
  json config = Sized();
  config["model_type"] = "deepseek_v3";
  config.update({{"n_routed_experts", 4},
                 {"n_group", 1},
                 {"topk_group", 1},
                 {"num_experts_per_tok", 2},
                 {"first_k_dense_replace", 1},
                 {"moe_intermediate_size", 32},
                 {"kv_lora_rank", 16},
                 {"q_lora_rank", 16},
                 {"qk_rope_head_dim", 8},
                 {"qk_nope_head_dim", 8},
                 {"v_head_dim", 8},
                 {"num_nextn_predict_layers", 1}});
  return config;
}

TEST(ModelRegistry, DeepseekMtpLayerIsKeptOnlyWhenAsked) {
  absl::StatusOr<ModelSpec> plain = ModelSpecFromConfig(TinyDeepseek(), DType::kBFloat16);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(plain->mtp.has_value());
  EXPECT_FALSE(plain->mtp_kept);
  EXPECT_EQ(plain->mtp->module.name, "model.layers.2");
  EXPECT_TRUE(plain->mtp->sparse);
  EXPECT_THAT(plain->ignored_prefixes, ::testing::ElementsAre("model.layers.2."));
  EXPECT_EQ(plain->decoder->mtp_layer, -1);

  absl::StatusOr<ModelSpec> kept = ModelSpecFromConfig(TinyDeepseek(), DType::kBFloat16, {.mtp = true});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->mtp_kept);
  EXPECT_TRUE(kept->ignored_prefixes.empty());
  EXPECT_EQ(kept->tied_weights.at("model.layers.2.shared_head.head.weight"), "lm_head.weight");
  EXPECT_EQ(kept->decoder->mtp_layer, 2);
  EXPECT_EQ(kept->decoder->moe.sparse, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(kept->decoder->sliding_window.size(), 3u);
  EXPECT_EQ(NoSplitModules(*kept).size(), 3u);
  EXPECT_EQ(NoSplitModules(*kept).back()->name, "model.layers.2");
  EXPECT_EQ(kept->per_expert_storage.back().module, "model.layers.2.mlp.experts");
  // Its own parameters and the decoder layer's, beside the tied head (not counted twice).
  absl::StatusOr<int64_t> plain_bytes = SpecBytes(*plain), kept_bytes = SpecBytes(*kept);
  ASSERT_TRUE(plain_bytes.ok() && kept_bytes.ok());
  EXPECT_GT(*kept_bytes, *plain_bytes);

  json none = TinyDeepseek();
  none.erase("num_nextn_predict_layers");
  absl::StatusOr<ModelSpec> refused = ModelSpecFromConfig(none, DType::kBFloat16, {.mtp = true});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("num_nextn_predict_layers"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--speculative mtp"));
  json llama = Sized();
  llama["model_type"] = "llama";
  EXPECT_FALSE(ModelSpecFromConfig(llama, DType::kBFloat16, {.mtp = true}).ok());
}

TEST(ModelRegistry, DeepseekMtpLayerIsPlacedWithLmHeadAndHoldsKv) {
  absl::StatusOr<ModelSpec> kept = ModelSpecFromConfig(TinyDeepseek(), DType::kBFloat16, {.mtp = true});
  ASSERT_TRUE(kept.ok()) << kept.status();
  for (const char* strategy : {"balanced_low_0", "balanced", "sequential"}) {
    PlanRequest request;
    request.device_map = *ParseDeviceMapChoice(strategy);
    request.max_memory = *ParseMaxMemory("0=1GiB,1=1GiB,2=1GiB,cpu=1GiB");
    request.kv_cache_tokens = 64;
    absl::StatusOr<Plan> plan = PlaceSpec(*kept, request);
    ASSERT_TRUE(plan.ok()) << strategy << ": " << plan.status();
    internal::DeviceResolver resolver(plan->device_map);
    ASSERT_TRUE(resolver.Find("model.layers.2.eh_proj.weight") && resolver.Find("lm_head.weight"));
    EXPECT_EQ(resolver.Find("model.layers.2.eh_proj.weight")->second, resolver.Find("lm_head.weight")->second)
        << strategy;
    int64_t kv = 0;
    for (const DeviceUsage& d : plan->devices) kv += d.kv_cache_bytes;
    EXPECT_EQ(kv, 3 * 64 * (16 + 8) * 2) << strategy;  // three latent layers, bfloat16
  }
}

}  // namespace strata::planner
