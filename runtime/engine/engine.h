#pragma once
// The serving engine's plain-C++ face (no torch headers): requests in, streamed tokens out, with
// continuous batching over a paged KV cache and micro-batches pipelined across the plan's stages.
//
//   Engine thread:  queue -> Scheduler (which sequences, how many tokens; never a tensor)
//                   -> MicroBatchWork -> Executor (runtime/executor: stages on their devices, one worker
//                   per stage, so stage s runs micro-batch m while stage s+1 runs m-1; sampling on the
//                   last stage's device) -> sampled ids -> EOS / length -> output queue.
//   Output thread:  detokenization, stop strings, GenerationChunks -> callbacks. A stop string found
//                   here ends the request; the engine frees its KV blocks when it next looks.
//
// Requests reaching Submit are trusted: the server validates them once, at the edge (server/
// generate_validation.h); Submit only refuses what depends on the engine's state (a full queue).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/speculation.h"
#include "runtime/executor/executor.h"
#include "runtime/executor/loaded_model.h"

namespace strata::tokenizer {
class Tokenizer;
}
namespace strata::structured {
class Grammar;
}

namespace strata::runtime {

// The logits of each step are processed in vLLM's order: logit_bias (and min_tokens' ban), then the
// penalties (repetition, frequency, presence), then temperature, top_k, top_p; temperature 0 is greedy
// (argmax of the processed logits). Each part on its own has transformers' (repetition penalty, warpers)
// or OpenAI's (the rest) semantics. Log-probabilities are always those of the raw logits.
struct SamplingParams {
  float temperature = 0;
  float top_p = 1;
  int32_t top_k = 0;  // 0: off
  float repetition_penalty = 1;
  // OpenAI's penalties over the tokens this request generated so far (not its prompt; vLLM's output
  // tokens): logit[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0).
  float presence_penalty = 0;
  float frequency_penalty = 0;
  // Added to the logits of these ids (OpenAI's logit_bias; ids in [0, vocab)); an id given twice gets both.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Until this many tokens were generated, the EOS ids cannot be sampled (their logits are -inf, unless
  // ignore_eos) and stop strings do not end the request (vLLM's min_tokens).
  int32_t min_tokens = 0;
  // A seeded request draws from its own generator, so its output does not depend on what else runs
  // in its batch; unseeded requests draw a seed from the engine's generator.
  std::optional<uint64_t> seed;
  // 0: the prompt is prefilled and the request ends with kLength and no token (for prompt_logprobs).
  int32_t max_new_tokens = 16;
  int32_t top_logprobs = 0;
  // -1: off. k >= 0: the log-probability of every prompt token after the first under the model given the
  // tokens before it (log_softmax of the raw logits at the position before), with the k most likely tokens
  // there: GenerationChunk::prompt_logprobs. Such a request computes its whole prompt (it takes no prefix
  // from the prefix cache).
  int32_t prompt_logprobs = -1;
  std::vector<std::string> stop;  // matched on decoded text, not emitted
  bool ignore_eos = false;
  // Speculative decoding (EngineOptions::speculative) for this request; false: one token per forward pass. Before
  // min_tokens a proposal ends where the EOS ban does; under a grammar, after the first token it refuses.
  bool speculative = true;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, each in [0, vocab)
  SamplingParams sampling;
  std::string request_id;
  // Structured output (structured/structured.h): every generated token is one the grammar allows, the EOS ids
  // only where it may end, and stop strings end the request only where the output before them completes it.
  // Compiled at the edge (server/generate_validation.h), never on the engine thread. Null: free text.
  std::shared_ptr<const structured::Grammar> grammar;
};

// kError: the forward pass or the sampler failed (GenerationChunk::error says where and why).
enum class FinishReason { kLength, kStop, kEos, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);

// One message of a request's stream: the tokens of one step (or several, when the consumer is slower
// than the engine and chunks are merged), the text they completed, and on the last one the reason.
struct GenerationChunk {
  std::vector<GeneratedToken> tokens;
  std::string text;
  // With SamplingParams::prompt_logprobs >= 0, on the request's first chunk only (the one with its first
  // token, or its final one when it ends before): one entry per prompt token, entry i scoring prompt token
  // i given the tokens before it (`id` is that token, `top` the prompt_logprobs most likely ones there).
  // Entry 0 is nullopt: the first token has no context to be scored in (OpenAI's null). Empty otherwise.
  std::vector<std::optional<GeneratedToken>> prompt_logprobs;
  std::optional<FinishReason> finish;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // so far
  absl::Status error;             // with kError: INTERNAL naming the stage, its device and the failure
};

// Called on the engine's output thread, once per step with new tokens and exactly once with `finish` set.
// It must not block (queue and return).
using ChunkCallback = std::function<void(GenerationChunk)>;

// Returned by Submit: cancelling makes the request leave its batch and free its KV blocks within one
// iteration; the callback then gets its final chunk with kCancelled.
class RequestHandle {
 public:
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  int64_t max_queue = 256;    // queued (not yet admitted) requests beyond which Submit refuses
  bool prefix_cache = true;   // reuse the KV blocks of prompt prefixes seen before (scheduler.h)
  int64_t micro_batches = 2;  // micro-batches in flight across the stages (1: one stage at a time)
  int64_t prefill_chunk_tokens = 256;
  int64_t micro_batch_tokens = 512;
  // Structured outputs: where a grammar allows exactly one token, append it without a forward pass of its own
  // (exact: the ids are those of decoding without it). Costs a mask fill on the engine thread after each token.
  bool jump_forward = false;
  int32_t intra_op_threads = 0;         // per stage worker (and sampler); 0: leave LibTorch's setting
  bool stage_threads = true;            // one worker thread per stage; false: stages run on the engine thread
  std::optional<FaultInjection> fault;  // the test seam (runtime/executor/executor.h)
  // Called once, on the engine thread, when a failure left a device unusable (a sticky CUDA error):
  // every request has then ended with kError and Submit refuses new ones. The server stops serving.
  std::function<void(const absl::Status&)> on_device_lost;
  // A group of nodes (runtime/executor/group_load.h): the leader's engine runs its stages here and the others on
  // their nodes. A lost node is a lost device: on_device_lost is called (from the group's thread, at once, even
  // when nothing runs) and every request ends UNAVAILABLE naming the node. Not owned.
  NodeGroup* group = nullptr;
  // Speculative decoding (speculation.h): each decoding sequence proposes tokens, which its next forward pass
  // verifies; the ids are those of decoding without it (greedy, and seeded sampling alike).
  SpeculativeOptions speculative;
  // SpeculativeOptions::Method::kDraft: the draft model (draft_model.h), loaded beside the target with a KV pool of as
  // many blocks of as many positions. Not owned; it must outlive the engine.
  LoadedModel* draft = nullptr;
  // Speculative decoding's trace (strata-generate --speculation-trace): a file that gets one JSON line per verified
  // proposal, {"sequence", "at" (the first proposed token's position), "proposed" (ids), "accepted" (how many were
  // kept)}, to see what a proposer proposes. Empty: none. Start fails with InvalidArgument naming it when it cannot
  // be written.
  std::string speculation_trace;
};

// Failed micro-batches per stage.
struct StageErrors {
  std::string stage;   // its index, "0", "1", ...
  std::string device;  // the plan's device of the stage
  uint64_t count = 0;
};

struct EngineStats {
  int64_t queued = 0;  // waiting: not yet admitted, or preempted and waiting to be recomputed
  int64_t active = 0;  // running: admitted, holding KV blocks
  int64_t max_running = 0;
  // The paged KV cache (every stage's pool has these blocks, indexed alike): KvBlocks' states.
  std::vector<std::string> kv_devices;  // plan devices of the stages that hold KV pools ("0", "cpu", ...)
  int64_t kv_blocks = 0;
  int64_t kv_block_tokens = 0;
  int64_t kv_used = 0;
  int64_t kv_cached = 0;
  int64_t kv_free = 0;
  uint64_t preemptions = 0;
  uint64_t prefix_queried_tokens = 0;  // prompt tokens looked up in the prefix cache at admission
  uint64_t prefix_hit_tokens = 0;      // of those, found there (not computed again)
  uint64_t micro_batches_run = 0;
  std::vector<StageBusy> stages;
  std::vector<LinkTransfer> transfers;  // a group of nodes: what each link carried
  int64_t refused_connections = 0;      // a group: connections the leader's data port refused
  std::vector<StageErrors> errors;      // stages that failed at least once
  // Rows whose logits were not finite (NaN or inf), by the stage that computed them: each ended its
  // request with kError.
  std::vector<StageErrors> nonfinite_logits;
  // Structured outputs: token masks filled (one per constrained row and step) and the time spent filling them,
  // on the mask thread while the forward passes ran.
  uint64_t masks_filled = 0;
  double mask_fill_seconds = 0;
  uint64_t forced_tokens = 0;  // appended by jump-forward (EngineOptions::jump_forward) without a forward pass
  // Speculative decoding: tokens proposed and verified, of those the ones the model agreed with, and the
  // verifications (rows that fed a proposal).
  uint64_t spec_proposed_tokens = 0;
  uint64_t spec_accepted_tokens = 0;
  uint64_t spec_verifications = 0;
  // Steps whose proposals the cost-aware switch held back (SpeculativeOptions::cost_aware): the measured cost of
  // verifying them exceeded what their expected acceptance repays.
  uint64_t spec_skipped_steps = 0;
  std::string spec_method;  // SpeculativeMethodName of EngineOptions::speculative ("none" when off)
  bool device_lost = false;
  // Requests that ended kError (a failed forward pass or sampler) since the last micro-batch that produced
  // a token: the server's readiness rule reads it (server/README.md).
  int64_t failed_in_a_row = 0;
};

class Engine {
 public:
  // Starts the engine thread (and one worker per stage) over `model`, which must outlive the engine.
  // `tokenizer` (may be null: then stop strings cannot be used and no text is produced) likewise.
  // `eos_ids` end a sequence (planner::EosTokenIds).
  static absl::StatusOr<std::unique_ptr<Engine>> Start(LoadedModel& model, const tokenizer::Tokenizer* tokenizer,
                                                       std::vector<int32_t> eos_ids, const EngineOptions& options);
  ~Engine();  // Cancels what runs, finishes every callback, joins the threads.

  // Queues a validated request. ResourceExhausted when max_queue requests are already waiting;
  // Unavailable once a device was lost or the engine is stopping.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerationRequest request, ChunkCallback callback);

  EngineStats Stats() const;
  int64_t max_context() const;
  // Tokens a sequence may hold in the KV cache at most: the pool's blocks x block tokens (a request's
  // prompt + new tokens beyond it can never run; the server refuses it).
  int64_t kv_cache_tokens() const;
  int64_t vocab_size() const;
  // Called on the engine thread with the rows of each micro-batch it runs (for a batch-size histogram).
  void SetMicroBatchObserver(std::function<void(int64_t rows)> observer);
  // Called on the mask thread with the seconds each constrained row's token mask took to fill (structured outputs).
  void SetMaskObserver(std::function<void(double seconds)> observer);
  // Called on the engine thread for each verified proposal: its tokens and how many of them were accepted.
  void SetSpeculationObserver(std::function<void(int64_t proposed, int64_t accepted)> observer);

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::runtime
