#pragma once
// Internal: what strata's AVX-512 CPU kernels share (linear.cc, decode_attention.cc, pointwise.cc). Each
// function carries its own target attribute, so the files compile for the baseline x86-64 and call these
// only after CpuHasAvx512() (cpu_features.h) said yes.

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define STRATA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace strata::runtime::simd {

// The first min(16, left) lanes.
STRATA_AVX512 inline __mmask16 Tail(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// 16 values (fewer under `mask`, the rest 0) as float32; bfloat16 is the high half of a float32.
STRATA_AVX512 inline __m512 Load(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
STRATA_AVX512 inline __m512 Load(const c10::BFloat16* p, __mmask16 mask) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

// One float32 result in T (bfloat16: rounded to nearest even, as c10::BFloat16).
inline void Store(float* y, float value) { *y = value; }
inline void Store(c10::BFloat16* y, float value) { *y = c10::BFloat16(value); }

// e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^7 (relative error below 2e-7, about
// one float32 step), scaled by 2^n. x is clamped to [-87, 89]: below, the result is 0 or a denormal, as far
// under any sum's precision as exp's; above, 2^n overflows to inf as exp does.
STRATA_AVX512 inline __m512 Exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln 2, high bits: n * hi is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);  // ln 2, the rest
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace strata::runtime::simd
