#pragma once
// strata's CPU kernels, one portable source for every ISA (Google Highway: SSE4, AVX2, AVX-512, NEON, SVE),
// the best target this CPU runs chosen at run time. Plain C++ on raw pointers: no torch, so the library
// builds and tests anywhere (kernels/README.md). runtime/model/pointwise.cc splits rows over LibTorch's
// threads and calls these.
//
// Rounding is transformers' (LlamaRMSNorm, LlamaMLP with ATen ops): float32 inside; for bfloat16 the values
// are rounded to bfloat16 (nearest even) at the same two points the ATen expressions round.

#include <cstdint>

namespace strata::kernels {

// A bfloat16 value's bits: the layout of c10::BFloat16 and of the checkpoint's bytes.
struct BFloat16 {
  uint16_t bits;
};

// Each of `rows` rows of `width`: y = w * (x * rsqrt(mean(x^2) + eps)), the product x * rsqrt(...)
// rounded to the dtype before the weight multiplies.
void RmsNormRows(const float* x, const float* w, float* y, int64_t width, int64_t rows, float eps);
void RmsNormRows(const BFloat16* x, const BFloat16* w, BFloat16* y, int64_t width, int64_t rows, float eps);

// y = silu(gate) * up over n values, silu rounded to the dtype before the product.
void SiluMul(const float* gate, const float* up, float* y, int64_t n);
void SiluMul(const BFloat16* gate, const BFloat16* up, BFloat16* y, int64_t n);

// gpt-oss's clamped SwiGLU (GptOssExperts._apply_gate) over n values: g = min(gate, limit), u = clamp(up, -limit,
// limit), y = (u + 1) * (g * sigmoid(g * alpha)), NaN kept through the clamps as torch.clamp keeps it; rounded to the
// dtype after each of the five operators (g * alpha, sigmoid, g * that, u + 1, the product), as the ATen expression.
void ClampedSwiglu(const float* gate, const float* up, float* y, int64_t n, float limit, float alpha);
void ClampedSwiglu(const BFloat16* gate, const BFloat16* up, BFloat16* y, int64_t n, float limit, float alpha);

// Rotate-half RoPE (transformers' apply_rotary_pos_emb) over `tokens` x `heads` vectors of `dim` (even), x and y
// [tokens, heads, dim] contiguous, cos and sin [tokens, dim] (each token's angles, halves equal as RopeForPositions
// makes them): y = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[dim/2:], x[:dim/2]). Each product is
// rounded to the dtype, then their sum: the ATen expression's three roundings, so bfloat16 results are bit for bit.
void RopeRows(const float* x, const float* cos, const float* sin, float* y, int64_t tokens, int64_t heads, int64_t dim);
void RopeRows(const BFloat16* x, const BFloat16* cos, const BFloat16* sin, BFloat16* y, int64_t tokens, int64_t heads,
              int64_t dim);

// The instruction set the kernels run on here ("AVX3", "AVX2", "SSE4", ...: Highway's names).
const char* KernelTarget();

}  // namespace strata::kernels
