// Per-target code of attention.cc (Highway's convention: included once per target, guarded by the toggle).
#if defined(STRATA_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_ATTENTION_INL_H_
#undef STRATA_KERNELS_ATTENTION_INL_H_
#else
#define STRATA_KERNELS_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// q . key over dim values, q already scaled and widened to float32 (`qs`).
template <class E, class D>
HWY_INLINE float Dot(D d, const float* qs, const typename E::T* key, int64_t dim, int64_t lanes) {
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * lanes <= dim; c += 2 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(d, qs + c), E::Load(d, key + c), acc0);
    acc1 = hn::MulAdd(hn::LoadU(d, qs + c + lanes), E::Load(d, key + c + lanes), acc1);
  }
  for (; c + lanes <= dim; c += lanes) acc0 = hn::MulAdd(hn::LoadU(d, qs + c), E::Load(d, key + c), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
  for (; c < dim; ++c) sum += qs[c] * E::LoadOne(key + c);
  return sum;
}

// exp(row[t] - max) in place over `length` scores; returns their sum.
template <class D>
HWY_INLINE float SoftmaxNumerators(D d, float* row, int64_t length, int64_t lanes,
                                   float sink = -std::numeric_limits<float>::infinity()) {
  // A sink (gpt-oss) is one more logit in the softmax whose value is zero: it takes part in the peak and the sum.
  float peak = sink;
  int64_t t = 0;
  if (length >= lanes) {
    auto top = hn::Set(d, peak);
    for (; t + lanes <= length; t += lanes) top = hn::Max(top, hn::LoadU(d, row + t));
    peak = hn::GetLane(hn::MaxOfLanes(d, top));
  }
  for (; t < length; ++t) peak = std::max(peak, row[t]);
  const auto vpeak = hn::Set(d, peak);
  auto total = hn::Zero(d);
  for (t = 0; t + lanes <= length; t += lanes) {
    const auto e = FastExp(d, hn::Sub(hn::LoadU(d, row + t), vpeak));
    hn::StoreU(e, d, row + t);
    total = hn::Add(total, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, total));
  for (; t < length; ++t) {
    const float e = hn::GetLane(FastExp(d, hn::Set(d, row[t] - peak)));
    row[t] = e;
    sum += e;
  }
  if (sink != -std::numeric_limits<float>::infinity()) sum += hn::GetLane(FastExp(d, hn::Set(d, sink - peak)));
  return sum;
}

template <class E>
void DecodeAttentionHeadT(const typename E::T* q, const typename E::T* keys, const typename E::T* values,
                          const int64_t* offsets, int64_t length, int64_t group, int64_t dim, float scale,
                          typename E::T* out, float* scratch, const float* sinks) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  float* qs = scratch;                    // [group, dim]: the scaled queries, float32
  float* scores = scratch + group * dim;  // [group, length]
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t c = 0; c < dim; ++c) qs[g * dim + c] = E::LoadOne(q + g * dim + c) * scale;
  }
  // Scores: each key (a few hundred bytes, from L1 after its first head) against the group's heads.
  for (int64_t t = 0; t < length; ++t) {
    const typename E::T* key = keys + offsets[t];
    for (int64_t g = 0; g < group; ++g) scores[g * length + t] = Dot<E>(d, qs + g * dim, key, dim, lanes);
  }
  // Softmax of each head's scores, then the weighted sum of the values, eight vectors of columns at a time
  // (the accumulators stay in registers: one pass over the values for head_dim 128 with AVX-512, two with
  // AVX2), then a vector at a time.
  for (int64_t g = 0; g < group; ++g) {
    float* row = scores + g * length;
    const float inverse = 1.0f / (sinks == nullptr ? SoftmaxNumerators(d, row, length, lanes)
                                                   : SoftmaxNumerators(d, row, length, lanes, sinks[g]));
    const auto vinverse = hn::Set(d, inverse);
    typename E::T* dst = out + g * dim;
    int64_t c = 0;
    for (; c + 8 * lanes <= dim; c += 8 * lanes) {
      auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      auto a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
      for (int64_t t = 0; t < length; ++t) {
        const typename E::T* value = values + offsets[t] + c;
        const auto w = hn::Set(d, row[t]);
        a0 = hn::MulAdd(w, E::Load(d, value), a0);
        a1 = hn::MulAdd(w, E::Load(d, value + lanes), a1);
        a2 = hn::MulAdd(w, E::Load(d, value + 2 * lanes), a2);
        a3 = hn::MulAdd(w, E::Load(d, value + 3 * lanes), a3);
        a4 = hn::MulAdd(w, E::Load(d, value + 4 * lanes), a4);
        a5 = hn::MulAdd(w, E::Load(d, value + 5 * lanes), a5);
        a6 = hn::MulAdd(w, E::Load(d, value + 6 * lanes), a6);
        a7 = hn::MulAdd(w, E::Load(d, value + 7 * lanes), a7);
      }
      E::Store(d, hn::Mul(a0, vinverse), dst + c);
      E::Store(d, hn::Mul(a1, vinverse), dst + c + lanes);
      E::Store(d, hn::Mul(a2, vinverse), dst + c + 2 * lanes);
      E::Store(d, hn::Mul(a3, vinverse), dst + c + 3 * lanes);
      E::Store(d, hn::Mul(a4, vinverse), dst + c + 4 * lanes);
      E::Store(d, hn::Mul(a5, vinverse), dst + c + 5 * lanes);
      E::Store(d, hn::Mul(a6, vinverse), dst + c + 6 * lanes);
      E::Store(d, hn::Mul(a7, vinverse), dst + c + 7 * lanes);
    }
    for (; c + lanes <= dim; c += lanes) {
      auto a = hn::Zero(d);
      for (int64_t t = 0; t < length; ++t) a = hn::MulAdd(hn::Set(d, row[t]), E::Load(d, values + offsets[t] + c), a);
      E::Store(d, hn::Mul(a, vinverse), dst + c);
    }
    for (; c < dim; ++c) {
      float a = 0;
      for (int64_t t = 0; t < length; ++t) a += row[t] * E::LoadOne(values + offsets[t] + c);
      E::StoreOne(a * inverse, dst + c);
    }
  }
}

template <class E>
void LatentAttentionHeadsT(const float* q, const typename E::T* rows, const int64_t* offsets, int64_t length,
                           int64_t heads, int64_t key_dim, int64_t value_dim, float scale, float* out, float* scratch) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  float* scores = scratch;                    // [heads, length]
  float* inverse = scratch + heads * length;  // [heads]: 1 / each head's softmax denominator
  // Scores: each row (a key_dim-value latent) read once, against every head's query.
  for (int64_t t = 0; t < length; ++t) {
    const typename E::T* row = rows + offsets[t];
    for (int64_t g = 0; g < heads; ++g) {
      scores[g * length + t] = scale * Dot<E>(d, q + g * key_dim, row, key_dim, lanes);
    }
  }
  for (int64_t g = 0; g < heads; ++g) inverse[g] = 1.0f / SoftmaxNumerators(d, scores + g * length, length, lanes);
  // The weighted sums, a tile of keys at a time (its values stay in L2 while every head reads them), four vectors of
  // columns per pass with the accumulators in registers, carried in `out` from tile to tile.
  constexpr int64_t kTile = 64;
  for (int64_t t0 = 0; t0 < length; t0 += kTile) {
    const int64_t t1 = std::min(length, t0 + kTile);
    for (int64_t g = 0; g < heads; ++g) {
      const float* w = scores + g * length;
      float* dst = out + g * value_dim;
      int64_t c = 0;
      for (; c + 4 * lanes <= value_dim; c += 4 * lanes) {
        auto a0 = t0 == 0 ? hn::Zero(d) : hn::LoadU(d, dst + c);
        auto a1 = t0 == 0 ? hn::Zero(d) : hn::LoadU(d, dst + c + lanes);
        auto a2 = t0 == 0 ? hn::Zero(d) : hn::LoadU(d, dst + c + 2 * lanes);
        auto a3 = t0 == 0 ? hn::Zero(d) : hn::LoadU(d, dst + c + 3 * lanes);
        for (int64_t t = t0; t < t1; ++t) {
          const typename E::T* value = rows + offsets[t] + c;
          const auto wt = hn::Set(d, w[t]);
          a0 = hn::MulAdd(wt, E::Load(d, value), a0);
          a1 = hn::MulAdd(wt, E::Load(d, value + lanes), a1);
          a2 = hn::MulAdd(wt, E::Load(d, value + 2 * lanes), a2);
          a3 = hn::MulAdd(wt, E::Load(d, value + 3 * lanes), a3);
        }
        hn::StoreU(a0, d, dst + c);
        hn::StoreU(a1, d, dst + c + lanes);
        hn::StoreU(a2, d, dst + c + 2 * lanes);
        hn::StoreU(a3, d, dst + c + 3 * lanes);
      }
      for (; c < value_dim; ++c) {
        float a = t0 == 0 ? 0.0f : dst[c];
        for (int64_t t = t0; t < t1; ++t) a += w[t] * E::LoadOne(rows + offsets[t] + c);
        dst[c] = a;
      }
    }
  }
  for (int64_t g = 0; g < heads; ++g) {
    const auto vinverse = hn::Set(d, inverse[g]);
    float* dst = out + g * value_dim;
    int64_t c = 0;
    for (; c + lanes <= value_dim; c += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, dst + c), vinverse), d, dst + c);
    for (; c < value_dim; ++c) dst[c] *= inverse[g];
  }
}

void LatentAttentionHeadsF32(const float* q, const float* rows, const int64_t* offsets, int64_t length, int64_t heads,
                             int64_t key_dim, int64_t value_dim, float scale, float* out, float* scratch) {
  LatentAttentionHeadsT<F32>(q, rows, offsets, length, heads, key_dim, value_dim, scale, out, scratch);
}
void LatentAttentionHeadsBF16(const float* q, const uint16_t* rows, const int64_t* offsets, int64_t length,
                              int64_t heads, int64_t key_dim, int64_t value_dim, float scale, float* out,
                              float* scratch) {
  LatentAttentionHeadsT<BF16>(q, rows, offsets, length, heads, key_dim, value_dim, scale, out, scratch);
}

void DecodeAttentionHeadF32(const float* q, const float* keys, const float* values, const int64_t* offsets,
                            int64_t length, int64_t group, int64_t dim, float scale, float* out, float* scratch,
                            const float* sinks) {
  DecodeAttentionHeadT<F32>(q, keys, values, offsets, length, group, dim, scale, out, scratch, sinks);
}
void DecodeAttentionHeadBF16(const uint16_t* q, const uint16_t* keys, const uint16_t* values, const int64_t* offsets,
                             int64_t length, int64_t group, int64_t dim, float scale, uint16_t* out, float* scratch,
                             const float* sinks) {
  DecodeAttentionHeadT<BF16>(q, keys, values, offsets, length, group, dim, scale, out, scratch, sinks);
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_ATTENTION_INL_H_
