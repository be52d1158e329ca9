#pragma once
// Quantized linear layers on the CPU: y = x W^T (+ b) for the few input rows of decode steps (1-32), the
// weights read packed and dequantized in registers, float32 accumulation; and the dequantizer prefill uses
// (past 32 rows the runtime dequantizes a block of weight rows into scratch and runs a GEMM on it). One Highway
// source for every ISA, as kernels/linear.h. The runtime converts every checkpoint layout into the two packed
// forms below at load.
//
// FP8 (torch float8_e4m3fn: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits, subnormals at exponent 0, no
// infinity, 0x7f and 0xff NaN): the weight bytes [n_total, k] row-major as the checkpoint stores them, and a
// float32 grid of scales [ceil(n_total / block_n), ceil(k / block_k)]:
//   W[n][j] = e4m3(data[n * k + j]) * scale[(n / block_n) * ceil(k / block_k) + j / block_k]
// Any positive block sizes (128 x 128 as DeepSeek-V3 / Qwen3-FP8; 1 x k per channel; n_total x k per tensor);
// neither k nor n_total need be a multiple of the block (the last blocks are ragged).
//
// Integers, group-wise along k: unsigned codes q in [0, 2^bits), bits 4 or 8, group g = j / group:
//   W[n][j] = (q[n][j] - zero[n][g]) * scale[n][g]
// `group` divides k (the caller checks; for 4 bits k is even); zero is uint8 [n_total, k / group], or null for
// symmetric codes (zero 2^(bits-1): 8 or 128); scale [n_total, k / group] in the dtype the checkpoint stores.
// int8: one code a byte, [n_total, k] row-major. int4: [n_total, k / 2] bytes, each row in chunks of 32
// codes (the last chunk of a row has k % 32 codes when k is not a multiple of 32): a chunk of c codes is c / 2
// bytes, byte i holding code i in its low nibble and code i + c / 2 in its high nibble. One 16-byte load then
// widens to 16 float32 lanes (AVX-512) whose low nibbles are 16 consecutive codes and high nibbles the next 16,
// one AND and one shift apart; narrower vectors take the chunk in 8- or 4-byte pieces. PackInt4 writes it.
// The fast int4 path wants group to be a multiple of 32 (or group == k); other groups run a scalar loop.
//
// Rows kernels: x float32 rows [rows, k] (the runtime widens bfloat16 activations once); bias [n_total] or
// null; writes y[m][n] for n in [n0, n1) only, y row-major [rows, n_total]; bfloat16 outputs rounded to
// nearest even. n0 and n1 are free (no alignment), so the caller may split [0, n_total) over threads anyhow.
// The order of summation is the kernel's (tolerance-tested); a NaN weight (e4m3 0x7f / 0xff) makes its
// outputs NaN.
//
// MXFP4 (OCP microscaling FP4, as gpt-oss stores its experts): blocks of 32 weights along k, each 16 bytes of E2M1
// codes and one E8M0 scale byte. Codes: 1 sign, 2 exponent bits, 1 mantissa bit, the 16 values {0, 0.5, 1, 1.5, 2,
// 3, 4, 6} and their negatives (code 8 is -0); two a byte, column 2i of a block in the low nibble of its byte i and
// column 2i + 1 in the high nibble. Scales: 2^(s - 127), applied as torch's ldexp (exact scaling: s = 255, E8M0's
// NaN, is 2^128 there, which makes 0.5 2^127 and 1 infinity).
//   W[n][j] = e2m1(nibble j of blocks[n][j / 32]) * 2^(scales[n][j / 32] - 127)
// k is a multiple of 32. The kernels read x in the codes' order (per block the even columns, then the odd ones),
// permuted once per call, which makes a block's bytes int4's chunk of 32 (low nibbles, then high ones); the codes
// are looked up in a 16-entry table of twice their values (TableLookupLanes on AVX-512's 16 float32 lanes,
// TableLookupBytes elsewhere), the scale applied as one multiply by 2^(s - 128) built from its bits (a float32 for
// every s, where 2^(s - 127) is not for 255): every product is exact (at most 2 significant bits, 2^-128 and up), or
// infinite past float32's range, as torch's ldexp makes it.
//
// DequantizeRows writes rows [n0, n1) of W as float32 or bfloat16 into out [(n1 - n0), k], bit-exact with
// torch: FP8 `w.to(float32) * scale` (one float32 multiply), integers float32(q - z) * float32(s); bfloat16 is
// that float32 value rounded to nearest even. MXFP4: transformers' convert_moe_packed_tensors (the code's value
// times 2^(s - 127) by ldexp in float32, rounded once; every finite value is a bfloat16, -0 kept).

#include <cstdint>

#include "kernels/pointwise.h"  // BFloat16

namespace strata::kernels {

struct Fp8Weights {
  const uint8_t* data = nullptr;  // [n_total, k] float8_e4m3fn bytes
  const float* scale = nullptr;   // [ceil(n_total / block_n), ceil(k / block_k)]
  int64_t block_n = 1;
  int64_t block_k = 1;
  // No byte is a NaN code (0x7f, 0xff; Fp8HasNanCode): the float32 tiles may skip making them NaN, three of the nine
  // vector operations of an e4m3 decode on AVX2 (the results are the same for such data).
  bool nan_free = false;
};

// Whether any of the `bytes` e4m3 codes at `data` is a NaN code (0x7f or 0xff).
bool Fp8HasNanCode(const uint8_t* data, int64_t bytes);

// One MXFP4 matrix [n_total, k] (one expert's projection), rows contiguous.
struct Mxfp4Weights {
  const uint8_t* blocks = nullptr;  // [n_total, k / 32, 16] E2M1 codes, two a byte (low nibble first)
  const uint8_t* scales = nullptr;  // [n_total, k / 32] E8M0 exponents
};

// The dtype of an integer layer's scales, as the checkpoint stores them (a float32 scale at group 32 would
// add a whole bit per weight).
enum class ScaleType : uint8_t { kFloat32, kBFloat16, kFloat16 };

struct IntWeights {
  int bits = 4;                   // 4 or 8
  const uint8_t* data = nullptr;  // int8: [n_total, k]; int4: [n_total, k / 2] in PackInt4's layout
  const void* scale = nullptr;    // [n_total, k / group] of scale_type
  ScaleType scale_type = ScaleType::kFloat32;
  const uint8_t* zero = nullptr;  // [n_total, k / group], or null: symmetric (zero 2^(bits-1))
  int64_t group = 128;            // divides k
};

// Rows kernels (see the top of this file).
void QuantizedLinearRows(const float* x, const Fp8Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1);
void QuantizedLinearRows(const float* x, const Fp8Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1);
void QuantizedLinearRows(const float* x, const IntWeights& w, const float* bias, float* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1);
void QuantizedLinearRows(const float* x, const IntWeights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1);

void QuantizedLinearRows(const float* x, const Mxfp4Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1);
void QuantizedLinearRows(const float* x, const Mxfp4Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1);

// bfloat16 input rows (the runtime's activations as they are): on AVX512_BF16's VDPBF16PS where the CPU has it
// (targets.h's Bf16DotAvailable, and VbmiAvailable for FP8), the codes converted to bfloat16 in registers
// (exact: e4m3 values and int4 codes are bfloat16 numbers) and multiplied 32 pairs an instruction, x permuted
// once per call to the order the codes unpack in. That path takes FP8 with block_k a multiple of 64 and int4
// with group 32, 64 or a multiple of 128 (k at least 64 / 128). Elsewhere one or two rows
// of int4 / int8 codes in groups of a multiple of 32 (k too) run 16-bit integer multiply-adds on SSE4, AVX2
// and AVX-512 (x made int16 with a power-of-two scale per block of 32-128 columns: exact for every x within 2^6
// of its block's largest, the rest rounded at 2^-16 of it; rows holding a NaN or infinity take the float32
// kernels). FP8, other layouts and other CPUs widen the rows to float32 on each call and run the kernels above
// (a caller that splits the work there should widen once and call those).
void QuantizedLinearRows(const BFloat16* x, const Fp8Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1);
void QuantizedLinearRows(const BFloat16* x, const IntWeights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1);
// MXFP4: up to 4 rows on VDPBF16PS where the CPU has AVX512_BF16 (k at least 128; the doubled E2M1 values are
// bfloat16 numbers, a block's scale per 128-bit lane); else x widened to float32 (and permuted) once per call and
// the float32 kernels.
void QuantizedLinearRows(const BFloat16* x, const Mxfp4Weights& w, const BFloat16* bias, BFloat16* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1);

// The layouts whose bfloat16 rows run on VDPBF16PS at any row count up to 32 (FP8 blocks of a multiple of 64 columns,
// int4 groups of 32, 64 or a multiple of 128), and whether this CPU runs them there (Bf16DotAvailable, and
// VbmiAvailable for FP8). Those tiles decode each weight in registers once per 4 input rows; at 5-32 rows they beat
// dequantizing blocks of weight rows into a bfloat16 scratch for the dense tiles (runtime/model/quantized_linear.cc:
// 1.1-1.25x in a 16-stream decode on Zen 4, int4 g32 1.25x), which every other layout takes past 4 rows.
inline bool Fp8DotLayout(const Fp8Weights& w, int64_t k) { return w.block_k % 64 == 0 && k >= 64; }
inline bool Int4DotLayout(const IntWeights& w, int64_t k) {
  return w.bits == 4 && k >= 128 && (w.group % 128 == 0 || w.group == 32 || w.group == 64);
}
bool Bf16DotTiles(const Fp8Weights& w, int64_t k);
bool Bf16DotTiles(const IntWeights& w, int64_t k);

// Weight rows [n0, n1) dequantized into out [(n1 - n0), k] (bit-exact with torch; see the top of this file).
void DequantizeRows(const Fp8Weights& w, int64_t k, int64_t n_total, int64_t n0, int64_t n1, float* out);
void DequantizeRows(const Fp8Weights& w, int64_t k, int64_t n_total, int64_t n0, int64_t n1, BFloat16* out);
void DequantizeRows(const IntWeights& w, int64_t k, int64_t n_total, int64_t n0, int64_t n1, float* out);
void DequantizeRows(const IntWeights& w, int64_t k, int64_t n_total, int64_t n0, int64_t n1, BFloat16* out);
void DequantizeRows(const Mxfp4Weights& w, int64_t k, int64_t n_total, int64_t n0, int64_t n1, float* out);
void DequantizeRows(const Mxfp4Weights& w, int64_t k, int64_t n_total, int64_t n0, int64_t n1, BFloat16* out);

// int4 packing (plain C++): codes [n, k] one code a byte (0..15; k even) -> out [n, k / 2] in the layout above.
void PackInt4(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out);
// The code at row n_idx, column k_idx of a packed [*, k] int4 matrix.
uint8_t Int4Code(const uint8_t* packed, int64_t k, int64_t n_idx, int64_t k_idx);

// Scalar conversions the runtime and the tests share: e4m3fn and float16 bits to float32 (exact; NaN kept); an
// E2M1 code (4 bits) to its value (code 8: -0.0).
float Fp8E4m3ToFloat(uint8_t bits);
float Float16ToFloat(uint16_t bits);
float E2m1ToFloat(uint8_t code);

}  // namespace strata::kernels
