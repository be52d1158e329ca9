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
}  // namespace strata::planner
