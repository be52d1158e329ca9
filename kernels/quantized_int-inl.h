// int8 and int4 weights, group-wise (scales in their stored dtype, zeros or symmetric), per target (included
// once per target from quantized-inl.h, guarded by the toggle): the group parameters both widths share
// (IntParams) and the two code layouts (Int8Format: a byte a code; Int4Format: PackInt4's chunks of 32).
#if defined(STRATA_KERNELS_QUANTIZED_INT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_INT_INL_H_
#undef STRATA_KERNELS_QUANTIZED_INT_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_INT_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/quantized.h"
#include "kernels/quantized_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(d) float16 values at p as float32 (exact, as Float16ToFloat: subnormals included; infinities and NaN
// only where the target widens float16 natively, not under Highway's emulation on SSE4 and below).
inline VQ HalfToFloat(DQ d, const uint16_t* p) {
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(d, Float16ToFloat(p[0]));
#else
  const hn::Rebind<hwy::float16_t, DQ> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
}

// Shared by int8 and int4: the group-wise scales and zeros.
struct IntParams {
  static constexpr bool kHasZero = true;
  const void* scale;
  ScaleType scale_type;
  const uint8_t* zero;
  int64_t group, groups;
  float symmetric_zero;
  IntParams(const IntWeights& w, int64_t k)
      : scale(w.scale),
        scale_type(w.scale_type),
        zero(w.zero),
        group(w.group),
        groups(k / w.group),
        symmetric_zero(w.bits == 4 ? 8.0f : 128.0f) {}
  int64_t Segments() const { return groups; }
  int64_t SegBegin(int64_t s) const { return s * group; }
  int64_t SegEnd(int64_t s) const { return (s + 1) * group; }
  void Params(int64_t n, int64_t s, float& mul, float& z) const {
    const int64_t i = n * groups + s;
    mul = 0.0f;
    switch (scale_type) {
      case ScaleType::kFloat32:
        mul = static_cast<const float*>(scale)[i];
        break;
      case ScaleType::kBFloat16:
        mul = BF16ToFloat(static_cast<const uint16_t*>(scale)[i]);
        break;
      case ScaleType::kFloat16:
        mul = Float16ToFloat(static_cast<const uint16_t*>(scale)[i]);
        break;
    }
    z = zero != nullptr ? static_cast<float>(zero[i]) : symmetric_zero;
  }
  // Params of every group of row n, vectorised (the scales widened by type).
  void RowParams(int64_t n, float* mul, float* sub) const { ChunkParams(n, 1, mul, sub); }
  // Params of rows [n, n + count), flat: mul[r * groups + s], sub likewise (scales and zeros are row-major
  // [n_total, groups], so a run of rows is one contiguous run of groups, widened in whole vectors).
  void ChunkParams(int64_t n, int64_t count, float* mul, float* sub) const {
    const DQ d;
    const hn::RebindToUnsigned<DQ> du32;
    const hn::RebindToSigned<DQ> di32;
    const hn::Rebind<uint8_t, DQ> du8;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const int64_t first = n * groups, total = count * groups;
    int64_t s = 0;
    // The next chunk's scales and zeros on their way to L2 while this one's run: a chunk's are one short stream of
    // their own beside the codes', which the hardware prefetchers do not start on soon enough (a stall per chunk).
    const int64_t scale_bytes = scale_type == ScaleType::kFloat32 ? 4 : 2;
    const char* next_scales = static_cast<const char*>(scale) + (first + total) * scale_bytes;
    for (int64_t b = 0; b < total * scale_bytes; b += 64) __builtin_prefetch(next_scales + b, 0, 2);
    if (zero != nullptr) {
      for (int64_t b = 0; b < total; b += 64) __builtin_prefetch(zero + first + total + b, 0, 2);
    }
    for (; s + lanes <= total; s += lanes) {
      VQ m;
      switch (scale_type) {
        case ScaleType::kFloat32:
          m = hn::LoadU(d, static_cast<const float*>(scale) + first + s);
          break;
        case ScaleType::kBFloat16:
          m = LoadBF16(d, static_cast<const uint16_t*>(scale) + first + s);
          break;
        default:
          m = HalfToFloat(d, static_cast<const uint16_t*>(scale) + first + s);
          break;
      }
      const VQ z = zero != nullptr
                       ? hn::ConvertTo(d, hn::BitCast(di32, hn::PromoteTo(du32, hn::LoadU(du8, zero + first + s))))
                       : hn::Set(d, symmetric_zero);
      hn::StoreU(m, d, mul + s);
      hn::StoreU(hn::Mul(z, m), d, sub + s);
    }
    for (; s < total; ++s) {
      float m, z;
      Params(n + s / groups, s % groups, m, z);
      mul[s] = m;
      sub[s] = z * m;
    }
  }
};

template <class DU8>
HWY_INLINE VQ BytesToFloat(DQ df, hn::Vec<DU8> bytes) {
  const hn::RebindToUnsigned<DQ> du32;
  const hn::RebindToSigned<DQ> di32;
  return hn::ConvertTo(df, hn::BitCast(di32, hn::PromoteTo(du32, bytes)));
}

struct Int8Format : IntParams {
  const uint8_t* data;
  int64_t k;
  Int8Format(const IntWeights& w, int64_t k_) : IntParams(w, k_), data(w.data), k(k_) {}
  const uint8_t* Row(int64_t n) const { return data + n * k; }
  static int64_t Bytes(int64_t j) { return j; }
  int64_t Step(int64_t lanes) const { return 2 * lanes; }
  static bool VectorAt(int64_t) { return true; }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
    const hn::Rebind<uint8_t, DQ> du8;
    fn(BytesToFloat<decltype(du8)>(df, hn::LoadU(du8, row + j)), j);
    fn(BytesToFloat<decltype(du8)>(df, hn::LoadU(du8, row + j + lanes)), j + lanes);
  }
  static float Code(const uint8_t* row, int64_t j) { return static_cast<float>(row[j]); }
};

// int4 in chunks of 32 codes (quantized.h): Lanes(df) bytes from byte c * Lanes(df) of a chunk hold codes
// c * Lanes(df) ... in their low nibbles and 16 + c * Lanes(df) ... in their high ones.
struct Int4Format : IntParams {
  const uint8_t* data;
  int64_t k;
  Int4Format(const IntWeights& w, int64_t k_) : IntParams(w, k_), data(w.data), k(k_) {}
  const uint8_t* Row(int64_t n) const { return data + n * (k / 2); }
  static int64_t Bytes(int64_t j) { return j / 2; }
  static int64_t Step(int64_t) { return 32; }
  static bool VectorAt(int64_t j) { return j % 32 == 0; }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
    const hn::Rebind<uint8_t, DQ> du8;
    const hn::RebindToUnsigned<DQ> du32;
    const hn::RebindToSigned<DQ> di32;
    const auto low = hn::Set(du32, 0xF);
    for (int64_t c = 0; c < 16; c += lanes) {
      const auto bytes = hn::PromoteTo(du32, hn::LoadU(du8, row + j / 2 + c));
      fn(hn::ConvertTo(df, hn::BitCast(di32, hn::And(bytes, low))), j + c);
      fn(hn::ConvertTo(df, hn::BitCast(di32, hn::ShiftRight<4>(bytes))), j + 16 + c);
    }
  }
  float Code(const uint8_t* row, int64_t j) const { return static_cast<float>(Int4Code(row, k, 0, j)); }
};

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_INT_INL_H_
