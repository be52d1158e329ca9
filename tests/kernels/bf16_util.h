#pragma once
// The kernel tests' bfloat16 reference: exact widening and round-to-nearest-even narrowing, as c10::BFloat16.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/pointwise.h"

namespace strata::kernels::reference {

inline float FromBF16(BFloat16 v) {
  const uint32_t wide = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

inline BFloat16 ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return {static_cast<uint16_t>((bits >> 16) | 0x0040)};
  bits += 0x7FFF + ((bits >> 16) & 1);
  return {static_cast<uint16_t>(bits >> 16)};
}

// The value a kernel reads or writes, as float32.
inline float Value(float v) { return v; }
inline float Value(BFloat16 v) { return FromBF16(v); }

}  // namespace strata::kernels::reference
