#include "runtime/model/pointwise.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/silu.h>

#include <algorithm>
#include <cmath>

#include "kernels/pointwise.h"
#include "runtime/model/parallel.h"

namespace strata::runtime {
namespace {

// A bfloat16 tensor's data as the kernels' type (the same 16 bits: c10::BFloat16 holds `x` alone).
kernels::BFloat16* Bits(const at::Tensor& t) {
  static_assert(sizeof(c10::BFloat16) == sizeof(kernels::BFloat16));
  return reinterpret_cast<kernels::BFloat16*>(t.data_ptr<c10::BFloat16>());
}

// y = fn(gate, up) elementwise, split over the threads in whole vectors (multiples of 16 elements), at least 64k per
// task; fn(gate, up, y, n) for float32 or kernels::BFloat16 pointers.
template <class Fn>
at::Tensor Gated(const char* what, const at::Tensor& gate, const at::Tensor& up, Fn&& fn) {
  TORCH_CHECK(gate.sizes() == up.sizes(), what, ": gate ", gate.sizes(), " and up ", up.sizes());
  at::Tensor y = at::empty_like(gate);
  const int64_t vectors = (gate.numel() + 15) / 16;
  ParallelRows(vectors, 4096, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * 16, last = std::min(end * 16, gate.numel());
    if (gate.scalar_type() == at::kFloat) {
      fn(gate.data_ptr<float>() + first, up.data_ptr<float>() + first, y.data_ptr<float>() + first, last - first);
    } else {
      fn(Bits(gate) + first, Bits(up) + first, Bits(y) + first, last - first);
    }
  });
  return y;
}

}  // namespace

bool FusedPointwiseApplies(const at::Tensor& x, const at::Tensor& other) {
  if (!x.device().is_cpu() || !other.device().is_cpu()) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  return other.scalar_type() == x.scalar_type() && x.is_contiguous() && other.is_contiguous() && x.dim() >= 1 &&
         x.numel() > 0;
}

at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t width = x.size(-1);
  TORCH_CHECK(weight.numel() == width, "FusedRmsNorm: weight of ", weight.numel(), " for rows of ", width);
  at::Tensor y = at::empty_like(x);
  const int64_t rows = x.numel() / width;
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / width);
  ParallelRows(rows, grain, [&](int64_t begin, int64_t end) {
    if (x.scalar_type() == at::kFloat) {
      kernels::RmsNormRows(x.data_ptr<float>() + begin * width, weight.data_ptr<float>(),
                           y.data_ptr<float>() + begin * width, width, end - begin, static_cast<float>(eps));
    } else {
      kernels::RmsNormRows(Bits(x) + begin * width, Bits(weight), Bits(y) + begin * width, width, end - begin,
                           static_cast<float>(eps));
    }
  });
  return y;
}

at::Tensor FusedSiluMul(const at::Tensor& gate, const at::Tensor& up) {
  return Gated("FusedSiluMul", gate, up,
               [](const auto* g, const auto* u, auto* y, int64_t n) { kernels::SiluMul(g, u, y, n); });
}

at::Tensor FusedClampedSwiglu(const at::Tensor& gate, const at::Tensor& up, double limit, double alpha) {
  return Gated("FusedClampedSwiglu", gate, up, [&](const auto* g, const auto* u, auto* y, int64_t n) {
    kernels::ClampedSwiglu(g, u, y, n, static_cast<float>(limit), static_cast<float>(alpha));
  });
}

at::Tensor SiluMul(const at::Tensor& gate, const at::Tensor& up) {
  if (FusedPointwiseApplies(gate, up) && gate.sizes() == up.sizes()) return FusedSiluMul(gate, up);
  return at::silu(gate) * up;
}

}  // namespace strata::runtime
