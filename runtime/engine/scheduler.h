#pragma once
// What to run next, apart from how to run it (STYLE.md, vLLM): the scheduler holds sequences as token
// lists and KV slots and hands out micro-batches as plain numbers. It never sees a tensor; the engine
// turns a ScheduledMicroBatch into a forward pass and reports back with Complete().
//
// Model of a sequence: `tokens` is the prompt followed by what was generated; `computed` tokens already
// have their keys and values in the sequence's KV slot. Every forward feeds tokens[computed, computed+n)
// at positions computed.. and, when that reaches the end of `tokens`, the last row's logits give the
// next token. A prefill chunk and a decode step are the same thing with different n.
//
// A micro-batch holds rows that all feed the same number of tokens (decode rows feed 1; prefill chunks
// of equal length can share one), so rows never need padding: nothing is written to a KV slot but real
// tokens, and what a row computes does not depend on which rows share its batch.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

namespace strata::runtime {

struct SchedulerOptions {
  int64_t slots = 1;                  // KV-cache sequence slots (the most sequences running at once)
  int64_t max_context = 2048;         // positions per slot
  int64_t prefill_chunk_tokens = 256;  // a longer prompt is prefilled in chunks of this many tokens
  int64_t micro_batch_tokens = 512;    // tokens one micro-batch may feed in all
  int64_t micro_batches = 1;           // micro-batches in flight at once (pipeline depth)
  // longrope (Phi-3): original_max_position_embeddings, or 0. A sequence whose cache was computed while it
  // was at most this long is recomputed from position 0 when it grows past it, as transformers' generate()
  // drops its cache there (the long factors then apply to every position).
  int64_t recompute_at = 0;
};

struct ScheduledRow {
  uint64_t sequence = 0;
  int64_t slot = 0;
  int64_t start = 0;  // first position fed
  int64_t count = 0;  // tokens fed (equal across the micro-batch's rows)
  bool samples = false;  // this chunk reaches the end of the known tokens: sample from its logits
  int64_t length = 0;    // the sequence's known tokens (prompt + generated) when scheduled
};

struct ScheduledMicroBatch {
  std::vector<ScheduledRow> rows;
  int64_t tokens() const { return rows.empty() ? 0 : static_cast<int64_t>(rows.size()) * rows.front().count; }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);

  // Queues a sequence (FIFO) until a slot is free. `prompt_length` + the tokens it will generate must fit
  // max_context (validated before it gets here).
  void Add(uint64_t sequence, int64_t prompt_length);

  // The next micro-batch among sequences not already in flight, or nothing when none can run. Admits
  // queued sequences into free slots first. Prefill chunks go before decodes (time to first token),
  // and a micro-batch takes at most its share of the active sequences, ceil(active / micro_batches), so
  // that the pipeline has `micro_batches` batches to overlap.
  std::optional<ScheduledMicroBatch> Next();

  // A scheduled micro-batch came back: its rows' chunks are in the cache. Rows that sampled and go on
  // must have had their token Append()ed first; sequences Finish()ed while in flight retire here.
  void Complete(const ScheduledMicroBatch& batch);
  // A sampled token was appended to a running sequence.
  void Append(uint64_t sequence);

  // Ends a sequence: queued ones leave the queue; running ones free their slot now when they are not in
  // flight, else as soon as their micro-batch completes. Unknown ids are ignored.
  void Finish(uint64_t sequence);

  int64_t queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t free_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  int64_t in_flight() const { return in_flight_batches_; }
  bool InFlight(uint64_t sequence) const;
  std::optional<int64_t> SlotOf(uint64_t sequence) const;

 private:
  struct Running {
    int64_t slot = 0;
    int64_t length = 0;    // tokens known (prompt + generated)
    int64_t computed = 0;  // tokens in the KV cache
    bool in_flight = false;
    bool finished = false;  // retire when it comes back
    uint64_t last_scheduled = 0;  // Next() call that last took it: the longest-waiting go first
    bool short_prefix = false;    // recompute_at: its cache was computed at a length <= recompute_at
  };
  void Retire(uint64_t sequence);

  SchedulerOptions options_;
  std::deque<std::pair<uint64_t, int64_t>> queue_;  // (sequence, prompt length)
  std::map<uint64_t, Running> running_;
  std::vector<int64_t> free_slots_;  // a stack: the lowest slot is handed out first
  int64_t in_flight_batches_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace strata::runtime
