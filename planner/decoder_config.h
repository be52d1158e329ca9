#pragma once
// The forward pass's hyper-parameters beyond the tensor shapes a ModelSpec's module tree holds:
// normalisation epsilon, RoPE, sliding windows, soft-caps, MoE routing. Read from config.json once, by the
// family builders (model_spec_{llama,gemma,phi3}.cc, model_spec_moe.h) while they build the spec, and kept
// in ModelSpec::decoder; the runtime reads only this. Plain C++.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::planner {

// transformers' rope_parameters, for the RoPE types the runtime implements.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3, kLongRope };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                   // linear, llama3
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  double original_max_positions = 8192;  // llama3, longrope: original_max_position_embeddings
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

// Which of the runtime's unit runners executes the model (runtime/model/unit.h's table): Llama's dense
// layers; Qwen3's with q/k norms and the sparse MoE blocks (Qwen3, Qwen3-MoE), which Mixtral's layers take
// too; Gemma 2; Gemma 3 text; Phi-3. model_registry.cc names each architecture's family; architecture
// names appear there and in each family's own files only.
enum class ModelFamily { kLlama, kQwen3, kMixtral, kGemma2, kGemma3, kPhi3 };

struct DecoderConfig {
  std::string architecture;                  // ModelSpec::architecture (config.json's architectures[0])
  ModelFamily family = ModelFamily::kLlama;  // set by ModelSpecFromConfig from model_registry.cc
  int64_t num_layers = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  // Per layer: 0 for full causal attention, else the sliding window (a key is visible to a query when
  // query_position - key_position < window, as transformers' sliding_window_overlay).
  std::vector<int64_t> sliding_window;
  bool qk_norm = false;  // Qwen3, Qwen3-MoE: RMSNorm over each query and key head before RoPE
  MoeConfig moe;
  // Gemma 2 / Gemma 3 text / Phi-3; the defaults are Llama's behaviour.
  std::optional<RopeConfig> sliding_rope;  // Gemma 3: RoPE of the sliding layers (rope_local_base_freq)
  double query_pre_attn_scalar = 0;        // Gemma: scores scaled by its -1/2 power (0: head_dim's)
  double attn_logit_softcapping = 0;       // Gemma 2: tanh soft-cap of attention scores (0: none)
  double final_logit_softcapping = 0;      // Gemma: tanh soft-cap of the logits (0: none)
  int64_t rotary_dim = 0;                  // Phi-3 partial_rotary_factor: leading dims rotated (0: all)
};

}  // namespace strata::planner
