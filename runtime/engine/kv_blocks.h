#pragma once
// The paged KV cache's bookkeeping (GUIDE.md, KV cache; vLLM's block manager): which blocks of the
// stages' pools are free, which a sequence holds, and which hold a cached prompt prefix. Plain numbers:
// every stage has a pool of the same number of blocks, indexed alike, so one block table serves them all.
//
// A block is in one of three states:
//   used    referenced by at least one running sequence;
//   cached  referenced by none, but its keys and values are a registered prefix block: a later sequence
//           whose tokens start the same way takes it again (Match) instead of recomputing it;
//   free    neither.
// Allocate takes a free block, or else evicts the least recently used cached one.
//
// Prefix identity is exact: a registered block is keyed by (its parent block and that parent's
// generation, its own token ids). A block's generation changes whenever it is handed out again, so a
// child registered under a parent that was later evicted and reused can never match again (it is evicted
// in its turn). This is the hash chained over every token before a block, without a hash's collisions.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

namespace strata::runtime {

struct KvBlockCounts {
  int64_t used = 0;
  int64_t cached = 0;
  int64_t free = 0;
};

class KvBlocks {
 public:
  KvBlocks(int64_t blocks, int64_t block_tokens, bool prefix_cache);

  int64_t blocks() const { return static_cast<int64_t>(state_.size()); }
  int64_t block_tokens() const { return block_tokens_; }
  bool prefix_cache() const { return prefix_cache_; }
  // Blocks Allocate can hand out now: free plus cached.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  KvBlockCounts counts() const;

  // A block with one reference (free first, lowest index first, else the least recently used cached one,
  // which leaves the prefix cache), or nothing when every block is used.
  std::optional<int32_t> Allocate();
  // Drops one reference; at none the block is cached when it is a registered prefix block, else free.
  void Release(int32_t block);

  // The longest run of registered blocks that `tokens` starts with, at most `max_blocks`: each gains a
  // reference (the caller now holds them as if allocated). Empty when the prefix cache is off.
  std::vector<int32_t> Match(std::span<const int32_t> tokens, int64_t max_blocks);
  // Declares `block` (held by the caller, its block_tokens positions computed) to hold `tokens` after
  // `parent` (-1: the first block of a sequence). Ignored when the prefix cache is off, when the parent is
  // not itself registered, or when another block is already registered with the same identity.
  void Register(int32_t block, int32_t parent, std::span<const int32_t> tokens);

 private:
  struct Key {
    int32_t parent = -1;
    uint64_t parent_generation = 0;
    std::vector<int32_t> tokens;
    auto operator<=>(const Key&) const = default;
  };
  struct State {
    int32_t references = 0;
    uint64_t generation = 0;
    uint64_t last_use = 0;   // when its last reference was dropped (LRU order)
    std::optional<Key> key;  // set while registered
  };
  void Unregister(int32_t block);

  const int64_t block_tokens_;
  const bool prefix_cache_;
  std::vector<State> state_;
  std::set<int32_t> free_;                      // lowest first: a new sequence's blocks tend to be consecutive
  std::set<std::pair<uint64_t, int32_t>> lru_;  // cached blocks by last use
  std::map<Key, int32_t> registered_;
  uint64_t clock_ = 0;
};

}  // namespace strata::runtime
