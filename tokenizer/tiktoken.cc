#include "tokenizer/tiktoken.h"

#include <algorithm>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "base/absl_compat.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizers.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

// The value of a base64 character, or -1.
int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with its padding; the error says what is wrong. (Python's b64decode, which tiktoken
// uses, skips characters outside the alphabet; strata refuses them, since no writer produces them.)
absl::StatusOr<std::string> DecodeBase64(std::string_view text) {
  if (text.size() % 4 != 0) {
    return absl::InvalidArgumentError(base::StrCat("bad base64 \"", text, "\": its length is not a multiple of 4"));
  }
  size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int nbits = 0;
  for (size_t i = 0; i < text.size() - padding; ++i) {
    const int v = Base64Value(text[i]);
    if (v < 0) {
      return absl::InvalidArgumentError(
          base::StrCat("bad base64 \"", text, "\": character ", i + 1, " is not in the base64 alphabet"));
    }
    bits = (bits << 6) | static_cast<uint32_t>(v);
    nbits += 6;
    if (nbits >= 8) {
      nbits -= 8;
      out.push_back(static_cast<char>((bits >> nbits) & 0xFF));
    }
  }
  return out;
}

// A decimal rank in 0..kMaxTokenId.
std::optional<int32_t> ParseRank(std::string_view text) {
  if (text.empty() || text.size() > 10) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value > kMaxTokenId) return std::nullopt;
  return static_cast<int32_t>(value);
}

// MergePiece keeps its scratch between calls for pieces up to this long.
constexpr uint32_t kKeptScratchBytes = 1 << 16;

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// Whether `b` can be a byte of well-formed UTF-8 (0xC0, 0xC1 and 0xF5..0xFF never are).
bool CanOccurInUtf8(int b) { return b < 0xC0 || (b >= 0xC2 && b <= 0xF4); }

// A possible merge: the parts starting at `start` and the one after it, together [start, end).
struct Candidate {
  int32_t rank;
  uint32_t start;
  uint32_t end;
  // The queue pops the lowest rank, then the leftmost pair: the pair tiktoken's scan picks.
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<TiktokenModel>> TiktokenModel::Parse(std::string_view text, std::string_view source) {
  auto model = std::make_unique<TiktokenModel>();
  std::vector<int32_t> line_of_rank;  // rank -> the line that gave it (0: none yet)
  int32_t count = 0;
  size_t line_start = 0;
  for (int32_t line_number = 1; line_start < text.size(); ++line_number) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    std::string_view line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    auto error = [&](std::string_view message) {
      return absl::InvalidArgumentError(base::StrCat(source, ": line ", line_number, ": ", message));
    };
    if (line.size() > kMaxTiktokenLineBytes) {
      return error(base::StrCat("longer than ", kMaxTiktokenLineBytes, " bytes (a token line is \"<base64> <rank>\")"));
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // tiktoken skips empty lines

    // "<base64> <rank>": two fields apart by blanks, as Python's bytes.split() reads them.
    size_t token_end = 0;
    while (token_end < line.size() && !IsBlank(line[token_end])) ++token_end;
    size_t rank_start = token_end;
    while (rank_start < line.size() && IsBlank(line[rank_start])) ++rank_start;
    size_t rank_end = rank_start;
    while (rank_end < line.size() && !IsBlank(line[rank_end])) ++rank_end;
    size_t rest = rank_end;
    while (rest < line.size() && IsBlank(line[rest])) ++rest;
    if (token_end == 0 || rank_start == rank_end || rest != line.size()) {
      return error("expected \"<base64 token> <rank>\"");
    }
    absl::StatusOr<std::string> token = DecodeBase64(line.substr(0, token_end));
    if (!token.ok()) return error(std::string(token.status().message()));
    if (token->empty()) return error("the token is empty");
    const std::string_view rank_text = line.substr(rank_start, rank_end - rank_start);
    const std::optional<int32_t> rank = ParseRank(rank_text);
    if (!rank.has_value()) {
      return error(base::StrCat("rank \"", rank_text, "\" is not a decimal integer from 0 to ", kMaxTokenId));
    }
    if (static_cast<size_t>(*rank) >= line_of_rank.size()) {
      const size_t grown = std::max<size_t>(static_cast<size_t>(*rank) + 1, line_of_rank.size() * 2);
      line_of_rank.resize(std::min<size_t>(grown, static_cast<size_t>(kMaxTokenId) + 1), 0);
    }
    if (line_of_rank[*rank] != 0) {
      return error(base::StrCat("rank ", *rank, " is already the rank of line ", line_of_rank[*rank]));
    }
    auto [it, inserted] = model->ranks_.emplace(*std::move(token), *rank);
    if (!inserted) {
      return error(base::StrCat("the token is already on line ", line_of_rank[it->second], " (rank ", it->second, ")"));
    }
    line_of_rank[*rank] = line_number;
    ++count;
  }
  if (count == 0) return absl::InvalidArgumentError(base::StrCat(source, ": no tokens"));

  // N distinct ranks fill 0..N-1 exactly when none is N or above; the first such line shows the gap.
  for (size_t r = static_cast<size_t>(count); r < line_of_rank.size(); ++r) {
    if (line_of_rank[r] == 0) continue;
    const auto missing =
        static_cast<size_t>(std::find(line_of_rank.begin(), line_of_rank.end(), 0) - line_of_rank.begin());
    return absl::InvalidArgumentError(
        base::StrCat(source, ": line ", line_of_rank[r], ": rank ", r, " leaves a gap: the file has ", count,
                     " tokens, so the ranks must be 0..", count - 1, " (rank ", missing, " is missing)"));
  }
  for (int b = 0; b < 256; ++b) {
    if (CanOccurInUtf8(b) && !model->ranks_.contains(std::string(1, static_cast<char>(b)))) {
      return absl::InvalidArgumentError(
          base::StrCat(source, ": no token for the byte ", absl::StrFormat("0x%02X", b),
                       " (byte-level BPE needs a token for every byte that UTF-8 text can hold)"));
    }
  }

  model->spelled_.resize(static_cast<size_t>(count));
  const auto& alphabet = ByteLevelAlphabet();
  for (const auto& [bytes, rank] : model->ranks_) {
    std::string& spelled = model->spelled_[rank];
    for (char c : bytes) spelled.append(alphabet[static_cast<unsigned char>(c)]);
  }
  return model;
}

std::optional<int32_t> TiktokenModel::RankOf(std::string_view bytes) const {
  auto it = ranks_.find(base::AbslView(bytes));
  if (it == ranks_.end()) return std::nullopt;
  return it->second;
}

void TiktokenModel::Tokenize(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  // A piece that is a token is that token, whatever merging would make of it (tiktoken looks it up first).
  if (std::optional<int32_t> whole = RankOf(piece)) {
    ids.push_back(*whole);
    return;
  }
  MergePiece(piece, ids);
}

void TiktokenModel::MergePiece(std::string_view piece, std::vector<int32_t>& ids) const {
  // tiktoken rescans the whole piece after every merge (quadratic in the piece's length); a queue of
  // candidate pairs makes the same choices in O(n log n), so a long piece cannot stall the encoder.
  // Parts are byte ranges; next[i] is where the part starting at byte i ends (the next part's start), and
  // prev[i] where the part before it starts. Offsets fit 32 bits: Tokenizer::Encode takes at most 1 GiB.
  thread_local std::vector<uint32_t> next;
  thread_local std::vector<uint32_t> prev;
  thread_local std::vector<bool> alive;
  thread_local std::vector<Candidate> queue;
  const auto n = static_cast<uint32_t>(piece.size());
  next.resize(n);
  prev.resize(n);
  alive.assign(n, true);
  queue.clear();
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? 0 : i - 1;
  }
  auto push = [&](uint32_t start) {
    const uint32_t mid = next[start];
    if (mid >= n) return;
    const uint32_t end = next[mid];
    if (std::optional<int32_t> rank = RankOf(piece.substr(start, end - start))) {
      queue.push_back(Candidate{*rank, start, end});
      std::push_heap(queue.begin(), queue.end(), std::greater<>());
    }
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), std::greater<>());
    const Candidate top = queue.back();
    queue.pop_back();
    // A candidate is current while its first part is alive and its second part still ends where it did:
    // parts only grow, so the same span means the same two parts.
    if (!alive[top.start] || next[top.start] >= n || next[next[top.start]] != top.end) continue;
    const uint32_t mid = next[top.start];
    alive[mid] = false;
    next[top.start] = top.end;
    if (top.end < n) prev[top.end] = top.start;
    if (top.start > 0) push(prev[top.start]);
    push(top.start);
  }
  for (uint32_t i = 0; i < n; i = next[i]) {
    // Every part is a token: single bytes of UTF-8 text are (Parse checks), and merges make tokens.
    if (std::optional<int32_t> rank = RankOf(piece.substr(i, next[i] - i))) ids.push_back(*rank);
  }
  if (n > kKeptScratchBytes) {
    // A rare huge piece: give its scratch back rather than hold it for the thread's life.
    std::vector<uint32_t>().swap(next);
    std::vector<uint32_t>().swap(prev);
    std::vector<bool>().swap(alive);
    std::vector<Candidate>().swap(queue);
  }
}

std::optional<int32_t> TiktokenModel::TokenToId(std::string_view token) const {
  if (FindInvalidUtf8(token) != std::string_view::npos) return std::nullopt;
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    const int b = ByteLevelByteOf(NextCodepoint(token, pos));
    if (b < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(b));
  }
  return RankOf(bytes);
}

const std::string* TiktokenModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= size()) return nullptr;
  return &spelled_[id];
}

absl::StatusOr<nlohmann::json> TiktokenSpecialTokens(const JsonAt& config, int32_t num_ranks) {
  if (num_ranks > kMaxTokenId + 1 - kKimiReservedSpecialTokens) {
    return absl::InvalidArgumentError(base::StrCat("tiktoken.model: ", num_ranks, " ranks leave no room for the ",
                                                   kKimiReservedSpecialTokens, " special tokens below the largest id (",
                                                   kMaxTokenId, ")"));
  }
  const int32_t first = num_ranks;
  const int32_t last = num_ranks + kKimiReservedSpecialTokens - 1;
  std::vector<std::optional<std::pair<std::string, bool>>> named(kKimiReservedSpecialTokens);  // content, special
  std::vector<std::string> key_of(kKimiReservedSpecialTokens);
  const JsonAt decoder = config.Field("added_tokens_decoder");
  if (!decoder.value.is_null()) {
    if (!decoder.value.is_object()) return decoder.Error("expected an object mapping ids to tokens");
    for (const auto& [key, entry] : decoder.value.items()) {
      const JsonAt at = decoder.Field(key);
      const std::optional<int32_t> id = ParseRank(key);
      if (!id.has_value()) return at.Error("expected a token id as the key");
      if (*id < first || *id > last) continue;  // Kimi's tokenizer names only its reserved ids
      if (!entry.is_object()) return at.Error("expected an object with \"content\"");
      auto content = at.String("content");
      if (!content.ok()) return content.status();
      if (content->empty()) return at.FieldError("content", "a special token cannot be empty");
      auto special = at.Bool("special", true);
      if (!special.ok()) return special.status();
      named[*id - first] = std::pair{*std::move(content), *special};
      key_of[*id - first] = key;
    }
  }
  nlohmann::json tokens = nlohmann::json::array();
  absl::flat_hash_map<std::string, int32_t> seen;
  for (int32_t i = 0; i < kKimiReservedSpecialTokens; ++i) {
    const int32_t id = first + i;
    std::string content = named[i].has_value() ? named[i]->first : base::StrCat("<|reserved_token_", id, "|>");
    auto [it, inserted] = seen.emplace(content, id);
    if (!inserted) {
      // Kimi's dict of special tokens would keep only one of the two ids, and the other could not be decoded.
      const int32_t other = it->second;
      const std::string key = named[i].has_value() ? key_of[i] : key_of[other - first];
      return decoder.Field(key).Error(
          base::StrCat("\"", content, "\" is the token of both id ", other, " and id ", id));
    }
    tokens.push_back({{"id", id},
                      {"content", std::move(content)},
                      {"special", named[i].has_value() ? named[i]->second : true},
                      {"normalized", false}});
  }
  return tokens;
}

}  // namespace strata::tokenizer
