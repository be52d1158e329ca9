#include "runtime/engine/batch_generate.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status CheckPrompts(const Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          const SamplingParams& sampling) {
  const int64_t vocab = engine.vocab_size();
  const int64_t max_context = engine.max_context();
  const int64_t new_tokens = sampling.max_new_tokens;
  if (new_tokens < 0) return absl::InvalidArgumentError("--max-new-tokens: must not be negative");
  if (sampling.top_logprobs < 0 || sampling.top_logprobs > vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-logprobs: ", sampling.top_logprobs, " is not in [0, ", vocab, "] (the vocabulary)"));
  }
  if (sampling.prompt_logprobs < -1 || sampling.prompt_logprobs > vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-logprobs: ", sampling.prompt_logprobs, " is not in [0, ", vocab, "] (the vocabulary)"));
  }
  if (sampling.min_tokens < 0) return absl::InvalidArgumentError("--min-tokens: must not be negative");
  for (const auto& [id, bias] : sampling.logit_bias) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit-bias: token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = prompts[p];
    if (prompt.empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", p, ": no token ids"));
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("prompt ", p, ": token id ", prompt[i], " at position ", i,
                                                       " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    // As the server counts (server/README.md): every prompt token and every token that may be generated.
    const int64_t context = static_cast<int64_t>(prompt.size()) + new_tokens;
    if (context > max_context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt ", p, ": ", prompt.size(), prompt.size() == 1 ? " token + " : " tokens + ", new_tokens,
          new_tokens == 1 ? " new token = " : " new tokens = ", context, ", more than --max-context ", max_context));
    }
    if (context > engine.kv_cache_tokens()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", p, ": ", context,
                                                     " tokens with its new ones, more than the KV pool holds (",
                                                     engine.kv_cache_tokens(), "; --kv-cache-tokens)"));
    }
  }
  return absl::OkStatus();
}

// What the callbacks (on the engine's output thread) collect.
struct Collected {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<BatchOutput> outputs;
  size_t with_first_token = 0;
  size_t ended = 0;
  std::optional<Clock::time_point> first_tokens_at;
  absl::Status error;
};

}  // namespace

absl::StatusOr<std::vector<BatchOutput>> GenerateBatch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                       const SamplingParams& sampling, BatchTiming* timing) {
  if (absl::Status s = CheckPrompts(engine, prompts, sampling); !s.ok()) return s;
  BatchTiming local;
  BatchTiming& t = timing != nullptr ? *timing : local;
  t = BatchTiming{};
  if (sampling.max_new_tokens == 0 && sampling.prompt_logprobs < 0) return std::vector<BatchOutput>(prompts.size());

  auto collected = std::make_shared<Collected>();
  collected->outputs.resize(prompts.size());
  const Clock::time_point start = Clock::now();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t p = 0; p < prompts.size(); ++p) {
    GenerationRequest request;
    request.prompt = prompts[p];
    request.sampling = sampling;
    request.request_id = absl::StrCat("prompt-", p);
    auto callback = [collected, p, n = prompts.size()](GenerationChunk chunk) {
      std::lock_guard lock(collected->mutex);
      BatchOutput& out = collected->outputs[p];
      const bool first = out.tokens.empty() && !chunk.tokens.empty();
      for (GeneratedToken& token : chunk.tokens) out.tokens.push_back(std::move(token));
      if (!chunk.prompt_logprobs.empty()) out.prompt_logprobs = std::move(chunk.prompt_logprobs);
      if (first && ++collected->with_first_token == n) collected->first_tokens_at = Clock::now();
      if (chunk.finish) {
        out.finish = *chunk.finish;
        if (*chunk.finish == FinishReason::kError && collected->error.ok()) {
          collected->error = absl::Status(chunk.error.code(), absl::StrCat("prompt ", p, ": ", chunk.error.message()));
        }
        ++collected->ended;
      }
      collected->changed.notify_all();
    };
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = engine.Submit(std::move(request), std::move(callback));
    if (!handle.ok()) {
      for (const auto& h : handles) h->Cancel();  // the engine ends them; their callbacks still run
      std::unique_lock lock(collected->mutex);
      collected->changed.wait(lock, [&] { return collected->ended == handles.size(); });
      return absl::Status(handle.status().code(), absl::StrCat("prompt ", p, ": ", handle.status().message()));
    }
    handles.push_back(*std::move(handle));
  }
  std::unique_lock lock(collected->mutex);
  collected->changed.wait(lock, [&] { return collected->ended == prompts.size(); });
  const Clock::time_point end = Clock::now();
  if (!collected->error.ok()) return collected->error;
  const Clock::time_point first = collected->first_tokens_at.value_or(end);
  t.prefill_seconds = std::chrono::duration<double>(first - start).count();
  t.decode_seconds = std::chrono::duration<double>(end - first).count();
  for (const BatchOutput& out : collected->outputs) {
    t.decode_steps = std::max(t.decode_steps, static_cast<int64_t>(out.tokens.size()) - 1);
  }
  return std::move(collected->outputs);
}

}  // namespace strata::runtime
