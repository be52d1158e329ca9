#pragma once
// Small tokenizers for the structured/ tests, written out by the tests themselves (no committed fixtures): a
// byte-level BPE vocabulary (GPT-2's alphabet, as Llama 3 and Qwen), a byte-fallback one (SentencePiece's "<0xAB>"
// and "\u2581", as Llama 2 and Mistral) and a tiktoken one (Kimi K2's layout). Each can spell any text: every
// byte is a token. A few multi-byte tokens make walks through a grammar take tokens that cross its boundaries.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace strata::structured::testing {

// GPT-2's bytes_to_unicode: the character each byte is spelt with in a byte-level vocabulary.
inline std::string ByteLevelChar(unsigned char byte) {
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  int codepoint = byte;
  if (!printable(byte)) {
    int n = 0;
    for (int b = 0; b < byte; ++b) n += printable(b) ? 0 : 1;
    codepoint = 256 + n;
  }
  std::string utf8;
  if (codepoint < 0x80) {
    utf8 += static_cast<char>(codepoint);
  } else {
    utf8 += static_cast<char>(0xC0 | (codepoint >> 6));
    utf8 += static_cast<char>(0x80 | (codepoint & 0x3F));
  }
  return utf8;
}

inline std::string ByteLevelSpelling(const std::string& bytes) {
  std::string out;
  for (char c : bytes) out += ByteLevelChar(static_cast<unsigned char>(c));
  return out;
}

// Multi-byte tokens of both vocabularies (their text; the byte-fallback one spells spaces "\u2581").
inline const std::vector<std::string>& MergedTokens() {
  static const auto* tokens =
      new std::vector<std::string>{"{\"", "\":", "\",", "\"}", "true", "false", "null",  "name", "age", "tags", "  ",
                                   " \"", "12",  "abc", "- ",  "yes",  "no",    "\":\"", "]}",   "[\"", "ab",   "0."};
  return *tokens;
}

// Byte-level BPE: ids 0..255 are the bytes, then MergedTokens(), then one id with no token (a hole), then the
// special tokens "<|endoftext|>" (the end of sequence) and "<|im_start|>", then a non-special added "<think>".
struct ByteLevelVocabulary {
  static constexpr int32_t kFirstMerged = 256;
  static int32_t Hole() { return kFirstMerged + static_cast<int32_t>(MergedTokens().size()); }
  static int32_t Eos() { return Hole() + 1; }
  static int32_t ImStart() { return Hole() + 2; }
  static int32_t Think() { return Hole() + 3; }
  static int32_t IdCount() { return Hole() + 4; }

  static std::string Json() {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<unsigned char>(b))] = b;
    int32_t id = kFirstMerged;
    for (const std::string& t : MergedTokens()) vocab[ByteLevelSpelling(t)] = id++;
    nlohmann::json added = nlohmann::json::array();
    auto add = [&](int32_t token_id, const char* content, bool special) {
      added.push_back({{"id", token_id},
                       {"content", content},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", special}});
    };
    add(Eos(), "<|endoftext|>", true);
    add(ImStart(), "<|im_start|>", true);
    add(Think(), "<think>", false);
    nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", added},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    return j.dump();
  }
};

// SentencePiece with byte fallback: "<unk>" 0, "<s>" 1, "</s>" 2 (the end of sequence), "<0x00>".."<0xFF>"
// 3..258, "\u2581" 259, then MergedTokens() with spaces spelt "\u2581".
struct ByteFallbackVocabulary {
  static constexpr int32_t kEos = 2;
  static int32_t IdCount() { return 260 + static_cast<int32_t>(MergedTokens().size()); }

  static std::string Json() {
    const std::string space = "\u2581";
    nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = 3 + b;
    }
    vocab[space] = 259;
    int32_t id = 260;
    for (std::string t : MergedTokens()) {
      for (size_t p = t.find(' '); p != std::string::npos; p = t.find(' ')) t.replace(p, 1, space);
      vocab[t] = id++;
    }
    nlohmann::json added = nlohmann::json::array();
    for (auto [token_id, content] : {std::pair{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}}) {
      added.push_back({{"id", token_id},
                       {"content", content},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
    nlohmann::json j = {{"version", "1.0"},
                        {"added_tokens", added},
                        {"normalizer",
                         {{"type", "Sequence"},
                          {"normalizers",
                           {{{"type", "Prepend"}, {"prepend", space}},
                            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}}}}}},
                        {"decoder",
                         {{"type", "Sequence"},
                          {"decoders",
                           {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                            {{"type", "ByteFallback"}},
                            {{"type", "Fuse"}},
                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
                        {"model",
                         {{"type", "BPE"},
                          {"vocab", vocab},
                          {"merges", nlohmann::json::array()},
                          {"byte_fallback", true},
                          {"unk_token", "<unk>"},
                          {"fuse_unk", true}}}};
    return j.dump();
  }
};

inline std::unique_ptr<tokenizer::Tokenizer> LoadTokenizer(const std::string& json) {
  auto tok = tokenizer::Tokenizer::FromJson(json);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

// Whether bit `id` of a mask is set.
inline bool Allowed(const std::vector<int32_t>& mask, int64_t id) {
  return (static_cast<uint32_t>(mask[id / 32]) >> (id % 32)) & 1u;
}

// A walk through a grammar: at each step the mask is filled, every padding id and special id is checked to be
// refused and the end-of-sequence id to be allowed exactly where the grammar may end; an allowed token is picked
// at random (the end of sequence with probability `stop` where it is allowed, always after `max_steps`) and
// accepted. Returns the ids before the end of sequence.
struct WalkOptions {
  int32_t eos = 0;
  int64_t tokenizer_ids = 0;           // ids from here to vocab_size are padding
  std::vector<int32_t> never_allowed;  // special tokens, holes
  double stop = 0.3;
  int max_steps = 400;
};

inline std::vector<int32_t> Walk(const std::shared_ptr<const Grammar>& grammar, std::mt19937& rng,
                                 const WalkOptions& o) {
  Matcher matcher(grammar);
  const int64_t vocab = matcher.vocab_size();
  std::vector<int32_t> mask(MaskWords(vocab));
  std::vector<int32_t> ids;
  for (int step = 0;; ++step) {
    EXPECT_LT(step, 5000) << "the walk does not end";
    if (step >= 5000) break;
    matcher.FillMask(mask.data());
    for (int64_t id = o.tokenizer_ids; id < vocab; ++id) {
      EXPECT_FALSE(Allowed(mask, id)) << "padding id " << id << " allowed at step " << step;
    }
    for (int32_t id : o.never_allowed) EXPECT_FALSE(Allowed(mask, id)) << "id " << id << " allowed at step " << step;
    EXPECT_EQ(Allowed(mask, o.eos), matcher.CanEnd()) << "at step " << step;
    std::vector<int32_t> allowed;
    for (int64_t id = 0; id < vocab; ++id) {
      if (id != o.eos && Allowed(mask, id)) allowed.push_back(static_cast<int32_t>(id));
    }
    const bool may_end = Allowed(mask, o.eos);
    if (may_end && (allowed.empty() || step >= o.max_steps || std::bernoulli_distribution(o.stop)(rng))) {
      EXPECT_TRUE(matcher.Accept(o.eos));
      EXPECT_TRUE(matcher.Ended());
      break;
    }
    EXPECT_FALSE(allowed.empty()) << "nothing allowed at step " << step;
    if (allowed.empty()) break;
    const int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    EXPECT_TRUE(matcher.Accept(id)) << "allowed id " << id << " refused at step " << step;
    ids.push_back(id);
  }
  return ids;
}

}  // namespace strata::structured::testing
