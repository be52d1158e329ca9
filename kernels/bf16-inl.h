// bfloat16 <-> float32 for the kernels, per target (included from each *-inl.h inside its toggle): widen
// by a 16-bit shift; round to nearest even as c10::BFloat16 does (NaN stays a quiet NaN).
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
hn::Vec<hn::RebindToUnsigned<DF>> RoundedBF16Bits(DF df, hn::Vec<DF> v) {
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

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_BF16_INL_H_
