#pragma once
// Internal (ATen): the Llama family's unit runner (unit.h), as transformers 5.23's LlamaForCausalLM computes
// it; it serves Llama, Mistral and Qwen2, whose differences are data: q/k/v biases (Qwen2, Llama's
// attention_bias with o's), MLP biases (Llama's mlp_bias), sliding windows per layer, tied embeddings. Its
// embedding, final norm and LM head also serve Qwen3, Qwen3-MoE and Mixtral (qwen3_model.h) and Phi-3.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/unit.h"

namespace strata::runtime {

// Weight order of a decoder layer's unit; then q/k/v biases (dims.qkv_bias), o's (dims.o_bias) and
// gate/up/down's (dims.mlp_bias), each group only where the model has it.
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
};

// UnitRunner::weights and ::run.
std::vector<std::string> LlamaUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims);
at::Tensor RunLlamaUnit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                        const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

// transformers' LlamaRMSNorm: in float32, cast back before the weight multiplies.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
// The final norm's input: packed hidden [1, tokens, hidden] -> the tokens whose logits are wanted (each
// row's last real token, or more: ForwardBatch::last), [wanted, 1, hidden]; `last` holds their places.
at::Tensor LastTokens(const at::Tensor& hidden, const at::Tensor& last);

}  // namespace strata::runtime
