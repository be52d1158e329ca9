// strata_pointwise_bench: a decoder layer's pointwise work, the ATen expressions transformers runs
// (LlamaRMSNorm: to(float), pow, mean, rsqrt, products; silu(gate) * up) against runtime/model/pointwise.h
// (kernels/pointwise.h: one pass each, the best Highway target of this CPU), and decode attention from the
// paged pool (runtime/model/decode_attention.h over kernels/attention.h). Microseconds per call, medians of
// alternating runs, on decode (1 row), batched decode (32 rows) and prefill (512 rows) shapes.
//
//   build/bench/strata_pointwise_bench [--threads 1,2] [--repeats 7] [--target AVX2]
//
// --target runs the kernels on another Highway target this CPU supports (AVX2 or SSE4 on an AVX-512
// machine): that target's code on this machine's memory system.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
#include <hwy/targets.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/pointwise.h"
#include "runtime/model/decode_attention.h"
#include "runtime/model/pointwise.h"

namespace {

std::vector<int> Ints(const char* text) { return strata::bench::Ints("strata_pointwise_bench", text); }
using strata::bench::Median;

// Microseconds per call of `op`, enough calls for ~20 ms.
template <typename Op>
double Micros(Op&& op) {
  int calls = 1;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) op();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0.02 || calls > (1 << 20)) return seconds / calls * 1e6;
    calls *= 2;
  }
}

at::Tensor AtenRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor x32 = x.to(at::kFloat);
  x32 = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return w * x32.to(x.scalar_type());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int repeats = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) {
      threads = Ints(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--repeats") == 0) {
      repeats = Ints(argv[i + 1]).front();
    } else if (std::strcmp(argv[i], "--target") == 0) {
      int64_t chosen = 0;
      std::string names;
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        names += std::string(names.empty() ? "" : ", ") + hwy::TargetName(target);
        if (std::strcmp(hwy::TargetName(target), argv[i + 1]) == 0) chosen = target;
      }
      if (chosen == 0) {
        std::fprintf(stderr, "strata_pointwise_bench: --target %s: this CPU runs %s\n", argv[i + 1], names.c_str());
        return 2;
      }
      hwy::SetSupportedTargetsForTest(chosen);
    } else {
      std::fprintf(stderr, "usage: strata_pointwise_bench [--threads 1,2] [--repeats 7] [--target NAME]\n");
      return 2;
    }
  }
  std::printf("kernel target: %s\n\n", strata::kernels::KernelTarget());
  std::printf(
      "| op | dtype | threads | rows x width | ATen us | strata us | speed-up |\n|---|---|---|---|---|---|---|\n");
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int t : threads) {
      at::set_num_threads(t);
      for (int64_t rows : {1, 32, 512}) {
        const int64_t hidden = 4096, inter = 14336;
        const at::Tensor x = at::randn({1, rows, hidden}).to(dtype), w = at::randn({hidden}).to(dtype);
        const at::Tensor gate = at::randn({1, rows, inter}).to(dtype), up = at::randn({1, rows, inter}).to(dtype);
        struct Case {
          const char* name;
          std::function<at::Tensor()> aten, ours;
          int64_t width;
        };
        const std::vector<Case> cases = {{"RMSNorm", [&] { return AtenRmsNorm(x, w, 1e-5); },
                                          [&] { return strata::runtime::FusedRmsNorm(x, w, 1e-5); }, hidden},
                                         {"SiLU x up", [&] { return at::silu(gate) * up; },
                                          [&] { return strata::runtime::FusedSiluMul(gate, up); }, inter}};
        for (const Case& c : cases) {
          std::vector<double> a, b;
          for (int i = 0; i < repeats; ++i) {
            a.push_back(Micros(c.aten));
            b.push_back(Micros(c.ours));
          }
          std::printf("| %s | %s | %d | %ld x %ld | %.1f | %.1f | %.2fx |\n", c.name,
                      dtype == at::kFloat ? "f32" : "bf16", t, static_cast<long>(rows), static_cast<long>(c.width),
                      Median(a), Median(b), Median(a) / Median(b));
          std::fflush(stdout);
        }
      }
    }
  }
  // Decode attention from the paged pool: rows x 32 query heads over 8 KV heads of 128, each row at `context`
  // positions of its own blocks (16 tokens each).
  std::printf("\n| op | dtype | threads | rows x context | strata us |\n|---|---|---|---|---|\n");
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int t : threads) {
      at::set_num_threads(t);
      for (int64_t rows : {1, 16}) {
        for (int64_t context : {512, 4096}) {
          const int64_t blocks_per_row = context / 16;
          strata::runtime::KvLayer cache{at::randn({rows * blocks_per_row * 16, 8, 128}).to(dtype),
                                         at::randn({rows * blocks_per_row * 16, 8, 128}).to(dtype)};
          const at::Tensor table = at::arange(rows * blocks_per_row, at::kLong).view({rows, blocks_per_row});
          const at::Tensor positions = at::full({rows, 1}, context - 1, at::kLong);
          const at::Tensor q = at::randn({rows, 32, 1, 128}).to(dtype);
          std::vector<double> b;
          for (int i = 0; i < repeats; ++i) {
            b.push_back(Micros([&] {
              return strata::runtime::DecodeAttention(q, cache, strata::runtime::KvBlockTables{table, 16}, positions, 0,
                                                      0.088);
            }));
          }
          std::printf("| DecodeAttention | %s | %d | %ld x %ld | %.1f |\n", dtype == at::kFloat ? "f32" : "bf16", t,
                      static_cast<long>(rows), static_cast<long>(context), Median(b));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
