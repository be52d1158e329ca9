#pragma once
// y = x W^T (+ b) for the few input rows of decode steps and short chunks, accumulated in float32. One or two
// rows stream each weight row once: the matrix is read as one sequential stream at memory speed. More rows
// go by register tiles (4 input rows x 3 or 4 weight rows, as many as the target has registers for) over
// blocks of weight rows, each block read from memory once for all the input rows. One Highway source for
// every ISA (the AVX512_BF16 dot product a per-target specialisation); runtime/model/linear.cc splits the output
// rows over threads.

#include <cstdint>

#include "kernels/pointwise.h"  // BFloat16

namespace strata::kernels {

// x: `rows` rows of k values; w: [n_total, k]; bias: [n_total] or null. Writes y[m][n] for n in [n0, n1), y
// row-major [rows, n_total], summed in float32; bfloat16 outputs rounded to nearest even.
void LinearRows(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t k, int64_t n_total,
                int64_t n0, int64_t n1);
// bfloat16 weights, float32 input rows (bfloat16 ones widened once by the caller): the weights are widened in
// registers as they stream.
void LinearRows(const float* x, const BFloat16* w, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1);
// bfloat16 input rows on AVX512_BF16's VDPBF16PS (neither side widened) where Bf16DotAvailable(); elsewhere
// the rows are widened on each call (a caller that splits the work widens once and calls the overload above).
void LinearRows(const BFloat16* x, const BFloat16* w, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1);

}  // namespace strata::kernels
