#pragma once
// y = x W^T (+ b) for one or two input rows (a decode step), streaming each weight row once: the matrix is
// read as one sequential stream at memory speed, every row's dot product accumulated in float32. One
// Highway source for every ISA; runtime/model/linear.cc splits the output rows over threads and uses it
// where its AVX-512 kernels do not run.

#include <cstdint>

#include "kernels/pointwise.h"  // BFloat16

namespace strata::kernels {

// x: `rows` (1 or 2) rows of k float32 (bfloat16 inputs are widened once by the caller). w: [n_total, k];
// bias: [n_total] or null. Writes y[m][n] for n in [n0, n1), y row-major [rows, n_total]; bfloat16 outputs
// rounded to nearest even.
void LinearRows(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t k, int64_t n_total,
                int64_t n0, int64_t n1);
void LinearRows(const float* x, const BFloat16* w, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1);

}  // namespace strata::kernels
