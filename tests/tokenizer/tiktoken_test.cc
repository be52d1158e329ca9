// tiktoken vocabularies (Kimi K2's tiktoken.model + tokenizer_config.json): tiktoken's merge rule on a tiny
// vocabulary, special tokens, decode and streaming, loading from a checkpoint directory, and rank files that
// are refused with the line that is wrong.
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out.push_back(kAlphabet[(v >> shift) & 63]);
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (bytes.size() - i == 2) {
    const uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

// The 256 single bytes (rank = byte), then `merged` in order.
std::string RankFile(const std::vector<std::string>& merged) {
  std::string out;
  int rank = 0;
  for (; rank < 256; ++rank) out += Base64(std::string(1, static_cast<char>(rank))) + " " + std::to_string(rank) + "\n";
  for (const std::string& token : merged) out += Base64(token) + " " + std::to_string(rank++) + "\n";
  return out;
}

// Ranks 256.. : "he" 256, "ll" 257, "llo" 258, "hello" 259, "aa" 260, "bc" 261, "ab" 262, " w" 263, "ab" + "ab" 264.
const std::vector<std::string> kMerged = {"he", "ll", "llo", "hello", "aa", "bc", "ab", " w", "abab"};
constexpr int32_t kFirstSpecial = 256 + 9;

std::string Config() {
  nlohmann::json decoder = nlohmann::json::object();
  decoder[std::to_string(kFirstSpecial)] = {{"content", "[BOS]"}, {"special", true}};
  decoder[std::to_string(kFirstSpecial + 2)] = {{"content", "<|im_end|>"}, {"special", true}};
  decoder[std::to_string(kFirstSpecial + 3)] = {{"content", "<｜end▁of▁sentence｜>"}, {"special", true}};
  decoder[std::to_string(kFirstSpecial + 4)] = {{"content", "<think>"}, {"special", false}};
  decoder["5"] = {{"content", "ignored: below the reserved ids"}};
  decoder[std::to_string(kFirstSpecial + 256)] = {{"content", "ignored: past the reserved ids"}};
  return nlohmann::json{{"added_tokens_decoder", decoder}}.dump();
}

std::unique_ptr<Tokenizer> Tiny() {
  auto tok = Tokenizer::FromTiktoken(RankFile(kMerged), Config());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text, /*add_special_tokens=*/true);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(Tiktoken, APieceThatIsATokenIsThatToken) {
  auto tok = Tiny();
  EXPECT_THAT(Ids(*tok, "hello"), ElementsAre(259));
}

TEST(Tiktoken, MergesTheLowestRankedPairUntilNoneIsAToken) {
  auto tok = Tiny();
  // h e l l o s: he (256), then ll (257), then llo (258), then he+llo = hello (259); "hellos" is no token.
  EXPECT_THAT(Ids(*tok, "hellos"), ElementsAre(259, 's'));
  // "bc" (261) ranks below "ab" (262), so a+bc, though ab is leftmost.
  EXPECT_THAT(Ids(*tok, "abc"), ElementsAre('a', 261));
}

TEST(Tiktoken, EqualRanksMergeLeftmostFirst) {
  auto tok = Tiny();
  EXPECT_THAT(Ids(*tok, "aaa"), ElementsAre(260, 'a'));
  EXPECT_THAT(Ids(*tok, "ababab"), ElementsAre(264, 262));
}

TEST(Tiktoken, KimiPatternSplitsHanCaseAndDigits) {
  auto tok = Tiny();
  // Pieces: "he" | "LLO" (a cased run may not go lower→upper) | " w" | "中" | "123" | "4".
  EXPECT_THAT(Ids(*tok, "heLLO w中1234"), ElementsAre(256, 'L', 'L', 'O', 263, 0xE4, 0xB8, 0xAD, '1', '2', '3', '4'));
  // A contraction stays on its word in any case: "he'LL" is one piece, so "he" then the rest byte by byte.
  EXPECT_THAT(Ids(*tok, "he'LL"), ElementsAre(256, '\'', 'L', 'L'));
}

TEST(Tiktoken, SpecialTokensAreFoundAnywhereInTheText) {
  auto tok = Tiny();
  EXPECT_THAT(Ids(*tok, "[BOS]hello<|im_end|>he"), ElementsAre(kFirstSpecial, 259, kFirstSpecial + 2, 256));
  // Ids Kimi leaves unnamed are "<|reserved_token_ID|>"; names outside the reserved ids are ignored.
  EXPECT_THAT(Ids(*tok, "<|reserved_token_266|>"), ElementsAre(kFirstSpecial + 1));
  EXPECT_EQ(tok->TokenToId("<|reserved_token_520|>"), kFirstSpecial + 255);
  EXPECT_EQ(tok->TokenToId("ignored: below the reserved ids"), std::nullopt);
  EXPECT_EQ(tok->IdToToken(kFirstSpecial + 256), std::nullopt);
  EXPECT_TRUE(tok->IsSpecial(kFirstSpecial));
  EXPECT_FALSE(tok->IsSpecial(kFirstSpecial + 4));
  EXPECT_FALSE(tok->IsSpecial(259));
}

TEST(Tiktoken, AddSpecialTokensAddsNothing) {
  auto tok = Tiny();
  auto ids = tok->Encode("hello", /*add_special_tokens=*/false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Ids(*tok, "hello"));
}

TEST(Tiktoken, TokensAreSpeltInTheByteLevelAlphabet) {
  auto tok = Tiny();
  EXPECT_EQ(tok->IdToToken(263), "Ġw");
  EXPECT_EQ(tok->TokenToId("Ġw"), 263);
  EXPECT_EQ(tok->IdToToken(0xC3), "Ã");
  EXPECT_EQ(tok->TokenToId(" w"), std::nullopt);  // the raw bytes are not how tokens are shown
  EXPECT_EQ(tok->IdToToken(kFirstSpecial + 2), "<|im_end|>");
}

TEST(Tiktoken, DecodeConcatenatesTheBytes) {
  auto tok = Tiny();
  const std::string text = "[BOS]hello wé<｜end▁of▁sentence｜>中<think>";
  const std::vector<int32_t> ids = Ids(*tok, text);
  EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/false), text);
  EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/true), "hello wé中<think>");
  // A cut inside a character decodes it as U+FFFD, as tiktoken's decode(errors="replace") does.
  EXPECT_EQ(tok->Decode({'a', 0xC3}, false), "a\xEF\xBF\xBD");
  // Ids past the vocabulary are dropped.
  EXPECT_EQ(tok->Decode({'a', kFirstSpecial + 300, 'b'}, false), "ab");
}

TEST(Tiktoken, StreamingDecodeHoldsBackSplitCharacters) {
  auto tok = Tiny();
  StreamingDecoder stream(*tok, /*skip_special_tokens=*/false);
  EXPECT_EQ(stream.Step('a'), "a");
  EXPECT_EQ(stream.Step(0xE4), "");
  EXPECT_EQ(stream.Step(0xB8), "");
  EXPECT_EQ(stream.Step(0xAD), "中");
  EXPECT_EQ(stream.Step(kFirstSpecial + 3), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(stream.Step(0xC3), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");
}

// CPU seconds of this thread: what the work costs, whatever else the machine runs at the time (a wall clock on 2
// shared cores is not; issue 40).
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

TEST(Tiktoken, ALongPieceMergesInLittleTime) {
  auto tok = Tiny();
  std::string text;
  for (int i = 0; i < 200000; ++i) text += "ab";
  const double start = ThreadCpuSeconds();
  const std::vector<int32_t> ids = Ids(*tok, text);
  const double seconds = ThreadCpuSeconds() - start;  // idle 0.13 s (2026-11-28); TSan (tests/sanitize) about 10x
  ASSERT_EQ(ids.size(), 100000u);
  EXPECT_EQ(ids.front(), 264);
  EXPECT_LT(seconds, 5.0);  // CPU seconds: tiktoken's rescan after every merge would take minutes
}

TEST(Tiktoken, CheckpointDirectoryWithoutTokenizerJsonLoadsTiktokenModel) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "strata_tiktoken_checkpoint";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(Tokenizer::DirectoryHasTokenizer(dir.string()));
  std::ofstream(dir / "tiktoken.model") << RankFile(kMerged);
  std::ofstream(dir / "tokenizer_config.json") << Config();
  EXPECT_TRUE(Tokenizer::DirectoryHasTokenizer(dir.string()));
  auto tok = Tokenizer::FromPath(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("[BOS]hello", false), ElementsAre(kFirstSpecial, 259));
  // The rank file on its own: no tokenizer_config.json, so every reserved id is "<|reserved_token_ID|>".
  auto file = Tokenizer::FromPath((dir / "tiktoken.model").string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->TokenToId("<|reserved_token_265|>"), kFirstSpecial);
  // Errors name the file.
  std::ofstream(dir / "tiktoken.model") << "bad line\n";
  auto bad = Tokenizer::FromPath(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr((dir / "tiktoken.model").string() + ": line 1: "));
  std::filesystem::remove_all(dir);
}

std::string ErrorOf(std::string_view ranks, std::string_view config = {}) {
  auto tok = Tokenizer::FromTiktoken(ranks, config);
  EXPECT_FALSE(tok.ok());
  if (tok.ok()) return "";
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(tok.status().message());
}

TEST(TiktokenErrors, ABadLineIsNamedByItsNumber) {
  const std::string base = RankFile({});  // lines 1..256
  EXPECT_EQ(ErrorOf(base + "YWI 256\n"),
            "tiktoken.model: line 257: bad base64 \"YWI\": its length is not a multiple of 4");
  EXPECT_EQ(ErrorOf(base + "YW*= 256\n"),
            "tiktoken.model: line 257: bad base64 \"YW*=\": character 3 is not in the base64 alphabet");
  EXPECT_EQ(ErrorOf(base + "YWI= -1\n"),
            "tiktoken.model: line 257: rank \"-1\" is not a decimal integer from 0 to 4194303");
  EXPECT_EQ(ErrorOf(base + "YWI= 99999999999\n"),
            "tiktoken.model: line 257: rank \"99999999999\" is not a decimal integer from 0 to 4194303");
  EXPECT_EQ(ErrorOf(base + "YWI= 2x\n"),
            "tiktoken.model: line 257: rank \"2x\" is not a decimal integer from 0 to 4194303");
  EXPECT_EQ(ErrorOf(base + "YWI=\n"), "tiktoken.model: line 257: expected \"<base64 token> <rank>\"");
  EXPECT_EQ(ErrorOf(base + "YWI= 256 7\n"), "tiktoken.model: line 257: expected \"<base64 token> <rank>\"");
  EXPECT_EQ(ErrorOf(base + "\n= 256\n"),
            "tiktoken.model: line 258: bad base64 \"=\": its length is not a multiple of 4");
  EXPECT_EQ(ErrorOf(base + "YWI= 10\n"), "tiktoken.model: line 257: rank 10 is already the rank of line 11");
  EXPECT_EQ(ErrorOf(base + "YQ== 256\n"), "tiktoken.model: line 257: the token is already on line 98 (rank 97)");
  EXPECT_EQ(ErrorOf(base + std::string(5000, 'Q') + " 256\n"),
            "tiktoken.model: line 257: longer than 4096 bytes (a token line is \"<base64> <rank>\")");
}

TEST(TiktokenErrors, RanksMustRunFromZeroWithoutAGap) {
  const std::string base = RankFile({});
  EXPECT_EQ(ErrorOf(base + "YWI= 257\nYmM= 258\n"),
            "tiktoken.model: line 258: rank 258 leaves a gap: the file has 258 tokens, so the ranks must be 0..257 "
            "(rank 256 is missing)");
  EXPECT_EQ(ErrorOf(""), "tiktoken.model: no tokens");
  EXPECT_EQ(ErrorOf("\n\n"), "tiktoken.model: no tokens");
}

TEST(TiktokenErrors, EveryByteOfUtf8TextNeedsAToken) {
  std::string ranks;
  for (int b = 1; b < 256; ++b)
    ranks += Base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b - 1) + "\n";
  EXPECT_EQ(ErrorOf(ranks),
            "tiktoken.model: no token for the byte 0x00 (byte-level BPE needs a token for every byte "
            "that UTF-8 text can hold)");
  // Bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF) may be missing.
  ranks.clear();
  int rank = 0;
  for (int b = 0; b < 0xF5; ++b) {
    if (b == 0xC0 || b == 0xC1) continue;
    ranks += Base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  }
  EXPECT_TRUE(Tokenizer::FromTiktoken(ranks).ok());
}

TEST(TiktokenErrors, CrLfLinesAndBlankLinesAreRead) {
  std::string ranks = RankFile({"ab"});
  std::string crlf;
  for (char c : ranks) {
    if (c == '\n') crlf += "\r\n\r\n";
    if (c != '\n') crlf += c;
  }
  auto tok = Tokenizer::FromTiktoken(crlf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("ab", false), ElementsAre(256));
}

TEST(TiktokenErrors, BadAddedTokensDecoderNamesTheJsonPath) {
  const std::string ranks = RankFile({});
  EXPECT_EQ(ErrorOf(ranks, R"({"added_tokens_decoder": []})"),
            "tokenizer_config.json: added_tokens_decoder: expected an object mapping ids to tokens");
  EXPECT_EQ(ErrorOf(ranks, R"({"added_tokens_decoder": {"x": {"content": "a"}}})"),
            "tokenizer_config.json: added_tokens_decoder.x: expected a token id as the key");
  EXPECT_EQ(ErrorOf(ranks, R"({"added_tokens_decoder": {"256": {"special": true}}})"),
            "tokenizer_config.json: added_tokens_decoder.256.content: missing (a string is required)");
  EXPECT_EQ(ErrorOf(ranks, R"({"added_tokens_decoder": {"256": {"content": ""}}})"),
            "tokenizer_config.json: added_tokens_decoder.256.content: a special token cannot be empty");
  EXPECT_EQ(ErrorOf(ranks, R"({"added_tokens_decoder": {"256": {"content": "<|reserved_token_300|>"}}})"),
            "tokenizer_config.json: added_tokens_decoder.256: \"<|reserved_token_300|>\" is the token of both id 256 "
            "and id 300");
  EXPECT_THAT(ErrorOf(ranks, "{not json"), HasSubstr("tokenizer_config.json"));
}

}  // namespace
}  // namespace strata::tokenizer
