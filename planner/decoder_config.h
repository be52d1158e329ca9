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
  enum class Type { kDefault, kLinear, kLlama3, kLongRope, kYarn };
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
  double attention_factor = 1.0;  // longrope, yarn: cos and sin scaled by it
  // yarn (DeepSeek-V3): interpolation by `factor` below the correction range [beta_fast, beta_slow] of
  // original_max_positions, extrapolation above it, a linear ramp between (truncated to whole dims unless
  // `truncate` is false).
  double beta_fast = 32;
  double beta_slow = 1;
  bool truncate = true;
};

// Sparse MoE blocks (Qwen3-MoE, Mixtral, DeepSeekMoE; runtime/model/moe.h).
struct MoeConfig {
  // How a token picks its experts: softmax over the router logits, top-k (Qwen3-MoE, Mixtral); or DeepSeekMoE's
  // sigmoid scores, top-k on the scores plus e_score_correction_bias within the topk_group best of n_group groups
  // (a group's score is the sum of its two best biased scores), weights from the unbiased scores.
  // MiniMax-M2's kSigmoid: sigmoid of the router logits (computed in the weights' dtype), the top k of the scores plus
  // the block's e_score_correction_bias, weights from the unbiased scores renormalised (no groups, no scaling).
  // gpt-oss's kTopkSoftmax: the top k of the router logits (with the router's bias), softmax over those k alone, in
  // the logits' dtype.
  enum class Router { kSoftmax, kSigmoidGroups, kSigmoid, kTopkSoftmax };
  // The experts' gated activation: act(gate) x up with SiLU; or gpt-oss's clamped SwiGLU, gate clamped above at
  // swiglu_limit, up to +-swiglu_limit, (up + 1) x gate x sigmoid(swiglu_alpha x gate), the experts' projections with
  // biases (gate_up_proj_bias, down_proj_bias).
  enum class Activation { kSiluGlu, kClampedSwiglu };
  Activation activation = Activation::kSiluGlu;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  Router router = Router::kSoftmax;
  int64_t num_experts = 0;  // 0: no layer is sparse
  int64_t top_k = 0;
  int64_t n_group = 1;                 // kSigmoidGroups
  int64_t topk_group = 1;              // kSigmoidGroups
  double routed_scaling_factor = 1.0;  // kSigmoidGroups: the weights' factor (after norm_topk_prob)
  int64_t shared_intermediate = 0;     // DeepSeekMoE: the shared experts' MLP, added unweighted (0: none)
  bool norm_topk_prob = false;         // divide the top-k probabilities by their sum (Mixtral: always)
  bool weights_in_float32 = false;     // Mixtral keeps the routing weights float32; Qwen3-MoE casts them back
  std::vector<bool> sparse;            // per layer: its MLP is the sparse block
};

// Multi-head latent attention (DeepSeek-V3; runtime/model/deepseek_model.h): keys and values are one latent
// row per token (kv_lora_rank, after kv_a_layernorm) with one shared RoPE key (qk_rope_head_dim), expanded per head
// by kv_b_proj. kv_lora_rank == 0: not MLA.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;  // RoPE pairs (x0, x1), (x2, x3), ... rather than halves
  double softmax_scale = 0;     // (qk_nope_head_dim + qk_rope_head_dim)^-1/2, times YaRN's mscale^2
  bool attention_bias = false;  // q_a_proj, kv_a_proj_with_mqa and o_proj have biases
};

// Which of the runtime's unit runners executes the model (runtime/model/unit.h's table): Llama's dense
// layers; Qwen3's with q/k norms and the sparse MoE blocks (Qwen3, Qwen3-MoE), which Mixtral's layers take
// too; Gemma 2; Gemma 3 text; Phi-3. model_registry.cc names each architecture's family; architecture
// names appear there and in each family's own files only.
enum class ModelFamily {
  kLlama,
  kQwen3,
  kMixtral,
  kGemma2,
  kGemma3,
  kPhi3,
  kDeepseekV3,
  kGlm4Moe,
  kMiniMaxM2,
  kGptOss,
};
// Every family (tests/runtime/unit_test.cc checks each has a registry row and a runner, and every registry row's
// family is here).
inline constexpr ModelFamily kModelFamilies[] = {
    ModelFamily::kLlama, ModelFamily::kQwen3,      ModelFamily::kMixtral, ModelFamily::kGemma2,    ModelFamily::kGemma3,
    ModelFamily::kPhi3,  ModelFamily::kDeepseekV3, ModelFamily::kGlm4Moe, ModelFamily::kMiniMaxM2, ModelFamily::kGptOss,
};

// The one hyper-parameter struct of a model: filled once by its family's spec builder from config.json
// (model_spec_<family>.cc), kept in ModelSpec::decoder, read by every unit runner (runtime/model/unit.h).
struct DecoderConfig {
  std::string architecture;                  // ModelSpec::architecture (config.json's architectures[0])
  ModelFamily family = ModelFamily::kLlama;  // set by ModelSpecFromConfig from model_registry.cc
  int64_t num_layers = 0;
  // The multi-token-prediction layer kept in the spec (ModelSpec::mtp_kept): its index, num_layers; -1 when none. Its
  // per-layer settings (moe.sparse, sliding_window) are at that index.
  int64_t mtp_layer = -1;
  // Sizes, as the module tree has them (spec_builder.h's ReadDecoderSizes and the family's own reads).
  int64_t hidden = 0;
  int64_t intermediate = 0;  // the dense MLP's (Phi-3: the split of gate_up_proj)
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool qkv_bias = false;  // q, k and v projections have biases (Qwen2; attention_bias)
  bool o_bias = false;    // o_proj has a bias (attention_bias)
  bool mlp_bias = false;  // Llama's mlp_bias: gate, up and down have biases
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  // Per layer: 0 for full causal attention, else the sliding window (a key is visible to a query when
  // query_position - key_position < window, as transformers' sliding_window_overlay).
  std::vector<int64_t> sliding_window;
  bool qk_norm = false;  // Qwen3, Qwen3-MoE: RMSNorm over each query and key head before RoPE
  // MiniMax-M2: the q/k RMSNorms span all query heads and all key heads at once ([heads x head_dim] weights)
  bool qk_norm_across_heads = false;
  MoeConfig moe;
  MlaConfig mla;  // DeepSeek-V3
  // Gemma 2 / Gemma 3 text / Phi-3; the defaults are Llama's behaviour.
  std::optional<RopeConfig> sliding_rope;  // Gemma 3: RoPE of the sliding layers (rope_local_base_freq)
  double query_pre_attn_scalar = 0;        // Gemma: scores scaled by its -1/2 power (0: head_dim's)
  double attn_logit_softcapping = 0;       // Gemma 2: tanh soft-cap of attention scores (0: none)
  double final_logit_softcapping = 0;      // Gemma: tanh soft-cap of the logits (0: none)
  int64_t rotary_dim = 0;                  // Phi-3 partial_rotary_factor: leading dims rotated (0: all)
  bool attention_sinks = false;            // gpt-oss: self_attn.sinks, one softmax logit per query head
};

}  // namespace strata::planner
