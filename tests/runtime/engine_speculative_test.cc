// Speculative decoding in the engine (issue 44; runtime/engine/speculation.h): n-gram proposals verified as chunks
// must leave every request's ids exactly those of decoding without them, greedy and seeded sampling alike, on a
// two-stage plan with micro-batches pipelined, under preemption, and with the logprobs of each token.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "runtime/engine/batch_generate.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/loaded_model.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

// Prompts whose continuations the tiny random model repeats (it falls into cycles), so that proposals are made and
// many accepted, and one without any repetition.
std::vector<std::vector<int32_t>> Prompts() {
  return {{1, 5, 9, 1, 5, 9, 1, 5}, {4}, {7, 7, 2, 3, 11, 40, 41, 7, 7, 2}, {90, 3}, {12, 13, 14, 15, 16, 17, 18}};
}

struct Outputs {
  std::vector<std::vector<GeneratedToken>> tokens;
  std::vector<FinishReason> reasons;
  EngineStats stats;
};

Outputs Generate(LoadedModel& model, const SamplingParams& sampling, const SpeculativeOptions& speculative,
                 int64_t micro_batches, LoadedModel* draft = nullptr) {
  EngineOptions options;
  options.micro_batches = micro_batches;
  options.speculative = speculative;
  options.draft = draft;
  auto engine = Engine::Start(model, nullptr, {}, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  Outputs run;
  if (!engine.ok()) return run;
  Collector c;
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.sampling = sampling;
    if (sampling.seed) r.sampling.seed = *sampling.seed + i;
    EXPECT_TRUE((*engine)->Submit(r, c.For(static_cast<int>(i))).ok());
  }
  c.Wait(static_cast<int>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<GeneratedToken> tokens;
    for (const GenerationChunk& chunk : c.chunks[static_cast<int>(i)]) {
      tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
    }
    run.tokens.push_back(std::move(tokens));
    run.reasons.push_back(c.Reason(static_cast<int>(i)));
  }
  run.stats = StatsWhenIdle(**engine);
  return run;
}

std::vector<int32_t> Ids(const std::vector<GeneratedToken>& tokens) {
  std::vector<int32_t> ids;
  for (const GeneratedToken& t : tokens) ids.push_back(t.id);
  return ids;
}

// Proposing whenever acceptance allows, whatever the passes cost (the cost-aware switch depends on timings: the
// counts these tests compare must not).
SpeculativeOptions Ngram(int32_t tokens) {
  SpeculativeOptions o;
  o.method = SpeculativeOptions::Method::kNgram;
  o.tokens = tokens;
  o.cost_aware = false;
  return o;
}

// Proposing at every step, however few are accepted (no adaptive pause): every step of a sampled run is verified.
SpeculativeOptions NgramAlways(int32_t tokens) {
  SpeculativeOptions o = Ngram(tokens);
  o.min_acceptance = 0;
  return o;
}

void ExpectSameTokens(const Outputs& expected, const Outputs& got, const std::string& what) {
  ASSERT_EQ(got.tokens.size(), expected.tokens.size());
  for (size_t i = 0; i < expected.tokens.size(); ++i) {
    EXPECT_EQ(Ids(got.tokens[i]), Ids(expected.tokens[i])) << what << ", prompt " << i;
    EXPECT_EQ(got.reasons[i], expected.reasons[i]) << what << ", prompt " << i;
    ASSERT_EQ(got.tokens[i].size(), expected.tokens[i].size());
    for (size_t j = 0; j < expected.tokens[i].size(); ++j) {
      // A verified position's logits come from a chunk, a decode step's from one row: the same up to rounding.
      EXPECT_NEAR(got.tokens[i][j].logprob, expected.tokens[i][j].logprob, 1e-4) << what << ", prompt " << i;
      ASSERT_EQ(got.tokens[i][j].top.size(), expected.tokens[i][j].top.size());
      for (size_t k = 0; k < expected.tokens[i][j].top.size(); ++k) {
        EXPECT_EQ(got.tokens[i][j].top[k].first, expected.tokens[i][j].top[k].first) << what << ", prompt " << i;
      }
    }
  }
}

TEST(EngineSpeculative, GreedyIdsAndLogprobsAreThoseOfDecodingWithoutIt) {
  auto model = Load(4);  // two stages
  ASSERT_TRUE(model);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  greedy.top_logprobs = 3;
  const Outputs plain = Generate(*model, greedy, {}, 2);
  EXPECT_EQ(plain.stats.spec_proposed_tokens, 0u);
  for (int32_t k : {1, 3, 8}) {
    for (int64_t micro_batches : {1, 2}) {
      const Outputs spec = Generate(*model, greedy, Ngram(k), micro_batches);
      const std::string what = "k " + std::to_string(k) + ", micro_batches " + std::to_string(micro_batches);
      ExpectSameTokens(plain, spec, what);
      // The test means something: proposals were made, some kept and some not.
      EXPECT_GE(spec.stats.spec_accepted_tokens, 8u) << what;
      EXPECT_LT(spec.stats.spec_accepted_tokens, spec.stats.spec_proposed_tokens) << what;
      EXPECT_LT(spec.stats.micro_batches_run, plain.stats.micro_batches_run) << what;
      EXPECT_EQ(spec.stats.kv_used, 0) << what;
      EXPECT_EQ(spec.stats.kv_free + spec.stats.kv_cached, spec.stats.kv_blocks) << what;
    }
  }
}

TEST(EngineSpeculative, SeededSamplingGivesTheIdsOfDecodingWithoutIt) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  SamplingParams sampled;
  sampled.max_new_tokens = 40;
  sampled.temperature = 0.7f;
  sampled.top_k = 20;
  sampled.top_p = 0.95f;
  sampled.seed = 77;
  const Outputs plain = Generate(*model, sampled, {}, 2);
  const Outputs spec = Generate(*model, sampled, NgramAlways(4), 2);
  ExpectSameTokens(plain, spec, "seeded");
  EXPECT_GE(spec.stats.spec_accepted_tokens, 1u);
  EXPECT_LT(spec.stats.micro_batches_run, plain.stats.micro_batches_run);
  // Another seed samples otherwise (the comparison can fail).
  sampled.seed = 78;
  EXPECT_NE(Ids(Generate(*model, sampled, Ngram(4), 2).tokens[0]), Ids(plain.tokens[0]));
}

TEST(EngineSpeculative, EndsExactlyAtMaxTokensAndEos) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  SamplingParams greedy;
  greedy.max_new_tokens = 13;
  const Outputs plain = Generate(*model, greedy, {}, 1);
  const Outputs spec = Generate(*model, greedy, Ngram(6), 1);
  ExpectSameTokens(plain, spec, "max_new_tokens 13");
  for (const auto& tokens : spec.tokens) EXPECT_EQ(tokens.size(), 13u);
  // An EOS id the greedy run reaches in the middle of a repeated span ends it there, proposals or not.
  const int32_t eos = plain.tokens[0].at(9).id;
  EngineOptions options;
  options.speculative = Ngram(6);
  auto engine = Engine::Start(*model, nullptr, {eos}, options);
  ASSERT_TRUE(engine.ok());
  auto out = GenerateBatch(**engine, {Prompts()[0]}, greedy);
  ASSERT_TRUE(out.ok()) << out.status();
  size_t first = 0;
  while (plain.tokens[0][first].id != eos) ++first;
  EXPECT_EQ((*out)[0].finish, FinishReason::kEos);
  EXPECT_EQ((*out)[0].tokens.size(), first + 1);
}

TEST(EngineSpeculative, MinTokensProposesWithinItsEosBan) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  SamplingParams greedy;
  greedy.max_new_tokens = 30;
  const Outputs free = Generate(*model, greedy, {}, 1);
  // An id the greedy run says early and often: before min_tokens it is banned at every verified position.
  const int32_t eos = free.tokens[0].at(3).id;
  auto run = [&](const SpeculativeOptions& speculative, int32_t min_tokens) {
    EngineOptions options;
    options.speculative = speculative;
    auto engine = Engine::Start(*model, nullptr, {eos}, options);
    EXPECT_TRUE(engine.ok());
    SamplingParams p = greedy;
    p.min_tokens = min_tokens;
    auto out = GenerateBatch(**engine, Prompts(), p);
    EXPECT_TRUE(out.ok()) << out.status();
    return std::make_pair(*std::move(out), StatsWhenIdle(**engine));
  };
  // Below 30 the ban ends mid-output (the EOS id comes back every few tokens), some proposal across its end; at 30
  // every proposal is made under it.
  for (int32_t min_tokens = 10; min_tokens <= 30; ++min_tokens) {
    const auto [plain, plain_stats] = run({}, min_tokens);
    const auto [spec, spec_stats] = run(NgramAlways(6), min_tokens);
    ASSERT_EQ(spec.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(Ids(spec[i].tokens), Ids(plain[i].tokens)) << "min_tokens " << min_tokens << ", prompt " << i;
      EXPECT_EQ(spec[i].finish, plain[i].finish) << "min_tokens " << min_tokens << ", prompt " << i;
    }
    EXPECT_GE(plain[0].tokens.size(), static_cast<size_t>(min_tokens));
    EXPECT_GT(spec_stats.spec_accepted_tokens, 0u) << "min_tokens " << min_tokens;
  }
}

TEST(EngineSpeculative, RequestsThatMustNotProposeDoNot) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  SamplingParams off;
  off.max_new_tokens = 30;
  off.speculative = false;
  EXPECT_EQ(Generate(*model, off, Ngram(4), 2).stats.spec_proposed_tokens, 0u);
}

TEST(EngineSpeculative, PreemptionLeavesTheIdsAlone) {
  // A KV pool too small for every sequence at once: sequences are preempted and recomputed.
  auto model = LoadPlan(WriteTinyLlama(), kTwoStageMap, {{0, {false, 0}}, {1, {false, 0}}}, 4, 64, /*kv_blocks=*/6);
  ASSERT_TRUE(model);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  const Outputs plain = Generate(*model, greedy, {}, 2);
  const Outputs spec = Generate(*model, greedy, Ngram(4), 2);
  ExpectSameTokens(plain, spec, "small KV pool");
  EXPECT_GT(spec.stats.preemptions, 0u);
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0u);
}

// A draft model (draft_model.h).
SpeculativeOptions Draft(int32_t tokens) {
  SpeculativeOptions o;
  o.method = SpeculativeOptions::Method::kDraft;
  o.draft_model = "(loaded by the test)";
  o.tokens = tokens;
  o.min_acceptance = 0;
  o.cost_aware = false;
  return o;
}

// A one-layer Llama of the tiny model's vocabulary, on one stage: a draft that agrees with the target sometimes.
std::unique_ptr<LoadedModel> LoadSmallDraft(int64_t max_batch, int64_t kv_blocks = 0) {
  LlamaDims dims;
  dims.layers = 1;
  static const std::filesystem::path dir = WriteLlama(dims, "engine_draft");
  return LoadPlan(dir, R"({"model.embed_tokens": 0, "model.layers.0": 0, "model.norm": 0, "lm_head": 0})",
                  {{0, {false, 0}}}, max_batch, 64, kv_blocks);
}

TEST(EngineDraftModel, PenalisedRequestsProposeAndKeepTheIdsOfDecodingWithoutIt) {
  auto model = Load(4);
  auto draft = Load(4);
  ASSERT_TRUE(model && draft);
  SamplingParams base;
  base.max_new_tokens = 30;
  const Outputs unpenalised = Generate(*model, base, {}, 2);
  struct Case {
    const char* what;
    float repetition, frequency, presence;
  };
  for (const Case& c : {Case{"repetition", 1.3f, 0, 0}, Case{"frequency", 1, 0.4f, 0}, Case{"presence", 1, 0, 0.6f},
                        Case{"all three", 1.2f, 0.3f, 0.3f}}) {
    for (const bool sampled : {false, true}) {
      SamplingParams p = base;
      p.repetition_penalty = c.repetition;
      p.frequency_penalty = c.frequency;
      p.presence_penalty = c.presence;
      if (sampled) {
        p.temperature = 0.8f;
        p.seed = 5;
      }
      const std::string what = std::string(c.what) + (sampled ? ", sampled" : ", greedy");
      const Outputs plain = Generate(*model, p, {}, 2);
      // Each verified position counts the proposals before it (BatchRow::penalty_pending): its penalties are those
      // of the decode step there. n-gram proposals copy ids the context has; the target as its own (unpenalised)
      // draft proposes ids it may not have, and is right wherever the penalty does not change the choice.
      const Outputs ngram = Generate(*model, p, NgramAlways(4), 2);
      ExpectSameTokens(plain, ngram, what + ", n-gram");
      EXPECT_GT(ngram.stats.spec_proposed_tokens, 0u) << what;
      const Outputs drafted = Generate(*model, p, Draft(4), 2, draft.get());
      if (sampled) {
        // A sampled draft is verified by rejection: distributed as the target (SamplerRejection), reproducible by
        // seed, not the ids of decoding without it.
        ExpectSameTokens(drafted, Generate(*model, p, Draft(4), 2, draft.get()), what + ", draft, again");
      } else {
        ExpectSameTokens(plain, drafted, what + ", draft");
      }
      EXPECT_GT(drafted.stats.spec_accepted_tokens, 0u) << what;
      EXPECT_LT(drafted.stats.spec_accepted_tokens, drafted.stats.spec_proposed_tokens) << what;
      if (!sampled) {
        // The penalty changes what the model says (the comparison can fail).
        size_t differ = 0;
        for (size_t i = 0; i < plain.tokens.size(); ++i) differ += Ids(plain.tokens[i]) != Ids(unpenalised.tokens[i]);
        EXPECT_GT(differ, 0u) << what;
      }
    }
  }
}

TEST(EngineDraftModel, TheTargetAsItsOwnDraftIsAlwaysRightAndChangesNoId) {
  auto model = Load(4);
  auto draft = Load(4);  // the target itself, loaded again as its own draft
  ASSERT_TRUE(model && draft);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  greedy.top_logprobs = 2;
  const Outputs plain = Generate(*model, greedy, {}, 2);
  const Outputs spec = Generate(*model, greedy, Draft(4), 2, draft.get());
  ExpectSameTokens(plain, spec, "the target as its draft");
  EXPECT_EQ(spec.stats.spec_method, "draft");
  EXPECT_GE(spec.stats.spec_proposed_tokens, 100u);
  // Its cache follows each sequence exactly: every proposal is the target's own choice.
  EXPECT_EQ(spec.stats.spec_accepted_tokens, spec.stats.spec_proposed_tokens);
  EXPECT_LT(spec.stats.micro_batches_run, plain.stats.micro_batches_run / 2);
  EXPECT_EQ(spec.stats.kv_used, 0);
}

TEST(EngineDraftModel, GreedyIdsAreThoseOfDecodingWithoutItWithAnotherDraft) {
  auto model = Load(4);
  auto draft = LoadSmallDraft(4);
  ASSERT_TRUE(model && draft);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  const Outputs plain = Generate(*model, greedy, {}, 2);
  for (int32_t k : {1, 3, 6}) {
    const Outputs spec = Generate(*model, greedy, Draft(k), 2, draft.get());
    ExpectSameTokens(plain, spec, "k " + std::to_string(k));
    EXPECT_GT(spec.stats.spec_proposed_tokens, 0u) << k;
    EXPECT_EQ(spec.stats.kv_used, 0) << k;
  }
}

TEST(EngineDraftModel, SampledRequestsAreReproducibleBySeedAndKeepSomeProposals) {
  auto model = Load(4);
  auto draft = Load(4);  // the target itself, loaded again as its own draft
  ASSERT_TRUE(model && draft);
  SamplingParams sampled;
  sampled.max_new_tokens = 30;
  sampled.temperature = 0.8f;
  sampled.top_k = 30;
  sampled.seed = 5;
  const Outputs first = Generate(*model, sampled, Draft(3), 2, draft.get());
  const Outputs again = Generate(*model, sampled, Draft(3), 1, draft.get());
  for (size_t i = 0; i < first.tokens.size(); ++i) {
    EXPECT_EQ(Ids(first.tokens[i]), Ids(again.tokens[i])) << "prompt " << i;
    EXPECT_EQ(first.tokens[i].size(), 30u);
  }
  // q = p (the target is its own draft): Leviathan's rule keeps every proposal.
  EXPECT_EQ(first.stats.spec_accepted_tokens, first.stats.spec_proposed_tokens);
  EXPECT_GT(first.stats.spec_proposed_tokens, 50u);
  sampled.seed = 6;
  EXPECT_NE(Ids(Generate(*model, sampled, Draft(3), 2, draft.get()).tokens[0]), Ids(first.tokens[0]));
}

TEST(EngineSpeculative, TheCostAwareSwitchChangesNoId) {
  // Whether a step proposes follows measured times here: whatever it decides, the ids are decoding's.
  auto model = Load(4);
  auto draft = LoadSmallDraft(4);
  ASSERT_TRUE(model && draft);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  const Outputs plain = Generate(*model, greedy, {}, 2);
  SpeculativeOptions ngram = Ngram(4);
  ngram.cost_aware = true;
  const Outputs spec = Generate(*model, greedy, ngram, 2);
  ExpectSameTokens(plain, spec, "ngram, cost-aware");
  EXPECT_GT(spec.stats.spec_proposed_tokens + spec.stats.spec_skipped_steps, 0u);
  SpeculativeOptions drafted = Draft(3);
  drafted.cost_aware = true;
  ExpectSameTokens(plain, Generate(*model, greedy, drafted, 2, draft.get()), "draft, cost-aware");
}

TEST(EngineDraftModel, PreemptionLeavesTheIdsAlone) {
  auto model = LoadPlan(WriteTinyLlama(), kTwoStageMap, {{0, {false, 0}}, {1, {false, 0}}}, 4, 64, /*kv_blocks=*/6);
  auto draft = LoadSmallDraft(4, /*kv_blocks=*/6);
  ASSERT_TRUE(model && draft);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  const Outputs plain = Generate(*model, greedy, {}, 2);
  const Outputs spec = Generate(*model, greedy, Draft(4), 2, draft.get());
  ExpectSameTokens(plain, spec, "small KV pool");
  EXPECT_GT(spec.stats.preemptions, 0u);
  EXPECT_GT(spec.stats.spec_proposed_tokens, 0u);
}

TEST(EngineDraftModel, ADraftThatCannotShareTheBlockTablesIsRefused) {
  auto model = Load(4);
  auto small_pool = LoadSmallDraft(4, /*kv_blocks=*/3);
  ASSERT_TRUE(model && small_pool);
  EngineOptions options;
  options.speculative = Draft(4);
  options.draft = small_pool.get();
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), testing::HasSubstr("--draft-model: its KV pool has 3 blocks"));
  options.draft = nullptr;
  engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), testing::HasSubstr("no draft model was loaded"));
}

}  // namespace
}  // namespace strata::runtime
