#pragma once
// Internal (ATen): causal self-attention with GQA, RoPE, an optional sliding window and the KV cache,
// through LibTorch's scaled-dot-product attention.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/model/kv_cache.h"
#include "runtime/model/rope.h"
#include "runtime/model/weights.h"

namespace strata::runtime {

// One group of a forward pass as a stage sees it, on that stage's device: `rows` sequences that each feed
// `count` tokens, at [offset, offset + rows * count) of the pass's packed tokens. Row b holds tokens at
// positions[b] (a sequence's own positions from 0), written to its KV blocks at those positions; a row
// right-padded (strata-generate's prefill) computes its padding and ignores it.
struct AttentionGroup {
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t count = 0;
  at::Tensor positions;  // [rows, count] int64
  KvBlockTables kv;
  int64_t key_length = 0;  // keys [0, key_length) of every row take part
  RopeTables rope;
  RopeTables rope_sliding;  // Gemma 3: the sliding layers' tables (rope_local_base_freq); else undefined
  // Boolean masks [rows, 1, count, key_length] per sliding window (0: full causal).
  std::map<int64_t, at::Tensor> masks;
};

// A forward pass's tokens are packed, [1, tokens, hidden]: every projection, norm and MLP runs once over
// all of them (decode rows and prefill chunks of any length together); attention runs group by group.
struct AttentionBatch {
  std::vector<AttentionGroup> groups;
};

// `x` [tokens, heads, head_dim] (packed) -> the group's [rows, heads, count, head_dim].
at::Tensor GroupHeads(const at::Tensor& x, const AttentionGroup& group);
// The group outputs [rows, heads, count, head_dim] -> packed [1, tokens, heads * head_dim].
at::Tensor PackHeads(const std::vector<at::Tensor>& outs);

// True where key position j is visible to the query at position p: j <= p, and p - j < window when
// window > 0 (transformers' causal mask and sliding_window_overlay).
at::Tensor AttentionMask(const at::Tensor& positions, int64_t key_length, int64_t window);

struct AttentionWeights {
  WeightTensor q, k, v, o;            // projection weights [out, in], dense or packed
  at::Tensor q_bias, k_bias, v_bias;  // undefined when the model has none (Llama, Mistral)
};

// What Qwen3 adds (qwen3_model.h); each undefined when absent.
struct AttentionAdditions {
  at::Tensor q_norm, k_norm;  // RMSNorm weights [head_dim] over each query / key head, before RoPE
  double norm_eps = 1e-6;
  bool norm_across_heads = false;  // MiniMax-M2: q_norm / k_norm [heads x head_dim] over all heads of a token at once
  at::Tensor o_bias;               // attention_bias
  // gpt-oss: a learned logit per query head [heads], one more column of each softmax with no value (its weight is
  // dropped), so that a head may attend to nothing.
  at::Tensor sinks;
};

// hidden [batch, tokens, hidden] -> [batch, tokens, hidden]: projections, RoPE, KV append, SDPA with the
// layer's mask and scale head_dim^-0.5, output projection.
at::Tensor SelfAttention(const at::Tensor& hidden, const AttentionWeights& w, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, int64_t window, AttentionBatch& batch, KvLayer& cache,
                         const AttentionAdditions& additions = {});

}  // namespace strata::runtime
