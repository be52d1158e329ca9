#pragma once
// Internal to ModelSpecFromConfig: the MoE pieces that Qwen3-MoE (model_spec_qwen3.h) and Mixtral change in the
// Llama-family layout that model_spec_llama.cc builds (sparse MoE blocks with fused experts), the MoE config fields
// they read, and the tree edits they share with dense Qwen3 (q/k RMSNorms per head). ExtendMixtralSpec edits the
// finished Llama-layout spec in place and sets the forward pass's settings that go with its changes
// (DecoderConfig::moe).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"

namespace strata::planner::internal {

// Caps on the MoE fields, checked before anything is sized by them (the largest released MoE models
// have 256 experts and 8 active per token).
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;
// Experts x sparse layers: each is three checkpoint tensors, listed one by one by the checkpoint check
// (Qwen3-235B-A22B has 128 x 94 = 12032, DeepSeek-V3's 256 x 58 = 14848).
inline constexpr int64_t kMaxExpertModules = int64_t{1} << 16;
// "num_local_experts" or "num_experts": the field config.json gives the experts' count in (the config
// classes' attribute_map makes them one; save_pretrained writes num_local_experts, the Hub's Qwen3-MoE
// configs num_experts).
const char* ExpertsField(const nlohmann::json& config);
// An error naming `experts_field` when experts x sparse layers exceeds kMaxExpertModules.
absl::Status CheckExpertModules(int64_t num_experts, int64_t sparse_layers, const char* experts_field);

// The MoE fields of a config, validated (errors name the field).
struct MoeFields {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t intermediate = 0;              // each expert's intermediate size
  int64_t decoder_sparse_step = 1;       // Qwen3-MoE: layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and i is not listed here
  bool norm_topk_prob = false;
};

// Qwen3-MoE: num_experts or its alias num_local_experts (default 128), num_experts_per_tok (8), moe_intermediate_size
// (768), decoder_sparse_step (1), mlp_only_layers ([]), norm_topk_prob (false), as Qwen3MoeConfig.
absl::StatusOr<MoeFields> ReadQwen3MoeFields(const nlohmann::json& config);
// Mixtral: num_local_experts (or its alias num_experts; default 8), num_experts_per_tok (2); the experts'
// intermediate size is intermediate_size; top-k weights are always renormalised.
absl::StatusOr<MoeFields> ReadMixtralFields(const nlohmann::json& config);

// DeepSeekMoE's router and experts as DeepseekV3Config and Glm4MoeConfig name them (the families differ in defaults):
// sigmoid scores, group-limited top-k with e_score_correction_bias, shared experts, the first first_k_dense_replace
// layers dense.
struct GroupRouterFields {
  int64_t moe_intermediate = 0;  // moe_intermediate_size
  int64_t n_shared_experts = 0;
  int64_t n_routed_experts = 0;  // or its alias num_local_experts
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 0;  // num_experts_per_tok
  int64_t first_k_dense_replace = 0;
  bool norm_topk_prob = true;
};
// Reads them over `defaults` and checks the router's shapes (equal groups of at least two experts, topk_group <=
// n_group, top_k within the kept groups) and the expert-module cap for `layers` layers; errors name the field.
absl::StatusOr<GroupRouterFields> ReadGroupRouterFields(const nlohmann::json& config, const GroupRouterFields& defaults,
                                                        int64_t layers);
// The forward pass's MoeConfig of those fields (MoeConfig::Router::kSigmoidGroups, shared experts, sparse layers).
void SetGroupRouterMoe(const GroupRouterFields& f, int64_t layers, MoeConfig& moe);

// Whether Qwen3-MoE's layer `layer` holds a sparse MoE block (Qwen3MoeDecoderLayer.__init__).
bool Qwen3MoeLayerIsSparse(const MoeFields& moe, int64_t layer);

// Mixtral (model_spec_mixtral.cc); Qwen3 and Qwen3-MoE are model_spec_qwen3.h's.
absl::Status ExtendMixtralSpec(const nlohmann::json& config, ModelSpec& spec, DecoderConfig& decoder);

// Shared by the Extend* functions (model_spec_moe.cc; Qwen3's and Mixtral's).
// Adds `prefix`RMSNorm q_norm and k_norm over head_dim to every layer's self_attn (Qwen3Attention).
void AddQkNorms(ModelSpec& spec, const std::string& prefix);
// The sparse block `prefix`SparseMoeBlock for layer `layer`'s `mlp`, children in registration order
// (`router_first`: Mixtral registers gate before experts, Qwen3-MoE after), and its checkpoint layout.
ModuleSpec SparseMoeBlock(const ModuleSpec& layer, const std::string& prefix, const MoeFields& moe, int64_t hidden,
                          const std::string& act_class, DType dtype, bool router_first);
// The layer module `model.layers.i` and, in it, the child named `local`.
ModuleSpec& LayerModule(ModelSpec& spec, int64_t layer);
ModuleSpec& Child(ModuleSpec& module, const std::string& local);

}  // namespace strata::planner::internal
