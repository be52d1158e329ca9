#include "tokenizer/added_tokens.h"

#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

// regex-syntax's \w: the word characters single_word looks at on both sides of a match.
bool IsWordChar(char32_t cp) { return cp == '_' || IsAlphanumeric(cp); }

char32_t LastCodepoint(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return NextCodepoint(text, start);
}

// Start of the run of whitespace that ends `text` (text.size() when there is none).
size_t TrailingWhitespaceStart(std::string_view text) {
  size_t begin = text.size();
  while (begin > 0) {
    size_t start = begin - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!IsWhitespace(NextCodepoint(text, pos))) break;
    begin = start;
  }
  return begin;
}

size_t LeadingWhitespaceEnd(std::string_view text) {
  size_t end = 0;
  while (end < text.size()) {
    size_t pos = end;
    if (!IsWhitespace(NextCodepoint(text, pos))) break;
    end = pos;
  }
  return end;
}

}  // namespace

void TokenMatcher::Add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      const auto child = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(-1);
      it = edges_.emplace(key, child).first;
    }
    node = it->second;
  }
  // Two tokens with the same pattern: the first one added wins, as with upstream's pattern order.
  if (nodes_[node] < 0) nodes_[node] = token_index;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

bool TokenMatcher::Next(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& token_index) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]));
      if (it == edges_.end()) break;
      node = it->second;
      if (nodes_[node] >= 0) {
        best = nodes_[node];
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      start = i;
      end = best_end;
      token_index = best;
      return true;
    }
  }
  return false;
}

absl::StatusOr<AddedVocabulary> AddedVocabulary::Parse(const JsonAt& json, const Normalizer* normalizer) {
  AddedVocabulary vocab;
  if (json.value.is_null()) return vocab;
  if (!json.value.is_array()) return json.Error("expected an array of added tokens");
  for (size_t i = 0; i < json.value.size(); ++i) {
    JsonAt t = json.Index(i);
    if (!t.value.is_object()) return t.Error("expected an object");
    AddedToken token;
    auto id = t.Int("id");
    if (!id.ok()) return id.status();
    if (*id < 0 || *id > INT32_MAX) return t.FieldError("id", "expected a non-negative 32-bit integer");
    token.id = static_cast<int32_t>(*id);
    auto content = t.String("content");
    if (!content.ok()) return content.status();
    if (content->empty()) return t.FieldError("content", "an added token cannot be empty");
    token.content = *std::move(content);
    auto special = t.Bool("special", false);
    if (!special.ok()) return special.status();
    token.special = *special;
    for (auto [key, field] : {std::pair{"single_word", &token.single_word}, std::pair{"lstrip", &token.lstrip},
                              std::pair{"rstrip", &token.rstrip}}) {
      auto b = t.Bool(key, false);
      if (!b.ok()) return b.status();
      *field = *b;
    }
    auto normalized = t.Bool("normalized", !token.special);
    if (!normalized.ok()) return normalized.status();
    token.normalized = *normalized;
    vocab.by_id_.emplace(token.id, vocab.tokens_.size());
    vocab.by_content_.emplace(token.content, token.id);
    if (token.special) vocab.special_contents_.insert(token.content);
    vocab.tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < vocab.tokens_.size(); ++i) {
    const AddedToken& token = vocab.tokens_[i];
    if (!token.normalized) {
      vocab.raw_.Add(token.content, static_cast<int32_t>(i));
    } else {
      std::string pattern = token.content;
      if (normalizer != nullptr) normalizer->Normalize(pattern);
      vocab.normalized_.Add(pattern, static_cast<int32_t>(i));
    }
  }
  return vocab;
}

const AddedToken* AddedVocabulary::ById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::IdOf(std::string_view content) const {
  auto it = by_content_.find(base::AbslView(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

void AddedVocabulary::Split(std::string_view text, bool normalized_tokens, std::vector<Segment>& out) const {
  const TokenMatcher& matcher = normalized_tokens ? normalized_ : raw_;
  size_t start_offset = 0;  // end of what previous segments cover
  size_t from = 0;          // where the matcher resumes: matches never overlap
  size_t start, end;
  int32_t index;
  while (matcher.Next(text, from, start, end, index)) {
    from = end;
    const AddedToken& token = tokens_[index];
    if (token.single_word) {
      // Only a match with no word character touching it on either side counts.
      const bool start_space = start == 0 || !IsWordChar(LastCodepoint(text.substr(0, start)));
      size_t after = end;
      const bool stop_space = end == text.size() || !IsWordChar(NextCodepoint(text, after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      // Whitespace before the token joins it, except what an earlier segment already took.
      start = std::max(TrailingWhitespaceStart(text.substr(0, start)), start_offset);
    }
    if (token.rstrip) end += LeadingWhitespaceEnd(text.substr(end));
    if (start_offset < start) out.push_back(Segment{start_offset, start, -1});
    out.push_back(Segment{start, end, token.id});
    start_offset = end;
  }
  if (start_offset < text.size() || text.empty()) out.push_back(Segment{start_offset, text.size(), -1});
}

}  // namespace strata::tokenizer
