// Behaviour of the tokenizer's components on small hand-written tokenizer.json files, each pinning one
// upstream rule. Parity on real layouts is tests/tokenizer_parity (pytest, live against `tokenizers`).
#include "tokenizer/tokenizer.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A BPE tokenizer.json with no pre-tokenizer unless `extra` adds components.
std::string Bpe(const nlohmann::json& vocab, const nlohmann::json& merges,
                nlohmann::json extra = nlohmann::json::object(),
                nlohmann::json model_extra = nlohmann::json::object()) {
  nlohmann::json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  if (model_extra.is_object()) model.update(model_extra);
  nlohmann::json j = {{"version", "1.0"}, {"added_tokens", nlohmann::json::array()}, {"model", model}};
  if (extra.is_object()) j.update(extra);
  return j.dump();
}

std::unique_ptr<Tokenizer> Load(const std::string& json, std::string_view config = {}) {
  auto tok = Tokenizer::FromJson(json, config);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& tok, std::string_view text, bool special = false) {
  auto ids = tok.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

const nlohmann::json kAbcVocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};

TEST(Bpe, LowestRankMergeAppliesFirst) {
  // "b c" outranks "a b", so "abc" is a + bc, then "a bc".
  auto tok = Load(Bpe(kAbcVocab, nlohmann::json::array({"b c", "a b", "a bc"})));
  EXPECT_THAT(Ids(*tok, "abc"), ElementsAre(5));
  auto other = Load(Bpe(kAbcVocab, nlohmann::json::array({"a b", "b c", "a bc"})));
  EXPECT_THAT(Ids(*other, "abc"), ElementsAre(3, 2));  // ab + c: no "ab c" merge
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  auto tok = Load(Bpe({{"a", 0}, {"aa", 1}}, nlohmann::json::array({"a a"})));
  EXPECT_THAT(Ids(*tok, "aaa"), ElementsAre(1, 0));
}

TEST(Bpe, MergesReadInBothSerialisations) {
  auto strings = Load(Bpe(kAbcVocab, nlohmann::json::array({"b c", "a bc"})));
  auto pairs = Load(
      Bpe(kAbcVocab, nlohmann::json::array({nlohmann::json::array({"b", "c"}), nlohmann::json::array({"a", "bc"})})));
  EXPECT_EQ(Ids(*strings, "abcab"), Ids(*pairs, "abcab"));
  EXPECT_THAT(Ids(*pairs, "abc"), ElementsAre(5));
}

TEST(Bpe, IgnoreMergesTakesAWholeWordToken) {
  // No merge can build "abc" from a, b, c here, but the vocab has it.
  auto merging = Load(Bpe(kAbcVocab, nlohmann::json::array({"a b"})));
  EXPECT_THAT(Ids(*merging, "abc"), ElementsAre(3, 2));
  auto ignoring = Load(Bpe(kAbcVocab, nlohmann::json::array({"a b"}), {}, {{"ignore_merges", true}}));
  EXPECT_THAT(Ids(*ignoring, "abc"), ElementsAre(5));
}

TEST(Bpe, ByteFallbackSpellsUnknownCharactersInBytes) {
  nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}, {"<0xE4>", 2}, {"<0xB8>", 3}, {"<0xAD>", 4}};
  auto tok =
      Load(Bpe(vocab, nlohmann::json::array(),
               {{"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}},
               {{"byte_fallback", true}, {"unk_token", "<unk>"}}));
  EXPECT_THAT(Ids(*tok, "a中a"), ElementsAre(1, 2, 3, 4, 1));
  EXPECT_EQ(tok->Decode({1, 2, 3, 4, 1}, false), "a中a");
  // Not all of "é"'s bytes have tokens: it becomes unk.
  EXPECT_THAT(Ids(*tok, "é"), ElementsAre(0));
  // An invalid run of byte tokens decodes to one U+FFFD per byte.
  EXPECT_EQ(tok->Decode({2, 3, 1}, false),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");
}

TEST(Bpe, FuseUnkJoinsARunOfUnknownCharacters) {
  nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}};
  auto fused = Load(Bpe(vocab, nlohmann::json::array(), {}, {{"unk_token", "<unk>"}, {"fuse_unk", true}}));
  EXPECT_THAT(Ids(*fused, "xya"), ElementsAre(0, 1));
  auto unfused = Load(Bpe(vocab, nlohmann::json::array(), {}, {{"unk_token", "<unk>"}}));
  EXPECT_THAT(Ids(*unfused, "xya"), ElementsAre(0, 0, 1));
  // Without unk_token, unknown characters are dropped, as upstream does.
  auto none = Load(Bpe(vocab, nlohmann::json::array()));
  EXPECT_THAT(Ids(*none, "xya"), ElementsAre(1));
}

TEST(Bpe, ContinuingSubwordPrefixMarksNonInitialCharacters) {
  nlohmann::json vocab = {{"a", 0}, {"##b", 1}, {"ab", 2}};
  auto tok = Load(Bpe(vocab, nlohmann::json::array({"a ##b"}), {}, {{"continuing_subword_prefix", "##"}}));
  EXPECT_THAT(Ids(*tok, "ab"), ElementsAre(2));
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  auto tok = Load(Bpe(kAbcVocab, nlohmann::json::array({"a b"})));
  auto ids = tok->Encode("ab\xC3(", false);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("invalid UTF-8 at byte 2"));
  EXPECT_FALSE(tok->Encode("\xED\xA0\x80", false).ok());  // an encoded surrogate
  EXPECT_FALSE(tok->Encode("\xC0\xAF", false).ok());      // an overlong "/"
}

TEST(Tokenizer, EmptyTextHasNoTokens) {
  auto tok = Load(Bpe(kAbcVocab, nlohmann::json::array({"a b"})));
  EXPECT_TRUE(Ids(*tok, "").empty());
}

TEST(Tokenizer, EncodesOnManyThreadsAtOnce) {
  // The server tokenizes requests on several threads (its admission pool) with one Tokenizer, whose word
  // cache is shared: every thread's ids equal the single-threaded ones. (The tsan lane runs this suite.)
  auto tok = Load(Bpe(kAbcVocab, nlohmann::json::array({"b c", "a b", "a bc"})));
  std::vector<std::string> words;
  for (int i = 1; i < 600; ++i) {
    std::string word;
    for (int v = i; v > 0; v /= 3) word += static_cast<char>('a' + v % 3);
    words.push_back(word);
  }
  std::vector<std::vector<int32_t>> expected;
  auto reference = Load(Bpe(kAbcVocab, nlohmann::json::array({"b c", "a b", "a bc"})));
  for (const std::string& word : words) expected.push_back(Ids(*reference, word));
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < words.size(); ++i) {
          const size_t k = (i * (t + 1) + round) % words.size();  // each thread its own order
          auto ids = tok->Encode(words[k], false);
          if (!ids.ok() || *ids != expected[k]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

nlohmann::json Added(int id, std::string content, bool special, nlohmann::json flags = nlohmann::json::object()) {
  nlohmann::json t = {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
                      {"rstrip", false}, {"normalized", !special}, {"special", special}};
  t.update(flags);
  return t;
}

std::string WithAdded(nlohmann::json added, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = nlohmann::json::parse(
      Bpe({{"a", 0}, {"b", 1}, {" ", 2}, {"<s>", 3}, {"[X]", 4}}, nlohmann::json::array(), extra));
  j["added_tokens"] = std::move(added);
  return j.dump();
}

TEST(AddedTokens, MatchedInTheRawTextAndNeverSplit) {
  auto tok = Load(WithAdded({Added(3, "<s>", true)}));
  EXPECT_THAT(Ids(*tok, "a<s>b"), ElementsAre(0, 3, 1));
  EXPECT_EQ(tok->Decode({0, 3, 1}, false), "a <s> b");  // no decoder: tokens joined by spaces
  EXPECT_EQ(tok->Decode({0, 3, 1}, true), "a b");
}

TEST(AddedTokens, LstripAndRstripSwallowSurroundingWhitespace) {
  auto tok = Load(WithAdded({Added(4, "[X]", true, {{"lstrip", true}, {"rstrip", true}})}));
  EXPECT_THAT(Ids(*tok, "a  [X]  b"), ElementsAre(0, 4, 1));
  auto plain = Load(WithAdded({Added(4, "[X]", true)}));
  EXPECT_THAT(Ids(*plain, "a [X] b"), ElementsAre(0, 2, 4, 2, 1));
}

TEST(AddedTokens, SingleWordMatchesOnlyAWholeWord) {
  auto tok = Load(WithAdded({Added(4, "ab", false, {{"single_word", true}, {"normalized", false}})}));
  EXPECT_THAT(Ids(*tok, "ab"), ElementsAre(4));
  EXPECT_THAT(Ids(*tok, "a ab"), ElementsAre(0, 2, 4));
  EXPECT_THAT(Ids(*tok, "aab"), ElementsAre(0, 0, 1));
}

TEST(AddedTokens, NormalizedTokensMatchTheNormalisedText) {
  // With a Lowercase normalizer, the normalised token "<s>" matches "<S>" in the input.
  auto tok =
      Load(WithAdded({Added(3, "<s>", false, {{"normalized", true}})}, {{"normalizer", {{"type", "Lowercase"}}}}));
  EXPECT_THAT(Ids(*tok, "A<S>"), ElementsAre(0, 3));
}

TEST(PostProcessor, TemplateAddsBosOnlyWhenAsked) {
  nlohmann::json tp = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", nlohmann::json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {3}}, {"tokens", {"<s>"}}}}}}};
  auto tok = Load(WithAdded({Added(3, "<s>", true)}, {{"post_processor", tp}}));
  EXPECT_THAT(Ids(*tok, "ab", true), ElementsAre(3, 0, 1));
  EXPECT_THAT(Ids(*tok, "ab", false), ElementsAre(0, 1));
}

TEST(PostProcessor, TokenizerConfigAddsBosAndEosWhenTheFileHasNone) {
  const std::string json = WithAdded({Added(3, "<s>", true), Added(4, "[X]", true)});
  auto tok = Load(
      json, R"({"add_bos_token": true, "bos_token": {"content": "<s>"}, "add_eos_token": true, "eos_token": "[X]"})");
  EXPECT_THAT(Ids(*tok, "a", true), ElementsAre(3, 0, 4));
  EXPECT_THAT(Ids(*tok, "a", false), ElementsAre(0));
  auto bad = Tokenizer::FromJson(json, R"({"add_bos_token": true, "bos_token": "<nope>"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("tokenizer_config.json: bos_token: \"<nope>\" is not a token"));
}

std::string WithNormalizer(nlohmann::json normalizer, nlohmann::json vocab) {
  return Bpe(vocab, nlohmann::json::array(), {{"normalizer", normalizer}});
}

TEST(Normalizers, NfcComposesCombiningMarks) {
  auto tok = Load(WithNormalizer({{"type", "NFC"}}, {{"é", 0}, {"e", 1}, {"\xCC\x81", 2}}));
  EXPECT_THAT(Ids(*tok, "e\xCC\x81"), ElementsAre(0));
  auto nfd = Load(WithNormalizer({{"type", "NFD"}}, {{"é", 0}, {"e", 1}, {"\xCC\x81", 2}}));
  EXPECT_THAT(Ids(*nfd, "é"), ElementsAre(1, 2));
}

TEST(Normalizers, NfkcFoldsCompatibilityCharacters) {
  auto tok = Load(WithNormalizer({{"type", "NFKC"}}, {{"f", 0}, {"i", 1}}));
  EXPECT_THAT(Ids(*tok, "ﬁ"), ElementsAre(0, 1));
}

TEST(Normalizers, LowercaseUsesFullMappingPerCharacter) {
  // U+0130 lowercases to "i" + U+0307 (Rust's char::to_lowercase).
  auto tok = Load(WithNormalizer({{"type", "Lowercase"}}, {{"i", 0}, {"\xCC\x87", 1}, {"σ", 2}}));
  EXPECT_THAT(Ids(*tok, "İΣ"), ElementsAre(0, 1, 2));
}

TEST(Normalizers, PrependReplaceAndStrip) {
  nlohmann::json seq = {{"type", "Sequence"},
                        {"normalizers",
                         {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                          {{"type", "Prepend"}, {"prepend", "▁"}},
                          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
  auto tok = Load(WithNormalizer(seq, {{"▁", 0}, {"a", 1}}));
  EXPECT_THAT(Ids(*tok, " \ta a\u3000"), ElementsAre(0, 1, 0, 1));
  EXPECT_TRUE(Ids(*tok, "   ").empty());  // stripped to nothing: Prepend leaves empty text empty
}

std::string WithPreTokenizer(nlohmann::json pre, nlohmann::json vocab) {
  return Bpe(vocab, nlohmann::json::array(), {{"pre_tokenizer", pre}});
}

TEST(PreTokenizers, SplitBehaviours) {
  const nlohmann::json vocab = {{"a", 0}, {"-", 1}, {"a-", 2}, {"-a", 3}, {"--", 4}};
  auto with = [&](const char* behavior, bool invert = false) {
    return Load(
        Bpe(vocab, nlohmann::json::array({"a -", "- a", "- -"}),
            {{"pre_tokenizer",
              {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}}}}));
  };
  EXPECT_THAT(Ids(*with("Isolated"), "a-a"), ElementsAre(0, 1, 0));
  EXPECT_THAT(Ids(*with("Removed"), "a-a"), ElementsAre(0, 0));
  EXPECT_THAT(Ids(*with("MergedWithPrevious"), "a-a"), ElementsAre(2, 0));
  EXPECT_THAT(Ids(*with("MergedWithNext"), "a-a"), ElementsAre(0, 3));
  EXPECT_THAT(Ids(*with("Contiguous"), "a--a"), ElementsAre(0, 4, 0));
  // Inverted: the text between "a" runs (the dashes) counts as the match, and Removed drops it.
  auto inverted =
      Load(Bpe(vocab, nlohmann::json::array({"- -"}),
               {{"pre_tokenizer",
                 {{"type", "Split"}, {"pattern", {{"Regex", "a+"}}}, {"behavior", "Removed"}, {"invert", true}}}}));
  EXPECT_THAT(Ids(*inverted, "a--a"), ElementsAre(0, 0));
}

TEST(PreTokenizers, DigitsIndividualOrContiguous) {
  const nlohmann::json vocab = {{"1", 0}, {"2", 1}, {"12", 2}, {"x", 3}};
  auto each = Load(WithPreTokenizer({{"type", "Digits"}, {"individual_digits", true}}, vocab));
  auto runs = Load(Bpe(vocab, nlohmann::json::array({"1 2"}),
                       {{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", false}}}}));
  EXPECT_THAT(Ids(*each, "x12"), ElementsAre(3, 0, 1));
  EXPECT_THAT(Ids(*runs, "x12"), ElementsAre(3, 2));
}

TEST(PreTokenizers, MetaspacePrependSchemes) {
  const nlohmann::json vocab = {{"▁", 0}, {"a", 1}, {"<s>", 2}};
  auto tok = [&](const char* scheme) {
    nlohmann::json j = nlohmann::json::parse(WithPreTokenizer(
        {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}}, vocab));
    j["added_tokens"] = {Added(2, "<s>", true)};
    return Load(j.dump());
  };
  EXPECT_THAT(Ids(*tok("always"), "a a"), ElementsAre(0, 1, 0, 1));
  EXPECT_THAT(Ids(*tok("never"), "a a"), ElementsAre(1, 0, 1));
  EXPECT_THAT(Ids(*tok("first"), "a a"), ElementsAre(0, 1, 0, 1));
  // "first" prepends only to text at the very start of the input, not after an added token.
  EXPECT_THAT(Ids(*tok("first"), "<s>a"), ElementsAre(2, 1));
  EXPECT_THAT(Ids(*tok("always"), "<s>a"), ElementsAre(2, 0, 1));
}

TEST(PreTokenizers, ByteLevelMapsEveryByteToAVisibleCharacter) {
  // Space is "Ġ" (U+0120) and the two bytes of "é" are "Ã" and "©".
  const nlohmann::json vocab = {{"Ġ", 0}, {"Ã", 1}, {"©", 2}, {"a", 3}};
  auto tok = Load(Bpe(vocab, nlohmann::json::array(),
                      {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
                       {"decoder", {{"type", "ByteLevel"}}}}));
  EXPECT_THAT(Ids(*tok, "é a"), ElementsAre(0, 1, 2, 0, 3));
  EXPECT_EQ(tok->Decode({0, 1, 2, 0, 3}, false), " é a");
  EXPECT_EQ(tok->Decode({1, 3}, false),
            "\xEF\xBF\xBD"
            "a");  // a lone lead byte: one U+FFFD
}

TEST(Decoders, StripAndReplaceAfterFuse) {
  nlohmann::json dec = {{"type", "Sequence"},
                        {"decoders",
                         {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                          {{"type", "Fuse"}},
                          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  auto tok = Load(Bpe({{"▁a", 0}, {"▁b", 1}}, nlohmann::json::array(), {{"decoder", dec}}));
  EXPECT_EQ(tok->Decode({0, 1}, false), "a b");
  EXPECT_EQ(tok->Decode({1, 999}, false), "b");  // ids with no token are dropped, as upstream does
}

TEST(Decoders, MetaspaceDropsReplacementInTheFirstTokenOnly) {
  auto tok = Load(Bpe({{"▁a", 0}, {"▁b", 1}}, nlohmann::json::array(),
                      {{"decoder", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}}}));
  EXPECT_EQ(tok->Decode({0, 1}, false), "a b");
}

// What a grammar engine must know of the vocabulary, read as xgrammar's TokenizerInfo::DetectMetadataFromHF reads
// tokenizer.json: the first ByteLevel or ByteFallback decoder decides the spelling; a Prepend("▁") normalizer or a
// Metaspace pre-tokenizer that prepends means a prefix space.
TEST(VocabularyFacts, SpellingAndPrefixSpaceAsXgrammarDetectsThem) {
  using Spelling = Tokenizer::TokenSpelling;
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"▁a", 2}};
  auto spelling = [&](nlohmann::json extra) {
    return Load(Bpe(vocab, nlohmann::json::array(), extra))->token_spelling();
  };
  EXPECT_EQ(spelling({}), Spelling::kRaw);
  EXPECT_EQ(spelling({{"decoder", {{"type", "ByteLevel"}}}}), Spelling::kByteLevel);
  EXPECT_EQ(spelling({{"decoder",
                       {{"type", "Sequence"},
                        {"decoders",
                         {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                          {{"type", "ByteFallback"}},
                          {{"type", "Fuse"}}}}}}}),
            Spelling::kByteFallback);
  EXPECT_EQ(spelling({{"decoder", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}}}),
            Spelling::kRaw);

  auto prefix = [&](nlohmann::json extra) {
    return Load(Bpe(vocab, nlohmann::json::array(), extra))->adds_prefix_space();
  };
  EXPECT_FALSE(prefix({}));
  EXPECT_TRUE(prefix({{"normalizer",
                       {{"type", "Sequence"},
                        {"normalizers",
                         {{{"type", "Prepend"}, {"prepend", "▁"}},
                          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}}}));
  EXPECT_TRUE(prefix({{"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}}}}));
  EXPECT_FALSE(prefix({{"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "never"}}}}));
}

TEST(VocabularyFacts, IdCountCoversAddedTokens) {
  nlohmann::json j = nlohmann::json::parse(Bpe({{"a", 0}, {"b", 1}}, nlohmann::json::array()));
  EXPECT_EQ(Load(j.dump())->IdCount(), 2);
  j["added_tokens"] = {{{"id", 7}, {"content", "<eos>"}, {"special", true}}};
  EXPECT_EQ(Load(j.dump())->IdCount(), 8);
}

}  // namespace
}  // namespace strata::tokenizer
