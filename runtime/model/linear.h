#pragma once
// Internal (ATen): y = x W^T (+ b), as at::linear. A decode step multiplies a few rows by every weight
// matrix of the model, and on the CPU that is bound by how fast the weights stream from memory; at::linear
// (MKL's sgemv / oneDNN for one row) streams a small decoder layer's matrices well below what one core can read
// (build/bench/strata_linear_bench; bench/README.md). So on the CPU Linear runs
// kernels/linear.h (one Highway source: AVX2, AVX-512, SSE4, NEON, ...), split over the intra-op threads:
// - a weight in panels (a CPU linear layer in float32, or in bfloat16 without AVX512_BF16, packed at load:
//   PanelsServe) runs kernels::LinearPanels for any number of rows, decode to prefill;
// - a weight as stored, up to kFewRows rows of float32 or bfloat16: the row kernels (one or two rows read each
//   weight row once, as one stream) and register tiles (3 to kFewRows), bfloat16 through AVX512_BF16's
//   VDPBF16PS where the CPU has it; bfloat16 prefill on a CPU without AVX512_BF16 widens to float32 block by
//   block for ATen's float32 GEMM (3-5x its bfloat16 one there, as llama.cpp converts to float32).
// Everything else (a stored weight's float32 and AVX512_BF16 prefill, CUDA, other dtypes) is at::linear.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/model/weights.h"

namespace strata::runtime {

inline constexpr int64_t kFewRows = 32;

// x [..., K], weight [N, K], bias [N] or undefined; returns [..., N] in x's dtype.
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});
// The same for a runner's weight: dense, a quantized layer's packed one (LinearPacked) or in panels.
at::Tensor Linear(const at::Tensor& x, const WeightTensor& weight, const at::Tensor& bias = {});

// y = x W^T (+ bias) for a weight given a block of rows at a time (`rows_of(n0, nb)`: W[n0, n0 + nb), any dtype,
// on x's device), each block converted into a reused buffer of `gemm_dtype` and multiplied by ATen's GEMM:
// bfloat16 prefill widened to float32, a quantized weight's prefill (quantized_linear.h). Returns x's dtype.
at::Tensor LinearOverRowBlocks(const at::Tensor& x, int64_t n,
                               const std::function<at::Tensor(int64_t, int64_t)>& rows_of, at::ScalarType gemm_dtype,
                               const at::Tensor& bias);

// Whether a CPU linear layer in `dtype` is packed into panels at load (kernels/linear.h; WeightLoader::Load): float32,
// and bfloat16 where the CPU lacks AVX512_BF16 (where it has it, bfloat16 keeps its rows for VDPBF16PS and
// oneDNN's bfloat16 GEMM). Their Linear is the panel kernel for any number of rows, prefill included: broadcast
// tiles with no horizontal sums, ahead of the row kernels, the tiles and MKL's sgemm (bench/README.md).
bool PanelsServe(at::ScalarType dtype);
// `dense` [N, K] (contiguous, CPU, out's dtype) into `out`'s N x K values in panel order.
void PackPanels(const at::Tensor& dense, const at::Tensor& out);
// The weight [N, K] back from its panels.
at::Tensor UnpackPanels(const PanelWeight& weight);
at::Tensor Linear(const at::Tensor& x, const PanelWeight& weight, const at::Tensor& bias = {});
// x through each of `weights` (plus biases[i], undefined for none): a layer's q, k and v, or gate and up. Where all
// are in panels of one K and dtype, one split over the threads serves them all (one join, x widened once);
// otherwise one Linear each.
std::vector<at::Tensor> LinearEach(const at::Tensor& x, std::span<const WeightTensor* const> weights,
                                   std::span<const at::Tensor> biases);

// Rows [n0, n0 + rows) of a weight [N, K] as a weight of its own (Phi-3's fused projections), a view: a packed
// FP8 weight's rows must start and end on its scale blocks; panels' rows that start or end inside a panel are
// unpacked (a copy).
WeightTensor WeightRows(const WeightTensor& weight, int64_t n0, int64_t rows);

// Whether Linear runs strata's kernel for these operands: up to kFewRows rows (tests and benchmarks say
// which path ran).
bool LinearUsesOwnKernel(const at::Tensor& x, const at::Tensor& weight);

// Whether Linear runs bfloat16 prefill through float32 (a CPU without AVX512_BF16, more than kFewRows rows).
bool LinearWidensBf16(const at::Tensor& x, const at::Tensor& weight);

}  // namespace strata::runtime
