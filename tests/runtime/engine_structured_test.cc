// Structured outputs in the engine over the tiny random Llama of engine_fixture.h (two stages, vocab 96): with a
// grammar every generated token is one it allows, the sequence ends exactly where the grammar ends (its EOS),
// masks are filled beside the forward passes, preemption and the prefix cache change nothing, and a stop string
// inside the constrained text does not cut it. A raw vocabulary (one printable ASCII character per id, <eos> last)
// is built by the test, so the output text is the ids' characters.

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/engine/batch_generate.h"
#include "runtime/engine/engine.h"
#include "structured/structured.h"
#include "tests/runtime/engine_fixture.h"
#include "tests/structured/char_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace strata::runtime {
namespace {

constexpr int32_t kEos = structured::testing::kCharEos;  // ids 0-94: ' ' .. '~'

std::unique_ptr<tokenizer::Tokenizer> CharTokenizer() {
  auto tokenizer = tokenizer::Tokenizer::FromJson(structured::testing::CharVocabularyJson());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

std::string Text(const std::vector<GeneratedToken>& tokens) {
  std::string text;
  for (const GeneratedToken& t : tokens) {
    if (t.id < 95) text += static_cast<char>(' ' + t.id);
  }
  return text;
}

struct Fixture {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<structured::Compiler> compiler;
  std::unique_ptr<Engine> engine;

  explicit Fixture(int64_t max_batch = 4, int64_t kv_blocks = 0, EngineOptions options = {}) {
    model = LoadPlan(WriteTinyLlama(), kTwoStageMap, {{0, {false, 0}}, {1, {false, 0}}}, max_batch, 64, kv_blocks);
    tokenizer = CharTokenizer();
    if (!model || !tokenizer) return;
    auto made = structured::Compiler::Create(*tokenizer, kVocab, {kEos}, structured::CompilerOptions{});
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) compiler = *std::move(made);
    auto started = Engine::Start(*model, tokenizer.get(), {kEos}, options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) engine = *std::move(started);
  }
  std::shared_ptr<const structured::Grammar> Compile(structured::ConstraintKind kind, std::string text) {
    structured::Constraint c;
    c.kind = kind;
    c.text = std::move(text);
    c.field = "test";
    auto grammar = compiler->Compile(c);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    return grammar.ok() ? *grammar : nullptr;
  }
};

GenerationRequest Request(std::vector<int32_t> prompt, std::shared_ptr<const structured::Grammar> grammar,
                          float temperature, uint64_t seed, int32_t max_new_tokens = 40) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.max_new_tokens = max_new_tokens;
  r.grammar = std::move(grammar);
  return r;
}

TEST(EngineStructured, EveryTokenIsAllowedAndTheSequenceEndsWithTheGrammar) {
  Fixture f;
  ASSERT_TRUE(f.engine && f.compiler);
  auto grammar = f.Compile(structured::ConstraintKind::kRegex, "[a-z]{2,6}-[0-9]{2}(!|\\?)");
  ASSERT_TRUE(grammar);
  const std::regex whole("[a-z]{2,6}-[0-9]{2}(!|\\?)");
  Collector c;
  int submitted = 0;
  for (int i = 0; i < 12; ++i) {
    // Greedy and temperature-1 rows, constrained and free, in the same micro-batches.
    const bool constrained = i % 3 != 2;
    auto r = Request({1 + i, 5, 9 + i}, constrained ? grammar : nullptr, i % 2 == 0 ? 0.f : 1.f, 100 + i);
    r.sampling.top_logprobs = 2;
    ASSERT_TRUE(f.engine->Submit(r, c.For(i)).ok());
    ++submitted;
  }
  c.Wait(submitted);
  for (int i = 0; i < 12; ++i) {
    std::vector<GeneratedToken> tokens;
    for (const auto& chunk : c.chunks[i]) tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
    if (i % 3 == 2) {
      EXPECT_EQ(c.Reason(i), FinishReason::kLength) << i;  // free rows of this model never pick id 95 first
      continue;
    }
    ASSERT_EQ(c.Reason(i), FinishReason::kEos) << i << ": " << Text(tokens);
    EXPECT_EQ(tokens.back().id, kEos);
    EXPECT_TRUE(std::regex_match(Text(tokens), whole)) << i << ": " << Text(tokens);
    for (const GeneratedToken& t : tokens) {
      // Log-probabilities of the masked distribution: the token's finite, at most 0; a forbidden alternative's -inf
      // (where the grammar allows a single id, the second best is one it forbids).
      EXPECT_LE(t.logprob, 1e-6);
      ASSERT_FALSE(t.top.empty());
      EXPECT_TRUE(std::isfinite(t.top[0].second));
      for (const auto& [id, logprob] : t.top) EXPECT_TRUE(std::isfinite(logprob) || logprob < 0) << id;
    }
  }
  const EngineStats stats = StatsWhenIdle(*f.engine);
  EXPECT_GT(stats.masks_filled, 0u);
}

// One grammar, the same seed: the same output alone, beside other requests, after preemption (a KV pool too small
// for everything at once makes the scheduler recompute), and from the prefix cache.
// With n-gram proposals too (verified rows preempted and recomputed, their masks per position).
class EngineStructuredRuns : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Speculating, EngineStructuredRuns, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "ngram" : "plain"; });

TEST_P(EngineStructuredRuns, OutputDoesNotDependOnBatchPreemptionOrThePrefixCache) {
  EngineOptions options;
  if (GetParam()) {
    options.speculative.method = SpeculativeOptions::Method::kNgram;
    options.speculative.min_acceptance = 0;
    options.speculative.cost_aware = false;
  }
  Fixture f(8, /*kv_blocks=*/8, options);  // 16 tokens a block: 8 sequences of up to ~45 tokens do not fit at once
  ASSERT_TRUE(f.engine && f.compiler);
  auto grammar = f.Compile(structured::ConstraintKind::kJsonSchema,
                           R"({"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"enum": ["x", "yy"]}},
                               "required": ["n", "tag"], "additionalProperties": false})");
  ASSERT_TRUE(grammar);
  std::vector<int32_t> prompt;  // 20 tokens: its first block (16) is cached after the first run
  for (int32_t i = 0; i < 20; ++i) prompt.push_back((3 + 5 * i) % 90);
  Collector alone;
  ASSERT_TRUE(f.engine->Submit(Request(prompt, grammar, 1.f, 7), alone.For(0)).ok());
  alone.Wait(1);
  Collector crowd;
  for (int i = 0; i < 8; ++i) {
    auto r = i == 3 ? Request(prompt, grammar, 1.f, 7) : Request({2 + i, 4, 6 + i, 1, 1}, grammar, 1.f, 50 + i);
    ASSERT_TRUE(f.engine->Submit(r, crowd.For(i)).ok());
  }
  crowd.Wait(8);
  EXPECT_EQ(crowd.Ids(3), alone.Ids(0));
  for (int i = 0; i < 8; ++i) {
    if (crowd.Reason(i) != FinishReason::kEos) continue;
    std::vector<GeneratedToken> tokens;
    for (const auto& chunk : crowd.chunks[i]) tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
    const nlohmann::json parsed = nlohmann::json::parse(Text(tokens), nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(parsed.is_object()) << Text(tokens);
    EXPECT_TRUE(parsed.contains("n") && parsed["n"].is_number_integer()) << Text(tokens);
    EXPECT_TRUE(parsed.contains("tag")) << Text(tokens);
  }
  const EngineStats stats = StatsWhenIdle(*f.engine);
  EXPECT_GT(stats.preemptions, 0u);
  EXPECT_GT(stats.prefix_hit_tokens, 0u);
  if (GetParam()) EXPECT_GT(stats.spec_proposed_tokens, 0u);
}

// A stop string that occurs inside the constrained text does not end it; the grammar's end does.
TEST(EngineStructured, AStopStringInsideTheGrammarDoesNotCutIt) {
  Fixture f;
  ASSERT_TRUE(f.engine && f.compiler);
  auto grammar = f.Compile(structured::ConstraintKind::kRegex, "a,b,c,d");
  ASSERT_TRUE(grammar);
  auto r = Request({4, 4}, grammar, 0.f, 1);
  r.sampling.stop = {","};
  Collector c;
  ASSERT_TRUE(f.engine->Submit(r, c.For(0)).ok());
  c.Wait(1);
  std::string text;
  for (const auto& chunk : c.chunks[0]) text += chunk.text;
  EXPECT_EQ(text, "a,b,c,d");
  EXPECT_EQ(c.Reason(0), FinishReason::kEos);
}

// Jump-forward is exact: where the grammar allows one id the engine appends it without a forward pass, and the ids
// (and, seeded, the samples after them) are those of decoding without it.
TEST(EngineStructured, JumpForwardGivesTheIdsOfDecodingWithoutIt) {
  EngineOptions jumping;
  jumping.jump_forward = true;
  Fixture plain(4), jump(4, 0, jumping);
  ASSERT_TRUE(plain.engine && jump.engine);
  const std::string pattern = "(yes|no)-[0-9]{2}-fixed tail [a-c]{1,3}\\.";
  auto g1 = plain.Compile(structured::ConstraintKind::kRegex, pattern);
  auto g2 = jump.Compile(structured::ConstraintKind::kRegex, pattern);
  ASSERT_TRUE(g1 && g2);
  Collector a, b;
  for (int i = 0; i < 4; ++i) {
    auto r1 = Request({2 + i, 7, 11}, g1, i % 2 == 0 ? 0.f : 1.f, 300 + i);
    auto r2 = Request({2 + i, 7, 11}, g2, i % 2 == 0 ? 0.f : 1.f, 300 + i);
    r1.sampling.top_logprobs = r2.sampling.top_logprobs = 1;
    ASSERT_TRUE(plain.engine->Submit(r1, a.For(i)).ok());
    ASSERT_TRUE(jump.engine->Submit(r2, b.For(i)).ok());
  }
  a.Wait(4);
  b.Wait(4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a.Ids(i), b.Ids(i)) << i;
    EXPECT_EQ(a.Reason(i), FinishReason::kEos) << i;
    EXPECT_EQ(b.Reason(i), FinishReason::kEos) << i;
    std::vector<double> la, lb;
    for (const auto& chunk : a.chunks[i]) {
      for (const auto& t : chunk.tokens) la.push_back(t.logprob);
    }
    for (const auto& chunk : b.chunks[i]) {
      for (const auto& t : chunk.tokens) lb.push_back(t.logprob);
    }
    ASSERT_EQ(la.size(), lb.size());
    for (size_t k = 0; k < la.size(); ++k) EXPECT_NEAR(la[k], lb[k], 1e-5) << i << " token " << k;
  }
  const EngineStats with = StatsWhenIdle(*jump.engine);
  const EngineStats without = StatsWhenIdle(*plain.engine);
  EXPECT_GT(with.forced_tokens, 4u * 10);  // "-fixed tail " and more, in every request
  EXPECT_EQ(without.forced_tokens, 0u);
  EXPECT_LT(with.micro_batches_run, without.micro_batches_run);
}

// Speculative decoding under a grammar: each verified position has the mask of the grammar's state after the
// proposals before it (the mask thread accepts them in turn, then rolls the matcher back), a proposal is cut after the
// first token the grammar refuses, and the ids are those of decoding without it: n-gram proposals greedy and seeded,
// the target as its own draft greedy (sampled: reproducible), with and without jump-forward.
TEST(EngineStructured, SpeculationGivesTheIdsOfDecodingWithoutIt) {
  SpeculativeOptions ngram;
  ngram.method = SpeculativeOptions::Method::kNgram;
  ngram.tokens = 4;
  ngram.min_acceptance = 0;
  ngram.cost_aware = false;
  SpeculativeOptions drafted = ngram;
  drafted.method = SpeculativeOptions::Method::kDraft;
  drafted.draft_model = "(loaded by the test)";
  auto draft = LoadPlan(WriteTinyLlama(), kTwoStageMap, {{0, {false, 0}}, {1, {false, 0}}}, 4, 64);
  ASSERT_TRUE(draft);
  EngineOptions with_ngram, with_draft, with_both;
  with_ngram.speculative = ngram;
  with_draft.speculative = drafted;
  with_draft.draft = draft.get();
  with_both = with_ngram;
  with_both.jump_forward = true;
  // Items the random model repeats once the mask leaves it little choice: the n-gram lookup finds them.
  const std::string schema = R"({"type": "array", "items": {"enum": ["abc", "abd", "xyz"]}, "minItems": 5,
                                 "maxItems": 9})";
  struct Run {
    std::map<int, std::vector<int32_t>> ids;
    std::map<int, FinishReason> reasons;
    EngineStats stats;
  };
  auto run = [&](const EngineOptions& options) {
    Fixture f(4, 0, options);
    Run out;
    EXPECT_TRUE(f.engine && f.compiler);
    if (!f.engine || !f.compiler) return out;
    auto grammar = f.Compile(structured::ConstraintKind::kJsonSchema, schema);
    Collector c;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> prompt = {2 + i};  // then ["abc","abd","abc"] in the character vocabulary
      for (const char ch : std::string(R"(["abc","abd","abc"])")) prompt.push_back(ch - ' ');
      auto r = Request(prompt, grammar, i % 2 == 0 ? 0.f : 0.9f, 400 + i, 60);
      EXPECT_TRUE(f.engine->Submit(r, c.For(i)).ok());
    }
    c.Wait(4);
    for (int i = 0; i < 4; ++i) {
      out.ids[i] = c.Ids(i);
      out.reasons[i] = c.Reason(i);
    }
    out.stats = StatsWhenIdle(*f.engine);
    return out;
  };
  const Run plain = run({});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(plain.reasons.at(i), FinishReason::kEos) << i;
  for (const auto& [what, options] : {std::pair<std::string, EngineOptions>{"n-gram", with_ngram},
                                      {"n-gram with jump-forward", with_both},
                                      {"draft", with_draft}}) {
    const Run spec = run(options);
    for (int i = 0; i < 4; ++i) {
      if (what == "draft" && i % 2 == 1) continue;  // sampled drafts are verified by rejection: below
      EXPECT_EQ(spec.ids.at(i), plain.ids.at(i)) << what << ", request " << i;
      EXPECT_EQ(spec.reasons.at(i), plain.reasons.at(i)) << what << ", request " << i;
    }
    EXPECT_GT(spec.stats.spec_accepted_tokens, 0u) << what;
    // (The draft's sampled requests make other outputs, of other lengths.)
    if (what != "draft") EXPECT_LT(spec.stats.micro_batches_run, plain.stats.micro_batches_run) << what;
    if (what == "draft") {
      // The target as its own draft, under the grammar's masks: right every time, greedy or sampled.
      EXPECT_EQ(spec.stats.spec_accepted_tokens, spec.stats.spec_proposed_tokens);
      const Run again = run(options);
      for (int i = 1; i < 4; i += 2) EXPECT_EQ(again.ids.at(i), spec.ids.at(i)) << "draft, sampled, request " << i;
    }
  }
}

}  // namespace
}  // namespace strata::runtime
