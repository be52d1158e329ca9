#include "runtime/engine/scheduler.h"

#include <algorithm>

namespace strata::runtime {

Scheduler::Scheduler(const SchedulerOptions& options) : options_(options) {
  options_.micro_batches = std::max<int64_t>(options_.micro_batches, 1);
  options_.prefill_chunk_tokens = std::max<int64_t>(options_.prefill_chunk_tokens, 1);
  options_.micro_batch_tokens = std::max(options_.micro_batch_tokens, options_.prefill_chunk_tokens);
  for (int64_t slot = options_.slots - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

void Scheduler::Add(uint64_t sequence, int64_t prompt_length) { queue_.emplace_back(sequence, prompt_length); }

bool Scheduler::InFlight(uint64_t sequence) const {
  auto it = running_.find(sequence);
  return it != running_.end() && it->second.in_flight;
}

std::optional<int64_t> Scheduler::SlotOf(uint64_t sequence) const {
  auto it = running_.find(sequence);
  if (it == running_.end()) return std::nullopt;
  return it->second.slot;
}

std::optional<ScheduledMicroBatch> Scheduler::Next() {
  ++tick_;
  while (!queue_.empty() && !free_slots_.empty()) {
    auto [sequence, length] = queue_.front();
    queue_.pop_front();
    Running r;
    r.slot = free_slots_.back();
    free_slots_.pop_back();
    r.length = length;
    running_.emplace(sequence, r);
  }

  // Idle sequences, the longest-waiting first.
  std::vector<std::pair<uint64_t, Running*>> prefilling;
  std::vector<std::pair<uint64_t, Running*>> decoding;
  for (auto& [id, r] : running_) {
    if (r.in_flight || r.finished) continue;
    if (options_.recompute_at > 0 && r.short_prefix && r.computed > 0 && r.length > options_.recompute_at) {
      r.computed = 0;  // SchedulerOptions::recompute_at
      r.short_prefix = false;
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
    row.slot = r.slot;
    row.start = r.computed;
    row.count = count;
    row.samples = r.computed + count == r.length;
    row.length = r.length;
    if (options_.recompute_at > 0 && r.length <= options_.recompute_at) r.short_prefix = true;
    r.in_flight = true;
    r.last_scheduled = tick_;
    batch.rows.push_back(row);
  };
  if (!prefilling.empty()) {
    // The first waiting prompt sets the chunk length; others whose next chunk has the same length join
    // while the token budget allows.
    auto chunk = [&](const Running& r) { return std::min(r.length - r.computed, options_.prefill_chunk_tokens); };
    const int64_t count = chunk(*prefilling.front().second);
    for (auto& [id, r] : prefilling) {
      if (static_cast<int64_t>(batch.rows.size()) >= share) break;
      if ((static_cast<int64_t>(batch.rows.size()) + 1) * count > options_.micro_batch_tokens) break;
      if (chunk(*r) == count) take(id, *r, count);
    }
  } else {
    for (auto& [id, r] : decoding) {
      if (static_cast<int64_t>(batch.rows.size()) >= std::min(share, options_.micro_batch_tokens)) break;
      take(id, *r, 1);
    }
  }
  if (batch.rows.empty()) return std::nullopt;
  ++in_flight_batches_;
  return batch;
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
    r.computed = row.start + row.count;
    if (r.finished) Retire(row.sequence);
  }
}

void Scheduler::Finish(uint64_t sequence) {
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
  free_slots_.push_back(it->second.slot);
  // Keep the lowest free slot on top: slots are then reused in a stable order.
  std::sort(free_slots_.begin(), free_slots_.end(), std::greater<>());
  running_.erase(it);
}

}  // namespace strata::runtime
