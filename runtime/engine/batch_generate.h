#pragma once
// The offline path over the serving engine (vLLM's LLM.generate): submit a batch of token-id prompts to an
// Engine, wait for every one to end, return what each produced. strata-generate and the tests run
// generation through it, so every token strata computes comes from the one loop the server drives
// (scheduler, executor, sampler, longrope's recompute rule). Plain C++.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"

namespace strata::runtime {

struct BatchOutput {
  std::vector<GeneratedToken> tokens;                          // the new tokens, with their logprobs and top_logprobs
  std::vector<std::optional<GeneratedToken>> prompt_logprobs;  // GenerationChunk::prompt_logprobs
  FinishReason finish = FinishReason::kLength;
};

struct BatchTiming {
  double prefill_seconds = 0;  // from the submission until every prompt has its first new token
  double decode_seconds = 0;   // from then until every request has ended
  int64_t decode_steps = 0;    // tokens after the first of the longest output: the decode steps
};

// Every prompt with `sampling` (greedy: temperature 0; a fixed length: ignore_eos), run together as the
// engine's batching allows. Checked first, each error naming the prompt: ids outside [0, vocab), empty
// prompts, prompt + max_new_tokens beyond --max-context or the KV pool, top_logprobs or prompt_logprobs
// beyond the vocabulary, logit_bias ids outside it. max_new_tokens 0 runs nothing unless prompt_logprobs
// asks for the prompts to be scored.
// The engine must accept `prompts.size()` queued requests (EngineOptions::max_queue). A request that ends
// kError makes the call return its error.
absl::StatusOr<std::vector<BatchOutput>> GenerateBatch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                       const SamplingParams& sampling, BatchTiming* timing = nullptr);

}  // namespace strata::runtime
