#pragma once
// Internal: the AVX-512 loads and stores of linear.cc's kernels (the others are kernels/, on Highway). Each
// function carries its own target attribute, so the files compile for the baseline x86-64 and call these
// only after CpuHasAvx512() (cpu_features.h) said yes.

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define STRATA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace strata::runtime::simd {

// 16 values (fewer under `mask`, the rest 0) as float32; bfloat16 is the high half of a float32.
STRATA_AVX512 inline __m512 Load(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
STRATA_AVX512 inline __m512 Load(const c10::BFloat16* p, __mmask16 mask) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

// One float32 result in T (bfloat16: rounded to nearest even, as c10::BFloat16).
inline void Store(float* y, float value) { *y = value; }
inline void Store(c10::BFloat16* y, float value) { *y = c10::BFloat16(value); }

}  // namespace strata::runtime::simd
