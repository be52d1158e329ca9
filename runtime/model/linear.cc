#include "runtime/model/linear.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <functional>
#include <span>
#include <vector>

#include "kernels/linear.h"
#include "kernels/targets.h"
#include "runtime/model/parallel.h"

namespace strata::runtime {

bool LinearUsesOwnKernel(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  if (x.scalar_type() != weight.scalar_type()) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  if (weight.dim() != 2 || !weight.is_contiguous() || x.dim() < 1 || x.size(-1) != weight.size(1)) return false;
  const int64_t k = weight.size(1);
  if (k <= 0 || x.numel() == 0) return false;
  // Past kFewRows (prefill) the blocked, packed GEMMs of MKL/oneDNN reuse each weight more often than the
  // tiles do (bench/linear_speed.cc measures where they cross).
  return x.numel() / k <= kFewRows;
}

bool LinearWidensBf16(const at::Tensor& x, const at::Tensor& weight) {
  return x.device().is_cpu() && weight.device().is_cpu() && x.scalar_type() == at::kBFloat16 &&
         weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
         x.numel() / std::max<int64_t>(1, weight.size(1)) > kFewRows && !kernels::Bf16DotAvailable();
}

namespace {

// At least ~64 KiB of weights per task (smaller pieces cost more in scheduling than they save), in whole
// blocks of 12 weight rows (the tiles take 3 or 4 at a time).
int64_t Grain(int64_t k, int64_t element_size) {
  const int64_t rows = std::max<int64_t>(1, (64 << 10) / (k * element_size));
  return (rows + 11) / 12 * 12;
}

// The few rows on kernels/linear.h, output rows split over the intra-op threads.
template <typename T, typename K, typename X>
void OwnKernel(const X* xs, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y, int64_t rows, int64_t k,
               int64_t n) {
  const K* ws = reinterpret_cast<const K*>(weight.data_ptr<T>());
  const K* bs = bias.defined() ? reinterpret_cast<const K*>(bias.data_ptr<T>()) : nullptr;
  K* ys = reinterpret_cast<K*>(y.data_ptr<T>());
  ParallelRows(n, Grain(k, sizeof(T)),
               [&](int64_t begin, int64_t end) { kernels::LinearRows(xs, ws, bs, ys, rows, k, n, begin, end); });
}

// Weights widened per block: a few MiB of float32, used by every row of x while it is in cache.
constexpr int64_t kWidenBlockBytes = int64_t{8} << 20;

// bfloat16 prefill on a CPU without AVX512_BF16, where ATen's bfloat16 GEMM (oneDNN's) runs 3-5x slower than
// its float32 one: as llama.cpp does, widen to float32 and run the float32 GEMM (MKL sgemm).
at::Tensor WidenedLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return LinearOverRowBlocks(
      x, weight.size(0), [&](int64_t n0, int64_t nb) { return weight.narrow(0, n0, nb); }, at::kFloat, bias);
}

}  // namespace

// x is converted once; the weights block by block into one reused buffer, each block's product written into its
// columns of a result in the GEMM's dtype (float32 for a bfloat16 x: rounded to bfloat16 once at the end, as a
// bfloat16 GEMM with float32 accumulation rounds).
at::Tensor LinearOverRowBlocks(const at::Tensor& x, int64_t n,
                               const std::function<at::Tensor(int64_t, int64_t)>& rows_of, at::ScalarType gemm_dtype,
                               const at::Tensor& bias) {
  const int64_t k = x.size(-1);
  const int64_t rows = x.numel() / k;
  const at::Tensor xg = x.reshape({rows, k}).to(gemm_dtype);
  at::Tensor y = at::empty({rows, n}, xg.options());
  const int64_t block = std::clamp<int64_t>(kWidenBlockBytes / (4 * k), 16, n);
  at::Tensor w_buffer = at::empty({block, k}, xg.options());
  at::Tensor part = at::empty({rows, block}, xg.options());
  for (int64_t n0 = 0; n0 < n; n0 += block) {
    const int64_t nb = std::min(block, n - n0);
    at::Tensor w_block = w_buffer.narrow(0, 0, nb);
    w_block.copy_(rows_of(n0, nb));
    at::Tensor out = part.narrow(1, 0, nb);
    if (nb == block) {
      at::mm_out(part, xg, w_block.t());
    } else {
      out = at::mm(xg, w_block.t());
    }
    y.narrow(1, n0, nb).copy_(out);
  }
  if (bias.defined()) y.add_(bias.to(gemm_dtype));
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n;
  return y.to(x.scalar_type()).reshape(sizes);
}

bool PanelsServe(at::ScalarType dtype) {
  return dtype == at::kFloat || (dtype == at::kBFloat16 && !kernels::Bf16DotAvailable());
}

void PackPanels(const at::Tensor& dense, const at::Tensor& out) {
  TORCH_CHECK(dense.dim() == 2 && dense.is_cpu() && out.is_cpu() && dense.scalar_type() == out.scalar_type() &&
                  out.is_contiguous() && out.numel() == dense.numel(),
              "PackPanels: a CPU matrix and a flat buffer of its size and dtype");
  const at::Tensor w = dense.contiguous();
  if (w.scalar_type() == at::kFloat) {
    kernels::PackPanels(w.data_ptr<float>(), w.size(0), w.size(1), out.data_ptr<float>());
  } else {
    TORCH_CHECK(w.scalar_type() == at::kBFloat16, "PackPanels: float32 or bfloat16, not ", w.scalar_type());
    kernels::PackPanels(reinterpret_cast<const kernels::BFloat16*>(w.data_ptr()), w.size(0), w.size(1),
                        reinterpret_cast<kernels::BFloat16*>(out.data_ptr()));
  }
}

at::Tensor UnpackPanels(const PanelWeight& weight) {
  const at::Tensor& p = weight.data;
  at::Tensor out = at::empty({weight.out_features, weight.in_features}, p.options());
  if (p.scalar_type() == at::kFloat) {
    kernels::UnpackPanels(p.data_ptr<float>(), weight.out_features, weight.in_features, out.data_ptr<float>());
  } else {
    kernels::UnpackPanels(reinterpret_cast<const kernels::BFloat16*>(p.data_ptr()), weight.out_features,
                          weight.in_features, reinterpret_cast<kernels::BFloat16*>(out.data_ptr()));
  }
  return out;
}

namespace {

// x times each of `weights` (panels of one dtype and one K) plus its bias, in one split over the threads: the
// pieces are ranges of the weights' panels side by side, so the threads join once, and a bfloat16 x is widened
// once, for all of them.
std::vector<at::Tensor> PanelLinears(const at::Tensor& x_in, std::span<const PanelWeight* const> weights,
                                     std::span<const at::Tensor> biases_in) {
  const int64_t k = weights.front()->in_features;
  const at::ScalarType dtype = weights.front()->data.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "Linear: panels of float32 or bfloat16, not ", dtype);
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == k && x_in.is_cpu(), "Linear: input of ", k,
              " features on the CPU for a weight in panels, got ", x_in.sizes());
  // Activations are in the serving dtype, the weight's; anything else is converted (and converted back).
  const at::Tensor x = x_in.scalar_type() == dtype ? x_in.contiguous() : x_in.to(dtype).contiguous();
  const int64_t rows = x.numel() / std::max<int64_t>(k, 1);
  struct Part {
    const PanelWeight* weight;
    at::Tensor bias, y;
    int64_t first;  // its first panel in the split's numbering
  };
  std::vector<Part> parts;
  int64_t panels = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const PanelWeight& w = *weights[i];
    TORCH_CHECK(w.in_features == k && w.data.scalar_type() == dtype, "Linear: weights of one input in panels of ", k,
                " features and one dtype");
    const at::Tensor& b = biases_in[i];
    at::Tensor bias = !b.defined() || (b.scalar_type() == dtype && b.is_contiguous() && b.is_cpu())
                          ? b
                          : b.to(at::kCPU, dtype).contiguous();
    std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
    sizes.back() = w.out_features;
    at::Tensor y = at::empty(sizes, x.options());
    if (k == 0) (bias.defined() ? y.copy_(bias.expand_as(y)) : y.zero_());
    parts.push_back({&w, std::move(bias), std::move(y), panels});
    panels += kernels::PanelCount(w.out_features);
  }
  if (rows > 0 && k > 0 && panels > 0) {
    // ~64 KiB of weights times rows per piece: a decode step's pieces stream their panels; a prefill's each
    // multiply every row by theirs.
    const int64_t panel_bytes = kernels::kPanelRows * k * static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / (panel_bytes * rows));
    const at::Tensor x32 = x.to(at::kFloat);  // bfloat16 widened once here, not once per piece
    const float* xs = x32.data_ptr<float>();
    ParallelRows(panels, grain, [&](int64_t p0, int64_t p1) {
      for (const Part& part : parts) {
        const int64_t n = part.weight->out_features;
        const int64_t q0 = std::max(p0, part.first) - part.first;
        const int64_t q1 = std::min(p1, part.first + kernels::PanelCount(n)) - part.first;
        if (q0 >= q1) continue;
        if (dtype == at::kFloat) {
          kernels::LinearPanels(xs, part.weight->data.data_ptr<float>(),
                                part.bias.defined() ? part.bias.data_ptr<float>() : nullptr, part.y.data_ptr<float>(),
                                rows, k, n, q0, q1);
        } else {
          auto bf16 = [](const at::Tensor& t) { return reinterpret_cast<kernels::BFloat16*>(t.data_ptr()); };
          kernels::LinearPanels(xs, bf16(part.weight->data), part.bias.defined() ? bf16(part.bias) : nullptr,
                                bf16(part.y), rows, k, n, q0, q1);
        }
      }
    });
  }
  std::vector<at::Tensor> out;
  for (Part& part : parts) {
    out.push_back(part.y.scalar_type() == x_in.scalar_type() ? std::move(part.y) : part.y.to(x_in.scalar_type()));
  }
  return out;
}

}  // namespace

at::Tensor Linear(const at::Tensor& x, const PanelWeight& weight, const at::Tensor& bias) {
  const PanelWeight* one[] = {&weight};
  return PanelLinears(x, one, std::span(&bias, 1)).front();
}

std::vector<at::Tensor> LinearEach(const at::Tensor& x, std::span<const WeightTensor* const> weights,
                                   std::span<const at::Tensor> biases) {
  TORCH_CHECK(!weights.empty() && weights.size() == biases.size(), "LinearEach: ", weights.size(), " weights and ",
              biases.size(), " biases");
  std::vector<const PanelWeight*> panels;
  for (const WeightTensor* w : weights) {
    if (w->panels == nullptr || w->panels->in_features != weights.front()->panels->in_features ||
        w->panels->data.scalar_type() != weights.front()->panels->data.scalar_type()) {
      break;
    }
    panels.push_back(w->panels.get());
  }
  if (panels.size() == weights.size()) return PanelLinears(x, panels, biases);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < weights.size(); ++i) out.push_back(Linear(x, *weights[i], biases[i]));
  return out;
}

at::Tensor Linear(const at::Tensor& x, const WeightTensor& weight, const at::Tensor& bias) {
  if (weight.panels) return Linear(x, *weight.panels, bias);
  if (weight.packed) return LinearPacked(x, *weight.packed, bias);
  return Linear(x, weight.tensor, bias);
}

WeightTensor WeightRows(const WeightTensor& weight, int64_t n0, int64_t rows) {
  if (weight.panels) {
    const PanelWeight& w = *weight.panels;
    const int64_t k = w.in_features;
    // Whole panels, or the last ones: a view; else the rows unpacked.
    if (n0 % kernels::kPanelRows == 0 && (rows % kernels::kPanelRows == 0 || n0 + rows == w.out_features)) {
      return {
          {}, nullptr, std::make_shared<const PanelWeight>(PanelWeight{w.data.narrow(0, n0 * k, rows * k), rows, k})};
    }
    return {UnpackPanels(w).narrow(0, n0, rows), nullptr, nullptr};
  }
  if (weight.packed) return {{}, std::make_shared<const PackedLinear>(PackedRows(*weight.packed, n0, rows)), nullptr};
  return {weight.tensor.narrow(0, n0, rows), nullptr, nullptr};
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool bias_ok =
      !bias.defined() || (bias.scalar_type() == x.scalar_type() && bias.is_contiguous() && bias.device().is_cpu());
  if (bias_ok && LinearWidensBf16(x, weight)) return WidenedLinear(x, weight, bias);
  if (!bias_ok || !LinearUsesOwnKernel(x, weight)) {
    return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  }
  const int64_t k = weight.size(1);
  const int64_t n = weight.size(0);
  const int64_t rows = x.numel() / k;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  const at::Tensor xc = x.contiguous();
  if (x.scalar_type() == at::kFloat) {
    OwnKernel<float, float>(xc.data_ptr<float>(), weight, bias, y, rows, k, n);
  } else if (kernels::Bf16DotAvailable()) {
    OwnKernel<c10::BFloat16, kernels::BFloat16>(reinterpret_cast<const kernels::BFloat16*>(xc.data_ptr()), weight, bias,
                                                y, rows, k, n);
  } else {  // widened once here, not once per task
    const at::Tensor x32 = xc.to(at::kFloat);
    OwnKernel<c10::BFloat16, kernels::BFloat16>(x32.data_ptr<float>(), weight, bias, y, rows, k, n);
  }
  return y;
}

}  // namespace strata::runtime
