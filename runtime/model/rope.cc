#include "runtime/model/rope.h"

#include <ATen/TensorIndexing.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/pointwise.h"

namespace strata::runtime {

at::Tensor RopeInvFreq(const planner::RopeConfig& rope, int64_t head_dim) {
  // 1 / base ** (arange(0, dim, 2).float() / dim), in float32 like upstream.
  at::Tensor exponent = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  at::Tensor inv_freq = at::reciprocal(at::pow(rope.theta, exponent));
  if (rope.type == planner::RopeConfig::Type::kLongRope) return LongRopeInvFreq(rope, head_dim, /*long_factors=*/false);
  if (rope.type == planner::RopeConfig::Type::kLinear) return inv_freq / rope.factor;
  if (rope.type == planner::RopeConfig::Type::kYarn) return YarnInvFreq(rope, head_dim);
  if (rope.type != planner::RopeConfig::Type::kLlama3) return inv_freq;

  const double old_context = rope.original_max_positions;
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  at::Tensor wavelen = (2 * std::numbers::pi) / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
  at::Tensor smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

at::Tensor YarnInvFreq(const planner::RopeConfig& rope, int64_t dim) {
  // transformers' _compute_yarn_parameters, in its order of float32 operations.
  const double d = static_cast<double>(dim);
  auto correction_dim = [&](double rotations) {
    return (d * std::log(rope.original_max_positions / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast);
  double high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // no singularity
  at::Tensor pos_freqs = at::pow(rope.theta, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / d);
  at::Tensor extrapolation = 1.0 / pos_freqs;
  at::Tensor interpolation = 1.0 / (rope.factor * pos_freqs);
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

RopeTables RopeForPositions(const at::Tensor& inv_freq, const at::Tensor& positions, at::ScalarType dtype,
                            double attention_factor) {
  at::Tensor freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq;  // [B, T, D/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  if (attention_factor != 1.0)
    return {(at::cos(emb) * attention_factor).to(dtype), (at::sin(emb) * attention_factor).to(dtype)};
  return {at::cos(emb).to(dtype), at::sin(emb).to(dtype)};
}

at::Tensor ApplyRopeInterleaved(const at::Tensor& x, const RopeTables& tables) {
  // The tables are cat(freqs, freqs): the first half holds each pair's angle.
  const int64_t half = tables.cos.size(-1) / 2;
  at::Tensor cos = tables.cos.narrow(-1, 0, half).unsqueeze(1);
  at::Tensor sin = tables.sin.narrow(-1, 0, half).unsqueeze(1);
  using at::indexing::Slice;
  at::Tensor x1 = x.index({"...", Slice(0, at::indexing::None, 2)});
  at::Tensor x2 = x.index({"...", Slice(1, at::indexing::None, 2)});
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

namespace {

// x [batch, heads, tokens, dim] whose memory is [batch, tokens, heads, dim] (GroupHeads' view of the packed q / k: a
// transpose of a contiguous tensor), the tables [batch, tokens, dim] contiguous in its dtype, all on the CPU, float32
// or bfloat16: kernels::RopeRows in one pass, where the ATen expression is nine operators per call.
bool FusedRopeApplies(const at::Tensor& x, const RopeTables& tables) {
  if (!x.device().is_cpu() || x.dim() != 4 || x.numel() == 0) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  const at::Tensor& cos = tables.cos;
  const at::Tensor& sin = tables.sin;
  for (const at::Tensor* t : {&cos, &sin}) {
    if (!t->device().is_cpu() || t->scalar_type() != x.scalar_type() || !t->is_contiguous() || t->dim() != 3)
      return false;
    if (t->size(0) != x.size(0) || t->size(1) != x.size(2) || t->size(2) != x.size(3)) return false;
  }
  return x.size(3) % 2 == 0 && x.transpose(1, 2).is_contiguous();
}

at::Tensor FusedRope(const at::Tensor& x, const RopeTables& tables) {
  const int64_t batch = x.size(0), heads = x.size(1), tokens = x.size(2), dim = x.size(3);
  at::Tensor y = at::empty({batch, tokens, heads, dim}, x.options());
  const at::Tensor in = x.transpose(1, 2);
  if (x.scalar_type() == at::kFloat) {
    kernels::RopeRows(in.data_ptr<float>(), tables.cos.data_ptr<float>(), tables.sin.data_ptr<float>(),
                      y.data_ptr<float>(), batch * tokens, heads, dim);
  } else {
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<kernels::BFloat16*>(t.data_ptr<c10::BFloat16>()); };
    kernels::RopeRows(bits(in), bits(tables.cos), bits(tables.sin), bits(y), batch * tokens, heads, dim);
  }
  return y.transpose(1, 2);
}

}  // namespace

at::Tensor ApplyRope(const at::Tensor& x, const RopeTables& tables) {
  if (FusedRopeApplies(x, tables)) return FusedRope(x, tables);
  if (tables.cos.size(-1) < x.size(-1)) {
    const int64_t rotary = tables.cos.size(-1);
    return at::cat({ApplyRope(x.narrow(-1, 0, rotary), tables), x.narrow(-1, rotary, x.size(-1) - rotary)}, -1);
  }
  const int64_t half = x.size(-1) / 2;
  at::Tensor cos = tables.cos.unsqueeze(1);
  at::Tensor sin = tables.sin.unsqueeze(1);
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor LongRopeInvFreq(const planner::RopeConfig& rope, int64_t rotary_dim, bool long_factors) {
  // torch.tensor(factors, dtype=float32) * base ** (arange(0, dim, 2).float() / dim), reciprocal.
  const std::vector<double>& factors = long_factors ? rope.long_factor : rope.short_factor;
  at::Tensor ext = at::tensor(at::ArrayRef<double>(factors), at::kDouble).to(at::kFloat);
  at::Tensor exponent = at::arange(0, rotary_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(rotary_dim);
  return at::reciprocal(ext * at::pow(rope.theta, exponent));
}

RopeTables LongRopeForPositions(const at::Tensor& short_inv_freq, const at::Tensor& long_inv_freq,
                                const planner::RopeConfig& rope, const at::Tensor& positions, const at::Tensor& seq_len,
                                at::ScalarType dtype) {
  at::Tensor use_long = (seq_len > static_cast<int64_t>(rope.original_max_positions)).view({-1, 1});
  at::Tensor inv_freq = at::where(use_long, long_inv_freq, short_inv_freq);  // [B, D/2]
  at::Tensor freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq.unsqueeze(1);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {(at::cos(emb) * rope.attention_factor).to(dtype), (at::sin(emb) * rope.attention_factor).to(dtype)};
}

}  // namespace strata::runtime
