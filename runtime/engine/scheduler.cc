#include "runtime/engine/scheduler.h"

#include <algorithm>
#include <span>

namespace strata::runtime {

namespace {

SchedulerOptions Normalized(SchedulerOptions o) {
  o.micro_batches = std::max<int64_t>(o.micro_batches, 1);
  o.prefill_chunk_tokens = std::max<int64_t>(o.prefill_chunk_tokens, 1);
  o.micro_batch_tokens = std::max<int64_t>(o.micro_batch_tokens, 1);
  o.block_tokens = std::max<int64_t>(o.block_tokens, 1);
  o.max_running = std::max<int64_t>(o.max_running, 1);
  if (o.recompute_at > 0) o.prefix_cache = false;
  return o;
}

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(Normalized(options)), blocks_(options_.kv_blocks, options_.block_tokens, options_.prefix_cache) {}

void Scheduler::Add(uint64_t sequence, const std::vector<int32_t>& tokens, bool reuse_prefix) {
  queue_.emplace_back(sequence, &tokens);
  if (!reuse_prefix) no_prefix_reuse_.insert(sequence);
}

bool Scheduler::InFlight(uint64_t sequence) const {
  auto it = running_.find(sequence);
  return it != running_.end() && it->second.in_flight;
}

void Scheduler::Admit() {
  while (!queue_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
    auto [sequence, tokens] = queue_.front();
    const int64_t length = static_cast<int64_t>(tokens->size());
    // At least the last known token is fed again: its logits choose the next one.
    std::vector<int32_t> hits = no_prefix_reuse_.contains(sequence)
                                    ? std::vector<int32_t>()
                                    : blocks_.Match(*tokens, (length - 1) / options_.block_tokens);
    const int64_t needed = BlocksFor(length) - static_cast<int64_t>(hits.size());
    // A watermark (vLLM's 1%) leaves the running sequences room to grow before anyone is preempted; a
    // sequence alone may take every block.
    const int64_t watermark = running_.empty() ? 0 : std::max<int64_t>(1, blocks_.blocks() / 100);
    if (needed + watermark > blocks_.available()) {
      for (int32_t block : hits) blocks_.Release(block);
      return;  // first come, first served: the head waits for blocks
    }
    queue_.pop_front();
    Running r;
    r.tokens = tokens;
    r.blocks = std::move(hits);
    r.computed = static_cast<int64_t>(r.blocks.size()) * options_.block_tokens;
    r.registered = static_cast<int64_t>(r.blocks.size());
    for (int64_t i = 0; i < needed; ++i) r.blocks.push_back(*blocks_.Allocate());
    r.length = length;
    r.admitted = ++admissions_;
    if (blocks_.prefix_cache() && !no_prefix_reuse_.contains(sequence)) {
      prefix_queried_ += static_cast<uint64_t>(length);
      prefix_hit_ += static_cast<uint64_t>(r.computed);
    }
    running_.emplace(sequence, std::move(r));
  }
}

void Scheduler::Grow() {
  std::vector<std::pair<uint64_t, uint64_t>> by_admission;  // (admitted, sequence), oldest first
  for (const auto& [id, r] : running_) by_admission.emplace_back(r.admitted, id);
  std::sort(by_admission.begin(), by_admission.end());
  for (const auto& [admitted, id] : by_admission) {
    auto it = running_.find(id);
    if (it == running_.end()) continue;  // preempted for an older sequence
    Running& r = it->second;
    if (r.in_flight || r.finished) continue;
    while (static_cast<int64_t>(r.blocks.size()) < BlocksFor(r.length)) {
      if (std::optional<int32_t> block = blocks_.Allocate()) {
        r.blocks.push_back(*block);
        continue;
      }
      // None left: preempt the most recently admitted sequence that can be (possibly this one).
      uint64_t victim = 0;
      uint64_t latest = 0;
      for (const auto& [other, o] : running_) {
        if (!o.in_flight && !o.finished && o.admitted >= latest) {
          latest = o.admitted;
          victim = other;
        }
      }
      if (latest == 0) break;  // every other holder is in flight: wait for them
      Preempt(victim);
      if (victim == id) break;
    }
  }
}

void Scheduler::Preempt(uint64_t sequence) {
  auto it = running_.find(sequence);
  for (int32_t block : it->second.blocks) blocks_.Release(block);
  queue_.emplace_front(sequence, it->second.tokens);
  running_.erase(it);
  ++preemptions_;
}

std::optional<ScheduledMicroBatch> Scheduler::Next() {
  ++tick_;
  Grow();  // running sequences first: admitting now and preempting the newcomer at once would be waste
  Admit();

  // Idle sequences with the blocks they need, the longest-waiting first.
  std::vector<std::pair<uint64_t, Running*>> prefilling;
  std::vector<std::pair<uint64_t, Running*>> decoding;
  for (auto& [id, r] : running_) {
    // A sequence whose sampled token has not been appended yet has nothing to feed.
    if (r.in_flight || r.finished || r.computed >= r.length) continue;
    if (static_cast<int64_t>(r.blocks.size()) < BlocksFor(r.length)) continue;  // waits for a block
    if (options_.recompute_at > 0 && r.short_prefix && r.computed > 0 && r.length > options_.recompute_at) {
      r.computed = 0;  // SchedulerOptions::recompute_at
      r.short_prefix = false;
      r.fresh = true;
    }
    (r.length - r.computed > 1 ? prefilling : decoding).emplace_back(id, &r);
  }
  auto by_wait = [](const auto& a, const auto& b) {
    return a.second->last_scheduled != b.second->last_scheduled ? a.second->last_scheduled < b.second->last_scheduled
                                                                : a.first < b.first;
  };
  std::sort(prefilling.begin(), prefilling.end(), by_wait);
  std::sort(decoding.begin(), decoding.end(), by_wait);

  const int64_t active = static_cast<int64_t>(running_.size());
  const int64_t share = std::max<int64_t>(1, (active + options_.micro_batches - 1) / options_.micro_batches);

  ScheduledMicroBatch batch;
  auto take = [&](uint64_t id, Running& r, int64_t count) {
    ScheduledRow row;
    row.sequence = id;
    row.blocks.assign(r.blocks.begin(), r.blocks.begin() + BlocksFor(r.computed + count));
    row.start = r.computed;
    row.count = count;
    row.samples = r.computed + count >= r.length;
    row.length = r.length;
    row.admitted = r.fresh;
    r.fresh = false;
    if (options_.recompute_at > 0 && r.length <= options_.recompute_at) r.short_prefix = true;
    r.in_flight = true;
    r.last_scheduled = tick_;
    batch.rows.push_back(std::move(row));
  };
  // Decodes first, so that a burst of prompts never holds a running sequence back; prefill chunks fill
  // what the token budget leaves, the longest-waiting first, the last one cut to fit (vLLM's chunked
  // prefill). Rows of different lengths share the micro-batch (the executor runs each length as a group).
  int64_t budget = options_.micro_batch_tokens;
  auto room = [&] { return static_cast<int64_t>(batch.rows.size()) < share && budget > 0; };
  for (auto& [id, r] : decoding) {
    if (!room()) break;
    const int64_t draft = DraftRoom(*r, budget);
    take(id, *r, 1 + draft);
    batch.rows.back().draft = draft;
    budget -= 1 + draft;
  }
  for (auto& [id, r] : prefilling) {
    if (!room()) break;
    const int64_t count = std::min({r->length - r->computed, options_.prefill_chunk_tokens, budget});
    take(id, *r, count);
    budget -= count;
  }
  if (batch.rows.empty()) return std::nullopt;
  ++in_flight_batches_;
  return batch;
}

void Scheduler::Propose(uint64_t sequence, int64_t tokens) {
  auto it = running_.find(sequence);
  if (it == running_.end() || it->second.in_flight || it->second.finished) return;
  it->second.draft = std::max<int64_t>(tokens, 0);
}

int64_t Scheduler::ReserveProposal(uint64_t sequence, int64_t tokens, std::vector<int32_t>* blocks) {
  auto it = running_.find(sequence);
  if (it == running_.end()) return 0;
  Running& r = it->second;
  if (r.in_flight || r.finished || r.computed + 1 != r.length || tokens < 1) return 0;
  r.draft = tokens;
  const int64_t room = DraftRoom(r, tokens + 1);
  r.draft = 0;
  if (blocks != nullptr) *blocks = r.blocks;
  return room;
}

int64_t Scheduler::DraftRoom(Running& r, int64_t budget) {
  int64_t draft = std::min(r.draft, budget - 1);
  if (options_.max_positions > 0) draft = std::min(draft, options_.max_positions - r.length);
  if (draft <= 0) return 0;
  while (static_cast<int64_t>(r.blocks.size()) < BlocksFor(r.length + draft) && blocks_.available() > 0) {
    std::optional<int32_t> block = blocks_.Allocate();
    if (!block) break;
    r.blocks.push_back(*block);
  }
  return std::max<int64_t>(0,
                           std::min(draft, static_cast<int64_t>(r.blocks.size()) * options_.block_tokens - r.length));
}

void Scheduler::Append(uint64_t sequence) {
  auto it = running_.find(sequence);
  if (it != running_.end()) ++it->second.length;
}

void Scheduler::Complete(const ScheduledMicroBatch& batch) {
  --in_flight_batches_;
  for (const ScheduledRow& row : batch.rows) {
    auto it = running_.find(row.sequence);
    if (it == running_.end()) continue;
    Running& r = it->second;
    r.in_flight = false;
    r.computed = row.start + row.count - (row.draft - std::clamp<int64_t>(row.accepted, 0, row.draft));
    r.draft = 0;
    if (r.finished) {
      Retire(row.sequence);
      continue;
    }
    // Blocks a proposal took past what the sequence now needs hold only rejected positions: free them for others
    // (the next proposal takes them again while free ones are left).
    while (static_cast<int64_t>(r.blocks.size()) > std::max<int64_t>(1, BlocksFor(r.length))) {
      blocks_.Release(r.blocks.back());
      r.blocks.pop_back();
    }
    // Full blocks now computed join the prefix cache.
    const int64_t size = options_.block_tokens;
    for (; (r.registered + 1) * size <= r.computed; ++r.registered) {
      const std::span<const int32_t> tokens(r.tokens->data() + r.registered * size, static_cast<size_t>(size));
      blocks_.Register(r.blocks[r.registered], r.registered > 0 ? r.blocks[r.registered - 1] : -1, tokens);
    }
  }
}

void Scheduler::Finish(uint64_t sequence) {
  no_prefix_reuse_.erase(sequence);
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->first == sequence) {
      queue_.erase(it);
      return;
    }
  }
  auto it = running_.find(sequence);
  if (it == running_.end()) return;
  it->second.finished = true;
  if (!it->second.in_flight) Retire(sequence);
}

void Scheduler::Retire(uint64_t sequence) {
  auto it = running_.find(sequence);
  for (int32_t block : it->second.blocks) blocks_.Release(block);
  running_.erase(it);
}

}  // namespace strata::runtime
