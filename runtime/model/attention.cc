#include "runtime/model/attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <cmath>

#include "runtime/model/llama_model.h"  // RmsNorm
#include "runtime/model/linear.h"

namespace strata::runtime {

at::Tensor AttentionMask(const at::Tensor& positions, int64_t key_length, int64_t window) {
  at::Tensor keys = at::arange(key_length, positions.options());        // [K]
  at::Tensor query = positions.unsqueeze(-1);                             // [B, T, 1]
  at::Tensor visible = keys <= query;                                     // [B, T, K]
  if (window > 0) visible = visible.logical_and(keys > query - window);
  return visible.unsqueeze(1);                                            // [B, 1, T, K]
}

at::Tensor SelfAttention(const at::Tensor& hidden, const AttentionWeights& w, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, int64_t window, AttentionBatch& batch, KvLayer& cache,
                         const AttentionAdditions& additions) {
  const int64_t b = hidden.size(0);
  const int64_t t = hidden.size(1);
  auto project = [&](const at::Tensor& weight, const at::Tensor& bias, int64_t heads, const at::Tensor& norm) {
    at::Tensor out = bias.defined() ? Linear(hidden, weight, bias) : Linear(hidden, weight);
    out = out.view({b, t, heads, head_dim});
    if (norm.defined()) out = RmsNorm(out, norm, additions.norm_eps);
    return out.transpose(1, 2);  // [B, heads, T, D]
  };
  at::Tensor q = ApplyRope(project(w.q, w.q_bias, num_heads, additions.q_norm), batch.rope);
  at::Tensor k = ApplyRope(project(w.k, w.k_bias, num_kv_heads, additions.k_norm), batch.rope);
  at::Tensor v = project(w.v, w.v_bias, num_kv_heads, at::Tensor());

  auto [keys, values] =
      KvAppend(cache, batch.kv, batch.positions, k, v, batch.key_length);
  const at::Tensor& mask = batch.masks.at(window);
  // GQA: SDPA repeats each KV head for its group of query heads (enable_gqa), as repeat_kv does upstream.
  at::Tensor out = at::scaled_dot_product_attention(q, keys, values, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                                    /*scale=*/1.0 / std::sqrt(static_cast<double>(head_dim)),
                                                    /*enable_gqa=*/num_kv_heads != num_heads);
  out = out.transpose(1, 2).reshape({b, t, num_heads * head_dim});
  return additions.o_bias.defined() ? Linear(out, w.o, additions.o_bias) : Linear(out, w.o);
}

}  // namespace strata::runtime
