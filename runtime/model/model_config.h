#pragma once
// What the forward pass needs from config.json beyond the tensor shapes the planner's ModelSpec
// already holds: normalisation epsilon, RoPE, sliding windows, activation. Plain C++, no torch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace strata::runtime {

// transformers' rope_parameters, for the RoPE types the runtime implements.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3, kLongRope };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;               // linear, llama3
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3
  double original_max_positions = 8192;  // llama3: original_max_position_embeddings
  // longrope (Phi-3): per-frequency divisors of inv_freq while the batch's longest sequence is at most
  // original_max_positions (short) and beyond it (long), and the cos/sin scale.
  std::vector<double> short_factor;
  std::vector<double> long_factor;
  double attention_factor = 1.0;
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
  // Gemma 2 / Gemma 3 text / Phi-3 (gemma_config.cc, phi3_config.cc); the defaults are Llama's behaviour.
  std::optional<RopeConfig> sliding_rope;  // Gemma 3: RoPE of the sliding layers (rope_local_base_freq)
  double query_pre_attn_scalar = 0;        // Gemma: scores scaled by its -1/2 power (0: head_dim's)
  double attn_logit_softcapping = 0;       // Gemma 2: tanh soft-cap of attention scores (0: none)
  double final_logit_softcapping = 0;      // Gemma: tanh soft-cap of the logits (0: none)
  int64_t rotary_dim = 0;                  // Phi-3 partial_rotary_factor: leading dims rotated (0: all)
};

// Reads the fields above from a parsed config.json (the architectures the planner builds specs for).
// Unsupported settings (another RoPE type, an activation other than SiLU, partial rotary factors) are
// InvalidArgument naming the config field.
absl::StatusOr<DecoderConfig> DecoderConfigFromJson(const nlohmann::json& config);

// Qwen3 / Qwen3-MoE / Mixtral: q/k norms and the MoE fields (model_config_moe.cc).
absl::Status ReadQwen3AndMoeConfig(const nlohmann::json& config, DecoderConfig& out);
// The RoPE settings of a config object as the Llama family reads them (rope_scaling / rope_parameters,
// rope_theta): shared with the families whose RoPE is a Llama-style dict.
absl::StatusOr<RopeConfig> RopeFromJson(const nlohmann::json& config);

// Gemma2ForCausalLM / Gemma3ForCausalLM (gemma_config.cc) and Phi3ForCausalLM (phi3_config.cc).
absl::StatusOr<DecoderConfig> GemmaDecoderConfigFromJson(const nlohmann::json& config);
absl::StatusOr<DecoderConfig> Phi3DecoderConfigFromJson(const nlohmann::json& config);

}  // namespace strata::runtime
