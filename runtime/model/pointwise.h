#pragma once
// Internal (ATen): RMSNorm and SiLU(gate) * up in one pass each on the CPU (kernels/pointwise.h: one Highway
// source, the best target of this CPU: AVX-512, AVX2, SSE4, ...). Written with ATen
// ops they are seven and two operators (conversions, pow, mean, rsqrt, products), each a dispatch, an
// allocation and a walk over the activations: for a decode step of a small model that per-op cost, not the
// arithmetic, is what they take (bench/README.md, peer_llamacpp). Both round exactly where the ATen
// expressions do (transformers' LlamaRMSNorm and LlamaMLP): float32 inside, the input's dtype at the same
// two points, so bfloat16 results are the same up to float32 summation order and exp's last bit.

#include <ATen/core/Tensor.h>

namespace strata::runtime {

// Whether the fused kernels run for `x` (and `other`, a weight or the second operand, in x's dtype): CPU,
// float32 or bfloat16, contiguous.
bool FusedPointwiseApplies(const at::Tensor& x, const at::Tensor& other);

// weight * (x * rsqrt(mean(x^2, -1) + eps)).to(x.dtype), x rounded to float32 first: LlamaRMSNorm.
at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// silu(gate) * up, silu rounded to the dtype before the product (at::silu(gate) * up).
at::Tensor FusedSiluMul(const at::Tensor& gate, const at::Tensor& up);

// gpt-oss's clamped SwiGLU, (up.clamp(-limit, limit) + 1) * (g * sigmoid(g * alpha)) with g = gate.clamp_max(limit),
// in one pass (kernels::ClampedSwiglu), rounded where that ATen expression rounds; where FusedPointwiseApplies.
at::Tensor FusedClampedSwiglu(const at::Tensor& gate, const at::Tensor& up, double limit, double alpha);

// at::silu(gate) * up: FusedSiluMul where it applies, else the ATen expression.
at::Tensor SiluMul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace strata::runtime
