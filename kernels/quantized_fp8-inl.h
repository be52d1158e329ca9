// FP8 e4m3 weights with a float32 grid of block scales, per target (included once per target from
// quantized-inl.h, guarded by the toggle): the decode of e4m3 bytes to float32 and the format the kernels read.
#if defined(STRATA_KERNELS_QUANTIZED_FP8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_FP8_INL_H_
#undef STRATA_KERNELS_QUANTIZED_FP8_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_FP8_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "kernels/quantized.h"
#include "kernels/quantized_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2 * Lanes(df) e4m3 bytes at p as float32 divided by 256 (exact): w0 the first Lanes(df), w1 the next. The
// bytes become float16 bits at twice the lanes (sign | magnitude << 7: the exponent and mantissa fields line
// up, bias 15 instead of 7, hence the 1/256; e4m3 subnormals are float16 subnormals), then widen; NaN codes
// (magnitude 0x7f) become NaN, unless !kNanCodes: the caller knows there are none (Fp8Weights::nan_free).
template <bool kNanCodes = true>
HWY_INLINE void DecodeFp8(DQ df, const uint8_t* p, VQ& w0, VQ& w1) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no vector of twice the lanes to widen from
  w0 = hn::Set(df, Fp8E4m3ToFloat(p[0]) * (1.0f / 256.0f));
  w1 = hn::Set(df, Fp8E4m3ToFloat(p[1]) * (1.0f / 256.0f));
#else
  const hn::Repartition<int16_t, DQ> di16;
  const hn::Rebind<int8_t, decltype(di16)> di8;
  const hn::Rebind<int16_t, DQ> dih;
  const hn::Rebind<hwy::float16_t, DQ> dh;
  // Sign-extended and shifted by 7: the magnitude at bits 7..13, the sign at 14 and 15; bit 14 cleared.
  const auto magnitude_bits = hn::Set(di16, 0x3F80);
  auto h = hn::ShiftLeft<7>(hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p))));
  h = hn::And(h, hn::Set(di16, static_cast<int16_t>(0xBF80)));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // A NaN code's magnitude is float16 1.875 (480 / 256, which no other code is): F16C widens float16 NaN to
  // NaN, so it becomes one here, at twice the lanes.
  if constexpr (kNanCodes) {
    h = hn::IfThenElse(hn::Eq(hn::And(h, magnitude_bits), magnitude_bits), hn::Set(di16, 0x7E00), h);
  }
#else
  (void)magnitude_bits;
#endif
  w0 = hn::PromoteTo(df, hn::BitCast(dh, hn::LowerHalf(dih, h)));
  w1 = hn::PromoteTo(df, hn::BitCast(dh, hn::UpperHalf(dih, h)));
#if !(HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
  // Highway's emulated float16 widening (SSE4 and below) makes exponent 31 a number: the NaN codes become NaN
  // after widening instead, from their +-1.875.
  if constexpr (kNanCodes) {
    const VQ nan_value = hn::Set(df, 1.875f), nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
    w0 = hn::IfThenElse(hn::Eq(hn::Abs(w0), nan_value), nan, w0);
    w1 = hn::IfThenElse(hn::Eq(hn::Abs(w1), nan_value), nan, w1);
  }
#endif
#endif  // HWY_TARGET == HWY_SCALAR
}

// kNanCodes false: Fp8NanFreeFormat, for weights with Fp8Weights::nan_free.
template <bool kNanCodes>
struct Fp8FormatT {
  const uint8_t* data;
  const float* scale;
  int64_t block_n, block_k, k, blocks_k;
  Fp8FormatT(const Fp8Weights& w, int64_t k_)
      : data(w.data),
        scale(w.scale),
        block_n(w.block_n),
        block_k(w.block_k),
        k(k_),
        blocks_k((k_ + w.block_k - 1) / w.block_k) {}
  int64_t Segments() const { return blocks_k; }
  int64_t SegBegin(int64_t s) const { return s * block_k; }
  int64_t SegEnd(int64_t s) const { return (s + 1) * block_k < k ? (s + 1) * block_k : k; }
  const uint8_t* Row(int64_t n) const { return data + n * k; }
  static int64_t Bytes(int64_t j) { return j; }
  // Codes are the e4m3 values / 256, so the multiplier is scale * 256: exact, and the product the same.
  void Params(int64_t n, int64_t s, float& mul, float& zero) const {
    mul = scale[(n / block_n) * blocks_k + s] * 256.0f;
    zero = 0.0f;
  }
  static constexpr bool kHasZero = false;
  // Params of every segment of row n: mul [segments], sub = zero * mul [segments].
  void RowParams(int64_t n, float* mul, float* sub) const {
    const DQ d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const float* from = scale + (n / block_n) * blocks_k;
    int64_t s = 0;
    for (; s + lanes <= blocks_k; s += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(d, from + s), hn::Set(d, 256.0f)), d, mul + s);
      hn::StoreU(hn::Zero(d), d, sub + s);
    }
    for (; s < blocks_k; ++s) {
      mul[s] = from[s] * 256.0f;
      sub[s] = 0.0f;
    }
  }
  // Rows [n, n + count) flat (mul[r * segments + s]; sub likewise), rows of one block of block_n copied.
  // The copies are vector loops, not std::copy: a memmove call per row of a few scales was 5% of a decode step.
  void ChunkParams(int64_t n, int64_t count, float* mul, float* sub) const {
    const DQ d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t r = 0; r < count; ++r) {
      if (r > 0 && (n + r) / block_n == (n + r - 1) / block_n) {
        const float* from = mul + (r - 1) * blocks_k;
        float* to = mul + r * blocks_k;
        float* zeros = sub + r * blocks_k;
        int64_t s = 0;
        for (; s + lanes <= blocks_k; s += lanes) {
          hn::StoreU(hn::LoadU(d, from + s), d, to + s);
          hn::StoreU(hn::Zero(d), d, zeros + s);
        }
        for (; s < blocks_k; ++s) {
          to[s] = from[s];
          zeros[s] = 0.0f;
        }
      } else {
        RowParams(n + r, mul + r * blocks_k, sub + r * blocks_k);
      }
    }
  }
  int64_t Step(int64_t lanes) const { return 2 * lanes; }
  static bool VectorAt(int64_t) { return true; }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
    VQ w0, w1;
    DecodeFp8<kNanCodes>(df, row + j, w0, w1);
    fn(w0, j);
    fn(w1, j + lanes);
  }
  static float Code(const uint8_t* row, int64_t j) { return Fp8E4m3ToFloat(row[j]) * (1.0f / 256.0f); }
};

using Fp8Format = Fp8FormatT<true>;
using Fp8NanFreeFormat = Fp8FormatT<false>;

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_FP8_INL_H_
