#pragma once
// Speculative decoding with a draft model (issue 44; README "Speculative decoding"): a smaller model of the target's
// vocabulary proposes each decoding sequence's next tokens, one forward pass of its own a token, and the target
// verifies them all in one pass (speculation.h). Greedy requests take the draft's argmax, and the target keeps the
// tokens its own argmax agrees with: the ids are those of decoding without a draft. Sampled requests draw each
// proposal from the draft's processed distribution q (the request's temperature, top_k and top_p), which comes back
// with it, and the target's sampler keeps or replaces it by Leviathan et al.'s rule (RowSampling::draft_probs): the
// tokens are distributed as the target's, whatever the draft.
//
// The draft has its own executor, stages and KV pools, with as many blocks of as many positions as the target's:
// a sequence's draft cache lives in the same block ids as its target cache (the scheduler's table), so the
// scheduler's accounting covers both. What the draft cache holds is tracked per sequence (DraftRequest::computed):
// each proposal first feeds the tokens it has not seen (the prompt, at the sequence's first proposal; then the
// token the target chose at the first disagreement, or the last proposed one and the bonus token) as a chunk.
// A wrong draft cache could only lower the acceptance: the target's verification alone decides the tokens.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/executor/executor.h"
#include "runtime/executor/loaded_model.h"
#include "structured/structured.h"

namespace strata::runtime {

struct DraftRequest {
  const std::vector<int32_t>* tokens = nullptr;  // the sequence's prompt and generated tokens
  // The sequence's block table, covering positions [0, tokens->size() + count - 1) (Scheduler::ReserveProposal).
  std::vector<int32_t> blocks;
  // The leading tokens whose keys and values the draft's cache holds; after Propose, those it holds then.
  int64_t computed = 0;
  int64_t count = 0;  // tokens to propose, at least 1
  // The request's warpers: temperature below kMinSamplingTemperature proposes the draft's argmax.
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 1;
  std::mt19937_64* random = nullptr;  // the draft's draws (sampled requests)
  // A constrained request's grammar at the sequence's end: each proposal is chosen under the mask of the grammar's
  // state after the proposals before it (the target's mask there, so a right draft is kept), accepted into the
  // matcher, which is rolled back before Propose returns. Null: unconstrained.
  structured::Matcher* matcher = nullptr;
};

struct DraftProposal {
  std::vector<int32_t> tokens;  // at most DraftRequest::count (fewer when the draft's logits were not finite)
  // Sampled requests: the distribution each token was drawn from, tokens.size() x the target's vocabulary (ids the
  // draft does not have at 0). Empty for greedy ones.
  std::vector<float> probs;
};

// The draft's load, planned beside the target's (`target_load`, from `target`): the same devices, dtype and
// serving limits, a KV pool of as many blocks of as many positions, the "sequential" strategy (a small draft fills
// the first device with room, under balanced_low_0 the light GPU 0 the sampler is on, rather than spreading over
// every stage), and as budgets what the target's plan leaves of each device's (its budget less its weights, KV
// reserve and runtime reserve); in a group of nodes (`target_load.gpu_nodes`), the leader's devices only: the draft
// runs in its process. `target` is the leader's own request (before PlanForGroup). Errors name --draft-model and what
// is wrong.
absl::StatusOr<LoadOptions> PlanDraftLoad(const ServingRequest& target, const LoadOptions& target_load,
                                          const std::filesystem::path& draft_dir);

// The draft must speak the target's vocabulary: where both folders have a tokenizer, every id below the smaller
// vocabulary must be the same token. InvalidArgument naming the first id that differs.
absl::Status CheckDraftTokenizer(const std::filesystem::path& target_dir, const std::filesystem::path& draft_dir);

class DraftModel {
 public:
  // Starts the draft's executor over `draft` (which must outlive it). InvalidArgument naming what does not match:
  // a vocabulary larger than the target's, a KV pool with fewer blocks or other block sizes, a shorter context.
  static absl::StatusOr<std::unique_ptr<DraftModel>> Start(LoadedModel& draft, const LoadedModel& target,
                                                           int64_t chunk_tokens, int32_t intra_op_threads);
  ~DraftModel();

  // Proposes for every request, batched: the chunks of what each draft cache lacks, then count - 1 single-token
  // steps. A failed pass is INTERNAL naming the draft's stage (device_lost() tells whether the device is unusable).
  absl::StatusOr<std::vector<DraftProposal>> Propose(std::vector<DraftRequest>& requests);
  bool device_lost() const { return device_lost_; }
  int64_t vocab_size() const { return vocab_; }

 private:
  DraftModel(std::unique_ptr<Executor> executor, int64_t vocab, int64_t target_vocab, int64_t chunk_tokens,
             int64_t block_tokens);
  // Runs one micro-batch and returns its result (its status checked).
  absl::StatusOr<MicroBatchResult> Run(MicroBatchWork work);

  std::unique_ptr<Executor> executor_;
  int64_t vocab_ = 0;
  int64_t target_vocab_ = 0;
  int64_t chunk_tokens_ = 256;
  int64_t block_tokens_ = 16;
  uint64_t next_id_ = 1;
  bool device_lost_ = false;
};

}  // namespace strata::runtime
