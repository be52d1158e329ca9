// Highway's dynamic dispatch for quantized-inl.h (see pointwise.cc), and the scalar int4 packing.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quantized.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/quantized-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/quantized.h"
#include "kernels/targets.h"

namespace strata::kernels {

HWY_EXPORT(QuantRowsFp8F32);
HWY_EXPORT(QuantRowsFp8BF16);
HWY_EXPORT(QuantRowsIntF32);
HWY_EXPORT(QuantRowsIntBF16);
HWY_EXPORT(QuantRowsFp8Dot);
HWY_EXPORT(QuantRowsIntDot);
HWY_EXPORT(DequantizeFp8F32);
HWY_EXPORT(DequantizeFp8BF16);
HWY_EXPORT(DequantizeIntF32);
HWY_EXPORT(DequantizeIntBF16);
HWY_EXPORT(QuantRowsMxfp4F32);
HWY_EXPORT(QuantRowsMxfp4BF16);
HWY_EXPORT(QuantRowsMxfp4Bf16x);
HWY_EXPORT(DequantizeMxfp4F32);
HWY_EXPORT(DequantizeMxfp4BF16);

void QuantizedLinearRows(const float* x, const Fp8Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsFp8F32)(x, w, bias, y, rows, k, n_total, n0, n1, Bf16DotAvailable() && VbmiAvailable());
}
void QuantizedLinearRows(const float* x, const Fp8Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsFp8BF16)
  (x, w, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1,
   Bf16DotAvailable() && VbmiAvailable());
}
void QuantizedLinearRows(const float* x, const IntWeights& w, const float* bias, float* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsIntF32)(x, w, bias, y, rows, k, n_total, n0, n1);
}
void QuantizedLinearRows(const float* x, const IntWeights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsIntBF16)
  (x, w, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1);
}

void QuantizedLinearRows(const BFloat16* x, const Fp8Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsFp8Dot)
  (&x->bits, w, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1,
   Bf16DotAvailable() && VbmiAvailable());
}
void QuantizedLinearRows(const BFloat16* x, const IntWeights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsIntDot)
  (&x->bits, w, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1, Bf16DotAvailable());
}

bool Fp8HasNanCode(const uint8_t* data, int64_t bytes) {
  // Blocks of 4 KiB, each OR-reduced (vectorized by the compiler), so a NaN code stops the scan early.
  constexpr int64_t kBlock = 4096;
  for (int64_t at = 0; at < bytes; at += kBlock) {
    const int64_t end = std::min(bytes, at + kBlock);
    uint8_t any = 0;
    for (int64_t i = at; i < end; ++i) any |= static_cast<uint8_t>((data[i] & 0x7F) == 0x7F);
    if (any != 0) return true;
  }
  return false;
}

void DequantizeRows(const Fp8Weights& w, int64_t k, int64_t /*n_total*/, int64_t n0, int64_t n1, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeFp8F32)(w, k, n0, n1, out);
}
void DequantizeRows(const Fp8Weights& w, int64_t k, int64_t /*n_total*/, int64_t n0, int64_t n1, BFloat16* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeFp8BF16)(w, k, n0, n1, &out->bits);
}
void DequantizeRows(const IntWeights& w, int64_t k, int64_t /*n_total*/, int64_t n0, int64_t n1, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeIntF32)(w, k, n0, n1, out);
}
void DequantizeRows(const IntWeights& w, int64_t k, int64_t /*n_total*/, int64_t n0, int64_t n1, BFloat16* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeIntBF16)(w, k, n0, n1, &out->bits);
}

void QuantizedLinearRows(const float* x, const Mxfp4Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsMxfp4F32)(x, w, bias, y, rows, k, n_total, n0, n1);
}
void QuantizedLinearRows(const float* x, const Mxfp4Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsMxfp4BF16)
  (x, w, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1);
}
void QuantizedLinearRows(const BFloat16* x, const Mxfp4Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(QuantRowsMxfp4Bf16x)
  (&x->bits, w, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1, Bf16DotAvailable());
}
void DequantizeRows(const Mxfp4Weights& w, int64_t k, int64_t /*n_total*/, int64_t n0, int64_t n1, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeMxfp4F32)(w, k, n0, n1, out);
}
void DequantizeRows(const Mxfp4Weights& w, int64_t k, int64_t /*n_total*/, int64_t n0, int64_t n1, BFloat16* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeMxfp4BF16)(w, k, n0, n1, &out->bits);
}

bool Bf16DotTiles(const Fp8Weights& w, int64_t k) {
  return Fp8DotLayout(w, k) && Bf16DotAvailable() && VbmiAvailable();
}
bool Bf16DotTiles(const IntWeights& w, int64_t k) { return Int4DotLayout(w, k) && Bf16DotAvailable(); }

void PackInt4(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out) {
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* c = codes + row * k;
    uint8_t* o = out + row * (k / 2);
    for (int64_t chunk = 0; chunk < k; chunk += 32) {
      const int64_t half = (k - chunk < 32 ? k - chunk : 32) / 2;
      for (int64_t i = 0; i < half; ++i) {
        o[chunk / 2 + i] = static_cast<uint8_t>((c[chunk + i] & 0xF) | (c[chunk + half + i] & 0xF) << 4);
      }
    }
  }
}

uint8_t Int4Code(const uint8_t* packed, int64_t k, int64_t n_idx, int64_t k_idx) {
  const int64_t chunk = k_idx / 32 * 32;
  const int64_t half = (k - chunk < 32 ? k - chunk : 32) / 2;
  const int64_t i = k_idx - chunk;
  const uint8_t byte = packed[n_idx * (k / 2) + chunk / 2 + (i < half ? i : i - half)];
  return i < half ? byte & 0xF : byte >> 4;
}

namespace {
float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace

float Fp8E4m3ToFloat(uint8_t bits) {
  const uint32_t magnitude = bits & 0x7F;
  float v;
  if (magnitude == 0x7F) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (magnitude < 8) {  // exponent 0: subnormal, mantissa * 2^-9
    v = static_cast<float>(magnitude) * 0x1p-9f;
  } else {
    v = FromBits(((magnitude >> 3) + 120) << 23 | (magnitude & 7) << 20);
  }
  return bits & 0x80 ? -v : v;
}

float E2m1ToFloat(uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0xF];
}

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  if (exponent == 31) return FromBits(sign | 0x7F800000 | mantissa << 13);
  return FromBits(sign | (exponent + 112) << 23 | mantissa << 13);
}

}  // namespace strata::kernels
#endif  // HWY_ONCE
