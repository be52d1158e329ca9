#include "runtime/engine/kv_blocks.h"

namespace strata::runtime {

KvBlocks::KvBlocks(int64_t blocks, int64_t block_tokens, bool prefix_cache)
    : block_tokens_(block_tokens), prefix_cache_(prefix_cache), state_(static_cast<size_t>(blocks)) {
  for (int32_t b = 0; b < static_cast<int32_t>(blocks); ++b) free_.insert(b);
}

KvBlockCounts KvBlocks::counts() const {
  KvBlockCounts c;
  c.free = static_cast<int64_t>(free_.size());
  c.cached = static_cast<int64_t>(lru_.size());
  c.used = blocks() - c.free - c.cached;
  return c;
}

std::optional<int32_t> KvBlocks::Allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = *free_.begin();
    free_.erase(free_.begin());
  } else if (!lru_.empty()) {
    block = lru_.begin()->second;
    lru_.erase(lru_.begin());
    Unregister(block);
  } else {
    return std::nullopt;
  }
  State& s = state_[block];
  s.references = 1;
  ++s.generation;
  return block;
}

void KvBlocks::Release(int32_t block) {
  State& s = state_.at(block);
  if (--s.references > 0) return;
  if (s.key) {
    s.last_use = ++clock_;
    lru_.emplace(s.last_use, block);
  } else {
    free_.insert(block);
  }
}

std::vector<int32_t> KvBlocks::Match(std::span<const int32_t> tokens, int64_t max_blocks) {
  std::vector<int32_t> hits;
  if (!prefix_cache_) return hits;
  Key key;
  for (int64_t i = 0; i < max_blocks && (i + 1) * block_tokens_ <= static_cast<int64_t>(tokens.size()); ++i) {
    key.tokens.assign(tokens.begin() + i * block_tokens_, tokens.begin() + (i + 1) * block_tokens_);
    auto it = registered_.find(key);
    if (it == registered_.end()) break;
    const int32_t block = it->second;
    State& s = state_[block];
    if (s.references++ == 0) lru_.erase({s.last_use, block});
    hits.push_back(block);
    key.parent = block;
    key.parent_generation = s.generation;
  }
  return hits;
}

void KvBlocks::Register(int32_t block, int32_t parent, std::span<const int32_t> tokens) {
  if (!prefix_cache_ || static_cast<int64_t>(tokens.size()) != block_tokens_) return;
  State& s = state_.at(block);
  if (s.key) return;
  Key key;
  if (parent >= 0) {
    const State& p = state_.at(parent);
    if (!p.key) return;
    key.parent = parent;
    key.parent_generation = p.generation;
  }
  key.tokens.assign(tokens.begin(), tokens.end());
  if (registered_.contains(key)) return;
  registered_.emplace(key, block);
  s.key = std::move(key);
}

void KvBlocks::Unregister(int32_t block) {
  State& s = state_[block];
  if (!s.key) return;
  registered_.erase(*s.key);
  s.key.reset();
}

}  // namespace strata::runtime
