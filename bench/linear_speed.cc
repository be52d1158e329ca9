// strata_linear_bench: the decode step's matrix-vector products, at::linear (MKL sgemv / oneDNN) against
// runtime/model/linear.h's kernels on the same matrix (the row kernel and tiles of a weight as stored) and on
// its panels (the layout CPU linear layers are packed into at load, where PanelsServe), on the weight shapes
// of a decoder layer, streamed from memory (enough matrices in rotation to exceed the last-level cache).
// Prints GiB/s of weights read, medians of alternating runs, and the machine's read bandwidth (a sum over the
// same bytes) as the roofline. More rows (--rows 16,512) measure batched decode and prefill: GiB/s times
// 2 x rows is the GFLOP/s.
//
//   build/bench/strata_linear_bench [--threads 1,2] [--rows 1,4] [--repeats 5]
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "runtime/model/linear.h"

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

std::vector<int> Ints(const char* text) { return strata::bench::Ints("strata_linear_bench", text); }
using strata::bench::Median;

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2}, rows_list = {1, 4};
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0)
      threads = Ints(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rows") == 0)
      rows_list = Ints(argv[i + 1]);
    else if (std::strcmp(argv[i], "--repeats") == 0)
      repeats = Ints(argv[i + 1]).front();
    else {
      std::fprintf(stderr, "usage: strata_linear_bench [--threads 1,2] [--rows 1,4] [--repeats 5]\n");
      return 2;
    }
  }
  // The bench/peer_llamacpp.py model (hidden 768, 12/4 heads, SwiGLU 3072) and a 4096-wide layer.
  const std::vector<Shape> shapes = {{"q/o 768x768", 768, 768},       {"k/v 256x768", 256, 768},
                                     {"gate/up 3072x768", 3072, 768}, {"down 768x3072", 768, 3072},
                                     {"q/o 4096x4096", 4096, 4096},   {"gate/up 14336x4096", 14336, 4096}};
  constexpr int64_t kRotationBytes = int64_t{256} << 20;  // 8x a 32 MiB L3
  std::printf(
      "| shape | dtype | threads | rows | at::linear GiB/s | strata rows GiB/s | strata panels GiB/s | ratio rows | "
      "ratio "
      "panels | read roofline GiB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const Shape& shape : shapes) {
      const int64_t bytes = shape.n * shape.k * static_cast<int64_t>(c10::elementSize(dtype));
      const int64_t count = std::max<int64_t>(2, kRotationBytes / bytes);
      std::vector<at::Tensor> weights;
      std::vector<strata::runtime::PanelWeight> panels;
      for (int64_t i = 0; i < count; ++i) {
        weights.push_back(at::randn({shape.n, shape.k}).to(dtype));
        panels.push_back({at::empty({shape.n * shape.k}, weights.back().options()), shape.n, shape.k});
        strata::runtime::PackPanels(weights.back(), panels.back().data);
      }
      for (int t : threads) {
        at::set_num_threads(t);
        for (int rows : rows_list) {
          const at::Tensor x = at::randn({rows, 1, shape.k}).to(dtype);
          auto pass = [&](auto&& op) {
            const auto start = std::chrono::steady_clock::now();
            for (size_t i = 0; i < weights.size(); ++i) op(i);
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            return static_cast<double>(bytes * count) / seconds / (1 << 30);
          };
          auto theirs = [&](size_t i) { return at::linear(x, weights[i]); };
          auto ours = [&](size_t i) { return strata::runtime::Linear(x, weights[i]); };
          auto ours_panels = [&](size_t i) { return strata::runtime::Linear(x, panels[i]); };
          auto read = [&](size_t i) { return at::sum(weights[i]); };
          pass(theirs);
          pass(ours);
          pass(ours_panels);
          std::vector<double> a, b, c, r;
          for (int i = 0; i < repeats; ++i) {
            a.push_back(pass(theirs));
            b.push_back(pass(ours));
            c.push_back(pass(ours_panels));
            r.push_back(pass(read));
          }
          std::printf("| %s | %s | %d | %d | %.1f | %.1f | %.1f | %.2fx | %.2fx | %.1f |\n", shape.name,
                      dtype == at::kFloat ? "f32" : "bf16", t, rows, Median(a), Median(b), Median(c),
                      Median(b) / Median(a), Median(c) / Median(a), Median(r));
          std::fflush(stdout);
        }
      }
    }
  }
  if (!strata::runtime::PanelsServe(at::kBFloat16)) {
    std::printf("(this CPU has AVX512_BF16: its bfloat16 CPU layers keep their rows, served by VDPBF16PS)\n");
  }
  return 0;
}
