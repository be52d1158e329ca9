// Qwen3-MoE and Mixtral specs: which layers are sparse, the checkpoint names of fused experts, and
// --experts-on's rule on a tiny tree. The trees themselves are checked live against transformers by
// tests/parity/test_family_plan_parity_moe.py; here the rules are pinned by hand-computed cases.

#include "planner/model_spec_moe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/experts_on.h"
#include "planner/model_spec.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json TinyMoe(const std::string& architecture, const std::string& model_type) {
  return {{"architectures", {architecture}},
          {"model_type", model_type},
          {"hidden_size", 8},
          {"intermediate_size", 16},
          {"moe_intermediate_size", 4},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"vocab_size", 10},
          {"num_experts", 3},
          {"num_experts_per_tok", 2}};
}

TEST(Qwen3MoeSpecTest, SparseLayersFollowStepAndMlpOnlyLayers) {
  json config = TinyMoe("Qwen3MoeForCausalLM", "qwen3_moe");
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = {3};
  absl::StatusOr<internal::MoeFields> moe = internal::ReadQwen3MoeFields(config);
  ASSERT_TRUE(moe.ok()) << moe.status();
  std::vector<bool> sparse;
  for (int i = 0; i < 4; ++i) sparse.push_back(internal::Qwen3MoeLayerIsSparse(*moe, i));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false}));
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->per_expert_storage.size(), 1u);
  EXPECT_EQ(spec->per_expert_storage[0].module, "model.layers.1.mlp.experts");
}

TEST(Qwen3MoeSpecTest, CheckpointHoldsOneTensorPerExpert) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(TinyMoe("Qwen3MoeForCausalLM", "qwen3_moe"), DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto tensors = CheckpointTensors(*spec);
  EXPECT_FALSE(tensors.contains("model.layers.0.mlp.experts.gate_up_proj"));
  ASSERT_TRUE(tensors.contains("model.layers.0.mlp.experts.2.gate_proj.weight"));
  EXPECT_EQ(tensors.at("model.layers.0.mlp.experts.2.gate_proj.weight").shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(tensors.at("model.layers.0.mlp.experts.2.down_proj.weight").shape, (std::vector<int64_t>{8, 4}));
  EXPECT_TRUE(tensors.contains("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_TRUE(tensors.contains("model.layers.0.mlp.gate.weight"));
}

TEST(MixtralSpecTest, CheckpointKeepsBlockSparseMoeNames) {
  json config = TinyMoe("MixtralForCausalLM", "mixtral");
  config.erase("moe_intermediate_size");
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto tensors = CheckpointTensors(*spec);
  EXPECT_TRUE(tensors.contains("model.layers.3.block_sparse_moe.gate.weight"));
  EXPECT_FALSE(tensors.contains("model.layers.3.mlp.gate.weight"));
  EXPECT_EQ(tensors.at("model.layers.3.block_sparse_moe.experts.1.w3.weight").shape, (std::vector<int64_t>{16, 8}));
}

TEST(MoeSpecTest, TopKAboveTheExpertsNamesTheField) {
  json config = TinyMoe("MixtralForCausalLM", "mixtral");
  config["num_local_experts"] = 2;
  config["num_experts_per_tok"] = 3;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("num_experts_per_tok (3) must not exceed num_local_experts (2)"));
}

TEST(ExpertsOnTest, MovesTheLastLayersExpertsUntilTheRestFits) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(TinyMoe("Qwen3MoeForCausalLM", "qwen3_moe"), DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<int64_t> total = SpecBytes(*spec);
  ASSERT_TRUE(total.ok());
  PlanRequest request;
  request.device_map.strategy = Strategy::kSequential;
  // A GPU 0 of 90% of the model cannot hold it all; without the last layer's experts it can.
  request.max_memory = ParseMaxMemory(absl::StrCat("0=", *total * 9 / 10, ",cpu=1GiB")).value();
  absl::StatusOr<ExpertsOnPlan> apart = PlaceSpecWithExpertsOn(*spec, request, Device::Cpu());
  ASSERT_TRUE(apart.ok()) << apart.status();
  ASSERT_FALSE(apart->moved.empty());
  EXPECT_EQ(apart->moved.back(), "model.layers.3.mlp.experts");
  for (const auto& [name, device] : apart->plan.device_map) {
    if (name.size() > 12 && name.substr(name.size() - 12) == ".mlp.experts") {
      EXPECT_TRUE(device.is_gpu() || device == Device::Cpu()) << name;
    } else {
      EXPECT_TRUE(device.is_gpu()) << name << " is on " << device.ToString();
    }
  }
  EXPECT_EQ(apart->plan.strategy, Strategy::kSequential);
}

TEST(ExpertsOnTest, RefusesManualMapsAndDenseModels) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(TinyMoe("Qwen3MoeForCausalLM", "qwen3_moe"), DType::kFloat32);
  ASSERT_TRUE(spec.ok());
  PlanRequest manual;
  manual.device_map.strategy = Strategy::kManual;
  manual.device_map.manual = {{"", Device::Cpu()}};
  EXPECT_THAT(PlaceSpecWithExpertsOn(*spec, manual, Device::Cpu()).status().message(), HasSubstr("needs a strategy"));
  json dense = TinyMoe("Qwen3ForCausalLM", "qwen3");
  absl::StatusOr<ModelSpec> qwen3 = ModelSpecFromConfig(dense, DType::kFloat32);
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  PlanRequest request;
  request.max_memory = ParseMaxMemory("0=1GiB,cpu=1GiB").value();
  EXPECT_THAT(PlaceSpecWithExpertsOn(*qwen3, request, Device::Cpu()).status().message(),
              HasSubstr("has no experts modules"));
}

}  // namespace
}  // namespace strata::planner
