#include "runtime/model/quantized_linear.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/linear.h"
#include "kernels/quantized.h"
#include "kernels/targets.h"
#include "runtime/model/linear.h"
#include "runtime/model/parallel.h"
#include "runtime/model/weights.h"

namespace strata::runtime {

using checkpoint::DType;
using checkpoint::TensorView;

using planner::QuantLayout;

int64_t PackedLinear::bytes() const {
  int64_t total = 0;
  for (const at::Tensor* t : {&data, &scale, &zero, &perm}) {
    if (t->defined()) total += static_cast<int64_t>(t->nbytes());
  }
  return total;
}

PackedLinear PackedLinear::To(at::Device device, bool non_blocking) const {
  PackedLinear out = *this;
  for (at::Tensor* t : {&out.data, &out.scale, &out.zero, &out.perm}) {
    if (t->defined()) *t = t->to(device, /*non_blocking=*/non_blocking, /*copy=*/false);
  }
  return out;
}

PackedLinear PackedLinear::Pinned() const {
  PackedLinear out = *this;
  for (at::Tensor* t : {&out.data, &out.scale, &out.zero, &out.perm}) {
    if (t->defined()) *t = t->pin_memory();
  }
  return out;
}

PackedLinear PackedRows(const PackedLinear& w, int64_t n0, int64_t rows) {
  TORCH_CHECK(n0 >= 0 && rows >= 0 && n0 + rows <= w.out_features, "PackedRows: rows [", n0, ", ", n0 + rows,
              ") of a weight of ", w.out_features);
  PackedLinear out = w;
  out.out_features = rows;
  out.data = w.data.narrow(0, n0, rows);
  if (w.kind == PackedLinear::Kind::kFp8) {
    TORCH_CHECK(n0 % w.block_n == 0 && (rows % w.block_n == 0 || n0 + rows == w.out_features), "PackedRows: rows [", n0,
                ", ", n0 + rows, ") do not start and end on the FP8 scale blocks of ", w.block_n, " rows");
    out.scale = w.scale.narrow(0, n0 / w.block_n, (rows + w.block_n - 1) / w.block_n);
  } else {
    out.scale = w.scale.narrow(0, n0, rows);
    if (w.zero.defined()) out.zero = w.zero.narrow(0, n0, rows);
  }
  return out;
}

namespace {

// Input rows up to which the kernels decode packed codes in registers (see LinearPacked).
constexpr int64_t kPackedRows = 4;

kernels::ScaleType KernelScaleType(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return kernels::ScaleType::kBFloat16;
    case at::kHalf:
      return kernels::ScaleType::kFloat16;
    default:
      return kernels::ScaleType::kFloat32;
  }
}

kernels::Fp8Weights Fp8Of(const PackedLinear& w) {
  return {w.data.data_ptr<uint8_t>(), w.scale.data_ptr<float>(), w.block_n, w.block_k, w.fp8_nan_free};
}

kernels::Mxfp4Weights Mxfp4Of(const PackedLinear& w) {
  return {w.data.data_ptr<uint8_t>(), w.scale.data_ptr<uint8_t>()};
}

kernels::IntWeights IntOf(const PackedLinear& w) {
  return {w.bits(),
          w.data.data_ptr<uint8_t>(),
          w.scale.data_ptr(),
          KernelScaleType(w.scale.scalar_type()),
          w.zero.defined() ? w.zero.data_ptr<uint8_t>() : nullptr,
          w.group};
}

// The integer codes of rows [n0, n1) as one byte each [rows, K], on the weight's device (ATen ops): int4 rows
// are chunks of 32 codes (the last one k % 32), byte i of a chunk of c holding code i low and i + c / 2 high.
at::Tensor IntCodes(const PackedLinear& w, int64_t n0, int64_t n1) {
  const at::Tensor rows = w.data.narrow(0, n0, n1 - n0);
  if (w.kind == PackedLinear::Kind::kInt8) return rows;
  const int64_t k = w.in_features;
  const int64_t full = k / 32 * 16;  // bytes of the whole chunks
  std::vector<at::Tensor> parts;
  if (full > 0) {
    const at::Tensor chunks = rows.narrow(1, 0, full).reshape({rows.size(0), k / 32, 16});
    parts.push_back(at::cat({chunks.bitwise_and(15), chunks.bitwise_right_shift(4)}, 2).reshape({rows.size(0), -1}));
  }
  if (k % 32 != 0) {
    const at::Tensor tail = rows.narrow(1, full, (k % 32) / 2);
    parts.push_back(at::cat({tail.bitwise_and(15), tail.bitwise_right_shift(4)}, 1));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 1);
}

// MXFP4 rows [n0, n1) as transformers' convert_moe_packed_tensors computes them: each code's E2M1 value (a table
// indexed by the nibble, -0 for code 8) times 2^(s - 127) by torch's ldexp in float32, rounded once to `dtype`. The
// table is made on the weight's device from the codes 0-15 (no host copy) and holds twice the values; the
// multiplier is 2^(s - 128) from its float32 bits ((s - 1) << 23; s = 0 and 1 subnormal), a float32 for every s
// (255 too, where 2^(s - 127) is not): the same real products as ldexp's exact scaling, hence its roundings.
at::Tensor DequantizeMxfp4WithAten(const PackedLinear& w, at::ScalarType dtype, int64_t n0, int64_t n1) {
  const int64_t rows = n1 - n0;
  const int64_t blocks = w.in_features / 32;
  const at::Tensor bytes = w.data.narrow(0, n0, rows).reshape({rows, blocks, 16});
  const at::TensorOptions ints = at::TensorOptions().dtype(at::kInt).device(w.data.device());
  const at::Tensor code = at::arange(16, ints);
  const at::Tensor magnitude = code.bitwise_and(7);
  const at::Tensor exponent = magnitude.bitwise_right_shift(1);
  const at::Tensor mantissa = magnitude.bitwise_and(1).to(at::kFloat);
  // Twice the value: exponent 0 holds 0 or 1 (0.5, subnormal); else (1 + m / 2) * 2^exponent.
  const at::Tensor value = at::where(exponent.eq(0), mantissa,
                                     (mantissa * 0.5 + 1.0) * at::ones_like(exponent).bitwise_left_shift(exponent));
  const at::Tensor table = at::where(code.bitwise_and(8).ne(0), -value, value);
  const at::Tensor low = table.index_select(0, bytes.bitwise_and(15).flatten().to(at::kLong));
  const at::Tensor high = table.index_select(0, bytes.bitwise_right_shift(4).flatten().to(at::kLong));
  const at::Tensor codes = at::stack({low.view({rows, blocks, 16}), high.view({rows, blocks, 16})}, -1);
  const at::Tensor s = w.scale.narrow(0, n0, rows).to(at::kInt);
  const at::Tensor multiplier =
      at::where(s.lt(2), (s + 1).bitwise_left_shift(21), (s - 1).bitwise_left_shift(23)).view(at::kFloat);
  return (codes.view({rows, blocks, 32}) * multiplier.unsqueeze(-1)).view({rows, w.in_features}).to(dtype);
}

}  // namespace

namespace {

// The products of Dequantize, unrounded (float32), or rounded once to bfloat16 when `dtype` is bfloat16.
at::Tensor DequantizedProducts(const PackedLinear& w, at::ScalarType dtype, int64_t n0, int64_t n1);

}  // namespace

at::Tensor Dequantize(const PackedLinear& w, at::ScalarType dtype, int64_t n0, int64_t n1) {
  if (n1 < 0) n1 = w.out_features;
  // The integer formats' references multiply in the scales' dtype (compressed-tensors' dequantize, AWQ's and
  // GPTQ's (q - z) * s in float16): the float32 product of a small integer and a 16-bit scale is exact, so
  // rounding it to the scales' dtype first gives their values; then to `dtype`.
  // FP8 and MXFP4 (whose scales are exponents) multiply in float32.
  const bool integer = w.kind == PackedLinear::Kind::kInt4 || w.kind == PackedLinear::Kind::kInt8;
  const at::ScalarType scale_dtype = integer ? w.scale.scalar_type() : at::kFloat;
  if (scale_dtype != at::kFloat && scale_dtype != dtype) {
    return DequantizedProducts(w, at::kFloat, n0, n1).to(scale_dtype).to(dtype);
  }
  return DequantizedProducts(w, dtype, n0, n1);
}

namespace {

at::Tensor DequantizedProducts(const PackedLinear& w, at::ScalarType dtype, int64_t n0, int64_t n1) {
  const int64_t rows = n1 - n0;
  const int64_t k = w.in_features;
  if (w.data.device().is_cpu() && w.data.is_contiguous() && w.scale.is_contiguous()) {
    // The kernels' dequantizer: the same float32 products as the ATen expressions below, in one pass.
    at::Tensor out =
        at::empty({rows, k}, at::TensorOptions().dtype(dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat));
    if (dtype == at::kBFloat16) {
      auto* y = reinterpret_cast<kernels::BFloat16*>(out.data_ptr());
      if (w.kind == PackedLinear::Kind::kFp8) {
        kernels::DequantizeRows(Fp8Of(w), k, w.out_features, n0, n1, y);
      } else if (w.kind == PackedLinear::Kind::kMxfp4) {
        kernels::DequantizeRows(Mxfp4Of(w), k, w.out_features, n0, n1, y);
      } else {
        kernels::DequantizeRows(IntOf(w), k, w.out_features, n0, n1, y);
      }
      return out;
    }
    float* y = out.data_ptr<float>();
    if (w.kind == PackedLinear::Kind::kFp8) {
      kernels::DequantizeRows(Fp8Of(w), k, w.out_features, n0, n1, y);
    } else if (w.kind == PackedLinear::Kind::kMxfp4) {
      kernels::DequantizeRows(Mxfp4Of(w), k, w.out_features, n0, n1, y);
    } else {
      kernels::DequantizeRows(IntOf(w), k, w.out_features, n0, n1, y);
    }
    return dtype == at::kFloat ? out : out.to(dtype);
  }
  return DequantizeWithAten(w, dtype, n0, n1);
}

}  // namespace

at::Tensor DequantizeWithAten(const PackedLinear& w, at::ScalarType dtype, int64_t n0, int64_t n1) {
  if (n1 < 0) n1 = w.out_features;
  const int64_t rows = n1 - n0;
  const int64_t k = w.in_features;
  if (w.kind == PackedLinear::Kind::kFp8) {
    // transformers' FP8 dequantization: float8 -> float32, times the block's float32 scale, cast once.
    const at::Tensor q = w.data.narrow(0, n0, rows).view(at::kFloat8_e4m3fn).to(at::kFloat);
    const int64_t g0 = n0 / w.block_n;
    const int64_t g1 = (n1 - 1) / w.block_n + 1;
    const at::Tensor s = w.scale.narrow(0, g0, g1 - g0)
                             .repeat_interleave(w.block_n, 0)
                             .narrow(0, n0 - g0 * w.block_n, rows)
                             .repeat_interleave(w.block_k, 1)
                             .narrow(1, 0, k);
    return (q * s).to(dtype);
  }
  if (w.kind == PackedLinear::Kind::kMxfp4) return DequantizeMxfp4WithAten(w, dtype, n0, n1);
  const at::Tensor codes = IntCodes(w, n0, n1).to(at::kFloat);
  const at::Tensor zero = w.zero.defined() ? w.zero.narrow(0, n0, rows).to(at::kFloat)
                                           : at::full({1, 1}, double(1 << (w.bits() - 1)), codes.options());
  const at::Tensor scale = w.scale.narrow(0, n0, rows).to(at::kFloat);
  const int64_t groups = k / w.group;
  const at::Tensor q = (codes.view({rows, groups, w.group}) - zero.view({zero.size(0), -1, 1}));
  const at::Tensor product = (q * scale.view({rows, groups, 1})).view({rows, k});
  return product.to(w.scale.scalar_type()).to(dtype);  // as Dequantize: through the scales' dtype
}

bool ScaledMmEligible(const PackedLinear& w) {
  return w.kind == PackedLinear::Kind::kFp8 && w.block_n == 128 && w.block_k == 128 && w.out_features % 128 == 0 &&
         w.in_features % 128 == 0 && w.scale.scalar_type() == at::kFloat;
}

std::pair<at::Tensor, at::Tensor> QuantizeFp8Activations(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 128 == 0, "QuantizeFp8Activations: x of shape ", x.sizes(),
              " is not [M, K] with K a multiple of 128");
  constexpr double kFp8Max = 448.0;  // float8_e4m3fn's largest finite value
  const int64_t m = x.size(0);
  const int64_t blocks = x.size(1) / 128;
  const at::Tensor groups = x.to(at::kFloat).reshape({m, blocks, 128});
  const at::Tensor scale = groups.abs().amax(-1).clamp_min(1e-10) / kFp8Max;  // [M, K / 128]
  const at::Tensor codes =
      (groups / scale.unsqueeze(-1)).clamp(-kFp8Max, kFp8Max).to(at::kFloat8_e4m3fn).reshape({m, blocks * 128});
  return {codes, scale.t().contiguous().t()};
}

namespace {

// y = x W^T (+ bias) as W8A8: x quantized per row and 128 columns, W's 128 x 128 block scales, one _scaled_mm.
at::Tensor ScaledMmLinear(const at::Tensor& x, const PackedLinear& w, const at::Tensor& bias) {
  const int64_t k = w.in_features;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = w.out_features;
  auto [codes, scale_a] = QuantizeFp8Activations(x.reshape({-1, k}));
  // mat2 [K, N] column-major: the stored [N, K] rows transposed; its scales [K / 128, N / 128] likewise.
  const at::Tensor mat2 = w.data.view(at::kFloat8_e4m3fn).t();
  const at::Tensor scale_b = w.scale.t();
  const at::ScalarType out = x.scalar_type();
  // _scaled_mm adds a bias only in bfloat16 (or float16) out of bfloat16 (float16) bias; others are added after.
  const bool fused_bias = bias.defined() && out != at::kFloat && bias.scalar_type() == out;
  at::Tensor y =
      at::_scaled_mm(codes, mat2, scale_a, scale_b, fused_bias ? std::optional<at::Tensor>(bias) : std::nullopt,
                     std::nullopt, out, /*use_fast_accum=*/false);
  if (bias.defined() && !fused_bias) y = y + bias.to(out);
  return y.view(sizes);
}

}  // namespace

absl::Status ProbeFp8ScaledMm(at::Device device) {
  // Every weight 1.0 (e4m3 0x38) in one 128 x 256 weight, scales 1; x rows of ones: each output is exactly 256,
  // for one row (a decode step) and for 17.
  const c10::DeviceGuard guard(device);
  PackedLinear w;
  w.kind = PackedLinear::Kind::kFp8;
  w.out_features = 128;
  w.in_features = 256;
  w.block_n = w.block_k = 128;
  w.data = at::full({128, 256}, 0x38, at::TensorOptions().dtype(at::kByte).device(device));
  w.scale = at::full({1, 2}, 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
  const std::string where = absl::StrCat("--fp8-matmul scaled_mm: ", device.str(), ": ");
  try {
    for (int64_t rows : {1, 17}) {
      const at::Tensor x = at::full({rows, 256}, 1.0, at::TensorOptions().dtype(at::kBFloat16).device(device));
      const at::Tensor y = ScaledMmLinear(x, w, at::Tensor()).to(at::kCPU, at::kFloat);
      const float* v = y.data_ptr<float>();
      for (int64_t i = 0; i < y.numel(); ++i) {
        if (v[i] != 256.0f) {
          return absl::InternalError(
              absl::StrCat(where, "a W8A8 probe of ones gave ", v[i], " instead of 256 at ", i, " of ", rows, " rows"));
        }
      }
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        "torch cannot run block-scaled _scaled_mm here (cuBLAS has it for compute capability 9.0 from CUDA "
        "12.9; serve without the flag): ",
        e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

bool LinearPackedUsesKernel(const at::Tensor& x, const PackedLinear& w) {
  if (!x.device().is_cpu() || !w.data.device().is_cpu() || !w.data.is_contiguous() || !w.scale.is_contiguous()) {
    return false;
  }
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  const int64_t k = w.in_features;
  return x.numel() > 0 && x.size(-1) == k && x.numel() / k <= kFewRows;
}

at::Tensor LinearPacked(const at::Tensor& x_in, const PackedLinear& w, const at::Tensor& bias) {
  TORCH_CHECK(x_in.size(-1) == w.in_features, "LinearPacked: input of ", x_in.size(-1), " features, weight of ",
              w.in_features);
  // GPTQ act-order: the weight's columns were sorted by group at load; x's follow them.
  const at::Tensor x = w.perm.defined() ? x_in.index_select(-1, w.perm) : x_in;
  if (w.scaled_mm && x.is_cuda() && x.numel() > 0) return ScaledMmLinear(x, w, bias);
  const int64_t k = w.in_features;
  const int64_t n = w.out_features;
  if (!LinearPackedUsesKernel(x, w) || (bias.defined() && bias.scalar_type() != x.scalar_type())) {
    // Blocks of rows dequantized into x's dtype (rounded there as transformers' dequantized weights are), then a
    // GEMM: float32 for float32 x, and for bfloat16 x on a CPU without AVX512_BF16 (where oneDNN's bfloat16 GEMM is
    // slow; the bfloat16-rounded weights widen exactly).
    at::ScalarType gemm = x.scalar_type();
    if (x.device().is_cpu() && gemm == at::kBFloat16 && !kernels::Bf16DotAvailable()) gemm = at::kFloat;
    if (x.device().is_cpu() && gemm != at::kBFloat16) gemm = at::kFloat;
    return LinearOverRowBlocks(
        x, n, [&](int64_t n0, int64_t nb) { return Dequantize(w, x.scalar_type(), n0, n0 + nb); }, gemm,
        bias.defined() ? bias.to(x.scalar_type()) : bias);
  }
  const int64_t rows = x.numel() / k;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n;
  // At least ~64 KiB of packed weights per task, in whole blocks of 12 weight rows (the tiles take 3 or 4).
  const int64_t row_bytes = std::max<int64_t>(1, w.data.nbytes() / std::max<int64_t>(1, n));
  const int64_t grain = (std::max<int64_t>(1, (64 << 10) / row_bytes) + 11) / 12 * 12;
  const bool fp8 = w.kind == PackedLinear::Kind::kFp8;
  const bool mxfp4 = w.kind == PackedLinear::Kind::kMxfp4;
  at::Tensor y = at::empty(sizes, x.options());
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  // bfloat16 rows stay bfloat16 on AVX512_BF16's VDPBF16PS, and for one or two rows of int codes in groups of
  // a multiple of 32 (the kernels' 16-bit integer path on other CPUs); elsewhere they are widened once, here.
  // MXFP4's bfloat16 rows only on VDPBF16PS (its other kernels read float32 rows: widened here, once).
  const bool bf16_dot =
      x.scalar_type() == at::kBFloat16 &&
      (mxfp4 ? kernels::Bf16DotAvailable()
             : kernels::Bf16DotAvailable() || (!fp8 && rows <= 2 && w.group % 32 == 0 && k % 32 == 0));
  const at::Tensor xc = bf16_dot || x.scalar_type() == at::kFloat ? x.contiguous() : x.to(at::kFloat).contiguous();
  // Past kPackedRows rows, decoding the codes in registers for every row tile costs more than it saves (the kernels
  // turn compute-bound: strata_quantized_bench, 16-32 rows at 0.5-1.2x bfloat16): each task dequantizes a few
  // L2-sized blocks of its weight rows (into bfloat16, or float32 for float32 x) and runs the dense tiles on them.
  // Except for the layouts whose bfloat16 rows have VDPBF16PS tiles (kernels::Bf16DotTiles), which decode each
  // weight once per 4 rows in registers, cheaper than the dequantizer's scaled and rounded store and the dense
  // tiles' read of it.
  const bool dot_tiles =
      bf16_dot && (fp8 ? kernels::Bf16DotTiles(Fp8Of(w), k) : !mxfp4 && kernels::Bf16DotTiles(IntOf(w), k));
  const bool via_blocks = rows > kPackedRows && !dot_tiles;
  auto run = [&](const auto* xs, const auto* bs, auto* ys, auto scratch_type) {
    using S = decltype(scratch_type);
    ParallelRows(n, grain, [&](int64_t n0, int64_t n1) {
      if (!via_blocks) {
        if (fp8) {
          kernels::QuantizedLinearRows(xs, Fp8Of(w), bs, ys, rows, k, n, n0, n1);
        } else if (mxfp4) {
          kernels::QuantizedLinearRows(xs, Mxfp4Of(w), bs, ys, rows, k, n, n0, n1);
        } else {
          kernels::QuantizedLinearRows(xs, IntOf(w), bs, ys, rows, k, n, n0, n1);
        }
        return;
      }
      const int64_t block = std::clamp<int64_t>((256 << 10) / (k * int64_t{sizeof(S)}), 4, 64);
      // One scratch per thread, grown and never cleared: DequantizeRows writes every element the tiles read (a
      // value-initialised vector per task was 12% of a 16-stream int4 decode, a 2-byte store loop).
      thread_local std::vector<S> scratch;
      const size_t need = static_cast<size_t>(std::min(block, n1 - n0) * k);
      if (scratch.size() < need) scratch.resize(need);
      for (int64_t s0 = n0; s0 < n1; s0 += block) {
        const int64_t s1 = std::min(n1, s0 + block);
        if (fp8) {
          kernels::DequantizeRows(Fp8Of(w), k, n, s0, s1, scratch.data());
        } else if (mxfp4) {
          kernels::DequantizeRows(Mxfp4Of(w), k, n, s0, s1, scratch.data());
        } else {
          kernels::DequantizeRows(IntOf(w), k, n, s0, s1, scratch.data());
        }
        // The block's rows as a weight of their own: output columns [s0, s1) of y, whose rows stay n apart.
        kernels::LinearRows(xs, scratch.data(), bs != nullptr ? bs + s0 : nullptr, ys + s0, rows, k, n, 0, s1 - s0);
      }
    });
  };
  if (x.scalar_type() == at::kFloat) {
    run(xc.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), float{});
    return y;
  }
  const auto* bs = b.defined() ? reinterpret_cast<const kernels::BFloat16*>(b.data_ptr()) : nullptr;
  auto* ys = reinterpret_cast<kernels::BFloat16*>(y.data_ptr());
  if (bf16_dot) {
    run(reinterpret_cast<const kernels::BFloat16*>(xc.data_ptr()), bs, ys, kernels::BFloat16{});
  } else {
    run(xc.data_ptr<float>(), bs, ys, kernels::BFloat16{});
  }
  return y;
}

// --- Loading ---------------------------------------------------------------------------------------------

namespace {

std::string Shape(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

absl::Status TensorError(const std::string& name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", name, " ", what));
}

// The stored tensor `name`, checked: present, one of `dtypes`, of `shape`.
absl::StatusOr<const TensorView*> Stored(const checkpoint::Checkpoint& checkpoint, const std::string& name,
                                         std::initializer_list<DType> dtypes, const std::vector<int64_t>& shape) {
  const TensorView* view = checkpoint.Find(name);
  if (view == nullptr) return TensorError(name, "is missing (a quantized layer's tensor)");
  if (std::find(dtypes.begin(), dtypes.end(), view->dtype) == dtypes.end()) {
    std::vector<std::string> names;
    for (DType d : dtypes) names.emplace_back(checkpoint::DTypeName(d));
    return TensorError(name, absl::StrCat("has dtype ", std::string(checkpoint::DTypeName(view->dtype)), ", expected ",
                                          absl::StrJoin(names, " or ")));
  }
  if (view->shape != shape) {
    return TensorError(name, absl::StrCat("has shape ", Shape(view->shape), ", expected ", Shape(shape)));
  }
  return view;
}

// A CPU tensor over the mapped bytes (no copy; never written), or a copy when the file misaligns them.
at::Tensor Mapped(const TensorView& view, at::ScalarType dtype) {
  auto keep_alive = view.file;
  if (reinterpret_cast<uintptr_t>(view.data()) % at::elementSize(dtype) != 0) {
    at::Tensor copy = at::empty(view.shape, at::TensorOptions().dtype(dtype));
    std::memcpy(copy.data_ptr(), view.data(), view.bytes);
    return copy;
  }
  return at::from_blob(
      const_cast<std::byte*>(view.data()), view.shape, [keep_alive](void*) {},
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

// Scales in float32, checked finite: an error names the tensor and the first bad block.
absl::StatusOr<at::Tensor> FiniteScales(const TensorView& view, at::ScalarType stored, bool ue8m0) {
  at::Tensor s;
  if (stored == at::kByte) {  // ue8m0 exponents: 2^(e - 127); 255 is E8M0's NaN
    const at::Tensor e = Mapped(view, at::kByte);
    s = at::empty(e.sizes(), at::TensorOptions().dtype(at::kFloat));
    const uint8_t* in = e.data_ptr<uint8_t>();
    float* out = s.data_ptr<float>();
    for (int64_t i = 0; i < e.numel(); ++i) {
      if (in[i] == 255) return TensorError(view.name, absl::StrCat("holds the ue8m0 NaN (255) at element ", i));
      out[i] = std::ldexp(1.0f, int{in[i]} - 127);
    }
    return s;
  }
  s = Mapped(view, stored).to(at::kFloat).contiguous();
  if (s.data_ptr() == view.data()) s = s.clone();  // own the bytes (the scales are small)
  const float* p = s.data_ptr<float>();
  // A finite scale can still make the weights infinite: 448 (e4m3's largest code) times it must be a
  // bfloat16, the widest dtype strata serves in, or every request would fail with logits not finite.
  constexpr float kLargestScale = 3.3895314e38f / 448.0f;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (!std::isfinite(p[i])) {
      return TensorError(view.name, absl::StrCat("holds a non-finite scale (", p[i], ") at element ", i));
    }
    if (std::fabs(p[i]) > kLargestScale) {
      return TensorError(view.name, absl::StrCat("holds the scale ", p[i], " at element ", i,
                                                 ": times 448 (the largest e4m3 code) it overflows bfloat16"));
    }
    if (ue8m0 && p[i] > 0 && std::exp2(std::round(std::log2(p[i]))) != p[i]) {
      return TensorError(view.name, absl::StrCat("holds ", p[i], " at element ", i,
                                                 ", not a power of two (quantization_config.scale_fmt is ue8m0)"));
    }
  }
  return s;
}

// float8_e4m3fn has no infinity; its NaN is S.1111.111 (0x7f, 0xff). A weight that holds one makes every
// logit NaN: refused at load with the count and the first, 8 bytes at a time.
absl::Status CheckNoFp8NaN(const TensorView& view) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(view.data());
  const size_t size = view.bytes;
  auto is_nan = [](uint8_t b) { return (b & 0x7f) == 0x7f; };
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHigh = 0x8080808080808080ULL;
  size_t count = 0;
  size_t first = size;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    const uint64_t y = (word & kLow7) ^ kLow7;  // a byte is zero where its low seven bits are all ones
    if (((y - kOnes) & ~y & kHigh) == 0) continue;
    for (size_t j = i; j < i + 8; ++j) {
      if (is_nan(bytes[j])) {
        first = std::min(first, j);
        ++count;
      }
    }
  }
  for (; i < size; ++i) {
    if (is_nan(bytes[i])) {
      first = std::min(first, i);
      ++count;
    }
  }
  if (count == 0) return absl::OkStatus();
  return TensorError(view.name, absl::StrCat("holds ", count, " float8_e4m3fn NaN byte", count == 1 ? "" : "s",
                                             " (0x7f or 0xff), the first at element ", first));
}

absl::StatusOr<PackedLinear> LoadFp8(const checkpoint::Checkpoint& checkpoint, const planner::QuantizedLinear& q) {
  const int64_t n = q.out_features;
  const int64_t k = q.in_features;
  if (q.block_n <= 0 || q.block_k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized layer ", q.module, ": FP8 blocks of ", q.block_n, " x ", q.block_k));
  }
  absl::StatusOr<const TensorView*> weight = Stored(checkpoint, q.weight, {DType::kFloat8E4M3}, {n, k});
  if (!weight.ok()) return weight.status();
  if (absl::Status nan = CheckNoFp8NaN(**weight); !nan.ok()) return nan;
  const std::vector<int64_t> grid = {(n + q.block_n - 1) / q.block_n, (k + q.block_k - 1) / q.block_k};
  // compressed-tensors' per-tensor FP8 scale is stored as [1] (or a scalar) for the grid of one block.
  const TensorView* scale_view = checkpoint.Find(q.scale);
  const bool one_block = grid[0] == 1 && grid[1] == 1 && scale_view != nullptr &&
                         (scale_view->shape.empty() || scale_view->shape == std::vector<int64_t>{1});
  absl::StatusOr<const TensorView*> scale =
      Stored(checkpoint, q.scale, {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kUInt8},
             one_block ? scale_view->shape : grid);
  if (!scale.ok()) return scale.status();
  if ((*scale)->dtype == DType::kUInt8 && !q.scale_ue8m0) {
    return TensorError(q.scale, "has dtype uint8, which only ue8m0 scales (quantization_config.scale_fmt) may have");
  }
  absl::StatusOr<at::Tensor> s = FiniteScales(**scale, ToScalarType((*scale)->dtype), q.scale_ue8m0);
  if (!s.ok()) return s.status();
  PackedLinear out;
  out.kind = PackedLinear::Kind::kFp8;
  out.out_features = n;
  out.in_features = k;
  out.block_n = q.block_n;
  out.block_k = q.block_k;
  out.data = Mapped(**weight, at::kByte);  // e4m3 bytes as the kernels read them
  out.scale = s->reshape(grid).contiguous();
  return out;
}

// --- Integer layouts: codes unpacked one a byte [N, K], then packed in the kernels' form ---------------------

// An int32 tensor's words, read in place.
const uint32_t* Words(const TensorView& view) { return reinterpret_cast<const uint32_t*>(view.data()); }

// Scales [N, groups] in their stored dtype, checked finite; `transposed` reads a [groups, N] tensor (AWQ, GPTQ).
absl::StatusOr<at::Tensor> IntScales(const TensorView& view, bool transposed) {
  at::Tensor s = Mapped(view, ToScalarType(view.dtype));
  const at::Tensor finite = at::isfinite(s.to(at::kFloat));
  if (!finite.all().item<bool>()) {
    // The element's place in the stored tensor, as a reader of the file counts it.
    const int64_t i = (finite.logical_not().flatten().nonzero()[0][0]).item<int64_t>();
    return TensorError(view.name, absl::StrCat("holds a non-finite scale at element ", i));
  }
  if (transposed) s = s.t();
  s = s.contiguous();
  if (s.data_ptr() == view.data()) s = s.clone();
  return s;
}

// Zero points [n, groups] as one byte each; `code(r, g)` reads row r's zero of group g from the layout's words.
template <typename Code>
at::Tensor ZeroPoints(int64_t n, int64_t groups, Code code) {
  at::Tensor zero = at::empty({n, groups}, at::TensorOptions().dtype(at::kByte));
  uint8_t* zs = zero.data_ptr<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) zs[r * groups + g] = code(r, g);
  }
  return zero;
}

// Codes [n, k] as one byte each, unpacked in parallel over the rows; `code(r, j)` reads row r's code of column j
// from the layout's words.
template <typename Code>
at::Tensor Codes(int64_t n, int64_t k, Code code) {
  at::Tensor codes = MappedEmpty({n, k}, at::kByte);
  uint8_t* c = codes.data_ptr<uint8_t>();
  at::parallel_for(0, n, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < k; ++j) c[r * k + j] = code(r, j);
    }
  });
  return codes;
}

// What an integer layout unpacks into: codes one a byte [N, K], zero points [N, groups] (undefined where the
// layout stores none), scales [N, groups] in their stored dtype, and GPTQ's act-order permutation of the columns
// (undefined where the columns are in order).
struct UnpackedInt {
  at::Tensor codes;
  at::Tensor zero;
  at::Tensor scale;
  at::Tensor perm;
};

// A layer's sizes as every integer layout reads them (LoadInt has checked them): N, K, the group and the groups
// per row, and the codes per 32-bit word with the mask of one.
struct IntGeometry {
  int64_t n = 0;
  int64_t k = 0;
  int64_t group = 0;
  int64_t groups = 0;
  int bits = 0;
  int per_word = 0;
  uint32_t mask = 0;
};

// The stored scales `name` of `shape` in a float dtype, checked finite (IntScales).
absl::StatusOr<at::Tensor> StoredIntScales(const checkpoint::Checkpoint& checkpoint, const std::string& name,
                                           std::vector<int64_t> shape, bool transposed) {
  absl::StatusOr<const TensorView*> v =
      Stored(checkpoint, name, {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, shape);
  if (!v.ok()) return v.status();
  return IntScales(**v, transposed);
}

// compressed-tensors' weight_shape [2], where stored: it must name the layer's [N, K].
absl::Status CheckWeightShape(const checkpoint::Checkpoint& checkpoint, const planner::QuantizedLinear& q, int64_t n,
                              int64_t k) {
  absl::StatusOr<const TensorView*> shape = Stored(checkpoint, q.shape, {DType::kInt64, DType::kInt32}, {2});
  if (!shape.ok()) return shape.status();
  const bool wide = (*shape)->dtype == DType::kInt64;
  const int64_t s0 = wide ? reinterpret_cast<const int64_t*>((*shape)->data())[0]
                          : reinterpret_cast<const int32_t*>((*shape)->data())[0];
  const int64_t s1 = wide ? reinterpret_cast<const int64_t*>((*shape)->data())[1]
                          : reinterpret_cast<const int32_t*>((*shape)->data())[1];
  if (s0 != n || s1 != k) {
    return TensorError(q.shape, absl::StrCat("says [", s0, ", ", s1, "], the layer is [", n, ", ", k, "]"));
  }
  return absl::OkStatus();
}

// compressed-tensors' pack-quantized layout.
absl::StatusOr<UnpackedInt> UnpackCompressed(const checkpoint::Checkpoint& checkpoint,
                                             const planner::QuantizedLinear& q, const IntGeometry& geo) {
  const int64_t n = geo.n, k = geo.k, groups = geo.groups;
  const int bits = geo.bits, per_word = geo.per_word;
  const uint32_t mask = geo.mask;
  // weight_packed [N, ceil(K * bits / 32)]: code j of a row at bit j * bits of the row's words (the stored
  // values carry compressed-tensors' +2^(bits-1) offset, so they are the unsigned codes).
  const int64_t words = (k * bits + 31) / 32;
  absl::StatusOr<const TensorView*> w = Stored(checkpoint, q.weight, {DType::kInt32}, {n, words});
  if (!w.ok()) return w.status();
  const uint32_t* p = Words(**w);
  UnpackedInt out;
  out.codes = Codes(n, k, [&](int64_t r, int64_t j) -> uint8_t {
    return (p[r * words + j / per_word] >> (bits * (j % per_word))) & mask;
  });
  absl::StatusOr<at::Tensor> scale = StoredIntScales(checkpoint, q.scale, {n, groups}, false);
  if (!scale.ok()) return scale.status();
  out.scale = *std::move(scale);
  if (!q.shape.empty()) {
    if (absl::Status s = CheckWeightShape(checkpoint, q, n, k); !s.ok()) return s;
  }
  if (!q.symmetric) {
    // weight_zero_point [ceil(N * bits / 32), groups], packed along the output rows, offset like the codes.
    const int64_t zwords = (n * bits + 31) / 32;
    absl::StatusOr<const TensorView*> z = Stored(checkpoint, q.zero_point, {DType::kInt32}, {zwords, groups});
    if (!z.ok()) return z.status();
    const uint32_t* zp = Words(**z);
    out.zero = ZeroPoints(n, groups, [&](int64_t r, int64_t g) -> uint8_t {
      return (zp[(r / per_word) * groups + g] >> (bits * (r % per_word))) & mask;
    });
  }
  return out;
}

// AutoAWQ's GEMM layout.
absl::StatusOr<UnpackedInt> UnpackAwq(const checkpoint::Checkpoint& checkpoint, const planner::QuantizedLinear& q,
                                      const IntGeometry& geo) {
  const int64_t n = geo.n, k = geo.k, groups = geo.groups;
  // qweight [K, N / 8]: nibble i of word (k, c) holds column 8c + AWQ's order[i] (0, 2, 4, 6, 1, 3, 5, 7);
  // qzeros [groups, N / 8] the same; scales [groups, N]. No offsets: W = (q - z) * s.
  constexpr int kNibbleOf[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column c % 8 -> its nibble
  absl::StatusOr<const TensorView*> w = Stored(checkpoint, q.weight, {DType::kInt32}, {k, n / 8});
  if (!w.ok()) return w.status();
  const uint32_t* p = Words(**w);
  UnpackedInt out;
  out.codes = Codes(
      n, k, [&](int64_t r, int64_t j) -> uint8_t { return (p[j * (n / 8) + r / 8] >> (4 * kNibbleOf[r % 8])) & 15; });
  absl::StatusOr<const TensorView*> z = Stored(checkpoint, q.zero_point, {DType::kInt32}, {groups, n / 8});
  if (!z.ok()) return z.status();
  const uint32_t* zp = Words(**z);
  out.zero = ZeroPoints(n, groups, [&](int64_t r, int64_t g) -> uint8_t {
    return (zp[g * (n / 8) + r / 8] >> (4 * kNibbleOf[r % 8])) & 15;
  });
  absl::StatusOr<at::Tensor> scale = StoredIntScales(checkpoint, q.scale, {groups, n}, true);
  if (!scale.ok()) return scale.status();
  out.scale = *std::move(scale);
  return out;
}

// GPTQ's g_idx [K], the group of each column: checked, and where the columns are not in group order
// (act-order), the codes' columns sorted by group (stable), so that each group is contiguous; x follows them
// through `perm`.
absl::Status ApplyActOrder(const checkpoint::Checkpoint& checkpoint, const planner::QuantizedLinear& q,
                           const IntGeometry& geo, UnpackedInt& out) {
  const int64_t n = geo.n, k = geo.k, group = geo.group, groups = geo.groups;
  absl::StatusOr<const TensorView*> gi = Stored(checkpoint, q.g_idx, {DType::kInt32}, {k});
  if (!gi.ok()) return gi.status();
  const int32_t* g = reinterpret_cast<const int32_t*>((*gi)->data());
  bool in_order = true;
  std::vector<int64_t> count(groups, 0);
  for (int64_t j = 0; j < k; ++j) {
    if (g[j] < 0 || g[j] >= groups) {
      return TensorError(q.g_idx, absl::StrCat("names group ", g[j], " for column ", j, " of ", groups));
    }
    in_order = in_order && g[j] == j / group;
    ++count[g[j]];
  }
  if (in_order) return absl::OkStatus();
  for (int64_t i = 0; i < groups; ++i) {
    if (count[i] != group) {
      return TensorError(q.g_idx, absl::StrCat("gives group ", i, " ", count[i], " columns, not ", group));
    }
  }
  std::vector<int64_t> order(k);
  for (int64_t j = 0; j < k; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return g[a] < g[b]; });
  out.perm = at::empty({k}, at::TensorOptions().dtype(at::kLong));
  std::copy(order.begin(), order.end(), out.perm.data_ptr<int64_t>());
  at::Tensor sorted = MappedEmpty({n, k}, at::kByte);
  at::index_select_out(sorted, out.codes, 1, out.perm);
  out.codes = sorted;
  return absl::OkStatus();
}

// AutoGPTQ's v1 layout.
absl::StatusOr<UnpackedInt> UnpackGptq(const checkpoint::Checkpoint& checkpoint, const planner::QuantizedLinear& q,
                                       const IntGeometry& geo) {
  const int64_t n = geo.n, k = geo.k, groups = geo.groups;
  const int bits = geo.bits, per_word = geo.per_word;
  const uint32_t mask = geo.mask;
  // qweight [K * bits / 32, N] packed along K: code of (k, n) at bit bits * (k % per_word) of word (k / per_word,
  // n); qzeros [groups, N * bits / 32] packed along N, stored minus one (v1); scales [groups, N]; g_idx [K].
  absl::StatusOr<const TensorView*> w = Stored(checkpoint, q.weight, {DType::kInt32}, {k / per_word, n});
  if (!w.ok()) return w.status();
  const uint32_t* p = Words(**w);
  UnpackedInt out;
  out.codes = Codes(n, k, [&](int64_t r, int64_t j) -> uint8_t {
    return (p[(j / per_word) * n + r] >> (bits * (j % per_word))) & mask;
  });
  absl::StatusOr<const TensorView*> z = Stored(checkpoint, q.zero_point, {DType::kInt32}, {groups, n / per_word});
  if (!z.ok()) return z.status();
  const uint32_t* zp = Words(**z);
  out.zero = ZeroPoints(n, groups, [&](int64_t r, int64_t g) -> uint8_t {
    return ((zp[g * (n / per_word) + r / per_word] >> (bits * (r % per_word))) & mask) + 1;
  });
  absl::StatusOr<at::Tensor> scale = StoredIntScales(checkpoint, q.scale, {groups, n}, true);
  if (!scale.ok()) return scale.status();
  out.scale = *std::move(scale);
  if (!q.g_idx.empty()) {
    if (absl::Status s = ApplyActOrder(checkpoint, q, geo, out); !s.ok()) return s;
  }
  return out;
}

absl::StatusOr<PackedLinear> LoadInt(const checkpoint::Checkpoint& checkpoint, const planner::QuantizedLinear& q) {
  const int64_t n = q.out_features;
  const int64_t k = q.in_features;
  const int bits = q.bits;
  const int64_t group = q.group_size;
  auto layer_error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("quantized layer ", q.module, ": ", what));
  };
  if (bits != 4 && bits != 8) return layer_error(absl::StrCat(bits, "-bit weights (4 and 8 are supported)"));
  if (group <= 0 || k % group != 0) return layer_error(absl::StrCat("group size ", group, " does not divide ", k));
  if (k % (32 / bits) != 0 || (q.layout != QuantLayout::kCompressedPacked && n % (32 / bits) != 0)) {
    return layer_error(absl::StrCat("[", n, ", ", k, "] does not pack whole 32-bit words of ", bits, "-bit codes"));
  }
  const IntGeometry geo{.n = n,
                        .k = k,
                        .group = group,
                        .groups = k / group,
                        .bits = bits,
                        .per_word = 32 / bits,
                        .mask = (1u << bits) - 1};
  absl::StatusOr<UnpackedInt> unpacked;
  switch (q.layout) {
    case QuantLayout::kCompressedPacked:
      unpacked = UnpackCompressed(checkpoint, q, geo);
      break;
    case QuantLayout::kAwqGemm:
      unpacked = UnpackAwq(checkpoint, q, geo);
      break;
    case QuantLayout::kGptqV1:
      unpacked = UnpackGptq(checkpoint, q, geo);
      break;
    case QuantLayout::kFp8Block:
      return layer_error("not an integer layout");
  }
  if (!unpacked.ok()) return unpacked.status();
  const at::Tensor& zero = unpacked->zero;
  PackedLinear out;
  out.kind = bits == 4 ? PackedLinear::Kind::kInt4 : PackedLinear::Kind::kInt8;
  out.out_features = n;
  out.in_features = k;
  out.group = group;
  out.scale = unpacked->scale;
  // Symmetric layouts that store their zero points anyway (GPTQ's, sym=True: 7 + 1) take the kernels' fast path.
  const bool all_mid = zero.defined() && zero.eq(1 << (bits - 1)).all().item<bool>();
  out.zero = all_mid ? at::Tensor() : zero;
  out.perm = unpacked->perm;
  if (bits == 8) {
    out.data = unpacked->codes;
  } else {
    out.data = MappedEmpty({n, k / 2}, at::kByte);
    kernels::PackInt4(unpacked->codes.data_ptr<uint8_t>(), n, k, out.data.data_ptr<uint8_t>());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<PackedLinear>> LoadMxfp4Experts(const checkpoint::Checkpoint& checkpoint,
                                                           const std::string& prefix, int64_t experts, int64_t n,
                                                           int64_t k, int64_t row0, int64_t step, at::Device device) {
  const std::string blocks_name = prefix + "_blocks", scales_name = prefix + "_scales";
  absl::StatusOr<const TensorView*> blocks = Stored(checkpoint, blocks_name, {DType::kUInt8}, {experts, n, k / 32, 16});
  if (!blocks.ok()) return blocks.status();
  absl::StatusOr<const TensorView*> scales = Stored(checkpoint, scales_name, {DType::kUInt8}, {experts, n, k / 32});
  if (!scales.ok()) return scales.status();
  const at::Tensor all_blocks = Mapped(**blocks, at::kByte), all_scales = Mapped(**scales, at::kByte);
  std::vector<PackedLinear> out;
  for (int64_t e = 0; e < experts; ++e) {
    const at::Tensor b = all_blocks.select(0, e).slice(0, row0, n, step).contiguous();
    const at::Tensor s = all_scales.select(0, e).slice(0, row0, n, step).contiguous();
    absl::StatusOr<PackedLinear> w = Mxfp4Linear(b, s, absl::StrCat(blocks_name, "[", e, "]"));
    if (!w.ok()) return w.status();
    out.push_back(device.is_cpu() ? *std::move(w) : w->To(device, /*non_blocking=*/false));
  }
  return out;
}

absl::StatusOr<PackedLinear> Mxfp4Linear(const at::Tensor& blocks, const at::Tensor& scales, std::string_view name) {
  const std::string tensor(name);  // std::string_view is not Abseil's here
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", tensor, " (MXFP4) ", what));
  };
  auto shape = [](const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); };
  if (!blocks.defined() || !scales.defined()) return error("has no blocks or no scales");
  if (blocks.scalar_type() != at::kByte) {
    return error(absl::StrCat("has blocks of dtype ", c10::toString(blocks.scalar_type()), ", expected uint8"));
  }
  if (scales.scalar_type() != at::kByte) {
    return error(absl::StrCat("has scales of dtype ", c10::toString(scales.scalar_type()), ", expected uint8"));
  }
  if (blocks.dim() != 3 || blocks.size(2) != 16 || blocks.size(0) == 0 || blocks.size(1) == 0) {
    return error(absl::StrCat("has blocks of shape ", shape(blocks), ", expected [N, K / 32, 16]"));
  }
  const int64_t n = blocks.size(0), blocks_k = blocks.size(1);
  if (scales.dim() != 2 || scales.size(0) != n || scales.size(1) != blocks_k) {
    return error(absl::StrCat("has scales of shape ", shape(scales), ", expected [", n, ", ", blocks_k,
                              "] (one per block of 32 of blocks ", shape(blocks), ")"));
  }
  // 6 (the largest E2M1 value) x 2^(s - 127) is a bfloat16 up to s = 252; 255 is E8M0's NaN. A larger scale would
  // make weights infinite and every logit of a request that meets them NaN: refused here.
  const at::Tensor exponents = scales.to(at::kCPU).contiguous();
  const uint8_t* e = exponents.data_ptr<uint8_t>();
  const int64_t count = exponents.numel();
  if (*std::max_element(e, e + count) > 252) {
    const int64_t i = std::find_if(e, e + count, [](uint8_t s) { return s > 252; }) - e;
    return error(absl::StrCat("holds the scale ", int{e[i]}, " at element ", i, " of its scales",
                              e[i] == 255 ? " (E8M0's NaN)" : "",
                              ": 2^(s - 127) times 6, the largest E2M1 value, overflows bfloat16 above 252"));
  }
  PackedLinear out;
  out.kind = PackedLinear::Kind::kMxfp4;
  out.out_features = n;
  out.in_features = blocks_k * 32;
  out.group = 32;
  out.data = blocks.contiguous();
  out.scale = scales.contiguous();
  return out;
}

absl::StatusOr<PackedLinear> LoadPackedLinear(const checkpoint::Checkpoint& checkpoint,
                                              const planner::QuantizedLinear& q, at::Device device, bool pinned) {
  absl::StatusOr<PackedLinear> packed;
  switch (q.layout) {
    case QuantLayout::kFp8Block:
      packed = LoadFp8(checkpoint, q);
      break;
    case QuantLayout::kCompressedPacked:
    case QuantLayout::kAwqGemm:
    case QuantLayout::kGptqV1:
      packed = LoadInt(checkpoint, q);
      break;
  }
  if (!packed.ok()) return packed.status();
  if (pinned) return packed->Pinned();
  if (!device.is_cpu()) return packed->To(device, /*non_blocking=*/false);
  // On the CPU the FP8 bytes are views of the mapping: read ahead of the caller's copy.
  if (const TensorView* view = checkpoint.Find(q.weight); view != nullptr && q.layout == QuantLayout::kFp8Block) {
    view->file->WillNeed(view->offset, view->bytes);
  }
  return packed;
}

}  // namespace strata::runtime
