#pragma once
// Internal (ATen): a model as a list of execution units in forward order — embedding, decoder layers, final
// norm, LM head — each with its weights already on their planned devices. Llama's units serve Llama,
// Mistral, Qwen2, Qwen3, Qwen3-MoE and Mixtral, whose differences are data: q/k/v biases (Qwen2), q/k norms
// (Qwen3), sliding windows per layer, sparse MoE layers, tied embeddings. ModelDims::family (the
// planner's, planner/decoder_config.h) sends Gemma 2/3 and Phi-3 units to their own files.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "planner/decoder_config.h"
#include "runtime/model/attention.h"
#include "runtime/model/weights.h"

namespace strata::runtime {

// Which unit code runs (llama_model.cc dispatches the others to gemma_model.cc / phi3_model.cc).
// Which unit runner a model's units take: the planner's family (planner/decoder_config.h).
using ModelFamily = planner::ModelFamily;

struct ModelDims {
  int64_t hidden = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  double rms_norm_eps = 1e-6;
  bool qkv_bias = false;
  bool qk_norm = false;    // Qwen3 families (qwen3_model.h)
  bool o_bias = false;     // Qwen3 families with attention_bias (with qkv_bias)
  planner::MoeConfig moe;  // Qwen3-MoE, Mixtral (moe.h)
  // Gemma 2 / Gemma 3 / Phi-3 (zero: not used).
  ModelFamily family = ModelFamily::kLlama;
  double attention_scale = 0;          // Gemma: query_pre_attn_scalar^-1/2 (0: head_dim^-1/2)
  double attn_logit_softcapping = 0;   // Gemma 2
  double final_logit_softcapping = 0;  // Gemma
  int64_t intermediate = 0;            // Phi-3: the split of gate_up_proj
};

enum class UnitKind { kEmbedding, kDecoderLayer, kFinalNorm, kLmHead };

// Weight order of a decoder layer's unit.
enum LayerWeight : int {
  kInputNorm,
  kQ,
  kK,
  kV,
  kO,
  kPostNorm,
  kGate,
  kUp,
  kDown,
  kQBias,
  kKBias,
  kVBias,
};

struct Unit {
  UnitKind kind = UnitKind::kEmbedding;
  std::string module;  // HF module name: "model.embed_tokens", "model.layers.3", "model.norm", "lm_head"
  int64_t layer = -1;  // decoder layer index
  int64_t window = 0;  // sliding window of a decoder layer (0: full)
  std::vector<Weight> weights;
  at::Device device = at::kCPU;  // where it executes
  // A sparse MoE layer's fused experts {gate_up [E, 2I, H], down [E, H, I]}, resident on the device they
  // execute on, which may differ from `device` (moe.h).
  std::vector<Weight> experts;
  std::string experts_label;  // the plan device of the experts ("cpu", "1")

  bool offloaded() const;  // some weight is fetched on use
  std::vector<const Weight*> weight_ptrs() const;
};

// The checkpoint tensor names a unit holds, in its weight order (for a decoder layer: LayerWeight order,
// biases only when `dims.qkv_bias`). The tied LM head names the embedding.
std::vector<std::string> UnitTensorNames(UnitKind kind, int64_t layer, const ModelDims& dims, bool tied_head);

// Runs one unit. `weights` are the unit's tensors on its device (Weight::Use or a Prefetch).
// Embedding: `hidden` is the packed ids [1, tokens] int64. Final norm first keeps each row's last token
// (`last`, [rows] int64 places among the packed tokens; LastTokens): logits are needed for one position per
// sequence. LM head returns float32 logits [rows, vocab].
at::Tensor RunUnit(const Unit& unit, const std::vector<at::Tensor>& weights, const ModelDims& dims,
                   const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

// transformers' LlamaRMSNorm: in float32, cast back before the weight multiplies.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
// The final norm's input: packed hidden [1, tokens, hidden] -> each row's last real token, [rows, 1, hidden];
// `last` [rows] holds their places among the packed tokens.
at::Tensor LastTokens(const at::Tensor& hidden, const at::Tensor& last);

}  // namespace strata::runtime
