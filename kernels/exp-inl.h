// e^x for the kernels, per target (included from each *-inl.h inside its toggle): x = n ln2 + r with
// |r| <= ln2 / 2, e^r by its Taylor series to r^7 (relative error below 2e-7, about one float32 step),
// scaled by 2^n in two halves (so that n = 128 near the top of the range stays finite where exp is). x is
// clamped to [-87, 89]: below, the result is 0 or a denormal, as far under any sum's precision as exp's;
// above, it overflows to inf as exp does. Cheaper than Highway's contrib Exp, which is accurate to the last
// bit: SiLU and softmax round to float32 or bfloat16 right after.
#if defined(STRATA_KERNELS_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_EXP_INL_H_
#undef STRATA_KERNELS_EXP_INL_H_
#else
#define STRATA_KERNELS_EXP_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class DF>
HWY_INLINE hn::Vec<DF> FastExp(DF df, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  x = hn::Min(hn::Max(x, hn::Set(df, -87.0f)), hn::Set(df, 89.0f));
  // n = round(x / ln2) by the 1.5 * 2^23 trick: adding it leaves n, rounded to nearest even, in the low
  // mantissa bits, read back as an integer without a (range-checked) float-to-int conversion.
  const auto magic = hn::Set(df, 12582912.0f);
  const auto shifted = hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), magic);
  const auto n = hn::Sub(shifted, magic);
  auto r = hn::NegMulAdd(n, hn::Set(df, 0.693145751953125f), x);    // ln 2, high bits: n * hi is exact
  r = hn::NegMulAdd(n, hn::Set(df, 1.428606765330187045e-06f), r);  // ln 2, the rest
  auto p = hn::Set(df, 1.0f / 5040);
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 720));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 120));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 24));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 6));
  p = hn::MulAdd(p, r, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  // 2^n as two powers of two built in the exponent field: n in [-126, 128], each half in [-63, 64].
  const auto ni = hn::Sub(hn::BitCast(di, shifted), hn::BitCast(di, magic));
  const auto half = hn::ShiftRight<1>(ni);
  const auto bias = hn::Set(di, 127);
  const auto first = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(half, bias)));
  const auto second = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni, half), bias)));
  return hn::Mul(hn::Mul(p, first), second);
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_EXP_INL_H_
