// A tokenizer.json that strata cannot honour exactly is refused with a message naming the JSON path of
// the offending component — never approximated.
#include <string>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {
namespace {

using ::testing::HasSubstr;

nlohmann::json Valid() {
  return {{"added_tokens", nlohmann::json::array()},
          {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
}

std::string ErrorOf(const nlohmann::json& j) {
  auto tok = Tokenizer::FromJson(j.dump());
  EXPECT_FALSE(tok.ok());
  if (tok.ok()) return "";
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(tok.status().message());
}

TEST(TokenizerErrors, ValidFileLoads) { EXPECT_TRUE(Tokenizer::FromJson(Valid().dump()).ok()); }

TEST(TokenizerErrors, MissingModel) {
  auto j = Valid();
  j.erase("model");
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model: missing"));
}

TEST(TokenizerErrors, UnsupportedComponentsNameTheirPath) {
  auto j = Valid();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}, {{"type", "Whitespace"}}}}};
  EXPECT_EQ(ErrorOf(j),
            "tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported pre-tokenizer \"Whitespace\"");
  j = Valid();
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.type: unsupported model \"WordPiece\"");
  j = Valid();
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "WordPiece"}}}}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: decoder.decoders[0].type: unsupported decoder \"WordPiece\"");
  j = Valid();
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: normalizer.type: unsupported normalizer \"Precompiled\"");
  j = Valid();
  j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "Mystery"}}}}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: post_processor.processors[0].type: unsupported post-processor \"Mystery\"");
}

TEST(TokenizerErrors, MergeNamingAnUnknownToken) {
  auto j = Valid();
  j["model"]["merges"] = nlohmann::json::array({"a b", "a zz"});
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.merges[1]: token \"zz\" is not in model.vocab");
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "b"}), nlohmann::json::array({"b", "a"})});
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.merges[1]: merged token \"ba\" is not in model.vocab");
  j["model"]["merges"] = nlohmann::json::array({"ab"});
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges[0]: expected \"left right\""));
}

TEST(TokenizerErrors, WrongTypesAndBadValues) {
  auto j = Valid();
  j["model"]["vocab"]["c"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("model.vocab.c: expected a non-negative 32-bit integer id"));
  j = Valid();
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: model.unk_token: \"<unk>\" is not in model.vocab");
  j = Valid();
  j["model"]["dropout"] = 0.1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("model.dropout: unsupported"));
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "[unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: pre_tokenizer.pattern.Regex: invalid regex \"[unclosed\""));
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: pre_tokenizer.behavior: unsupported split behaviour \"Sideways\"");
  j = Valid();
  j["added_tokens"] = {{{"id", "seven"}, {"content", "<s>"}}};
  EXPECT_EQ(ErrorOf(j), "tokenizer.json: added_tokens[0].id: expected an integer, got string");
  j = Valid();
  j["padding"] = {{"strategy", "BatchLongest"}};
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: padding: unsupported"));
}

TEST(TokenizerErrors, NotJson) {
  auto tok = Tokenizer::FromJson("{\"model\": ");
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("tokenizer.json: not valid JSON"));
}

TEST(TokenizerErrors, MissingFileIsBadInputNamingThePath) {
  // Bad input like any other (every binary exits 2 on it), with the path and the reason.
  auto tok = Tokenizer::FromPath("/nonexistent/strata/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("/nonexistent/strata/tokenizer.json: cannot open"));
}

TEST(TokenizerErrors, VocabularyIdNearInt32MaxIsAnErrorNamingTheToken) {
  // Before: the id -> token table was resized to max_id + 1, which overflowed at INT32_MAX.
  for (int64_t id : {int64_t{2147483647}, int64_t{2147483646}, int64_t{1} << 22}) {
    auto j = Valid();
    j["model"]["vocab"]["ab"] = id;
    EXPECT_THAT(ErrorOf(j), HasSubstr("model.vocab.ab: id ")) << id;
  }
}

// A tokenizer.json whose `component` is `levels` Sequences around `leaf`, written as text (nlohmann's own
// dump recurses too).
std::string NestedSequences(const std::string& component, const std::string& list_key, const std::string& leaf,
                            int levels) {
  std::string nested;
  for (int i = 0; i < levels; ++i) nested += R"({"type": "Sequence", ")" + list_key + R"(": [)";
  nested += leaf;
  for (int i = 0; i < levels; ++i) nested += "]}";
  std::string text = Valid().dump();
  text.insert(1, "\"" + component + "\": " + nested + ", ");
  return text;
}

TEST(TokenizerErrors, DeeplyNestedSequencesAreAnErrorNotAStackOverflow) {
  // Before: each Sequence level was read by a recursive call, so a file nested 200,000 levels deep
  // (7 MB; tokenizer.json may be 256 MB) overflowed the stack. Found by fuzzing tests/fuzz/fuzz_tokenizer.
  const std::tuple<std::string, std::string, std::string> kinds[] = {
      {"normalizer", "normalizers", R"({"type": "NFC"})"},
      {"pre_tokenizer", "pretokenizers", R"({"type": "Digits", "individual_digits": true})"},
      {"decoder", "decoders", R"({"type": "Fuse"})"},
      {"post_processor", "processors", R"({"type": "ByteLevel", "trim_offsets": false})"}};
  for (const auto& [component, list_key, leaf] : kinds) {
    auto tok = Tokenizer::FromJson(NestedSequences(component, list_key, leaf, 200000));
    ASSERT_FALSE(tok.ok()) << component;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr("tokenizer.json: JSON nests deeper than 127 levels"))
        << component;
  }
}

TEST(TokenizerErrors, NestingLimitIsSerdeJsonsOf127Levels) {
  // `tokenizers` loads 62 Sequences around an NFC normalizer (126 levels with the root) and refuses 63
  // ("recursion limit exceeded"): the same line here.
  EXPECT_TRUE(Tokenizer::FromJson(NestedSequences("normalizer", "normalizers", R"({"type": "NFC"})", 62)).ok());
  auto tok = Tokenizer::FromJson(NestedSequences("normalizer", "normalizers", R"({"type": "NFC"})", 63));
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("nests deeper than 127 levels"));
  // Brackets inside strings are text, not nesting.
  auto j = Valid();
  j["model"]["vocab"][std::string(500, '[') + "\"{{"] = 3;
  EXPECT_TRUE(Tokenizer::FromJson(j.dump()).ok());
}

}  // namespace
}  // namespace strata::tokenizer
