#pragma once
// Internal (ATen): rotary position embeddings as transformers computes them for the Llama family,
// operation for operation, so that float32 results match to rounding.

#include <ATen/core/Tensor.h>

#include "planner/decoder_config.h"

namespace strata::runtime {

// inv_freq (float32, CPU, head_dim / 2 entries) for the default, "linear", "llama3" and "yarn" RoPE types, as
// transformers' rope init functions compute it (llama3: divide low frequencies by `factor`, keep high
// ones, interpolate between).
at::Tensor RopeInvFreq(const planner::RopeConfig& rope, int64_t head_dim);

struct RopeTables {
  at::Tensor cos;  // [batch, tokens, head_dim], in the activations' dtype
  at::Tensor sin;
};

// cos/sin for `positions` ([batch, tokens], int64) on inv_freq's device: float32 angles, scaled by
// `attention_factor` (YaRN's) and cast to `dtype` at the end, as LlamaRotaryEmbedding.forward.
RopeTables RopeForPositions(const at::Tensor& inv_freq, const at::Tensor& positions, at::ScalarType dtype,
                            double attention_factor = 1.0);

// YaRN's inv_freq for `dim` rotated dims (transformers' _compute_yarn_parameters): interpolated by `factor` below
// the correction range, extrapolated above it, a linear ramp between.
at::Tensor YarnInvFreq(const planner::RopeConfig& rope, int64_t dim);

// DeepSeek's interleaved RoPE (rope_interleave): pairs (x0, x1), (x2, x3), ... each rotated by one angle, the
// result laid out as [rotated evens, rotated odds] (transformers' apply_rotary_pos_emb_interleave): x [batch, heads,
// tokens, dim] with tables [batch, tokens, dim].
at::Tensor ApplyRopeInterleaved(const at::Tensor& x, const RopeTables& tables);

// x * cos + rotate_half(x) * sin for x [batch, heads, tokens, head_dim]. Tables narrower than the head
// (partial rotary, Phi-3) rotate its first dims and pass the rest through, as upstream.
at::Tensor ApplyRope(const at::Tensor& x, const RopeTables& tables);

// longrope (Phi-3): 1 / (factor * theta^(2i/d)) with the short or long factors (`long_factors`).
at::Tensor LongRopeInvFreq(const planner::RopeConfig& rope, int64_t rotary_dim, bool long_factors);

// longrope's tables: per row, the long inverse frequencies when its sequence's length (`seq_len`, [batch]
// int64 on the positions' device) exceeds original_max_positions, else the short ones (chosen on the
// device, as dynamic_rope_update's torch.where); cos/sin scaled by attention_factor in float32.
RopeTables LongRopeForPositions(const at::Tensor& short_inv_freq, const at::Tensor& long_inv_freq,
                                const planner::RopeConfig& rope, const at::Tensor& positions, const at::Tensor& seq_len,
                                at::ScalarType dtype);

}  // namespace strata::runtime
