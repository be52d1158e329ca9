// The runtime reserve's terms (planner/runtime_reserve.h) against what the runtime allocates, measured on the
// CPU: every tensor the CPU path allocates while it samples, scores or runs a batch step goes through a counting
// allocator installed as LibTorch's CPU allocator, and the peak of what it holds must stay within the term the
// planner keeps for it. On a GPU the same operations allocate from the caching allocator; the CPU path computes
// the same tensors (plus host staging, which it counts here and a GPU keeps in host memory).

#include "planner/runtime_reserve.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "runtime/executor/sampler.h"
#include "tests/runtime/counting_allocator.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

BatchRow Sampled(float temperature, int32_t top_k, float top_p, float penalty, int32_t top_logprobs, uint64_t seq) {
  BatchRow row;
  row.samples = true;
  row.sequence = seq;
  row.sampling.temperature = temperature;
  row.sampling.top_k = top_k;
  row.sampling.top_p = top_p;
  row.sampling.repetition_penalty = penalty;
  row.sampling.frequency_penalty = 0.5f;
  row.sampling.presence_penalty = 0.25f;
  row.sampling.logit_bias = {{3, 1.5f}, {7, -100.0f}};
  row.sampling.uniform = 0.37;
  row.sampling.top_logprobs = top_logprobs;
  row.penalty_tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  row.output_tokens = {5, 6, 7, 8};
  row.penalty_reset = true;
  return row;
}

TEST(RuntimeReserve, SamplerWorkStaysWithinItsTermPerLogit) {
  for (int64_t vocab : {4096, 32000}) {
    for (int64_t rows : {1, 8, 32}) {
      std::vector<BatchRow> batch;
      for (int64_t r = 0; r < rows; ++r) batch.push_back(Sampled(0.8f, 40, 0.9f, 1.2f, 5, static_cast<uint64_t>(r)));
      std::vector<const BatchRow*> pointers;
      for (const BatchRow& row : batch) pointers.push_back(&row);
      const at::Tensor logits = at::randn({rows, vocab});
      PenaltySlots slots;
      const SamplingInputs inputs = StageSamplingInputs(pointers, /*pinned=*/false, &slots);
      PenaltyPool pool;
      int64_t peak = 0;
      {
        Measure measure;
        PendingSamples pending = SampleAsync(logits, inputs, &pool);
        std::vector<GeneratedToken> tokens = FinishSamples(pending, inputs);
        ASSERT_EQ(static_cast<int64_t>(tokens.size()), rows);
        peak = measure.peak_above_start();
      }
      const int64_t term = planner::SamplerWorkBytes(rows, vocab, rows + 1);
      EXPECT_LE(peak, term) << rows << " rows x " << vocab;
      std::cout << "sampler, " << rows << " rows x " << vocab << ": peak " << peak << " B, term " << term << " ("
                << static_cast<double>(peak) / static_cast<double>(term) << ")\n";
    }
  }
}

TEST(RuntimeReserve, PromptScoresStayWithinTheirTermPerLogit) {
  for (int64_t rows : {16, 256}) {
    const int64_t vocab = 32000;
    const at::Tensor logits = at::randn({rows, vocab});
    const at::Tensor targets = at::randint(vocab, {rows}, at::kLong);
    int64_t peak = 0;
    {
      Measure measure;
      PendingSamples pending = ScoreAsync(logits, targets, 5);
      std::vector<GeneratedToken> scores = FinishScores(pending, std::vector<int32_t>(rows, 5));
      ASSERT_EQ(static_cast<int64_t>(scores.size()), rows);
      peak = measure.peak_above_start();
    }
    EXPECT_LE(peak, planner::ScoreWorkBytes(rows, vocab)) << rows << " rows";
    std::cout << "prompt scores, " << rows << " rows x " << vocab << ": "
              << static_cast<double>(peak) / static_cast<double>(rows * vocab) << " B per logit (term "
              << planner::kScoreBytesPerLogit << ")\n";
  }
}

// A serving step at its limits: a prompt of a whole micro-batch's tokens with prompt log-probabilities, sampled
// rows with every warper and penalty beside it, on two stages. What the step allocates (activations, attention,
// logits, sampler) must stay within the auto reserve's terms for these limits, workspaces aside (cuBLAS has none
// on the CPU).
TEST(RuntimeReserve, ABatchStepAtTheLimitsStaysWithinTheAutoReserve) {
  const LlamaDims dims{
      .vocab = 8192, .hidden = 256, .inter = 704, .heads = 8, .kv_heads = 2, .layers = 2, .max_positions = 4096};
  const planner::ServingLimits limits{
      .max_batch = 4, .max_context = 512, .max_batch_tokens = 128, .micro_batches = 1, .prompt_logprobs = true};
  std::unique_ptr<LoadedModel> model =
      LoadPlan(WriteLlama(dims, "runtime_reserve"),
               R"({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1, "lm_head": 1})",
               {{0, {false, 0}}, {1, {false, 0}}}, limits.max_batch, limits.max_context);
  ASSERT_TRUE(model);

  planner::RuntimeReserve reserve;
  reserve.kind = planner::RuntimeReserve::Kind::kAuto;
  reserve.limits = limits;
  int64_t bound = 0;
  for (const auto& [device, parts] :
       planner::RuntimeReserveBytes(model->report().spec, model->report().plan.device_map, reserve)) {
    bound += parts.activations + parts.attention + parts.sampler;
    std::cout << "GPU " << device.ToString() << ": " << parts.Describe() << "\n";
  }

  EngineOptions engine_options;
  engine_options.micro_batches = limits.micro_batches;
  engine_options.micro_batch_tokens = limits.max_batch_tokens;
  engine_options.prefill_chunk_tokens = limits.max_batch_tokens;
  auto engine = Engine::Start(*model, nullptr, {}, engine_options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  int64_t peak = 0;
  {
    Measure measure;
    Collector c;
    for (int i = 0; i < limits.max_batch; ++i) {
      GenerationRequest request;
      // Prompts that fill the micro-batch, one with its prompt's log-probabilities.
      const int64_t length = i == 0 ? limits.max_batch_tokens - 8 : 40 * (i + 1);
      for (int64_t t = 0; t < length; ++t) request.prompt.push_back(static_cast<int32_t>((t * 37 + i) % dims.vocab));
      request.sampling.max_new_tokens = 24;
      request.sampling.temperature = 0.8f;
      request.sampling.top_k = 50;
      request.sampling.top_p = 0.9f;
      request.sampling.repetition_penalty = 1.1f;
      request.sampling.top_logprobs = 5;
      request.sampling.seed = 7 + i;
      if (i == 0) request.sampling.prompt_logprobs = 5;
      ASSERT_TRUE((*engine)->Submit(request, c.For(i)).ok());
    }
    c.Wait(static_cast<int>(limits.max_batch));
    peak = measure.peak_above_start();
  }
  std::cout << "a step at the limits: peak " << peak << " B of CPU allocations, auto reserve without workspaces "
            << bound << " B (" << static_cast<double>(peak) / static_cast<double>(bound) << ")\n";
  EXPECT_LE(peak, bound);
}

}  // namespace
}  // namespace strata::runtime
