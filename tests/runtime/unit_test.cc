// unit.h: each architecture of the planner's registry meets its unit runner. The units are found in the
// spec's module tree, every parameter a runner reads is in its unit's subtree and every parameter there is
// read (or is a sparse block's experts, loaded apart), for each row and the switches that add tensors.
#include "runtime/model/unit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/model_registry.h"

namespace strata::runtime {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Every unit of the config-built spec meets its runner, with the switches the spec builder set.
absl::Status MapUnits(const json& config) {
  absl::StatusOr<planner::ModelSpec> spec = planner::ModelSpecFromConfig(config, planner::DType::kBFloat16);
  if (!spec.ok()) return spec.status();
  if (!spec->decoder.ok()) return spec->decoder.status();
  absl::StatusOr<std::vector<UnitModule>> units = UnitModules(*spec);
  if (!units.ok()) return units.status();
  if (units->size() != static_cast<size_t>(spec->num_hidden_layers + 3)) return absl::InternalError("unit count");
  const DecoderConfig& dims = *spec->decoder;
  for (const UnitModule& unit : *units) {
    absl::StatusOr<std::vector<std::string>> names = UnitTensorNames(unit, dims);
    if (!names.ok()) return names.status();
    if (names->empty()) return absl::InternalError(absl::StrCat(unit.module->name, " reads nothing"));
  }
  return absl::OkStatus();
}

json Config(const planner::Architecture& a) {
  return {{"architectures", {std::string(a.name)}},
          {"model_type", std::string(a.model_type)},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"num_hidden_layers", 3},
          {"vocab_size", 256},
          {"pad_token_id", 0}};
}

TEST(UnitRunners, EveryRegistryRowMapsOntoItsRunner) {
  for (const planner::Architecture& a : planner::Architectures()) {
    json config = Config(a);
    EXPECT_TRUE(MapUnits(config).ok()) << a.name << ": " << MapUnits(config);
    config["tie_word_embeddings"] = true;
    EXPECT_TRUE(MapUnits(config).ok()) << a.name << " tied: " << MapUnits(config);
    config["tie_word_embeddings"] = false;
    config["attention_bias"] = true;  // read by Llama, Qwen3, Qwen3-MoE and Gemma; ignored by the others
    EXPECT_TRUE(MapUnits(config).ok()) << a.name << " attention_bias: " << MapUnits(config);
  }
}

TEST(UnitRunners, LlamaMlpBiasAndDenseLayersAmongSparseOnes) {
  json llama = Config(planner::Architectures()[0]);
  llama["mlp_bias"] = true;
  EXPECT_TRUE(MapUnits(llama).ok()) << MapUnits(llama);
  for (const planner::Architecture& a : planner::Architectures()) {
    if (a.name != "Qwen3MoeForCausalLM") continue;
    json moe = Config(a);
    moe["num_experts"] = 4;
    moe["num_experts_per_tok"] = 2;
    moe["moe_intermediate_size"] = 32;
    moe["mlp_only_layers"] = {1};
    EXPECT_TRUE(MapUnits(moe).ok()) << MapUnits(moe);
  }
}

TEST(UnitRunners, AParameterNoRunnerReadsIsRefusedNamingIt) {
  absl::StatusOr<planner::ModelSpec> spec =
      planner::ModelSpecFromConfig(Config(planner::Architectures()[0]), planner::DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<UnitModule>> units = UnitModules(*spec);
  ASSERT_TRUE(units.ok()) << units.status();
  // A tree that holds a tensor the dims do not announce (as a bias the runner would skip).
  DecoderConfig dims = *spec->decoder;
  planner::ModuleSpec layer = *(*units)[1].module;
  layer.children[0].children[3].parameters.push_back({"bias", {64}, planner::DType::kBFloat16});  // o_proj
  UnitModule unit{UnitKind::kDecoderLayer, 0, &layer};
  absl::StatusOr<std::vector<std::string>> names = UnitTensorNames(unit, dims);
  ASSERT_FALSE(names.ok());
  EXPECT_THAT(names.status().message(), HasSubstr("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_THAT(names.status().message(), HasSubstr("does not read"));
  // And one the runner reads that the tree lacks.
  dims.qkv_bias = true;
  names = UnitTensorNames((*units)[1], dims);
  ASSERT_FALSE(names.ok());
  EXPECT_THAT(names.status().message(), HasSubstr("has no parameter model.layers.0.self_attn.q_proj.bias"));
}

TEST(UnitRunners, EveryFamilyHasARegistryRowAndARunner) {
  // (Each registry row's parity config: tests/runtime_parity/test_generate_parity.py's
  // test_every_architecture_has_a_parity_row.)
  for (planner::ModelFamily family : planner::kModelFamilies) {
    bool registered = false;
    for (const planner::Architecture& a : planner::Architectures()) registered = registered || a.family == family;
    EXPECT_TRUE(registered) << "ModelFamily " << static_cast<int>(family) << " has no row in model_registry.cc";
    const UnitRunner& runner = RunnerFor(family);
    EXPECT_NE(runner.weights, nullptr);
    EXPECT_NE(runner.run, nullptr);
  }
  for (const planner::Architecture& a : planner::Architectures()) {
    const bool listed = std::find(std::begin(planner::kModelFamilies), std::end(planner::kModelFamilies), a.family) !=
                        std::end(planner::kModelFamilies);
    EXPECT_TRUE(listed) << a.name << "'s family is missing from kModelFamilies";
  }
}

}  // namespace
}  // namespace strata::runtime
