// Per-target code of pointwise.cc (Highway's convention: included once per target, guarded by the toggle).
#if defined(STRATA_KERNELS_POINTWISE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_POINTWISE_INL_H_
#undef STRATA_KERNELS_POINTWISE_INL_H_
#else
#define STRATA_KERNELS_POINTWISE_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class E>
void RmsNormRowsT(const typename E::T* x, const typename E::T* w, typename E::T* y, int64_t width, int64_t rows,
                  float eps) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t row = 0; row < rows; ++row) {
    const typename E::T* in = x + row * width;
    typename E::T* out = y + row * width;
    auto squares = hn::Zero(d);
    int64_t j = 0;
    for (; j + lanes <= width; j += lanes) {
      const auto v = E::Load(d, in + j);
      squares = hn::MulAdd(v, v, squares);
    }
    float sum = hn::GetLane(hn::SumOfLanes(d, squares));
    for (int64_t t = j; t < width; ++t) sum += E::LoadOne(in + t) * E::LoadOne(in + t);
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
    const auto vscale = hn::Set(d, scale);
    for (j = 0; j + lanes <= width; j += lanes) {
      const auto normed = E::Round(d, hn::Mul(E::Load(d, in + j), vscale));
      E::Store(d, hn::Mul(E::Load(d, w + j), normed), out + j);
    }
    for (int64_t t = j; t < width; ++t) {
      E::StoreOne(E::LoadOne(w + t) * E::RoundOne(E::LoadOne(in + t) * scale), out + t);
    }
  }
}

template <class E>
void SiluMulT(const typename E::T* gate, const typename E::T* up, typename E::T* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    const auto g = E::Load(d, gate + j);
    const auto silu = E::Round(d, hn::Div(g, hn::Add(one, FastExp(d, hn::Neg(g)))));
    E::Store(d, hn::Mul(silu, E::Load(d, up + j)), y + j);
  }
  for (; j < n; ++j) {
    const float g = E::LoadOne(gate + j);
    E::StoreOne(E::RoundOne(g / (1.0f + std::exp(-g))) * E::LoadOne(up + j), y + j);
  }
}

template <class E>
void ClampedSwigluT(const typename E::T* gate, const typename E::T* up, typename E::T* y, int64_t n, float limit,
                    float alpha) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f), hi = hn::Set(d, limit), lo = hn::Set(d, -limit), a = hn::Set(d, alpha);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    auto g = E::Load(d, gate + j), u = E::Load(d, up + j);
    g = hn::IfThenElse(hn::Gt(g, hi), hi, g);  // a NaN compares false: kept
    u = hn::IfThenElse(hn::Gt(u, hi), hi, hn::IfThenElse(hn::Lt(u, lo), lo, u));
    const auto scaled = E::Round(d, hn::Mul(g, a));
    const auto sigmoid = E::Round(d, hn::Div(one, hn::Add(one, FastExp(d, hn::Neg(scaled)))));
    const auto glu = E::Round(d, hn::Mul(g, sigmoid));
    E::Store(d, hn::Mul(E::Round(d, hn::Add(u, one)), glu), y + j);
  }
  for (; j < n; ++j) {
    float g = E::LoadOne(gate + j), u = E::LoadOne(up + j);
    g = g > limit ? limit : g;
    u = u > limit ? limit : (u < -limit ? -limit : u);
    const float scaled = E::RoundOne(g * alpha);
    const float glu = E::RoundOne(g * E::RoundOne(1.0f / (1.0f + std::exp(-scaled))));
    E::StoreOne(E::RoundOne(u + 1.0f) * glu, y + j);
  }
}

// y = x * cos + rotate_half(x) * sin per head vector; the first half's rotated partner is -x[i + half] (its product
// negated exactly), the second half's x[i - half]. Mul and Add, never a fused multiply-add: ATen rounds each.
template <class E>
void RopeRowsT(const typename E::T* x, const typename E::T* cos, const typename E::T* sin, typename E::T* y,
               int64_t tokens, int64_t heads, int64_t dim) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const typename E::T* c = cos + t * dim;
    const typename E::T* s = sin + t * dim;
    for (int64_t h = 0; h < heads; ++h) {
      const typename E::T* in = x + (t * heads + h) * dim;
      typename E::T* out = y + (t * heads + h) * dim;
      int64_t j = 0;
      for (; j + lanes <= half; j += lanes) {
        const auto lo = E::Load(d, in + j), hi = E::Load(d, in + half + j);
        const auto lo_cos = E::Round(d, hn::Mul(lo, E::Load(d, c + j)));
        const auto hi_sin = E::Round(d, hn::Mul(hn::Neg(hi), E::Load(d, s + j)));
        E::Store(d, hn::Add(lo_cos, hi_sin), out + j);
        const auto hi_cos = E::Round(d, hn::Mul(hi, E::Load(d, c + half + j)));
        const auto lo_sin = E::Round(d, hn::Mul(lo, E::Load(d, s + half + j)));
        E::Store(d, hn::Add(hi_cos, lo_sin), out + half + j);
      }
      for (; j < half; ++j) {
        const float lo = E::LoadOne(in + j), hi = E::LoadOne(in + half + j);
        E::StoreOne(E::RoundOne(lo * E::LoadOne(c + j)) + E::RoundOne(-hi * E::LoadOne(s + j)), out + j);
        E::StoreOne(E::RoundOne(hi * E::LoadOne(c + half + j)) + E::RoundOne(lo * E::LoadOne(s + half + j)),
                    out + half + j);
      }
    }
  }
}

// The target this copy of the code was compiled for: what the dispatch picked.
const char* TargetOfThisCode() { return hwy::TargetName(HWY_TARGET); }

void RmsNormRowsF32(const float* x, const float* w, float* y, int64_t width, int64_t rows, float eps) {
  RmsNormRowsT<F32>(x, w, y, width, rows, eps);
}
void RmsNormRowsBF16(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t width, int64_t rows, float eps) {
  RmsNormRowsT<BF16>(x, w, y, width, rows, eps);
}
void ClampedSwigluF32(const float* gate, const float* up, float* y, int64_t n, float limit, float alpha) {
  ClampedSwigluT<F32>(gate, up, y, n, limit, alpha);
}
void ClampedSwigluBF16(const uint16_t* gate, const uint16_t* up, uint16_t* y, int64_t n, float limit, float alpha) {
  ClampedSwigluT<BF16>(gate, up, y, n, limit, alpha);
}
void RopeRowsF32(const float* x, const float* cos, const float* sin, float* y, int64_t tokens, int64_t heads,
                 int64_t dim) {
  RopeRowsT<F32>(x, cos, sin, y, tokens, heads, dim);
}
void RopeRowsBF16(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* y, int64_t tokens,
                  int64_t heads, int64_t dim) {
  RopeRowsT<BF16>(x, cos, sin, y, tokens, heads, dim);
}
void SiluMulF32(const float* gate, const float* up, float* y, int64_t n) { SiluMulT<F32>(gate, up, y, n); }
void SiluMulBF16(const uint16_t* gate, const uint16_t* up, uint16_t* y, int64_t n) { SiluMulT<BF16>(gate, up, y, n); }

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_POINTWISE_INL_H_
