// bfloat16 <-> float32 for the kernels, per target (included from each *-inl.h inside its toggle): widen
// by a 16-bit shift; round to nearest even as c10::BFloat16 does (NaN stays a quiet NaN). And the element
// access the kernels are templated on (F32, BF16).
#if defined(STRATA_KERNELS_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_BF16_INL_H_
#undef STRATA_KERNELS_BF16_INL_H_
#else
#define STRATA_KERNELS_BF16_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline float BF16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

inline uint16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (f != f) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN, sign kept
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Lanes(d) bfloat16 values at p, as float32.
template <class DF>
hn::Vec<DF> LoadBF16(DF df, const uint16_t* p) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
}

// float32 -> the bits of the nearest bfloat16 (ties to even), as uint32 lanes holding 16 bits.
template <class DF>
hn::Vec<hn::RebindToUnsigned<DF>> RoundedBF16Bits(DF /*df*/, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::BitCast(du32, v);
  const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1));
  auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du32, 0x7FFF), odd)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du32, 0x0040));
  return hn::IfThenElse(hn::RebindMask(du32, hn::Ne(v, v)), quiet, rounded);
}

// v rounded to bfloat16 and widened back: the value a bfloat16 tensor would hold.
template <class DF>
hn::Vec<DF> RoundBF16(DF df, hn::Vec<DF> v) {
  return hn::BitCast(df, hn::ShiftLeft<16>(RoundedBF16Bits(df, v)));
}

// v rounded to bfloat16, stored as Lanes(d) values at p.
template <class DF>
void StoreRoundedBF16(DF df, hn::Vec<DF> v, uint16_t* p) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::RebindToSigned<DF> di32;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, RoundedBF16Bits(df, v))), du16, p);
}

// Element access by type: float32 as is; bfloat16 as its bits, widened on load and rounded on store.
struct F32 {
  using T = float;
  template <class D>
  static hn::Vec<D> Load(D d, const float* p) {
    return hn::LoadU(d, p);
  }
  template <class D>
  static hn::Vec<D> Round(D, hn::Vec<D> v) {
    return v;
  }
  template <class D>
  static void Store(D d, hn::Vec<D> v, float* p) {
    hn::StoreU(v, d, p);
  }
  static float LoadOne(const float* p) { return *p; }
  static float RoundOne(float v) { return v; }
  static void StoreOne(float v, float* p) { *p = v; }
};

struct BF16 {
  using T = uint16_t;
  template <class D>
  static hn::Vec<D> Load(D d, const uint16_t* p) {
    return LoadBF16(d, p);
  }
  template <class D>
  static hn::Vec<D> Round(D d, hn::Vec<D> v) {
    return RoundBF16(d, v);
  }
  template <class D>
  static void Store(D d, hn::Vec<D> v, uint16_t* p) {
    StoreRoundedBF16(d, v, p);
  }
  static float LoadOne(const uint16_t* p) { return BF16ToFloat(*p); }
  static float RoundOne(float v) { return BF16ToFloat(FloatToBF16(v)); }
  static void StoreOne(float v, uint16_t* p) { *p = FloatToBF16(v); }
};

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_BF16_INL_H_
