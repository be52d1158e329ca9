// strata_grammar_bench: what structured outputs cost outside the forward pass (bench/structured_speed.py drives
// it). For each JSON schema of a corpus (one per line of a JSONL file), against a tokenizer.json's vocabulary:
// the compile time with an empty cache, then a seeded random walk through the grammar (each step fills the
// next token's mask, picks an allowed id at random and accepts it) timing every mask fill, until the grammar
// ends or --steps. Prints compile and mask-fill percentiles, and the share of walks that ended.
//
//   strata_grammar_bench --tokenizer DIR/tokenizer.json --vocab 32000 --eos 2 --schemas corpus.jsonl [--steps 256]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

int Usage() {
  std::fprintf(stderr,
               "usage: strata_grammar_bench --tokenizer FILE --vocab N --eos ID --schemas FILE.jsonl [--steps N] "
               "[--seed N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  std::string tokenizer_path, schemas_path;
  int64_t vocab = 0, eos = -1, steps = 256, seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    bool ok = true;
    if (flag == "--tokenizer") {
      tokenizer_path = value;
    } else if (flag == "--schemas") {
      schemas_path = value;
    } else if (flag == "--vocab") {
      ok = absl::SimpleAtoi(value, &vocab);
    } else if (flag == "--eos") {
      ok = absl::SimpleAtoi(value, &eos);
    } else if (flag == "--steps") {
      ok = absl::SimpleAtoi(value, &steps);
    } else if (flag == "--seed") {
      ok = absl::SimpleAtoi(value, &seed);
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  if (tokenizer_path.empty() || schemas_path.empty() || vocab <= 0 || eos < 0) return Usage();
  auto tokenizer = tokenizer::Tokenizer::FromPath(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "strata_grammar_bench: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  std::ifstream in(schemas_path);
  std::vector<std::string> schemas;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) schemas.push_back(line);
  }
  if (schemas.empty()) {
    std::fprintf(stderr, "strata_grammar_bench: no schemas in %s\n", schemas_path.c_str());
    return 1;
  }
  std::vector<double> compile_ms, mask_us;
  int ended = 0, refused = 0;
  std::mt19937_64 random(static_cast<uint64_t>(seed));
  const int64_t words = structured::MaskWords(vocab);
  std::vector<int32_t> mask(static_cast<size_t>(words));
  for (const std::string& schema : schemas) {
    // A compiler of its own: every compile starts from an empty cache.
    auto compiler = structured::Compiler::Create(**tokenizer, vocab, {static_cast<int32_t>(eos)}, {});
    if (!compiler.ok()) {
      std::fprintf(stderr, "strata_grammar_bench: %s\n", std::string(compiler.status().message()).c_str());
      return 1;
    }
    structured::Constraint constraint;
    constraint.kind = structured::ConstraintKind::kJsonSchema;
    constraint.text = schema;
    constraint.field = "schema";
    const auto start = std::chrono::steady_clock::now();
    auto grammar = (*compiler)->Compile(constraint);
    compile_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (!grammar.ok()) {
      ++refused;
      std::fprintf(stderr, "refused: %s\n", std::string(grammar.status().message()).c_str());
      continue;
    }
    structured::Matcher matcher(*grammar);
    for (int64_t step = 0; step < steps && !matcher.Ended(); ++step) {
      const auto fill = std::chrono::steady_clock::now();
      matcher.FillMask(mask.data());
      mask_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - fill).count());
      std::vector<int32_t> allowed;
      for (int64_t id = 0; id < vocab; ++id) {
        if ((static_cast<uint32_t>(mask[static_cast<size_t>(id / 32)]) >> (id % 32)) & 1u) {
          allowed.push_back(static_cast<int32_t>(id));
        }
      }
      if (allowed.empty()) break;
      // Prefer ending once the grammar may end, so walks finish as a model's outputs do.
      const bool can_end = matcher.CanEnd();
      const int32_t id = can_end && std::uniform_int_distribution<int>(0, 3)(random) == 0
                             ? static_cast<int32_t>(eos)
                             : allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(random)];
      if (!matcher.Accept(id)) {
        std::fprintf(stderr, "strata_grammar_bench: the matcher refused id %d it allowed\n", id);
        return 1;
      }
    }
    if (matcher.Ended()) ++ended;
  }
  std::printf("schemas: %zu (refused %d), walks that ended: %d, mask fills: %zu (vocab %lld)\n", schemas.size(),
              refused, ended, mask_us.size(), static_cast<long long>(vocab));
  std::printf("compile ms  p50 %.2f  p99 %.2f  max %.2f\n", Percentile(compile_ms, 0.5), Percentile(compile_ms, 0.99),
              Percentile(compile_ms, 1.0));
  std::printf("mask fill us  p50 %.1f  p99 %.1f  max %.1f\n", Percentile(mask_us, 0.5), Percentile(mask_us, 0.99),
              Percentile(mask_us, 1.0));
  return 0;
}
