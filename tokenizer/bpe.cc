#include "tokenizer/bpe.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/absl_compat.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

constexpr size_t kCacheCapacity = 1 << 16;
constexpr size_t kCacheMaxWordBytes = 256;  // longer pieces are rare and would bloat the cache

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

// A possible merge of the pair starting at `pos`. The queue pops the lowest rank, then the leftmost
// position: the order upstream's BinaryHeap of `Merge`s yields.
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Parse(const JsonAt& json) {
  if (json.value.is_null()) return json.Error("missing (tokenizer.json needs a model)");
  if (!json.value.is_object()) return json.Error(base::StrCat("expected an object, got ", json.value.type_name()));
  // Files from before typed models carry no "type"; upstream then recognises BPE by its merges.
  if (json.Has("type") || !json.Has("merges")) {
    auto type = json.String("type");
    if (!type.ok()) return type.status();
    if (*type != "BPE") return json.FieldError("type", base::StrCat("unsupported model \"", *type, "\""));
  }
  auto model = std::make_unique<BpeModel>();

  JsonAt dropout = json.Field("dropout");
  if (!dropout.value.is_null() && !(dropout.value.is_number() && dropout.value.get<double>() == 0.0)) {
    return dropout.Error("unsupported: BPE dropout samples merges at random, so its output is not reproducible");
  }

  if (absl::Status vocab = model->ParseVocab(json.Field("vocab")); !vocab.ok()) return vocab;
  if (absl::Status options = model->ParseOptions(json); !options.ok()) return options;
  if (absl::Status merges = model->ParseMerges(json.Field("merges")); !merges.ok()) return merges;
  return model;
}

// vocab_, and the id -> token table from it.
absl::Status BpeModel::ParseVocab(const JsonAt& vocab) {
  if (!vocab.value.is_object()) return vocab.Error("expected an object mapping tokens to ids");
  vocab_.reserve(vocab.value.size());
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab.value.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return vocab.Field(token).Error("expected a non-negative 32-bit integer id");
    }
    // The id -> token table is sized by the largest id: a huge id would ask for gigabytes (or, at
    // INT32_MAX, overflow max_id + 1).
    if (id.get<int64_t>() > kMaxTokenId) {
      return vocab.Field(token).Error(
          base::StrCat("id ", id.get<int64_t>(), " is above the largest supported id (", kMaxTokenId, ")"));
    }
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    vocab_.emplace(token, i);
    max_id = std::max(max_id, i);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_token_[id] = true;
  }
  return absl::OkStatus();
}

// The affixes, fuse_unk, byte_fallback, ignore_merges, unk_token and the byte-fallback tokens' ids.
absl::Status BpeModel::ParseOptions(const JsonAt& json) {
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (json.Has(key)) {
      auto s = json.String(key);
      if (!s.ok()) return s.status();
      (std::string_view(key) == "continuing_subword_prefix" ? continuing_subword_prefix_ : end_of_word_suffix_) = *s;
    }
  }
  auto fuse_unk = json.Bool("fuse_unk", false);
  if (!fuse_unk.ok()) return fuse_unk.status();
  fuse_unk_ = *fuse_unk;
  auto byte_fallback = json.Bool("byte_fallback", false);
  if (!byte_fallback.ok()) return byte_fallback.status();
  byte_fallback_ = *byte_fallback;
  auto ignore_merges = json.Bool("ignore_merges", false);
  if (!ignore_merges.ok()) return ignore_merges.status();
  ignore_merges_ = *ignore_merges;
  if (json.Has("unk_token")) {
    auto unk = json.String("unk_token");
    if (!unk.ok()) return unk.status();
    auto it = vocab_.find(*unk);
    if (it == vocab_.end()) {
      return json.FieldError("unk_token", base::StrCat("\"", *unk, "\" is not in model.vocab"));
    }
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(absl::StrFormat("<0x%02X>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  return absl::OkStatus();
}

// Merges: "a b" strings (split at the first space) or ["a", "b"] pairs. A merge's rank is its index;
// a repeated pair keeps its last rank, as upstream's map collection does.
absl::Status BpeModel::ParseMerges(const JsonAt& merges) {
  if (!merges.value.is_array()) return merges.Error("expected an array of merges");
  merges_.reserve(merges.value.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t i = 0; i < merges.value.size(); ++i) {
    JsonAt m = merges.Index(i);
    std::string a, b;
    if (m.value.is_string()) {
      const std::string& s = m.value.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return m.Error(base::StrCat("expected \"left right\", got \"", s, "\""));
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.value.is_array() && m.value.size() == 2 && m.value[0].is_string() && m.value[1].is_string()) {
      a = m.value[0].get<std::string>();
      b = m.value[1].get<std::string>();
    } else {
      return m.Error("expected a \"left right\" string or a [left, right] pair");
    }
    auto ia = vocab_.find(a);
    if (ia == vocab_.end()) return m.Error(base::StrCat("token \"", a, "\" is not in model.vocab"));
    auto ib = vocab_.find(b);
    if (ib == vocab_.end()) return m.Error(base::StrCat("token \"", b, "\" is not in model.vocab"));
    const std::string merged = a + b.substr(std::min(prefix_len, b.size()));
    auto im = vocab_.find(merged);
    if (im == vocab_.end()) {
      return m.Error(base::StrCat("merged token \"", merged, "\" is not in model.vocab"));
    }
    merges_.insert_or_assign(PairKey(ia->second, ib->second), MergeRule{static_cast<int32_t>(i), im->second});
  }
  return absl::OkStatus();
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(base::AbslView(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    // Llama-3: a piece that is itself a token is that token, whatever the merges would make of it.
    auto it = vocab_.find(base::AbslView(word));
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mu_);
    auto it = cache_.find(base::AbslView(word));
    if (it != cache_.end()) {
      const auto [offset, len] = it->second;
      ids.insert(ids.end(), cache_ids_.begin() + offset, cache_ids_.begin() + offset + len);
      return;
    }
  }
  const size_t first = ids.size();
  MergeWord(word, ids);
  if (cacheable) {
    std::unique_lock lock(cache_mu_);
    if (cache_.size() < kCacheCapacity && !cache_.contains(base::AbslView(word))) {
      const auto offset = static_cast<uint32_t>(cache_ids_.size());
      cache_ids_.insert(cache_ids_.end(), ids.begin() + first, ids.end());
      cache_.emplace(word, std::make_pair(offset, static_cast<uint32_t>(ids.size() - first)));
    }
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>& ids) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> queue;
  thread_local std::string with_affixes;
  symbols.clear();
  queue.clear();
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, false});
  };

  // Initial symbols, one per character. Unknown characters fall back to their bytes' "<0xAB>" tokens
  // (when all exist), else to unk_token (consecutive unknowns fused into one with fuse_unk), else
  // they are dropped, as upstream does.
  bool pending_unk = false;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    pos += Utf8SequenceLength(static_cast<unsigned char>(word[pos]));
    std::string_view ch = word.substr(start, pos - start);
    if (!continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty()) {
      with_affixes.clear();
      if (start != 0) with_affixes.append(continuing_subword_prefix_);
      with_affixes.append(ch);
      if (pos == word.size()) with_affixes.append(end_of_word_suffix_);
      ch = with_affixes;
    }
    auto it = vocab_.find(base::AbslView(ch));
    if (it != vocab_.end()) {
      if (pending_unk) add(*unk_id_);
      pending_unk = false;
      add(it->second);
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      // Upstream does not flush a pending unk here, so it lands after these bytes.
      for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) add(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(*unk_id_);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const auto n = static_cast<int32_t>(symbols.size());
  auto rule_for = [&](int32_t a, int32_t b) -> const MergeRule* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto push = [&](int32_t pos, const MergeRule& r) {
    queue.push_back(Candidate{r.rank, pos, r.new_id});
    std::push_heap(queue.begin(), queue.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const MergeRule* r = rule_for(symbols[i].id, symbols[i + 1].id)) push(i, *r);
  }
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), std::greater<>());
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& cur = symbols[top.pos];
    if (cur.removed || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    // Entries go stale when a neighbour merged first; the pair must still make the same token.
    const MergeRule* now = rule_for(cur.id, symbols[next_pos].id);
    if (now == nullptr || now->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.next = symbols[next_pos].next;
    symbols[next_pos].removed = true;
    if (cur.next >= 0) symbols[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeRule* r = rule_for(symbols[cur.prev].id, cur.id)) push(cur.prev, *r);
    }
    if (cur.next >= 0) {
      if (const MergeRule* r = rule_for(cur.id, symbols[cur.next].id)) push(top.pos, *r);
    }
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) ids.push_back(s.id);
  }
}

}  // namespace strata::tokenizer
