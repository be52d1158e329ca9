#include "runtime/model/deepseek_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <cstdlib>
#include <string_view>

#include "runtime/model/decode_attention.h"
#include "runtime/model/linear.h"
#include "runtime/model/llama_model.h"
#include "runtime/model/moe.h"
#include "runtime/model/pointwise.h"
#include "runtime/model/rope.h"

namespace strata::runtime {
namespace {

bool Sparse(const DecoderConfig& c, int64_t layer) {
  return layer >= 0 && static_cast<size_t>(layer) < c.moe.sparse.size() && c.moe.sparse[static_cast<size_t>(layer)];
}

// A decoder layer's weights in the order DeepseekV3UnitWeights lists them: -1 where the model has none.
struct Layout {
  int norm_in = 0, q = -1, q_a = -1, q_a_norm = -1, q_b = -1, kv_a, kv_a_norm, kv_b, o, norm_post;
  int mlp = 0;  // dense: gate, up, down; sparse: router, correction bias, shared gate, up, down
  int q_a_bias = -1, kv_a_bias = -1, o_bias = -1;
};

Layout LayoutOf(const DecoderConfig& c, int64_t layer, std::vector<std::string>* names) {
  Layout l;
  int next = 0;
  auto add = [&](const char* name) {
    if (names != nullptr) names->push_back(name);
    return next++;
  };
  l.norm_in = add("input_layernorm.weight");
  if (c.mla.q_lora_rank > 0) {
    l.q_a = add("self_attn.q_a_proj.weight");
    l.q_a_norm = add("self_attn.q_a_layernorm.weight");
    l.q_b = add("self_attn.q_b_proj.weight");
  } else {
    l.q = add("self_attn.q_proj.weight");
  }
  l.kv_a = add("self_attn.kv_a_proj_with_mqa.weight");
  l.kv_a_norm = add("self_attn.kv_a_layernorm.weight");
  l.kv_b = add("self_attn.kv_b_proj.weight");
  l.o = add("self_attn.o_proj.weight");
  l.norm_post = add("post_attention_layernorm.weight");
  if (Sparse(c, layer)) {
    l.mlp = add("mlp.gate.weight");
    add("mlp.gate.e_score_correction_bias");
    add("mlp.shared_experts.gate_proj.weight");
    add("mlp.shared_experts.up_proj.weight");
    add("mlp.shared_experts.down_proj.weight");
  } else {
    l.mlp = add("mlp.gate_proj.weight");
    add("mlp.up_proj.weight");
    add("mlp.down_proj.weight");
  }
  if (c.mla.attention_bias) {
    if (c.mla.q_lora_rank > 0) l.q_a_bias = add("self_attn.q_a_proj.bias");
    l.kv_a_bias = add("self_attn.kv_a_proj_with_mqa.bias");
    l.o_bias = add("self_attn.o_proj.bias");
  }
  return l;
}

// MLA's sizes.
struct MlaShape {
  explicit MlaShape(const DecoderConfig& c)
      : heads(c.num_heads),
        nope(c.mla.qk_nope_head_dim),
        rope(c.mla.qk_rope_head_dim),
        rank(c.mla.kv_lora_rank),
        v(c.mla.v_head_dim) {}
  int64_t heads, nope, rope, rank, v;
};

at::Tensor Optional(const std::vector<WeightTensor>& w, int index) { return index < 0 ? at::Tensor() : w[index]; }

// STRATA_MLA_ATTENTION=absorbed|expanded runs every group one way (bench/deepseek_peer.py measures both); unset, each
// group takes the cheaper (Absorbs).
enum class MlaForm { kAuto, kAbsorbed, kExpanded };
MlaForm FormFromEnvironment() {
  static const MlaForm form = [] {
    const char* mode = std::getenv("STRATA_MLA_ATTENTION");
    if (mode == nullptr) return MlaForm::kAuto;
    const std::string_view m(mode);
    return m == "expanded" ? MlaForm::kExpanded : m == "absorbed" ? MlaForm::kAbsorbed : MlaForm::kAuto;
  }();
  return form;
}

// Whether a group of `count` queries per row over `keys` keys runs absorbed: its multiply-adds per head,
// count x keys x (2 rank + rope) absorbed against keys x (nope + v) x rank (kv_b_proj over the keys) plus
// count x keys x (nope + rope + v) expanded. Decode rows always; prefill chunks while they are short (V3: up to
// ~170 queries per row).
bool Absorbs(const MlaShape& s, int64_t count, int64_t keys) {
  const MlaForm form = FormFromEnvironment();
  if (form != MlaForm::kAuto) return form == MlaForm::kAbsorbed;
  if (count == 1) return true;
  const double absorbed = static_cast<double>(count) * keys * (2 * s.rank + s.rope);
  const double expanded =
      static_cast<double>(keys) * (s.nope + s.v) * s.rank + static_cast<double>(count) * keys * (s.nope + s.rope + s.v);
  return absorbed < expanded;
}

at::Tensor Rope(const at::Tensor& x, const RopeTables& tables, bool interleave) {
  return interleave ? ApplyRopeInterleaved(x, tables) : ApplyRope(x, tables);
}

// Multi-head latent attention over the packed tokens hidden [1, n, hidden] -> [1, n, hidden].
at::Tensor LatentAttention(const at::Tensor& hidden, const std::vector<WeightTensor>& w, const Layout& l,
                           const DecoderConfig& c, AttentionBatch& batch, KvLayer& cache) {
  const MlaShape s(c);
  const int64_t n = hidden.size(1);
  at::Tensor q =
      l.q >= 0
          ? Linear(hidden, w[l.q])
          : Linear(RmsNorm(Linear(hidden, w[l.q_a], Optional(w, l.q_a_bias)), w[l.q_a_norm], c.rms_norm_eps), w[l.q_b]);
  q = q.view({n, s.heads, s.nope + s.rope});
  const at::Tensor q_nope = q.narrow(-1, 0, s.nope);
  const at::Tensor q_rot = q.narrow(-1, s.nope, s.rope);
  const at::Tensor compressed = Linear(hidden, w[l.kv_a], Optional(w, l.kv_a_bias)).view({n, 1, s.rank + s.rope});
  const at::Tensor latent = RmsNorm(compressed.narrow(-1, 0, s.rank), w[l.kv_a_norm], c.rms_norm_eps);
  const at::Tensor k_rot = compressed.narrow(-1, s.rank, s.rope);
  // kv_b_proj [heads x (nope + v), rank]: per head, W_UK [nope, rank] then W_UV [v, rank].
  const at::Tensor kv_b = static_cast<const at::Tensor&>(w[l.kv_b]).view({s.heads, s.nope + s.v, s.rank});
  std::vector<at::Tensor> outs;
  for (AttentionGroup& group : batch.groups) {
    const at::Tensor qr = Rope(GroupHeads(q_rot, group), group.rope, c.mla.rope_interleave);  // [rows, H, T, rope]
    const at::Tensor kr = Rope(GroupHeads(k_rot, group), group.rope, c.mla.rope_interleave);  // [rows, 1, T, rope]
    const at::Tensor row = at::cat({GroupHeads(latent, group), kr}, -1);  // [rows, 1, T, rank + rope]
    KvWrite(cache, group.kv, group.positions, row, at::Tensor());
    const at::Tensor& mask = group.masks.at(0);
    const at::Tensor qn = GroupHeads(q_nope, group);  // [rows, H, T, nope]
    if (Absorbs(s, group.count, group.key_length)) {
      // Absorbed: the queries into latent space, one KV head of rank + rope over every query head, values the latent,
      // W_UV on the way out. Scores and sums in float32 (in bfloat16 they moved greedy choices above the bf16
      // noise margin: tests/runtime_parity/test_deepseek_parity.py).
      const at::ScalarType dtype = qn.scalar_type();
      const at::Tensor q_full =
          at::cat({at::matmul(qn, kv_b.narrow(1, 0, s.nope)), qr}, -1);  // [rows, H, 1, rank + rope]
      at::Tensor out_latent;                                             // [rows, H, 1, rank], float32
      if (LatentDecodeApplies(q_full, cache, group.count)) {
        out_latent = LatentDecodeAttention(q_full, cache, group.kv, group.positions, s.rank, c.mla.softmax_scale);
      } else {
        const at::Tensor cached = KvRead(cache.k, group.kv, group.key_length).to(at::kFloat);
        out_latent = at::scaled_dot_product_attention(q_full.to(at::kFloat), cached, cached.narrow(-1, 0, s.rank), mask,
                                                      /*dropout_p=*/0.0, /*is_causal=*/false, c.mla.softmax_scale,
                                                      /*enable_gqa=*/true);
      }
      outs.push_back(at::matmul(out_latent.to(dtype), kv_b.narrow(1, s.nope, s.v).transpose(1, 2)));  // [rows, H, T, v]
      continue;
    }
    const at::Tensor cached = KvRead(cache.k, group.kv, group.key_length);  // [rows, 1, L, rank + rope]
    // Expanded: per-head keys and values from the latent (transformers' expand_kv).
    const int64_t rows = cached.size(0), keys = cached.size(2);
    const at::Tensor kv = Linear(cached.narrow(-1, 0, s.rank), w[l.kv_b])
                              .view({rows, keys, s.heads, s.nope + s.v})
                              .transpose(1, 2);  // [rows, H, L, nope + v]
    const at::Tensor k = at::cat(
        {kv.narrow(-1, 0, s.nope), cached.narrow(-1, s.rank, s.rope).expand({rows, s.heads, keys, s.rope})}, -1);
    outs.push_back(at::scaled_dot_product_attention(at::cat({qn, qr}, -1), k, kv.narrow(-1, s.nope, s.v), mask,
                                                    /*dropout_p=*/0.0, /*is_causal=*/false, c.mla.softmax_scale));
  }
  return Linear(PackHeads(outs), w[l.o], Optional(w, l.o_bias));
}

}  // namespace

std::vector<std::string> DeepseekV3UnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& config) {
  if (kind != UnitKind::kDecoderLayer) return LlamaUnitWeights(kind, layer, config);
  std::vector<std::string> names;
  LayoutOf(config, layer, &names);
  return names;
}

at::Tensor RunDeepseekV3Unit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& c,
                             const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  if (unit.kind != UnitKind::kDecoderLayer) return RunLlamaUnit(unit, w, c, hidden, batch, cache, last);
  const Layout l = LayoutOf(c, unit.layer, nullptr);
  at::Tensor h = hidden + LatentAttention(RmsNorm(hidden, w[l.norm_in], c.rms_norm_eps), w, l, c, batch, *cache);
  const at::Tensor normed = RmsNorm(h, w[l.norm_post], c.rms_norm_eps);
  const int m = l.mlp;
  if (!Sparse(c, unit.layer)) {
    return h + Linear(SiluMul(Linear(normed, w[m]), Linear(normed, w[m + 1])), w[m + 2]);
  }
  const at::Tensor routed = SparseMoe(normed, w[m], unit.experts, c.moe, w[m + 1]);
  const at::Tensor shared = Linear(SiluMul(Linear(normed, w[m + 2]), Linear(normed, w[m + 3])), w[m + 4]);
  return h + (routed + shared);
}

}  // namespace strata::runtime
