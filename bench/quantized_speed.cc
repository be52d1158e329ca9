// strata_quantized_bench: kernels/quantized.h's rows kernels (FP8 e4m3, int8, int4, MXFP4 read packed and
// dequantized in registers) against kernels/linear.h's bfloat16 LinearRows on the same shape in the same run, the
// decode step's matrix products. Enough matrices in rotation (256 MiB of each format) that the weights stream from
// memory. The output rows are split over the threads as runtime/model/linear.cc splits them; each thread walks
// the whole rotation on its own slice (no barrier per matrix). Prints GiB/s of weight bytes read (packed codes
// plus scales and zeros), microseconds per matrix, and the speed-up over bfloat16 (its time / ours: the ratio
// of decode tokens per second for a memory-bound layer). Medians of alternating runs. torch-free. x float32
// rows run the float32 kernels against LinearRows(float32 x, bfloat16 W); x bfloat16 rows the VDPBF16PS paths
// (where the CPU has AVX512_BF16) against LinearRows(bfloat16 x, bfloat16 W), which uses it too.
//
//   build/bench/strata_quantized_bench [--threads 1,2] [--rows 1,2,16,32] [--repeats 5] [--x f32,bf16]
//                                      [--only int4,mxfp4] [--shapes 2048x2048,8192x2048]
//   build/bench/strata_quantized_bench --shapes 5760x2880,2880x2880 --rows 1,2,4   (gpt-oss's expert projections)
// A shape's K is a multiple of 32; a format whose group does not divide it (int g128 at K 2880) is left out there.
//   STRATA_CPU_ISA=avx2 build/bench/strata_quantized_bench ...   (the AVX2 code on an AVX-512 machine)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "kernels/linear.h"
#include "kernels/pointwise.h"
#include "kernels/quantized.h"
#include "kernels/targets.h"

namespace {

using strata::bench::Median;
using strata::kernels::BFloat16;

std::vector<int> Ints(const char* text) { return strata::bench::Ints("strata_quantized_bench", text); }

struct Shape {
  std::string name;
  int64_t n, k;
};

// "NxK,NxK,...": weight shapes [out, in]; exits 2 naming a malformed one.
std::vector<Shape> Shapes(const char* text) {
  std::vector<Shape> shapes;
  std::string all(text);
  for (size_t start = 0; start <= all.size();) {
    const size_t comma = std::min(all.find(',', start), all.size());
    const std::string item = all.substr(start, comma - start);
    long long n = 0, k = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%lldx%lld%c", &n, &k, &tail) != 2 || n <= 0 || k <= 0 || k % 32 != 0) {
      std::fprintf(stderr, "strata_quantized_bench: --shapes: '%s' is not NxK with K a multiple of 32\n", item.c_str());
      std::exit(2);
    }
    shapes.push_back({item, n, k});
    start = comma + 1;
  }
  return shapes;
}

// Cheap random bytes (xorshift64*): the contents do not matter to the speed, only that they are not all zero.
struct Bytes {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  uint8_t Next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<uint8_t>((state * 0x2545F4914F6CDD1Dull) >> 56);
  }
  void Fill(std::vector<uint8_t>& v) {
    for (uint8_t& b : v) b = Next();
  }
};

// One weight matrix of a format, what it reads and how to run it.
struct Matrix {
  std::vector<uint8_t> data, zero, exponents;  // exponents: MXFP4's E8M0 scales
  std::vector<float> scale_f32;
  std::vector<uint16_t> scale_16;
  std::vector<BFloat16> bf16;
  int64_t bytes = 0;
};

struct Format {
  const char* name;
  int64_t group;  // K must be a multiple of it (0: any K)
  // Builds a matrix of [n, k]; runs rows x it over output rows [n0, n1).
  std::function<Matrix(int64_t n, int64_t k, Bytes& random)> make;
  std::function<void(const Matrix&, const float* x, const BFloat16* x16, BFloat16* y, int64_t rows, int64_t k,
                     int64_t n, int64_t n0, int64_t n1)>
      run;
};

uint16_t Bf16Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

Format Bf16Format() {
  return {"bf16", 0,
          [](int64_t n, int64_t k, Bytes& random) {
            Matrix m;
            m.bf16.resize(static_cast<size_t>(n * k));
            for (BFloat16& v : m.bf16) v.bits = Bf16Bits(static_cast<float>(random.Next()) / 128.0f - 1.0f);
            m.bytes = n * k * 2;
            return m;
          },
          [](const Matrix& m, const float* x, const BFloat16* x16, BFloat16* y, int64_t rows, int64_t k, int64_t n,
             int64_t n0, int64_t n1) {
            if (x16 != nullptr) return strata::kernels::LinearRows(x16, m.bf16.data(), nullptr, y, rows, k, n, n0, n1);
            strata::kernels::LinearRows(x, m.bf16.data(), nullptr, y, rows, k, n, n0, n1);
          }};
}

Format Fp8Format(const char* name, int64_t block_n, int64_t block_k) {  // 0: the whole dimension
  auto blocks = [block_n, block_k](int64_t n, int64_t k) {
    const int64_t bn = block_n > 0 ? block_n : n, bk = block_k > 0 ? block_k : k;
    return std::pair<int64_t, int64_t>(bn, bk);
  };
  return {name, 0,
          [blocks](int64_t n, int64_t k, Bytes& random) {
            Matrix m;
            m.data.resize(static_cast<size_t>(n * k));
            random.Fill(m.data);
            for (uint8_t& b : m.data) {
              if ((b & 0x7F) == 0x7F) b = 0x7E;  // no NaN codes
            }
            const auto [bn, bk] = blocks(n, k);
            m.scale_f32.assign(static_cast<size_t>(((n + bn - 1) / bn) * ((k + bk - 1) / bk)), 0.01f);
            m.bytes = n * k + static_cast<int64_t>(m.scale_f32.size() * 4);
            return m;
          },
          [blocks](const Matrix& m, const float* x, const BFloat16* x16, BFloat16* y, int64_t rows, int64_t k,
                   int64_t n, int64_t n0, int64_t n1) {
            const auto [bn, bk] = blocks(n, k);
            const strata::kernels::Fp8Weights w{m.data.data(), m.scale_f32.data(), bn, bk};
            if (x16 != nullptr) return strata::kernels::QuantizedLinearRows(x16, w, nullptr, y, rows, k, n, n0, n1);
            strata::kernels::QuantizedLinearRows(x, w, static_cast<const BFloat16*>(nullptr), y, rows, k, n, n0, n1);
          }};
}

Format IntFormat(const char* name, int bits, int64_t group, strata::kernels::ScaleType type, bool asymmetric) {
  return {name, group,
          [=](int64_t n, int64_t k, Bytes& random) {
            Matrix m;
            m.data.resize(static_cast<size_t>(n * k * bits / 8));
            random.Fill(m.data);
            const size_t groups = static_cast<size_t>(n * (k / group));
            if (type == strata::kernels::ScaleType::kFloat32) {
              m.scale_f32.assign(groups, 0.01f);
            } else {
              m.scale_16.assign(groups, type == strata::kernels::ScaleType::kBFloat16 ? Bf16Bits(0.01f) : 0x211F);
            }
            if (asymmetric) {
              m.zero.resize(groups);
              random.Fill(m.zero);
            }
            m.bytes =
                static_cast<int64_t>(m.data.size() + m.zero.size() + m.scale_f32.size() * 4 + m.scale_16.size() * 2);
            return m;
          },
          [=](const Matrix& m, const float* x, const BFloat16* x16, BFloat16* y, int64_t rows, int64_t k, int64_t n,
              int64_t n0, int64_t n1) {
            strata::kernels::IntWeights w;
            w.bits = bits;
            w.data = m.data.data();
            w.scale = type == strata::kernels::ScaleType::kFloat32 ? static_cast<const void*>(m.scale_f32.data())
                                                                   : static_cast<const void*>(m.scale_16.data());
            w.scale_type = type;
            w.zero = asymmetric ? m.zero.data() : nullptr;
            w.group = group;
            if (x16 != nullptr) return strata::kernels::QuantizedLinearRows(x16, w, nullptr, y, rows, k, n, n0, n1);
            strata::kernels::QuantizedLinearRows(x, w, static_cast<const BFloat16*>(nullptr), y, rows, k, n, n0, n1);
          }};
}

// gpt-oss's experts: E2M1 codes in blocks of 32 (16 bytes) with one E8M0 scale byte each, 4.25 bits a weight.
Format Mxfp4Format() {
  return {"mxfp4", 32,
          [](int64_t n, int64_t k, Bytes& random) {
            Matrix m;
            m.data.resize(static_cast<size_t>(n * k / 2));
            random.Fill(m.data);
            m.exponents.assign(static_cast<size_t>(n * k / 32), 120);  // 2^-7
            m.bytes = static_cast<int64_t>(m.data.size() + m.exponents.size());
            return m;
          },
          [](const Matrix& m, const float* x, const BFloat16* x16, BFloat16* y, int64_t rows, int64_t k, int64_t n,
             int64_t n0, int64_t n1) {
            const strata::kernels::Mxfp4Weights w{m.data.data(), m.exponents.data()};
            if (x16 != nullptr) return strata::kernels::QuantizedLinearRows(x16, w, nullptr, y, rows, k, n, n0, n1);
            strata::kernels::QuantizedLinearRows(x, w, static_cast<const BFloat16*>(nullptr), y, rows, k, n, n0, n1);
          }};
}

// Enough matrices of `format` for `rotation_bytes`.
std::vector<Matrix> Rotation(const Format& format, const Shape& shape, int64_t rotation_bytes, Bytes& random) {
  std::vector<Matrix> matrices;
  matrices.push_back(format.make(shape.n, shape.k, random));
  const int64_t count = std::max<int64_t>(2, rotation_bytes / matrices.front().bytes);
  while (static_cast<int64_t>(matrices.size()) < count) matrices.push_back(format.make(shape.n, shape.k, random));
  return matrices;
}

// Seconds for one pass over the rotation: `threads` threads, each on its slice of the output rows.
double Pass(const Format& format, const std::vector<Matrix>& matrices, const Shape& shape, const float* x,
            const BFloat16* x16, std::vector<std::vector<BFloat16>>& ys, int rows, int threads) {
  auto slice = [&](int t) {
    const int64_t n0 = shape.n * t / threads, n1 = shape.n * (t + 1) / threads;
    for (const Matrix& m : matrices)
      format.run(m, x, x16, ys[static_cast<size_t>(t)].data(), rows, shape.k, shape.n, n0, n1);
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(slice, t);
  slice(0);
  for (std::thread& w : workers) w.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2}, rows_list = {1, 2, 16, 32};
  int repeats = 5;
  std::string x_kinds = "f32,bf16", only;
  std::vector<Shape> shapes = {{"2048x2048", 2048, 2048}, {"8192x2048", 8192, 2048}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0)
      threads = Ints(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rows") == 0)
      rows_list = Ints(argv[i + 1]);
    else if (std::strcmp(argv[i], "--repeats") == 0)
      repeats = Ints(argv[i + 1]).front();
    else if (std::strcmp(argv[i], "--x") == 0)
      x_kinds = argv[i + 1];
    else if (std::strcmp(argv[i], "--only") == 0)
      only = argv[i + 1];
    else if (std::strcmp(argv[i], "--shapes") == 0)
      shapes = Shapes(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: strata_quantized_bench [--threads 1,2] [--rows 1,2,16,32] [--repeats 5] [--x f32,bf16] "
                   "[--only FORMAT-SUBSTRING,...] [--shapes 2048x2048,8192x2048]\n");
      return 2;
    }
  }
  using strata::kernels::ScaleType;
  const std::vector<Format> formats = {
      Fp8Format("fp8 128x128", 128, 128),
      Fp8Format("fp8 per-channel", 1, 0),
      IntFormat("int8 g128 sym bf16", 8, 128, ScaleType::kBFloat16, false),
      IntFormat("int4 g128 sym bf16", 4, 128, ScaleType::kBFloat16, false),
      IntFormat("int4 g128 asym f16", 4, 128, ScaleType::kFloat16, true),
      IntFormat("int4 g32 asym bf16", 4, 32, ScaleType::kBFloat16, true),
      IntFormat("int4 g32 sym bf16", 4, 32, ScaleType::kBFloat16, false),
      Mxfp4Format(),
  };
  const Format bf16 = Bf16Format();
  // --only: formats whose name contains any of its comma-separated parts.
  const std::vector<absl::string_view> wanted = absl::StrSplit(only, ',', absl::SkipEmpty());
  constexpr int64_t kRotationBytes = int64_t{256} << 20;  // 8x a 32 MiB L3
  std::printf("%s; kernel target %s%s%s; VDPBF16PS %s\n\n", strata::bench::CpuName().c_str(),
              strata::kernels::KernelTarget(), *strata::kernels::CpuIsaCap() != '\0' ? ", STRATA_CPU_ISA=" : "",
              strata::kernels::CpuIsaCap(), strata::kernels::Bf16DotAvailable() ? "yes" : "no");
  std::printf(
      "| shape | format | x | threads | rows | bf16 GiB/s | quantized GiB/s | bf16 us | quantized us | speed-up |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  Bytes random;
  for (const Shape& shape : shapes) {
    const std::vector<Matrix> bf16_matrices = Rotation(bf16, shape, kRotationBytes, random);
    for (const Format& format : formats) {
      if (!only.empty() && std::none_of(wanted.begin(), wanted.end(),
                                        [&](absl::string_view part) { return absl::StrContains(format.name, part); })) {
        continue;
      }
      if (format.group > 0 && shape.k % format.group != 0) continue;
      const std::vector<Matrix> matrices = Rotation(format, shape, kRotationBytes, random);
      for (int t : threads) {
        for (int rows : rows_list) {
          for (const char* kind : {"f32", "bf16"}) {
            if (x_kinds.find(kind) == std::string::npos || (std::strcmp(kind, "f32") == 0 && x_kinds == "bf16")) {
              continue;
            }
            const bool x_bf16 = std::strcmp(kind, "bf16") == 0;
            std::vector<float> x(static_cast<size_t>(rows * shape.k));
            std::vector<BFloat16> x16(x.size());
            for (size_t i = 0; i < x.size(); ++i) {
              x16[i].bits = Bf16Bits(static_cast<float>(random.Next()) / 128.0f - 1.0f);
              const uint32_t wide = static_cast<uint32_t>(x16[i].bits) << 16;
              std::memcpy(&x[i], &wide, sizeof wide);
            }
            const BFloat16* xb = x_bf16 ? x16.data() : nullptr;
            std::vector<std::vector<BFloat16>> ys(static_cast<size_t>(t),
                                                  std::vector<BFloat16>(static_cast<size_t>(rows * shape.n)));
            Pass(bf16, bf16_matrices, shape, x.data(), xb, ys, rows, t);
            Pass(format, matrices, shape, x.data(), xb, ys, rows, t);
            std::vector<double> a, b;
            for (int i = 0; i < repeats; ++i) {
              a.push_back(Pass(bf16, bf16_matrices, shape, x.data(), xb, ys, rows, t));
              b.push_back(Pass(format, matrices, shape, x.data(), xb, ys, rows, t));
            }
            const double ta = Median(a) / static_cast<double>(bf16_matrices.size()),
                         tb = Median(b) / static_cast<double>(matrices.size());
            const double gib = 1024.0 * 1024.0 * 1024.0;
            std::printf("| %s | %s | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", shape.name.c_str(),
                        format.name, kind, t, rows, static_cast<double>(bf16_matrices.front().bytes) / ta / gib,
                        static_cast<double>(matrices.front().bytes) / tb / gib, ta * 1e6, tb * 1e6, ta / tb);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  return 0;
}
