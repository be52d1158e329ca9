#pragma once
// What the forward pass needs from config.json beyond the tensor shapes the planner's ModelSpec
// already holds: normalisation epsilon, RoPE, sliding windows, activation. Plain C++, no torch.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace strata::runtime {

// transformers' rope_parameters, for the RoPE types the runtime implements.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3 };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;               // linear, llama3
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3
  double original_max_positions = 8192;  // llama3: original_max_position_embeddings
};

// Sparse MoE blocks (Qwen3-MoE, Mixtral; runtime/model/moe.h).
struct MoeConfig {
  int64_t num_experts = 0;  // 0: no layer is sparse
  int64_t top_k = 0;
  bool norm_topk_prob = false;      // divide the top-k probabilities by their sum (Mixtral: always)
  bool weights_in_float32 = false;  // Mixtral keeps the routing weights float32; Qwen3-MoE casts them back
  std::vector<bool> sparse;         // per layer: its MLP is the sparse block
};

struct DecoderConfig {
  std::string architecture;  // LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
  int64_t num_layers = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  // Per layer: 0 for full causal attention, else the sliding window (a key is visible to a query when
  // query_position - key_position < window, as transformers' sliding_window_overlay).
  std::vector<int64_t> sliding_window;
  bool qk_norm = false;  // Qwen3, Qwen3-MoE: RMSNorm over each query and key head before RoPE
  MoeConfig moe;
};

// Reads the fields above from a parsed config.json (the architectures the planner builds specs for).
// Unsupported settings (another RoPE type, an activation other than SiLU, partial rotary factors) are
// InvalidArgument naming the config field.
absl::StatusOr<DecoderConfig> DecoderConfigFromJson(const nlohmann::json& config);

// Qwen3 / Qwen3-MoE / Mixtral: q/k norms and the MoE fields (model_config_moe.cc).
absl::Status ReadQwen3AndMoeConfig(const nlohmann::json& config, DecoderConfig& out);

}  // namespace strata::runtime
