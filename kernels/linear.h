#pragma once
// y = x W^T (+ b), accumulated in float32, two ways. LinearRows takes a weight as stored ([n, k], the
// checkpoint's layout): one or two rows stream each weight row once, more go by register tiles (4 input rows x
// 3 or 4 weight rows) over blocks of weight rows read from memory once; it serves bfloat16 layers on AVX512_BF16
// (VDPBF16PS) and weights that are views of others. LinearPanels takes a weight packed once at load into panels
// of 16 output rows side by side (below): tiles broadcast each input value against whole vectors of outputs, no
// horizontal sums, one kernel for any number of rows, decode to prefill; runtime/model packs the CPU's float32
// layers, and its bfloat16 ones where the CPU has no AVX512_BF16, into panels (linear.h's PanelsServe). One
// Highway source for every ISA (the AVX512_BF16 dot product a per-target specialisation); runtime/model/linear.cc
// splits the output rows (or panels) over threads.

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

// ---- The panel layout: a weight [n, k] packed once (at load) for the panel kernels. Panel p holds the rows
// [16 p, 16 p + w), w = min(16, n - 16 p), column by column: row 16 p + r, column j at 16 p k + j w + r. Same
// size as the matrix (no padding); only the last panel is narrower.
inline constexpr int64_t kPanelRows = 16;
inline int64_t PanelCount(int64_t n) { return (n + kPanelRows - 1) / kPanelRows; }

void PackPanels(const float* w, int64_t n, int64_t k, float* out);
void PackPanels(const BFloat16* w, int64_t n, int64_t k, BFloat16* out);
// The matrix [n, k] back from its panels.
void UnpackPanels(const float* panels, int64_t n, int64_t k, float* out);
void UnpackPanels(const BFloat16* panels, int64_t n, int64_t k, BFloat16* out);

// y = x W^T (+ b) for a weight in panels, any number of float32 input rows (bfloat16 ones widened by the caller):
// writes y[m][n] for the rows of panels [p0, p1) (row-major [rows, n_total]), summed in float32, bfloat16 outputs
// rounded to nearest even. Rows whose columns fit L2 take the panels one by one (each streamed once: decode
// steps, batched decode); more rows (prefill, an f32 GEMM) go in blocks of rows against groups of panels, a
// chunk of 256 columns at a time, so the panels stream once per block of up to 256 rows.
void LinearPanels(const float* x, const float* panels, const float* bias, float* y, int64_t rows, int64_t k,
                  int64_t n_total, int64_t p0, int64_t p1);
void LinearPanels(const float* x, const BFloat16* panels, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                  int64_t n_total, int64_t p0, int64_t p1);

}  // namespace strata::kernels
