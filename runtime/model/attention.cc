#include "runtime/model/attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "runtime/model/decode_attention.h"
#include "runtime/model/linear.h"
#include "runtime/model/llama_model.h"  // RmsNorm

namespace strata::runtime {

at::Tensor AttentionMask(const at::Tensor& positions, int64_t key_length, int64_t window) {
  at::Tensor keys = at::arange(key_length, positions.options());  // [K]
  at::Tensor query = positions.unsqueeze(-1);                     // [B, T, 1]
  at::Tensor visible = keys <= query;                             // [B, T, K]
  if (window > 0) visible = visible.logical_and(keys > query - window);
  return visible.unsqueeze(1);  // [B, 1, T, K]
}

at::Tensor GroupHeads(const at::Tensor& x, const AttentionGroup& group) {
  return x.narrow(0, group.offset, group.rows * group.count)
      .view({group.rows, group.count, x.size(1), x.size(2)})
      .transpose(1, 2);
}

at::Tensor PackHeads(const std::vector<at::Tensor>& outs) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& out : outs) {
    flat.push_back(out.transpose(1, 2).reshape({out.size(0) * out.size(2), out.size(1) * out.size(3)}));
  }
  at::Tensor packed = flat.size() == 1 ? flat.front() : at::cat(flat);
  return packed.unsqueeze(0);
}

namespace {

// Attention with a sink logit per query head (gpt-oss's eager_attention_forward): scores and softmax in float32 over
// the visible keys and the sink, the sink's weight dropped. q [rows, H, T, D], keys / values [rows, KV, L, D], mask
// [rows, 1, T, L] boolean.
at::Tensor SinkAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& mask,
                         const at::Tensor& sinks, double scale) {
  const int64_t rows = q.size(0), heads = q.size(1), count = q.size(2), kv_heads = keys.size(1);
  const int64_t length = keys.size(2), dim = keys.size(3);
  auto repeat = [&](const at::Tensor& x) {  // repeat_kv
    if (kv_heads == heads) return x.to(at::kFloat);
    return x.unsqueeze(2)
        .expand({rows, kv_heads, heads / kv_heads, length, dim})
        .reshape({rows, heads, length, dim})
        .to(at::kFloat);
  };
  at::Tensor scores = at::matmul(q.to(at::kFloat), repeat(keys).transpose(-1, -2)) * scale;  // [rows, H, T, L]
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  const at::Tensor sink = sinks.to(at::kFloat).view({1, heads, 1, 1}).expand({rows, heads, count, 1});
  at::Tensor combined = at::cat({scores, sink}, -1);
  combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
  const at::Tensor probs = at::softmax(combined, -1).narrow(-1, 0, length);
  return at::matmul(probs, repeat(values)).to(q.scalar_type());
}

}  // namespace

at::Tensor SelfAttention(const at::Tensor& hidden, const AttentionWeights& w, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, int64_t window, AttentionBatch& batch, KvLayer& cache,
                         const AttentionAdditions& additions) {
  const int64_t n = hidden.size(1);  // packed tokens: hidden is [1, n, hidden]
  // q, k and v in one split over the threads where their weights are in panels.
  const WeightTensor* weights[] = {&w.q, &w.k, &w.v};
  const at::Tensor biases[] = {w.q_bias, w.k_bias, w.v_bias};
  std::vector<at::Tensor> qkv = LinearEach(hidden, weights, biases);
  auto heads_of = [&](at::Tensor out, int64_t heads, const at::Tensor& norm) {
    if (norm.defined() && additions.norm_across_heads)
      return RmsNorm(out, norm, additions.norm_eps).view({n, heads, head_dim});
    out = out.view({n, heads, head_dim});
    if (norm.defined()) out = RmsNorm(out, norm, additions.norm_eps);
    return out;  // [n, heads, D]
  };
  const at::Tensor q_all = heads_of(std::move(qkv[0]), num_heads, additions.q_norm);
  const at::Tensor k_all = heads_of(std::move(qkv[1]), num_kv_heads, additions.k_norm);
  const at::Tensor v_all = heads_of(std::move(qkv[2]), num_kv_heads, at::Tensor());
  std::vector<at::Tensor> outs;
  for (AttentionGroup& group : batch.groups) {
    at::Tensor q = ApplyRope(GroupHeads(q_all, group), group.rope);
    at::Tensor k = ApplyRope(GroupHeads(k_all, group), group.rope);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    if (DecodeAttentionApplies(q, cache, group.count)) {  // decode rows on a CPU: straight from the pools
      KvWrite(cache, group.kv, group.positions, k, GroupHeads(v_all, group));
      outs.push_back(DecodeAttention(q, cache, group.kv, group.positions, window, scale, additions.sinks));
      continue;
    }
    auto [keys, values] = KvAppend(cache, group.kv, group.positions, k, GroupHeads(v_all, group), group.key_length);
    if (additions.sinks.defined()) {
      outs.push_back(SinkAttention(q, keys, values, group.masks.at(window), additions.sinks, scale));
      continue;
    }
    // GQA: SDPA repeats each KV head for its group of query heads (enable_gqa), as repeat_kv does upstream.
    outs.push_back(at::scaled_dot_product_attention(q, keys, values, group.masks.at(window), /*dropout_p=*/0.0,
                                                    /*is_causal=*/false,
                                                    /*scale=*/scale,
                                                    /*enable_gqa=*/num_kv_heads != num_heads));
  }
  at::Tensor out = PackHeads(outs);
  return additions.o_bias.defined() ? Linear(out, w.o, additions.o_bias) : Linear(out, w.o);
}

}  // namespace strata::runtime
