#include "runtime/model/pointwise.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/silu.h>

#include <algorithm>
#include <cmath>

#include "runtime/model/cpu_features.h"
#include "runtime/model/simd_avx512.h"

namespace strata::runtime {
namespace {

// GCC 12 warns, wrongly, that intrinsics built on _mm512_undefined_*() (masked loads, reductions, min/max)
// read an uninitialized value: that operand is meant to be undefined (see linear.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

using simd::Exp;
using simd::Load;
using simd::Tail;

// To the dtype and back to float32: for bfloat16, round to nearest even as c10::BFloat16 (NaN stays NaN).
STRATA_AVX512 inline __m512 Round(__m512 v, float*) { return v; }
STRATA_AVX512 inline __m512 Round(__m512 v, c10::BFloat16*) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  rounded = _mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(rounded), nan, _mm512_set1_ps(NAN));
}

// Stores a value already rounded by Round (bfloat16: its high half).
STRATA_AVX512 inline void Store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
STRATA_AVX512 inline void Store(c10::BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

template <typename T>
STRATA_AVX512 void RmsNormRows(const T* x, const T* w, T* y, int64_t width, float eps, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const T* in = x + row * width;
    T* out = y + row * width;
    __m512 squares = _mm512_setzero_ps();
    for (int64_t j = 0; j < width; j += 16) {
      const __m512 v = Load(in + j, Tail(width - j));
      squares = _mm512_fmadd_ps(v, v, squares);
    }
    const float scale = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(width) + eps);
    for (int64_t j = 0; j < width; j += 16) {
      const __mmask16 m = Tail(width - j);
      const __m512 normed = Round(_mm512_mul_ps(Load(in + j, m), _mm512_set1_ps(scale)), out);
      Store(out + j, Round(_mm512_mul_ps(Load(w + j, m), normed), out), m);
    }
  }
}

template <typename T>
STRATA_AVX512 void SiluMulRange(const T* gate, const T* up, T* y, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; j += 16) {
    const __mmask16 m = Tail(end - j);
    const __m512 g = Load(gate + j, m);
    const __m512 silu =
        Round(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), Exp(_mm512_sub_ps(_mm512_setzero_ps(), g)))), y);
    Store(y + j, Round(_mm512_mul_ps(silu, Load(up + j, m)), y), m);
  }
}

#pragma GCC diagnostic pop

}  // namespace

bool FusedPointwiseApplies(const at::Tensor& x, const at::Tensor& other) {
  if (!CpuHasAvx512() || !x.device().is_cpu() || !other.device().is_cpu()) return false;
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
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    if (x.scalar_type() == at::kFloat) {
      RmsNormRows(x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), width, static_cast<float>(eps),
                  begin, end);
    } else {
      RmsNormRows(x.data_ptr<c10::BFloat16>(), weight.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), width,
                  static_cast<float>(eps), begin, end);
    }
  });
  return y;
}

at::Tensor FusedSiluMul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "FusedSiluMul: gate ", gate.sizes(), " and up ", up.sizes());
  at::Tensor y = at::empty_like(gate);
  // Whole vectors per task (multiples of 16 elements), at least 64k of them.
  const int64_t vectors = (gate.numel() + 15) / 16;
  at::parallel_for(0, vectors, 4096, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * 16, last = std::min(end * 16, gate.numel());
    if (gate.scalar_type() == at::kFloat) {
      SiluMulRange(gate.data_ptr<float>(), up.data_ptr<float>(), y.data_ptr<float>(), first, last);
    } else {
      SiluMulRange(gate.data_ptr<c10::BFloat16>(), up.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), first,
                   last);
    }
  });
  return y;
}

at::Tensor SiluMul(const at::Tensor& gate, const at::Tensor& up) {
  if (FusedPointwiseApplies(gate, up) && gate.sizes() == up.sizes()) return FusedSiluMul(gate, up);
  return at::silu(gate) * up;
}

}  // namespace strata::runtime
