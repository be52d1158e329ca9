// The device sampler (runtime/executor/sampler.h): batch invariance of mixed micro-batches, greedy ties,
// the edges of top_k / top_p, the zero-probability guard of the inverse CDF, per-row top logprobs. The
// comparison with transformers' own processors is in tests/sampling_parity (pytest, live).
#include "runtime/executor/sampler.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "runtime/executor/torch_info.h"

namespace strata::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

at::Tensor Logits(const std::vector<std::vector<float>>& rows) {
  const int64_t vocab = static_cast<int64_t>(rows.front().size());
  at::Tensor t = at::empty({static_cast<int64_t>(rows.size()), vocab}, at::kFloat);
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), t.data_ptr<float>() + r * vocab);
  return t;
}

// Deterministic random logits [rows, vocab], with a few exact ties and one very peaked row.
at::Tensor RandomLogits(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<std::vector<float>> values(rows, std::vector<float>(vocab));
  for (auto& row : values) {
    for (float& v : row) v = normal(gen);
    row[5] = row[17] = row[40];  // ties
  }
  if (rows > 1) values[1][33] = 80.f;  // peaked: the rest underflows to probability 0 in float32
  return Logits(values);
}

BatchRow Row(float temperature, int32_t top_k, float top_p, float penalty, double uniform, int32_t top_logprobs,
             std::vector<int32_t> context = {}) {
  BatchRow row;
  row.samples = true;
  row.sampling.temperature = temperature;
  row.sampling.top_k = top_k;
  row.sampling.top_p = top_p;
  row.sampling.repetition_penalty = penalty;
  row.sampling.uniform = uniform;
  row.sampling.top_logprobs = top_logprobs;
  row.penalty_tokens = std::move(context);  // the whole context, as a first step sends it
  row.penalty_reset = true;
  return row;
}

SamplingInputs Stage(const std::vector<BatchRow>& rows, bool pinned = false) {
  std::vector<const BatchRow*> pointers;
  for (const BatchRow& row : rows) pointers.push_back(&row);
  return StageSamplingInputs(pointers, pinned);
}

std::vector<GeneratedToken> Sample(const at::Tensor& logits, const std::vector<BatchRow>& rows) {
  SamplingInputs inputs = Stage(rows, logits.is_cuda());
  PendingSamples pending = SampleAsync(logits, inputs);
  return FinishSamples(pending, inputs);
}

std::vector<BatchRow> MixedRows() {
  return {
      Row(0, 0, 1, 1, 0.3, 0),                             // greedy
      Row(0.8f, 0, 1, 1, 0.42, 3),                         // temperature only (on the peaked row)
      Row(0, 0, 1, 1.3f, 0.9, 2, {1, 2, 3, 40, 40, 7}),    // greedy + penalty
      Row(0.7f, 20, 1, 1, 0.77, 0),                        // top_k
      Row(1.0f, 0, 0.9f, 1, 0.123, 5),                     // top_p
      Row(1.3f, 50, 0.8f, 1.2f, 0.999, 1, {9, 8, 5, 17}),  // everything
      Row(0.5f, 1, 1, 1, 0.5, 0),                          // top_k 1: greedy by another road
      Row(2.0f, 0, 1, 0.7f, 0.01, 4, {0, 1, 2, 3, 4, 5}),  // penalty < 1 rewards the context
  };
}

void ExpectSameToken(const GeneratedToken& a, const GeneratedToken& b, const std::string& what) {
  EXPECT_EQ(a.id, b.id) << what;
  EXPECT_EQ(a.logprob, b.logprob) << what;
  EXPECT_EQ(a.top, b.top) << what;
}

TEST(Sampler, MixedBatchRowsEqualEachRowSampledAlone) {
  const std::vector<BatchRow> rows = MixedRows();
  at::Tensor logits = RandomLogits(static_cast<int64_t>(rows.size()), 1000, 7);
  const std::vector<GeneratedToken> together = Sample(logits, rows);
  const at::Tensor scores = ProcessedScores(logits, Stage(rows));
  ASSERT_EQ(together.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const at::Tensor one = logits.narrow(0, static_cast<int64_t>(r), 1).clone();
    const std::vector<GeneratedToken> alone = Sample(one, {rows[r]});
    ExpectSameToken(together[r], alone[0], "row " + std::to_string(r));
    EXPECT_TRUE(at::equal(scores.narrow(0, static_cast<int64_t>(r), 1), ProcessedScores(one, Stage({rows[r]}))))
        << "row " << r;
  }
}

TEST(Sampler, GreedyTiesTakeTheFirstIndexAsTorchArgmax) {
  at::Tensor logits = Logits({{1, 5, 2, 5, 5}, {3, 1, 6, 0, 3}});
  // Row 1: a penalty of 2 on token 2 (6 -> 3) ties it with tokens 0 and 4: token 0 wins.
  const std::vector<GeneratedToken> tokens = Sample(logits, {Row(0, 0, 1, 1, 0.9, 0), Row(0, 0, 1, 2, 0.9, 0, {2})});
  EXPECT_EQ(tokens[0].id, 1);
  EXPECT_EQ(tokens[1].id, 0);
  const std::vector<GeneratedToken> greedy = Sample(logits, std::vector<BatchRow>(2, Row(0, 0, 1, 1, 0.5, 0)));
  EXPECT_EQ(greedy[0].id, 1);
  EXPECT_EQ(greedy[1].id, 2);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  at::Tensor logits = Logits({{2, -2, 1, 0, 4}});
  at::Tensor scores = ProcessedScores(logits, Stage({Row(0, 0, 1, 2, 0, 0, {0, 1, 1, 3, 99, -5})}));
  // Ids outside the vocabulary (99, -5) are ignored; 1 counts once however often it appears.
  EXPECT_TRUE(at::equal(scores, Logits({{1, -4, 1, 0, 4}})));
}

// OpenAI's penalties count the generated ids only (output_tokens), each occurrence for the frequency
// penalty, once for the presence penalty; the repetition penalty still sees the prompt (penalty_tokens).
TEST(Sampler, FrequencyAndPresencePenaltiesSubtractPerGeneratedOccurrence) {
  at::Tensor logits = Logits({{2, -2, 1, 0, 4}, {2, -2, 1, 0, 4}});
  BatchRow openai = Row(0, 0, 1, 1, 0, 0);
  openai.sampling.frequency_penalty = 0.5f;
  openai.sampling.presence_penalty = 0.25f;
  openai.output_tokens = {4, 4, 4, 1, 99};  // 99: outside the vocabulary, ignored
  BatchRow both = openai;
  both.sampling.repetition_penalty = 2;
  both.penalty_tokens = {0, 4, 4, 4, 1};  // prompt {0}, then the output
  at::Tensor scores = ProcessedScores(logits, Stage({openai, both}));
  // Row 0: 4 generated 3 times: 4 - 1.5 - 0.25; 1 once: -2 - 0.5 - 0.25.
  // Row 1: the repetition penalty first (0, 1 and 4 seen: 2 / 2, -2 * 2, 4 / 2), then the same subtraction.
  EXPECT_TRUE(at::allclose(scores, Logits({{2, -2.75f, 1, 0, 2.25f}, {1, -4.75f, 1, 0, 0.25f}})));
  // Greedy on the processed scores: 4 wins unpenalised, 0 once penalised.
  std::vector<GeneratedToken> tokens = Sample(logits, {Row(0, 0, 1, 1, 0, 0), openai});
  EXPECT_EQ(tokens[0].id, 4);
  EXPECT_EQ(tokens[1].id, 4);  // 2.25 > 2
  openai.output_tokens = {4, 4, 4, 4};
  EXPECT_EQ(Sample(logits.narrow(0, 0, 1), {openai})[0].id, 0);  // 4 - 2 - 0.25 < 2
  // Log-probabilities stay those of the raw logits.
  EXPECT_NEAR(Sample(logits.narrow(0, 0, 1), {openai})[0].logprob, at::log_softmax(logits[0], 0)[0].item<float>(),
              1e-6);
}

// The counts live in the pool between steps: each step's new ids add to them; a reset starts over.
TEST(Sampler, GeneratedCountsAccumulateAcrossSteps) {
  const at::Tensor logits = RandomLogits(1, 50, 5);
  PenaltySlots slots;
  PenaltyPool pool;
  auto step = [&](std::vector<int32_t> added, bool reset) {
    BatchRow r = Row(0, 0, 1, 1, 0.5, 0);
    r.sampling.frequency_penalty = 1;
    r.sequence = 3;
    r.output_tokens = std::move(added);
    r.penalty_reset = reset;
    std::vector<const BatchRow*> pointers{&r};
    return ProcessedScores(logits, StageSamplingInputs(pointers, false, &slots), &pool);
  };
  step({}, true);
  step({7}, false);
  at::Tensor scores = step({7, 2}, false);
  at::Tensor expected = logits.clone();
  expected[0][7] -= 2;
  expected[0][2] -= 1;
  EXPECT_TRUE(at::allclose(scores, expected));
  EXPECT_TRUE(at::allclose(step({}, true), logits));
}

// OpenAI's logit_bias is added to the logits before the penalties; an id given twice gets both; -inf bans.
TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  at::Tensor logits = Logits({{2, -2, 1, 0, 4}});
  BatchRow row = Row(0, 0, 1, 2, 0, 0, {1});
  row.sampling.logit_bias = {{1, 3}, {3, -1}, {3, -0.5f}, {4, -kInf}};
  // 1: (-2 + 3) / 2 (positive after the bias: divided); 3: -1.5; 4: banned.
  at::Tensor scores = ProcessedScores(logits, Stage({row}));
  EXPECT_TRUE(at::equal(scores, Logits({{2, 0.5f, 1, -1.5f, -kInf}})));
  EXPECT_EQ(Sample(logits, {row})[0].id, 0);
  row.sampling.logit_bias = {{2, 1.5f}};
  EXPECT_EQ(Sample(logits, {row})[0].id, 4);
  row.sampling.logit_bias = {{2, 3.5f}};
  EXPECT_EQ(Sample(logits, {row})[0].id, 2);  // 4.5 > 4
}

// Prompt scoring: log_softmax of the raw logits at each target, with the top tokens of each row.
TEST(Sampler, ScoresTargetsWithTheirTopTokens) {
  const at::Tensor logits = RandomLogits(3, 50, 8);
  at::Tensor targets = at::empty({3}, at::kLong);
  targets[0] = 4;
  targets[1] = 33;
  targets[2] = 49;
  PendingSamples pending = ScoreAsync(logits, targets, 3);
  std::vector<GeneratedToken> scored = FinishScores(pending, {0, 3, 1});
  const at::Tensor expected = at::log_softmax(logits, 1);
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(scored[r].id, targets[r].item<int64_t>());
    EXPECT_NEAR(scored[r].logprob, expected[r][targets[r].item<int64_t>()].item<float>(), 1e-6);
  }
  EXPECT_TRUE(scored[0].top.empty());
  ASSERT_EQ(scored[1].top.size(), 3u);
  ASSERT_EQ(scored[2].top.size(), 1u);
  EXPECT_EQ(scored[1].top[0].first, 33);  // the peaked row's maximum
  EXPECT_NEAR(scored[2].top[0].second, expected[2].max().item<float>(), 1e-6);
}

TEST(Sampler, TopKAtLeastTheVocabularyKeepsEveryToken) {
  at::Tensor logits = RandomLogits(1, 64, 3);
  for (int32_t k : {64, 65, 1000}) {
    at::Tensor scores = ProcessedScores(logits, Stage({Row(1, k, 1, 1, 0.5, 0)}));
    EXPECT_TRUE(at::equal(scores, logits)) << "top_k " << k;
  }
}

TEST(Sampler, TopPOneRemovesNothingEvenTokensOfProbabilityZero) {
  // The peaked row: every other token has probability 0 in float32, yet transformers adds no top_p
  // warper at 1, so none is removed.
  at::Tensor logits = RandomLogits(2, 64, 5).narrow(0, 1, 1).clone();
  at::Tensor scores = ProcessedScores(logits, Stage({Row(1, 0, 1, 1, 0.5, 0)}));
  EXPECT_TRUE(at::equal(scores, logits));
}

TEST(Sampler, TinyTopPKeepsOnlyTheMostLikelyToken) {
  at::Tensor logits = RandomLogits(1, 500, 11);
  const int64_t best = Sample(logits, {Row(0, 0, 1, 1, 0.5, 0)})[0].id;
  for (double uniform : {0.0, 0.5, 0.999999}) {
    const std::vector<BatchRow> rows{Row(1.5f, 0, 1e-6f, 1, uniform, 0)};
    at::Tensor scores = ProcessedScores(logits, Stage(rows));
    EXPECT_EQ(at::isfinite(scores).sum().item<int64_t>(), 1);
    EXPECT_EQ(Sample(logits, rows)[0].id, best) << "uniform " << uniform;
  }
}

TEST(Sampler, InverseCdfInVocabularyOrder) {
  at::Tensor logits = Logits({{std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)}});
  const std::vector<std::pair<double, int32_t>> cases{{0.0, 0}, {0.05, 0}, {0.15, 1}, {0.35, 2}, {0.65, 3}, {0.99, 3}};
  for (const auto& [uniform, id] : cases) {
    EXPECT_EQ(Sample(logits, {Row(1, 0, 1, 1, uniform, 0)})[0].id, id) << "uniform " << uniform;
  }
}

TEST(Sampler, UniformNearOneNeverPicksAZeroProbabilityToken) {
  const double almost_one = std::nextafter(1.0, 0.0);
  std::vector<float> row(100, -kInf);
  row[10] = 1;
  row[20] = 2;
  row[30] = 3;
  at::Tensor logits = Logits({row});
  // Only 10, 20, 30 are possible; the cdf is flat from 30 to the end.
  EXPECT_EQ(Sample(logits, {Row(1, 0, 1, 1, almost_one, 0)})[0].id, 30);
  EXPECT_EQ(Sample(logits, {Row(1, 0, 1, 1, 0.0, 0)})[0].id, 10);
  // top_k removes tokens with finite logits: the last kept one, not the vocabulary's last.
  at::Tensor random = RandomLogits(1, 300, 13);
  const std::vector<BatchRow> rows{Row(1, 5, 1, 1, almost_one, 0)};
  const int32_t id = Sample(random, rows)[0].id;
  at::Tensor scores = ProcessedScores(random, Stage(rows));
  EXPECT_TRUE(std::isfinite(scores[0][id].item<float>()));
  EXPECT_FALSE(at::isfinite(scores[0].narrow(0, id + 1, 300 - id - 1)).any().item<bool>())
      << "a kept token lies after the chosen one";
}

// No sampling parameter makes the sampler emit a token its distribution does not support. Over extreme
// temperatures (float32's smallest denormal to its largest), penalties and logit scales, every sampled id
// has a finite log-probability, and is either a token of positive probability under the processed scores
// or, where those overflowed to +inf, their argmax. Rows below kMinSamplingTemperature are exactly greedy.
// (The binary before this test emitted id 0 with a log-probability near -12 for temperature 1e-39.)
TEST(Sampler, ExtremeParametersNeverEmitAnUnsupportedToken) {
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> temperatures{denorm, 1e-39f, 1e-38f, 1e-30f, 1e-6f, 9.9e-6f, 1e-5f, 1e-3f, 1.f, 1e30f, big};
  const std::vector<float> penalties{1e-40f, 1e-30f, 1e-6f, 1.f, 1.3f, 1e6f, 1e30f, big};
  const std::vector<float> scales{1e-3f, 1.f, 30.f, 1e4f};
  std::mt19937 gen(29);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int rows_checked = 0, overflowed = 0;
  for (float scale : scales) {
    at::Tensor logits = RandomLogits(1, 64, static_cast<uint32_t>(scale * 7 + 1)).mul(scale);
    const at::Tensor raw_logprobs = at::log_softmax(logits, 1);
    const float best_logprob = raw_logprobs.max().item<float>();
    for (float t : temperatures) {
      for (float p : penalties) {
        for (auto [top_k, top_p] : {std::pair{0, 1.f}, std::pair{5, 1.f}, std::pair{0, 0.5f}}) {
          const std::vector<BatchRow> rows{Row(t, top_k, top_p, p, uniform(gen), 0, {3, 5, 17, 40, 63})};
          const GeneratedToken token = Sample(logits, rows)[0];
          const std::string where = "scale " + std::to_string(scale) + " temperature " + std::to_string(t) +
                                    " penalty " + std::to_string(p) + " top_k " + std::to_string(top_k) + " top_p " +
                                    std::to_string(top_p);
          ASSERT_GE(token.id, 0) << where;
          ASSERT_LT(token.id, 64) << where;
          ASSERT_TRUE(std::isfinite(token.logprob)) << where;
          const at::Tensor scores = ProcessedScores(logits, Stage(rows))[0];
          const float max_score = scores.max().item<float>();
          if (t < kMinSamplingTemperature) {
            // Greedy: the argmax of the penalised logits.
            EXPECT_EQ(token.id, scores.argmax().item<int64_t>()) << where;
            if (p == 1.f) {
              EXPECT_EQ(token.logprob, best_logprob) << where;
            }
          } else if (!std::isfinite(max_score)) {
            ++overflowed;
            EXPECT_EQ(scores[token.id].item<float>(), max_score) << where;
          } else {
            const double probability = at::softmax(scores.to(at::kDouble), 0)[token.id].item<double>();
            EXPECT_GT(probability, 0.0) << where;
          }
          ++rows_checked;
        }
      }
    }
  }
  EXPECT_EQ(rows_checked, 4 * 11 * 8 * 3);
  EXPECT_GT(overflowed, 0) << "no case reached the overflow guard";
}

TEST(Sampler, TopLogprobsPerRowOfTheRawLogits) {
  const std::vector<BatchRow> rows{Row(0, 0, 1, 1, 0, 0), Row(0, 0, 1, 1.5f, 0, 2, {1}), Row(1.7f, 3, 1, 1, 0.6, 5)};
  at::Tensor logits = RandomLogits(3, 50, 17);
  const std::vector<GeneratedToken> tokens = Sample(logits, rows);
  at::Tensor logprobs = at::log_softmax(logits, 1);
  const std::vector<size_t> sizes{0, 2, 5};
  for (size_t r = 0; r < rows.size(); ++r) {
    const GeneratedToken& t = tokens[r];
    ASSERT_EQ(t.top.size(), sizes[r]) << "row " << r;
    EXPECT_DOUBLE_EQ(t.logprob, logprobs[r][t.id].item<float>()) << "row " << r;
    for (size_t j = 0; j < t.top.size(); ++j) {
      EXPECT_DOUBLE_EQ(t.top[j].second, logprobs[r][t.top[j].first].item<float>());
      if (j > 0) {
        EXPECT_GE(t.top[j - 1].second, t.top[j].second);
      }
    }
  }
  // Top logprobs are of the raw logits, not of the penalised ones.
  const std::vector<GeneratedToken> unpenalised =
      Sample(logits, std::vector<BatchRow>(static_cast<size_t>(logits.size(0)), Row(0, 0, 1, 1, 0.5, 1)));
  EXPECT_EQ(tokens[1].top[0].first, unpenalised[1].top[0].first);
}

// The engine sends a penalised sequence's context once, then each step's new ids: the pool must hold what
// the whole context would give, across steps, slot reuse and growth.
TEST(Sampler, PenaltyStateAcrossStepsEqualsTheWholeContext) {
  const at::Tensor logits = RandomLogits(3, 50, 29);
  PenaltySlots slots;
  PenaltyPool pool;
  auto step = [&](std::vector<BatchRow> rows) {
    std::vector<const BatchRow*> pointers;
    for (const BatchRow& row : rows) pointers.push_back(&row);
    return ProcessedScores(logits.narrow(0, 0, static_cast<int64_t>(rows.size())),
                           StageSamplingInputs(pointers, false, &slots), &pool);
  };
  auto whole = [&](std::vector<BatchRow> rows) {  // stateless: every row carries its whole context
    return ProcessedScores(logits.narrow(0, 0, static_cast<int64_t>(rows.size())), Stage(rows));
  };
  auto row = [](uint64_t sequence, std::vector<int32_t> added, bool reset) {
    BatchRow r = Row(0, 0, 1, 1.7f, 0.5, 0);
    r.sequence = sequence;
    r.penalty_tokens = std::move(added);
    r.penalty_reset = reset;
    return r;
  };
  // Step 1: two sequences send their prompts; a third row has no penalty.
  EXPECT_TRUE(
      at::equal(step({row(7, {0, 1}, true), row(9, {4}, true), Row(0, 0, 1, 1, 0.5, 0)}),
                whole({Row(0, 0, 1, 1.7f, 0.5, 0, {0, 1}), Row(0, 0, 1, 1.7f, 0.5, 0, {4}), Row(0, 0, 1, 1, 0.5, 0)})));
  // Step 2: each sends only its new id (and an id outside the vocabulary, ignored).
  EXPECT_TRUE(at::equal(step({row(9, {2}, false), row(7, {3, 77}, false)}),
                        whole({Row(0, 0, 1, 1.7f, 0.5, 0, {4, 2}), Row(0, 0, 1, 1.7f, 0.5, 0, {0, 1, 3})})));
  // Sequence 7 ends; a new one takes its slot and starts empty, whatever 7 had seen.
  slots.Release(7);
  EXPECT_TRUE(at::equal(step({row(11, {5}, true)}), whole({Row(0, 0, 1, 1.7f, 0.5, 0, {5})})));
  // Twenty more sequences: the pool grows past its first 8 slots and keeps what 9 and 11 have seen.
  std::vector<BatchRow> many;
  for (uint64_t s = 20; s < 40; ++s) many.push_back(row(s, {static_cast<int32_t>(s)}, true));
  for (size_t k = 0; k < many.size(); k += 3) {
    std::vector<BatchRow> three(many.begin() + static_cast<std::ptrdiff_t>(k),
                                many.begin() + static_cast<std::ptrdiff_t>(std::min(k + 3, many.size())));
    step(three);
  }
  EXPECT_GE(slots.capacity(), 22);
  EXPECT_TRUE(at::equal(step({row(9, {}, false), row(11, {}, false)}),
                        whole({Row(0, 0, 1, 1.7f, 0.5, 0, {4, 2}), Row(0, 0, 1, 1.7f, 0.5, 0, {5})})));
}

// A verified position's penalties count the proposals before it (penalty_pending) as if its slot held them, and the
// slot keeps none of them: the next step sees only what was sent.
TEST(Sampler, PendingIdsCountForTheirRowOnlyAndStayOutOfTheSlot) {
  const at::Tensor logits = RandomLogits(3, 50, 31);
  PenaltySlots slots;
  PenaltyPool pool;
  auto row = [](std::vector<int32_t> added, std::vector<int32_t> pending, bool reset) {
    BatchRow r = Row(0, 0, 1, 1.5f, 0.5, 0);
    r.sampling.frequency_penalty = 0.7f;
    r.sampling.presence_penalty = 0.2f;
    r.sequence = 4;
    r.penalty_tokens = added;
    r.output_tokens = std::move(added);
    r.penalty_pending = std::move(pending);
    r.penalty_reset = reset;
    return r;
  };
  auto step = [&](std::vector<BatchRow> rows) {
    std::vector<const BatchRow*> pointers;
    for (const BatchRow& r : rows) pointers.push_back(&r);
    return ProcessedScores(logits.narrow(0, 0, static_cast<int64_t>(rows.size())),
                           StageSamplingInputs(pointers, false, &slots), &pool);
  };
  auto whole = [&](std::vector<std::vector<int32_t>> contexts) {  // stateless, every row its whole context
    std::vector<BatchRow> rows;
    for (auto& context : contexts) rows.push_back(row(std::move(context), {}, true));
    std::vector<const BatchRow*> pointers;
    for (const BatchRow& r : rows) pointers.push_back(&r);
    return ProcessedScores(logits.narrow(0, 0, static_cast<int64_t>(rows.size())),
                           StageSamplingInputs(pointers, false));
  };
  // Three positions of one sequence: its new ids {1, 2} sent once (by the last), proposals 9 and 2 before the later
  // positions (2 twice: counted twice by the frequency penalty).
  const at::Tensor verified = step({row({}, {}, false), row({}, {9}, false), row({1, 2}, {9, 2}, true)});
  EXPECT_TRUE(at::allclose(verified, whole({{1, 2}, {1, 2, 9}, {1, 2, 9, 2}})));
  EXPECT_FALSE(at::allclose(verified[0], verified[2]));  // the pending ids changed something
  // The slot kept {1, 2} only.
  EXPECT_TRUE(at::allclose(step({row({}, {}, false)}), whole({{1, 2}})));
}

// Structured outputs: a row's grammar mask leaves only its allowed ids (greedy and sampled), its log-probabilities
// are those of the masked distribution (vLLM's), and an unconstrained row of the same batch is untouched.
TEST(Sampler, AGrammarMaskLeavesOnlyItsIdsAndLogprobsOfTheMaskedDistribution) {
  const int64_t vocab = 70;  // three words, the last one partial
  at::Tensor logits = RandomLogits(3, vocab, 11);
  std::vector<int32_t> words(3, 0);
  for (int32_t id : {3, 40, 64, 69}) words[id / 32] |= int32_t(1u << (id % 32));
  std::vector<BatchRow> rows{Row(0, 0, 1, 1, 0.5, 2), Row(1.0f, 0, 1, 1, 0.77, 0), Row(0, 0, 1, 1, 0.5, 0)};
  rows[0].sampling.allowed = AllowedTokens::Ready(words);
  rows[1].sampling.allowed = AllowedTokens::Ready(words);
  const std::vector<GeneratedToken> tokens = Sample(logits, rows);
  const float* row0 = logits.data_ptr<float>();
  int32_t best = 3;
  for (int32_t id : {40, 64, 69}) {
    if (row0[id] > row0[best]) best = id;
  }
  EXPECT_EQ(tokens[0].id, best);
  at::Tensor allowed_logits = at::empty({4}, at::kFloat);
  for (int k = 0; k < 4; ++k) allowed_logits[k] = row0[std::vector<int32_t>{3, 40, 64, 69}[k]];
  const at::Tensor masked_logprobs = at::log_softmax(allowed_logits, 0);
  double expected = 0;
  for (int k = 0; k < 4; ++k) {
    if (std::vector<int32_t>{3, 40, 64, 69}[k] == best) expected = masked_logprobs[k].item<float>();
  }
  EXPECT_NEAR(tokens[0].logprob, expected, 1e-5);
  ASSERT_EQ(tokens[0].top.size(), 2u);
  for (const auto& [id, logprob] : tokens[0].top) {
    EXPECT_TRUE(id == 3 || id == 40 || id == 64 || id == 69) << id;
    EXPECT_TRUE(std::isfinite(logprob));
  }
  for (int trial = 0; trial < 20; ++trial) {
    rows[1].sampling.uniform = (trial + 0.5) / 20.0;
    const int32_t id = Sample(logits, rows)[1].id;
    EXPECT_TRUE(id == 3 || id == 40 || id == 64 || id == 69) << id;
  }
  const std::vector<GeneratedToken> free = Sample(logits.narrow(0, 2, 1).clone(), {rows[2]});
  ExpectSameToken(tokens[2], free[0], "unconstrained row");
  // A mask shorter than the logits' vocabulary is the sampler's error, not a silent pass.
  rows[0].sampling.allowed = AllowedTokens::Ready({-1});
  EXPECT_THROW(Sample(logits, rows), c10::Error);
}

// The CPU reads the mask's bits in place; CUDA logits take ATen's expansion: both give the same logits.
TEST(Sampler, TheMaskReadInPlaceEqualsItsExpansionByAtenOps) {
  const int64_t vocab = 1000;  // 32 words, the last one partial (1000 = 31 x 32 + 8)
  at::Tensor logits = RandomLogits(4, vocab, 5);
  std::mt19937 gen(9);
  std::vector<BatchRow> rows(4, Row(0, 0, 1, 1, 0.5, 0));
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> words(32);
    for (int32_t& w : words) w = static_cast<int32_t>(gen());
    words[3] = -1;  // every id of a word allowed
    words[4] = 0;   // none
    rows[r].sampling.allowed = AllowedTokens::Ready(words);
  }
  const SamplingInputs inputs = Stage(rows);  // row 3 unconstrained
  const at::Tensor in_place = AllowedLogits(logits, inputs);
  EXPECT_TRUE(at::equal(in_place, AllowedLogits(logits, inputs, /*device_ops=*/true)));
  EXPECT_TRUE(at::equal(in_place.narrow(0, 3, 1), logits.narrow(0, 3, 1)));
  EXPECT_FALSE(at::equal(in_place.narrow(0, 0, 1), logits.narrow(0, 0, 1)));
}

// The mask may be filled after the inputs are staged (the engine's mask thread): sampling waits for it.
TEST(Sampler, WaitsForAMaskFilledAfterStaging) {
  at::Tensor logits = RandomLogits(1, 64, 3);  // at least 41 ids: RandomLogits writes id 40
  std::vector<BatchRow> rows{Row(0, 0, 1, 1, 0.5, 0)};
  auto mask = std::make_shared<AllowedTokens>(2);
  rows[0].sampling.allowed = mask;
  SamplingInputs inputs = Stage(rows);
  std::thread filler([mask] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    mask->data()[1] = 1 << 5;  // id 37 alone
    mask->MarkReady();
  });
  PendingSamples pending = SampleAsync(logits, inputs);
  filler.join();
  EXPECT_EQ(FinishSamples(pending, inputs)[0].id, 37);
}

// Rejection sampling of a draft model's proposals (RowSampling::draft_token), over many rows of one batch: each row's
// proposal d drawn from q, its acceptance draw and its redraw independent. The tokens must be distributed as p
// (Pearson's chi-squared against p, seeded so the verdict is fixed; the limit is chi-squared's 0.999 quantile), and
// the proposals kept at the rate sum_i min(p_i, q_i) (within 4 standard deviations).
struct RejectionOutcome {
  std::vector<int64_t> counts;
  int64_t accepted = 0;
  int64_t rows = 0;
};

RejectionOutcome SampleProposals(const std::vector<float>& logits, float temperature, int32_t top_k,
                                 const std::vector<float>& q, int64_t rows, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::discrete_distribution<int32_t> from_q(q.begin(), q.end());
  std::vector<BatchRow> batch;
  std::vector<int32_t> proposed;
  for (int64_t r = 0; r < rows; ++r) {
    BatchRow row = Row(temperature, top_k, 1, 1, uniform(gen), 0);
    row.sampling.draft_token = from_q(gen);
    row.sampling.accept_uniform = uniform(gen);
    row.sampling.draft_probs = std::span<const float>(q);
    proposed.push_back(row.sampling.draft_token);
    batch.push_back(std::move(row));
  }
  std::vector<std::vector<float>> values(static_cast<size_t>(rows), logits);
  std::vector<GeneratedToken> tokens = Sample(Logits(values), batch);
  RejectionOutcome outcome;
  outcome.counts.assign(logits.size(), 0);
  outcome.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    ++outcome.counts.at(tokens[r].id);
    if (tokens[r].id == proposed[r]) ++outcome.accepted;
  }
  return outcome;
}

// chi-squared of the counts against p, over the ids with p > 0 (an id with p = 0 drawn at all fails outright).
double ChiSquared(const RejectionOutcome& outcome, const std::vector<double>& p) {
  double chi = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] * static_cast<double>(outcome.rows);
    if (p[i] == 0) {
      if (outcome.counts[i] != 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    chi += (outcome.counts[i] - expected) * (outcome.counts[i] - expected) / expected;
  }
  return chi;
}

void ExpectAcceptance(const RejectionOutcome& outcome, const std::vector<double>& p, const std::vector<float>& q) {
  double expected = 0;
  for (size_t i = 0; i < p.size(); ++i) expected += std::min(p[i], static_cast<double>(q[i]));
  const double rate = static_cast<double>(outcome.accepted) / static_cast<double>(outcome.rows);
  const double sd = std::sqrt(expected * (1 - expected) / static_cast<double>(outcome.rows));
  EXPECT_NEAR(rate, expected, 4 * sd + 1e-12) << "acceptance " << rate << ", sum min(p, q) " << expected;
}

std::vector<double> Softmax(const std::vector<float>& logits, float temperature, int32_t top_k) {
  std::vector<float> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  const float kth = top_k > 0 ? sorted[static_cast<size_t>(top_k) - 1] : -kInf;
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = logits[i] < kth ? 0 : std::exp(static_cast<double>(logits[i]) / temperature);
    total += p[i];
  }
  for (double& v : p) v /= total;
  return p;
}

TEST(SamplerRejection, TokensAreDistributedAsTheTargetWhateverTheDraft) {
  const std::vector<float> logits = {1.0f, -0.5f, 2.0f, 0.3f, -2.0f, 0.8f};
  const std::vector<double> p = Softmax(logits, 1, 0);
  const double limit = 20.52;  // chi-squared, 5 degrees of freedom, 0.999
  for (const std::vector<float>& q : std::vector<std::vector<float>>{
           {0.05f, 0.3f, 0.1f, 0.25f, 0.2f, 0.1f},  // far from p
           {0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f},    // a point mass on p's mode
           {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f},    // a point mass on an unlikely token
       }) {
    const RejectionOutcome outcome = SampleProposals(logits, 1, 0, q, 40000, 7);
    EXPECT_LT(ChiSquared(outcome, p), limit) << "q[0] " << q[0];
    ExpectAcceptance(outcome, p, q);
  }
  // q = p: every proposal is kept.
  std::vector<float> same(p.begin(), p.end());
  const RejectionOutcome outcome = SampleProposals(logits, 1, 0, same, 20000, 11);
  EXPECT_LT(ChiSquared(outcome, p), limit);
  EXPECT_GE(outcome.accepted, outcome.rows - 2);
}

TEST(SamplerRejection, TheTargetIsTheWarpedDistribution) {
  // Temperature 0.7 and top_k 4: ids 1 and 4 cannot be chosen, even when the draft proposes them.
  const std::vector<float> logits = {1.0f, -0.5f, 2.0f, 0.3f, -2.0f, 0.8f};
  const std::vector<double> p = Softmax(logits, 0.7f, 4);
  ASSERT_EQ(p[1], 0);
  ASSERT_EQ(p[4], 0);
  const std::vector<float> q = {0.1f, 0.25f, 0.2f, 0.1f, 0.25f, 0.1f};
  const RejectionOutcome outcome = SampleProposals(logits, 0.7f, 4, q, 40000, 13);
  EXPECT_LT(ChiSquared(outcome, p), 16.27);  // 3 degrees of freedom, 0.999
  ExpectAcceptance(outcome, p, q);
}

TEST(SamplerRejection, GreedyRowsIgnoreTheDraftAndReturnedProbsAreTheSampledDistribution) {
  const std::vector<float> logits = {1.0f, -0.5f, 2.0f, 0.3f, -2.0f, 0.8f};
  const std::vector<float> q = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  BatchRow greedy = Row(0, 0, 1, 1, 0.5, 0);
  greedy.sampling.draft_token = 1;
  greedy.sampling.accept_uniform = 0;
  greedy.sampling.draft_probs = std::span<const float>(q);
  greedy.sampling.return_probs = true;
  BatchRow sampled = Row(0.7f, 4, 1, 1, 0.5, 0);
  sampled.sampling.return_probs = true;
  std::vector<BatchRow> rows{greedy, sampled};
  SamplingInputs inputs = Stage(rows);
  PendingSamples pending = SampleAsync(Logits({logits, logits}), inputs);
  std::vector<std::vector<float>> probs;
  std::vector<GeneratedToken> tokens = FinishSamples(pending, inputs, &probs);
  EXPECT_EQ(tokens[0].id, 2);  // the argmax, though the draft proposed 1 with an acceptance draw of 0
  ASSERT_EQ(probs.size(), 2u);
  EXPECT_EQ(probs[0], (std::vector<float>{0, 0, 1, 0, 0, 0}));
  const std::vector<double> p = Softmax(logits, 0.7f, 4);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(probs[1][i], p[i], 1e-6) << "id " << i;
}

TEST(SamplerRejection, ADraftOverAnotherVocabularyIsRefused) {
  const std::vector<float> q = {0.5f, 0.5f};
  BatchRow row = Row(1, 0, 1, 1, 0.5, 0);
  row.sampling.draft_token = 0;
  row.sampling.draft_probs = std::span<const float>(q);
  std::vector<BatchRow> rows{row};
  SamplingInputs inputs = Stage(rows);
  EXPECT_THROW(SampleAsync(Logits({{1.0f, 2.0f, 3.0f}}), inputs), c10::Error);
}

TEST(SamplerCuda, SamplesOnTheDeviceAsOnTheCpuWithOneEvent) {
  if (!QueryTorch().cuda_available) GTEST_SKIP() << "torch cuda not available";
  const std::vector<BatchRow> rows = MixedRows();
  at::Tensor logits = RandomLogits(static_cast<int64_t>(rows.size()), 32000, 23);
  at::Tensor device_logits = logits.to(at::Device(at::kCUDA, 0));
  SamplingInputs inputs = Stage(rows, /*pinned=*/true);
  EXPECT_TRUE(inputs.params.is_pinned());
  PendingSamples pending = SampleAsync(device_logits, inputs);
  EXPECT_TRUE(pending.ready.has_value());
  EXPECT_TRUE(pending.host.is_pinned());
  const std::vector<GeneratedToken> on_device = FinishSamples(pending, inputs);
  const std::vector<GeneratedToken> on_cpu = Sample(logits, rows);
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(on_device[r].id, on_cpu[r].id) << "row " << r;
    EXPECT_NEAR(on_device[r].logprob, on_cpu[r].logprob, 1e-4) << "row " << r;
    ASSERT_EQ(on_device[r].top.size(), on_cpu[r].top.size());
  }
  // Batch invariance on the device too.
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<GeneratedToken> alone = Sample(device_logits.narrow(0, static_cast<int64_t>(r), 1), {rows[r]});
    EXPECT_EQ(alone[0].id, on_device[r].id) << "row " << r;
  }
}

}  // namespace
}  // namespace strata::runtime
