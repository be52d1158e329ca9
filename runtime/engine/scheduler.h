#pragma once
// What to run next, apart from how to run it (STYLE.md, vLLM): the scheduler holds sequences as token
// lists and KV block tables and hands out micro-batches as plain numbers. It never sees a tensor; the
// engine turns a ScheduledMicroBatch into a forward pass and reports back with Complete().
//
// Model of a sequence: `tokens` is the prompt followed by what was generated; `computed` tokens already
// have their keys and values in the sequence's KV blocks (kv_blocks.h), block i holding positions
// [i * block_tokens, (i + 1) * block_tokens). Every forward feeds tokens[computed, computed+n)
// at positions computed.. and, when that reaches the end of `tokens`, the last row's logits give the
// next token. A prefill chunk and a decode step are the same thing with different n.
//
// A micro-batch mixes decode rows (1 token) and prefill chunks of any length under a token budget
// (micro_batch_tokens): decodes first, then chunks. Rows never need padding: nothing is written to a KV
// block but real tokens, and what a row computes does not depend on which rows share its batch.
//
// Memory is counted in blocks, not slots. A queued sequence is admitted (FIFO) while fewer than
// max_running run and the blocks for all its known tokens can be had, less the full blocks its tokens
// share with the prefix cache, which it takes as they are (their tokens are not fed again; at least the
// last known token always is, for its logits). A running sequence gains a block when its next token
// starts one. When none is left, the most recently admitted sequence that is not in flight is preempted:
// its blocks are released (their full, computed ones stay in the prefix cache) and it goes back to the
// front of the queue with every token it knows, to be recomputed when it is admitted again; its stream
// goes on from there (the engine keeps its tokens). A running sequence is never failed for lack of memory.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "runtime/engine/kv_blocks.h"

namespace strata::runtime {

struct SchedulerOptions {
  int64_t max_running = 1;    // sequences running at once (--max-batch)
  int64_t kv_blocks = 128;    // blocks in each stage's KV pool
  int64_t block_tokens = 16;  // positions per block
  // Reuse cached full prompt blocks. Off when recompute_at is set: longrope's keys depend on the whole
  // sequence's length, so a block is not determined by the tokens before it.
  bool prefix_cache = true;
  int64_t prefill_chunk_tokens = 256;  // a longer prompt is prefilled in chunks of this many tokens
  int64_t micro_batch_tokens = 512;    // tokens one micro-batch may feed in all (decodes + prefill chunks)
  int64_t micro_batches = 1;           // micro-batches in flight at once (pipeline depth)
  int64_t max_positions = 0;           // KV positions a sequence may hold (proposals stop there); 0: no limit
  // longrope (Phi-3): original_max_position_embeddings, or 0. A sequence whose cache was computed while it
  // was at most this long is recomputed from position 0 when it grows past it, as transformers' generate()
  // drops its cache there (the long factors then apply to every position).
  int64_t recompute_at = 0;
};

struct ScheduledRow {
  uint64_t sequence = 0;
  std::vector<int32_t> blocks;  // the sequence's block table, as far as positions [0, start + count) reach
  int64_t start = 0;            // first position fed
  int64_t count = 0;            // tokens fed (equal across the micro-batch's rows)
  bool samples = false;         // this chunk reaches the end of the known tokens: sample from its logits
  int64_t length = 0;           // the sequence's known tokens (prompt + generated) when scheduled
  // Speculative decoding: a decode row feeds its last known token and then `draft` proposed ones (Propose), so
  // count = 1 + draft. The engine sets `accepted` (how many of them the model agreed with) before Complete: only
  // those positions' keys and values count as computed.
  int64_t draft = 0;
  int64_t accepted = 0;
  // The sequence's first row since it was (re)admitted, or since longrope's recompute: what its KV blocks held
  // before is not its own (a draft model's cache of it starts again).
  bool admitted = false;
};

struct ScheduledMicroBatch {
  std::vector<ScheduledRow> rows;
  int64_t tokens() const {
    int64_t total = 0;
    for (const ScheduledRow& row : rows) total += row.count;
    return total;
  }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);

  // Queues a sequence (FIFO). `tokens` (the prompt; the caller appends what is generated, then calls
  // Append) must outlive the sequence's time here. Its prompt + the tokens it will generate must fit the
  // KV pool (validated before it gets here), so that it can always run once the others are preempted.
  // `reuse_prefix` false: it takes nothing from the prefix cache (every token is fed, as prompt
  // log-probabilities need), though its own blocks join it.
  void Add(uint64_t sequence, const std::vector<int32_t>& tokens, bool reuse_prefix = true);

  // The next micro-batch among sequences not already in flight, or nothing when none can run. Gives
  // running sequences the blocks their next tokens need (preempting), then admits queued ones. Decodes go
  // first, prefill chunks fill the rest of the token budget, and a micro-batch takes at most its share of
  // the active sequences, ceil(active / micro_batches), so that the pipeline has `micro_batches` batches
  // to overlap.
  std::optional<ScheduledMicroBatch> Next();

  // A scheduled micro-batch came back: its rows' chunks are in the cache. Rows that sampled and go on
  // must have had their token Append()ed first; sequences Finish()ed while in flight retire here.
  void Complete(const ScheduledMicroBatch& batch);
  // A sampled token was appended to a running sequence.
  void Append(uint64_t sequence);
  // Speculative decoding: the sequence, when it next decodes, also feeds up to `tokens` proposed tokens after
  // its last known one (fewer where the micro-batch's token budget, its free KV blocks or its context end: no
  // sequence is preempted for a proposal). Ignored for sequences in flight, prefilling or not running; replaced
  // by the next call; cleared when the row completes.
  void Propose(uint64_t sequence, int64_t tokens);
  // A draft model's proposal, before it is made: takes the blocks that `tokens` proposed tokens after the idle
  // running sequence's last known one need (while free ones are left, never by preemption; positions stop at
  // max_positions) and returns how many of them fit, with the sequence's block table in `blocks` (0 for a sequence
  // in flight, prefilling or not running).
  int64_t ReserveProposal(uint64_t sequence, int64_t tokens, std::vector<int32_t>* blocks);

  // Ends a sequence: queued ones leave the queue; running ones release their blocks now when they are
  // not in flight, else as soon as their micro-batch completes. Unknown ids are ignored.
  void Finish(uint64_t sequence);

  int64_t queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t in_flight() const { return in_flight_batches_; }
  bool InFlight(uint64_t sequence) const;
  const KvBlocks& blocks() const { return blocks_; }
  uint64_t preemptions() const { return preemptions_; }
  // Prompt tokens looked up in the prefix cache at admission (not those of sequences added without prefix
  // reuse), and those found there (vLLM counts both).
  uint64_t prefix_queried_tokens() const { return prefix_queried_; }
  uint64_t prefix_hit_tokens() const { return prefix_hit_; }

 private:
  struct Running {
    const std::vector<int32_t>* tokens = nullptr;
    std::vector<int32_t> blocks;
    int64_t length = 0;      // tokens known (prompt + generated)
    int64_t computed = 0;    // tokens in the KV cache
    int64_t registered = 0;  // leading full blocks already offered to the prefix cache
    bool in_flight = false;
    bool finished = false;        // retire when it comes back
    uint64_t admitted = 0;        // admission order: the most recent is preempted first
    uint64_t last_scheduled = 0;  // Next() call that last took it: the longest-waiting go first
    bool short_prefix = false;    // recompute_at: its cache was computed at a length <= recompute_at
    int64_t draft = 0;            // Propose: tokens it would feed after its last known one
    bool fresh = true;            // no row taken since its admission (ScheduledRow::admitted)
  };
  void Admit();
  // Gives idle running sequences the blocks their next token needs, preempting when none is left.
  void Grow();
  void Preempt(uint64_t sequence);
  void Retire(uint64_t sequence);
  int64_t BlocksFor(int64_t tokens) const { return (tokens + options_.block_tokens - 1) / options_.block_tokens; }
  // Of r.draft proposed tokens, how many a decode row of r can feed within `budget` tokens in all: blocks for
  // them are taken while free ones are left (never by preemption), and positions stop at max_positions.
  int64_t DraftRoom(Running& r, int64_t budget);

  SchedulerOptions options_;
  KvBlocks blocks_;
  std::deque<std::pair<uint64_t, const std::vector<int32_t>*>> queue_;
  std::map<uint64_t, Running> running_;
  std::set<uint64_t> no_prefix_reuse_;  // Add(reuse_prefix = false) until they finish
  int64_t in_flight_batches_ = 0;
  uint64_t tick_ = 0;
  uint64_t admissions_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t prefix_queried_ = 0;
  uint64_t prefix_hit_ = 0;
};

}  // namespace strata::runtime
