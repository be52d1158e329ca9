// libFuzzer harness: structured outputs' constraints (structured/structured.h on xgrammar). The input is
//   CONTROL_BYTE TEXT
// where the control byte's bits 0-2 pick the kind (json_schema, regex, choice (TEXT split at '\n'), grammar
// (EBNF/GBNF), structural_tag, json_object), bit 3 strict, bit 4 any_whitespace, and bits 5-7 seed the walk.
// Against a raw vocabulary of 96 printable characters and <eos> in a model vocabulary of 100: Compile either
// refuses with InvalidArgument naming the field, or gives a grammar whose matcher, walked up to 48 steps through
// ids its mask allows, accepts every id it allowed, never allows a padding id, and allows <eos> exactly where it
// may end. No input may crash, hang or exhaust memory (the compile deadline bounds the time).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "structured/structured.h"
#include "tests/structured/char_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace st = strata::structured;

constexpr int32_t kEos = st::testing::kCharEos;
constexpr int64_t kModelVocab = 100;  // ids 96-99: padding rows of the model, never allowed

std::unique_ptr<strata::tokenizer::Tokenizer> MakeTokenizer() {
  auto tokenizer = strata::tokenizer::Tokenizer::FromJson(st::testing::CharVocabularyJson());
  if (!tokenizer.ok()) std::abort();
  return *std::move(tokenizer);
}

bool Allowed(const std::vector<int32_t>& mask, int64_t id) {
  return (static_cast<uint32_t>(mask[static_cast<size_t>(id / 32)]) >> (id % 32)) & 1u;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<strata::tokenizer::Tokenizer> tokenizer = MakeTokenizer();
  static const std::unique_ptr<st::Compiler> compiler = [] {
    st::CompilerOptions options;
    options.max_compile_time = std::chrono::milliseconds(2000);
    options.max_constraint_bytes = 4096;
    options.cache_bytes = 64 << 20;
    auto made = st::Compiler::Create(*tokenizer, kModelVocab, {kEos}, options);
    if (!made.ok()) std::abort();
    return *std::move(made);
  }();
  if (size == 0) return 0;
  const uint8_t control = data[0];
  st::Constraint c;
  const st::ConstraintKind kinds[] = {st::ConstraintKind::kJsonSchema,    st::ConstraintKind::kRegex,
                                      st::ConstraintKind::kChoice,        st::ConstraintKind::kGrammar,
                                      st::ConstraintKind::kStructuralTag, st::ConstraintKind::kJsonObject,
                                      st::ConstraintKind::kJsonSchema,    st::ConstraintKind::kRegex};
  c.kind = kinds[control & 7];
  c.strict = (control & 8) != 0;
  c.any_whitespace = (control & 16) != 0;
  c.field = "fuzz";
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (c.kind == st::ConstraintKind::kChoice) {
    c.choices = absl::StrSplit(text, '\n');
  } else {
    c.text = text;
  }
  auto grammar = compiler->Compile(c);
  if (!grammar.ok()) {
    if (grammar.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (grammar.status().message().find("fuzz") == std::string::npos) std::abort();  // the field is named
    return 0;
  }
  st::Matcher matcher(*grammar);
  std::mt19937 random(control >> 5);
  std::vector<int32_t> mask(static_cast<size_t>(st::MaskWords(kModelVocab)));
  for (int step = 0; step < 48 && !matcher.Ended(); ++step) {
    matcher.FillMask(mask.data());
    std::vector<int32_t> ids;
    for (int64_t id = 0; id < kModelVocab; ++id) {
      if (!Allowed(mask, id)) continue;
      if (id > kEos) std::abort();  // a padding row allowed
      ids.push_back(static_cast<int32_t>(id));
    }
    if (Allowed(mask, kEos) != matcher.CanEnd()) std::abort();
    if (ids.empty()) break;
    const int32_t id = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(random)];
    if (!matcher.Accept(id)) std::abort();  // it allowed the id
  }
  return 0;
}
