#pragma once
// Internal (ATen): quantized linear layers, the one new kind of linear layer every family uses. A checkpoint's
// quantized weight (planner::QuantizedLinear: block-wise FP8, compressed-tensors' pack-quantized and FP8,
// AWQ's GEMM layout, GPTQ v1; gpt-oss's MXFP4 experts through Mxfp4Linear) is loaded into one packed form per
// kind (PackedLinear: kernels/quantized.h's canonical layouts) and stays packed on its device: no dequantized copy of a
// layer exists anywhere, only a block of rows at a time while a prefill's GEMM or a GPU's matmul uses it.
//
// On the CPU, up to kFewRows input rows (decode steps, batched decodes) run kernels/quantized.h, which reads the
// packed bytes and dequantizes in registers (AVX2 and AVX-512 alike); more rows dequantize blocks of weight
// rows into a float32 (or bfloat16 on AVX512_BF16) scratch and run ATen's GEMM on each (linear.cc's widening
// loop). On a GPU, blocks of rows are dequantized with ATen ops into the activations' dtype and multiplied,
// with no host synchronisation.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "planner/quantization.h"

namespace strata::runtime {

// A quantized linear layer's weight [N, K] in kernels/quantized.h's canonical form, on one device.
struct PackedLinear {
  enum class Kind { kFp8, kInt4, kInt8, kMxfp4 };
  Kind kind = Kind::kFp8;
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K
  // kFp8: the float8_e4m3fn bytes [N, K] as stored (uint8); kInt8: codes [N, K]; kInt4: [N, K / 2] in the
  // kernels' nibble order (kernels::PackInt4); kMxfp4: the E2M1 blocks as stored, uint8 [N, K / 32, 16] (or
  // [N, K / 2]), column 2i of a block in the low nibble of its byte i, 2i + 1 in the high one.
  at::Tensor data;
  // kFp8: float32 [ceil(N / block_n), ceil(K / block_k)], the multiplier of each block. Integer kinds:
  // [N, K / group] in the checkpoint's float dtype (float32, bfloat16 or float16). kMxfp4: the E8M0 exponents,
  // uint8 [N, K / 32] (a block's multiplier is 2^(s - 127)).
  at::Tensor scale;
  at::Tensor zero;  // integer kinds, asymmetric: uint8 [N, K / group]; undefined when symmetric (2^(bits-1))
  // GPTQ act-order: int64 [K], the input columns in the order `data` holds them (x's columns are gathered
  // with it first); undefined when the columns are in order.
  at::Tensor perm;
  int64_t block_n = 0;  // kFp8
  int64_t block_k = 0;
  int64_t group = 0;  // integer kinds (kMxfp4: 32, its block)
  // kFp8 on a CUDA device under --fp8-matmul scaled_mm (ScaledMmEligible): LinearPacked quantizes x per row and
  // block of 128 columns to FP8 and runs at::_scaled_mm with the weight's 128 x 128 block scales (W8A8), instead
  // of dequantizing blocks of rows into a GEMM in x's dtype.
  bool scaled_mm = false;
  // kFp8 loaded for the CPU: no byte is an e4m3 NaN code (kernels::Fp8HasNanCode, checked at load), so the kernels
  // skip making them NaN (kernels::Fp8Weights::nan_free).
  bool fp8_nan_free = false;

  int bits() const { return kind == Kind::kInt4 || kind == Kind::kMxfp4 ? 4 : 8; }
  int64_t bytes() const;  // of every tensor above
  // The same weight on `device` (each tensor copied; non_blocking from pinned memory).
  PackedLinear To(at::Device device, bool non_blocking) const;
  PackedLinear Pinned() const;
};

// Rows [n0, n0 + rows) of `w` as a weight of its own (views); FP8 rows must start and end on scale blocks
// (TORCH_CHECK).
PackedLinear PackedRows(const PackedLinear& w, int64_t n0, int64_t rows);

// The weight [N, K] as a dense tensor of `dtype` on the packed weight's device, as transformers dequantizes it
// (FP8: float8 -> float32, times the block's scale; integers: (q - zero) x scale in float32; MXFP4 as
// convert_moe_packed_tensors: ldexp(E2M1 value, s - 127) in float32, an exact scaling; rounded once to `dtype`).
// Rows [n0, n1) only when given.
at::Tensor Dequantize(const PackedLinear& w, at::ScalarType dtype, int64_t n0 = 0, int64_t n1 = -1);
// The same with ATen ops on any device (what a GPU runs; Dequantize runs the kernels on the CPU).
at::Tensor DequantizeWithAten(const PackedLinear& w, at::ScalarType dtype, int64_t n0 = 0, int64_t n1 = -1);

// y = x W^T (+ bias) in x's dtype; x [..., K].
at::Tensor LinearPacked(const at::Tensor& x, const PackedLinear& w, const at::Tensor& bias);

// W8A8 through at::_scaled_mm (--fp8-matmul scaled_mm, off by default; a GPU path): FP8 weights of 128 x 128 blocks
// whose N and K are whole blocks, as DeepSeek-V3 and the Qwen3 FP8 releases store them. The activations are
// quantized as DeepSeek-V3's act_quant and vLLM's per_token_group_quant_fp8 do: per row and block of 128 columns,
// scale = max(amax, 1e-10) / 448, codes = x / scale in float8_e4m3fn. Not exact: the parity tests bound it
// (tests/runtime_parity/test_quantized_cuda_parity.py).
bool ScaledMmEligible(const PackedLinear& w);
// x [M, K] (K a multiple of 128) -> (codes float8_e4m3fn [M, K], scales float32 [M, K / 128] with strides (1, M):
// the outer-dim-major layout _scaled_mm's 1 x 128 block scaling takes). ATen ops, on x's device, no host sync.
std::pair<at::Tensor, at::Tensor> QuantizeFp8Activations(const at::Tensor& x);
// Runs one small W8A8 product on `device` (a CUDA device) and checks its value: an error naming the device and
// torch's reason where this GPU, its cuBLAS or the wheel cannot run _scaled_mm's block scaling (cuBLAS has it for
// compute capability 9.0 from CUDA 12.9). Synchronises the device: for loading, not for steps.
absl::Status ProbeFp8ScaledMm(at::Device device);

// gpt-oss's MXFP4 experts from the mapped checkpoint: `prefix`_blocks uint8 [E, N, K / 32, 16] and `prefix`_scales
// uint8 [E, N, K / 32] (errors name them: missing, another dtype or shape, a scale past 252). Per expert, the rows
// row0, row0 + step, ... (step 2 picks gate_up_proj's gate or up rows, which the format interleaves) as one
// PackedLinear on `device` (copied out of the file: 0.53 bytes per weight).
absl::StatusOr<std::vector<PackedLinear>> LoadMxfp4Experts(const checkpoint::Checkpoint& checkpoint,
                                                           const std::string& prefix, int64_t experts, int64_t n,
                                                           int64_t k, int64_t row0, int64_t step, at::Device device);

// Whether LinearPacked runs the kernels on packed bytes for these operands (a CPU, up to kFewRows rows);
// else blocks of dequantized rows (tests and benchmarks say which path ran).
bool LinearPackedUsesKernel(const at::Tensor& x, const PackedLinear& w);

// One MXFP4 projection (one expert's, as gpt-oss stores them in `*_blocks` [E, N, K / 32, 16] and `*_scales`
// [E, N, K / 32]): `blocks` uint8 [N, K / 32, 16] and `scales` uint8 [N, K / 32], any device, views of a mapped
// checkpoint allowed (kept as they are; made contiguous only where they are not). Checks the dtypes and shapes,
// and that every scale keeps its block finite in bfloat16 (s <= 252: 6, the largest E2M1 value, times 2^(s - 127);
// 255 is E8M0's NaN); errors name `name`, and the first bad scale's element. The scales are read on the CPU.
absl::StatusOr<PackedLinear> Mxfp4Linear(const at::Tensor& blocks, const at::Tensor& scales, std::string_view name);

// Reads one quantized linear layer from the mapped checkpoint and converts it to the packed form on `device`
// (pinned host memory when `pinned`). Every tensor's dtype and shape is checked against `q`, and every scale
// is finite: errors name the tensor. FP8 weights on the CPU are views of the mapped bytes (WeightLoader::LoadPacked
// moves a CPU layer into its 2 MiB pages).
absl::StatusOr<PackedLinear> LoadPackedLinear(const checkpoint::Checkpoint& checkpoint,
                                              const planner::QuantizedLinear& q, at::Device device, bool pinned);

}  // namespace strata::runtime
