// Matchers walked token by token through each kind of constraint, on a byte-level, a byte-fallback and a tiktoken
// vocabulary: at every step the mask never allows a padding id or a special token, allows the end of sequence
// exactly where the grammar may end, and the text of the walk is what the constraint asks for.
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/structured/test_vocabularies.h"

namespace strata::structured {
namespace {

using testing::ByteFallbackVocabulary;
using testing::ByteLevelVocabulary;
using testing::LoadTokenizer;
using testing::WalkOptions;

constexpr int64_t kPadding = 45;  // logits columns past the tokenizer's ids (not a multiple of 32)

// One vocabulary under test: its tokenizer, a compiler over it, and what a walk checks.
struct Vocabulary {
  std::string name;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<Compiler> compiler;
  WalkOptions walk;
};

Vocabulary MakeVocabulary(std::string name, std::unique_ptr<tokenizer::Tokenizer> tok, int32_t eos,
                          std::vector<int32_t> never_allowed) {
  Vocabulary v;
  v.name = std::move(name);
  v.walk.eos = eos;
  v.walk.tokenizer_ids = tok->IdCount();
  v.walk.never_allowed = std::move(never_allowed);
  auto compiler = Compiler::Create(*tok, tok->IdCount() + kPadding, {eos}, {});
  EXPECT_TRUE(compiler.ok()) << compiler.status();
  v.compiler = compiler.ok() ? *std::move(compiler) : nullptr;
  v.tok = std::move(tok);
  return v;
}

std::vector<Vocabulary> Vocabularies() {
  std::vector<Vocabulary> all;
  all.push_back(MakeVocabulary("byte-level", LoadTokenizer(ByteLevelVocabulary::Json()), ByteLevelVocabulary::Eos(),
                               {ByteLevelVocabulary::Hole(), ByteLevelVocabulary::ImStart()}));
  all.push_back(MakeVocabulary("byte-fallback", LoadTokenizer(ByteFallbackVocabulary::Json()),
                               ByteFallbackVocabulary::kEos, {0, 1}));
  return all;
}

std::shared_ptr<const Grammar> CompileOk(Compiler& compiler, const Constraint& c) {
  auto g = compiler.Compile(c);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

Constraint Make(ConstraintKind kind, std::string text) {
  Constraint c;
  c.kind = kind;
  c.text = std::move(text);
  c.field = "test";
  return c;
}

// Decoded text of `walks` random walks through `c` on every vocabulary.
template <typename Check>
void WalkEach(const Constraint& c, int walks, Check check) {
  for (Vocabulary& v : Vocabularies()) {
    SCOPED_TRACE(v.name);
    auto grammar = CompileOk(*v.compiler, c);
    ASSERT_NE(grammar, nullptr);
    std::mt19937 rng(1234);
    for (int i = 0; i < walks; ++i) {
      const std::vector<int32_t> ids = testing::Walk(grammar, rng, v.walk);
      const std::string text = v.tok->Decode(ids, /*skip_special_tokens=*/true);
      SCOPED_TRACE(text);
      check(text);
      // The byte-fallback decoder strips the space its first token may begin with; the grammar saw it.
      EXPECT_TRUE(Completes(*grammar, text) || Completes(*grammar, " " + text));
    }
  }
}

bool HasWhitespaceOutsideStrings(const std::string& json) {
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    if (in_string) {
      if (json[i] == '\\')
        ++i;
      else if (json[i] == '"')
        in_string = false;
    } else if (json[i] == '"') {
      in_string = true;
    } else if (json[i] == ' ' || json[i] == '\n' || json[i] == '\t' || json[i] == '\r') {
      return true;
    }
  }
  return false;
}

size_t Utf8Length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

TEST(Walk, JsonSchemaOutputValidates) {
  Constraint c = Make(ConstraintKind::kJsonSchema, R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 6},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age", "tags", "ok"]
  })");
  for (bool any_whitespace : {false, true}) {
    SCOPED_TRACE(any_whitespace ? "any whitespace" : "compact");
    c.any_whitespace = any_whitespace;
    WalkEach(c, 12, [&](const std::string& text) {
      nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_object());
      EXPECT_EQ(j.size(), 4u);  // no property the schema does not name
      ASSERT_TRUE(j["name"].is_string());
      EXPECT_LE(Utf8Length(j["name"].get<std::string>()), 6u);
      ASSERT_TRUE(j["age"].is_number_integer());
      EXPECT_GE(j["age"].get<int>(), 0);
      EXPECT_LE(j["age"].get<int>(), 150);
      ASSERT_TRUE(j["tags"].is_array());
      EXPECT_LE(j["tags"].size(), 3u);
      for (const auto& t : j["tags"]) EXPECT_TRUE(t == "a" || t == "b");
      EXPECT_TRUE(j["ok"].is_boolean());
      if (!any_whitespace) {
        EXPECT_FALSE(HasWhitespaceOutsideStrings(text));
      }
    });
  }
}

TEST(Walk, RegexOutputMatches) {
  const std::string regex = "[a-c]{2,5}-[0-9]{3}(x|yz)?";
  WalkEach(Make(ConstraintKind::kRegex, regex), 20,
           [&](const std::string& text) { EXPECT_TRUE(std::regex_match(text, std::regex(regex))); });
}

TEST(Walk, ChoiceOutputIsOneOfTheChoices) {
  Constraint c = Make(ConstraintKind::kChoice, "");
  c.choices = {"yes", "no", "maybe \"so\"", "back\\slash", "tab\there", "na\xc3\xafve", ""};
  std::set<std::string> seen;
  WalkEach(c, 30, [&](const std::string& text) {
    EXPECT_THAT(c.choices, ::testing::Contains(text));
    seen.insert(text);
  });
  EXPECT_GE(seen.size(), 4u);
}

TEST(Walk, EbnfGrammarOutputParses) {
  WalkEach(Make(ConstraintKind::kGrammar, "root ::= item+\nitem ::= \"- \" [a-z]+ \"\\n\"\n"), 12,
           [&](const std::string& text) { EXPECT_TRUE(std::regex_match(text, std::regex("(- [a-z]+\n)+"))); });
}

TEST(Walk, JsonObjectOutputIsAnObject) {
  // Objects nest without bound: end the walks early.
  for (Vocabulary& v : Vocabularies()) {
    SCOPED_TRACE(v.name);
    auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kJsonObject, ""));
    ASSERT_NE(grammar, nullptr);
    EXPECT_TRUE(Completes(*grammar, R"({"a": 1, "b": [true, null, {"c": "d"}], "e": {}})"));
    EXPECT_TRUE(Completes(*grammar, "{}"));
    EXPECT_FALSE(Completes(*grammar, "[]"));
    EXPECT_FALSE(Completes(*grammar, "\"text\""));
    EXPECT_FALSE(Completes(*grammar, R"({"a": 1)"));
  }
}

TEST(Grammar, WhitespaceRunsAreBounded) {
  Vocabulary v = std::move(Vocabularies()[0]);
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kJsonSchema, R"({"type": "object"})"));
  ASSERT_NE(grammar, nullptr);
  EXPECT_TRUE(Completes(*grammar, "{" + std::string(20, ' ') + "}"));
  EXPECT_FALSE(Completes(*grammar, "{" + std::string(21, ' ') + "}"));
  Constraint compact =
      Make(ConstraintKind::kJsonSchema, R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  compact.any_whitespace = false;
  auto tight = CompileOk(*v.compiler, compact);
  EXPECT_TRUE(Completes(*tight, R"({"a":1})"));
  EXPECT_FALSE(Completes(*tight, R"({"a": 1})"));
}

TEST(Grammar, StrictModeSchemasAllowOnlyNamedProperties) {
  // xgrammar's strict_mode (vLLM's default): a schema's object has the properties it names and no others.
  Vocabulary v = std::move(Vocabularies()[0]);
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kJsonSchema,
                                             R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
  EXPECT_TRUE(Completes(*grammar, R"({"a": 1})"));
  EXPECT_FALSE(Completes(*grammar, R"({"a": 1, "b": 2})"));
}

// llama.cpp's grammars/json.gbnf as it ships: its `ws` rule begins with an empty alternative.
constexpr char kLlamaCppJsonGbnf[] = R"GBNF(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)GBNF";

TEST(Grammar, LlamaCppJsonGbnfCompiles) {
  for (Vocabulary& v : Vocabularies()) {
    SCOPED_TRACE(v.name);
    auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kGrammar, kLlamaCppJsonGbnf));
    ASSERT_NE(grammar, nullptr);
    EXPECT_TRUE(Completes(*grammar, R"({"a": [1, -2.5e3, "x\n\u00e9", true, null], "b": {}} )"));
    EXPECT_TRUE(Completes(*grammar, "{\n  \"k\": \"v\"\n}"));
    EXPECT_FALSE(Completes(*grammar, "[1, 2]"));  // root is an object
    EXPECT_FALSE(Completes(*grammar, R"({"a": 01})"));
    EXPECT_FALSE(Completes(*grammar, R"({"a": 1)"));
  }
}

TEST(Grammar, FirstMaskAllowsOnlyWhatTheGrammarStartsWith) {
  Vocabulary v = std::move(Vocabularies()[0]);
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kGrammar, kLlamaCppJsonGbnf));
  Matcher m(grammar);
  std::vector<int32_t> mask(MaskWords(m.vocab_size()));
  m.FillMask(mask.data());
  std::vector<int32_t> allowed;
  for (int64_t id = 0; id < m.vocab_size(); ++id) {
    if (testing::Allowed(mask, id)) allowed.push_back(static_cast<int32_t>(id));
  }
  const int32_t brace_quote = ByteLevelVocabulary::kFirstMerged;  // "{\"", the first merged token
  EXPECT_THAT(allowed, ::testing::UnorderedElementsAre('{', brace_quote));
  EXPECT_FALSE(m.CanEnd());
}

TEST(Matcher, DisallowedTokenIsRefusedAndChangesNothing) {
  Vocabulary v = std::move(Vocabularies()[0]);
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kRegex, "ab"));
  Matcher m(grammar);
  EXPECT_FALSE(m.Accept('b'));
  EXPECT_FALSE(m.Accept(ByteLevelVocabulary::Eos()));  // the grammar cannot end yet
  EXPECT_FALSE(m.Accept(ByteLevelVocabulary::ImStart()));
  EXPECT_FALSE(m.Accept(ByteLevelVocabulary::IdCount() + 3));  // padding
  EXPECT_FALSE(m.Accept(-1));
  EXPECT_TRUE(m.Accept('a'));
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Accept('b'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Ended());
  EXPECT_FALSE(m.Accept('b'));
  EXPECT_TRUE(m.Accept(ByteLevelVocabulary::Eos()));
  EXPECT_TRUE(m.Ended());
  EXPECT_FALSE(m.Accept('a'));  // nothing follows the end
  std::vector<int32_t> mask(MaskWords(m.vocab_size()));
  m.FillMask(mask.data());
  for (int64_t id = 0; id < m.vocab_size(); ++id) {
    EXPECT_EQ(testing::Allowed(mask, id), id == ByteLevelVocabulary::Eos()) << id;
  }
}

// Speculative decoding fills a proposal's masks position by position, then rolls the matcher back: past the grammar's
// end too (an accepted EOS id), after which the matcher takes tokens as before.
TEST(Matcher, RollbackRestoresTheEarlierPositionEvenPastTheEnd) {
  Vocabulary v = std::move(Vocabularies()[0]);
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kRegex, "a(b|c)d"));
  Matcher m(grammar);
  auto mask = [&] {
    std::vector<int32_t> words(MaskWords(m.vocab_size()));
    m.FillMask(words.data());
    return words;
  };
  ASSERT_TRUE(m.Accept('a'));
  const std::vector<int32_t> after_a = mask();
  ASSERT_TRUE(m.Accept('b'));
  ASSERT_TRUE(m.Accept('d'));
  ASSERT_TRUE(m.Accept(ByteLevelVocabulary::Eos()));
  EXPECT_TRUE(m.Ended());
  const std::vector<int32_t> ended = mask();  // only the EOS ids, and the matcher is not failed by it
  for (int64_t id = 0; id < m.vocab_size(); ++id) {
    EXPECT_EQ(testing::Allowed(ended, id), id == ByteLevelVocabulary::Eos()) << id;
  }
  m.Rollback(3);
  EXPECT_FALSE(m.Ended());
  EXPECT_EQ(mask(), after_a);
  EXPECT_FALSE(m.Accept('d'));
  ASSERT_TRUE(m.Accept('c'));
  ASSERT_TRUE(m.Accept('d'));
  EXPECT_TRUE(m.CanEnd());
  m.Rollback(0);  // nothing
  EXPECT_TRUE(m.CanEnd());
}

TEST(Matcher, ForcedTextIsTheCommonContinuation) {
  Vocabulary v = std::move(Vocabularies()[0]);
  Constraint c = Make(ConstraintKind::kChoice, "");
  c.choices = {"apple pie", "apple tart"};
  Matcher m(CompileOk(*v.compiler, c));
  EXPECT_EQ(m.ForcedText(), "apple ");
  for (char ch : std::string("apple ")) ASSERT_TRUE(m.Accept(ch));
  EXPECT_EQ(m.ForcedText(), "");  // pie or tart
  ASSERT_TRUE(m.Accept('t'));
  EXPECT_EQ(m.ForcedText(), "art");
}

TEST(Matcher, NonSpecialAddedTokensAreText) {
  // "<think>" is an added token that is not special: it stands for its text like any other token.
  Vocabulary v = std::move(Vocabularies()[0]);
  Matcher m(CompileOk(*v.compiler, Make(ConstraintKind::kRegex, "<think>[a-z]")));
  std::vector<int32_t> mask(MaskWords(m.vocab_size()));
  m.FillMask(mask.data());
  EXPECT_TRUE(testing::Allowed(mask, ByteLevelVocabulary::Think()));
  EXPECT_TRUE(testing::Allowed(mask, '<'));
  EXPECT_TRUE(m.Accept(ByteLevelVocabulary::Think()));
  EXPECT_TRUE(m.Accept('q'));
  EXPECT_TRUE(m.CanEnd());
}

TEST(Matcher, PaddingWordsOfTheLastMaskWordStayClear) {
  Vocabulary v = std::move(Vocabularies()[0]);
  Matcher m(CompileOk(*v.compiler, Make(ConstraintKind::kRegex, "[^a]*")));  // almost every token allowed
  const int64_t vocab = m.vocab_size();
  std::vector<int32_t> mask(MaskWords(vocab), -1);
  m.FillMask(mask.data());
  for (int64_t id = ByteLevelVocabulary::IdCount(); id < vocab; ++id) EXPECT_FALSE(testing::Allowed(mask, id)) << id;
  EXPECT_TRUE(testing::Allowed(mask, 'b'));
  EXPECT_FALSE(testing::Allowed(mask, 'a'));
}

TEST(Grammar, JsonPatternsMatchAsTheRegexKindDoes) {
  // A schema's `pattern` goes through xgrammar's regex automaton, the regex kind through its EBNF: the same strings
  // must match. (The automaton's `?` used to let a group ending in `+` or `*` in without its first character:
  // structured/xgrammar.cmake fixes it.)
  Vocabulary v = std::move(Vocabularies()[0]);
  std::mt19937 rng(5);
  const std::string alphabet = "abcdxyz5-.";
  for (const std::string pattern :
       {"[0-9](x[a-z]+)?", "5(xa+)?", "5(x[a-z]*)?", "(ab|c)*d?", "a(b(c|d)+)?x", "[a-c]{2,3}(-[0-9]+)?", "(x?y+)?z",
        "(a|bc)+", "x(y*z?)?b", "^[0-9]+\\.[0-9]+(-[0-9A-Za-z.-]+)?$", "((ab)?c)+", "(a+|b)?(c|d+)?"}) {
    SCOPED_TRACE(pattern);
    auto as_schema = CompileOk(*v.compiler, Make(ConstraintKind::kJsonSchema,
                                                 nlohmann::json({{"type", "string"}, {"pattern", pattern}}).dump()));
    auto as_regex = CompileOk(*v.compiler, Make(ConstraintKind::kRegex, pattern));
    ASSERT_NE(as_schema, nullptr);
    ASSERT_NE(as_regex, nullptr);
    std::vector<std::string> texts = {"",    "5",     "5x",   "5xa", "5a", "5ab", "5aa",
                                      "1.2", "1.2-x", "1.2x", "abx", "ax", "xb",  "xyzb"};
    for (int i = 0; i < 300; ++i) {
      std::string t(std::uniform_int_distribution<size_t>(0, 7)(rng), ' ');
      for (char& c : t) c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      texts.push_back(t);
    }
    int matched = 0;
    for (const std::string& t : texts) {
      const bool regex = Completes(*as_regex, t);
      EXPECT_EQ(Completes(*as_schema, "\"" + t + "\""), regex) << t;
      matched += regex;
    }
    EXPECT_GT(matched, 0);
  }
}

TEST(Grammar, StructuralTagInBothForms) {
  // xgrammar's format, and vLLM's older {"structures", "triggers"} (a schema as an object or its JSON text): free
  // text, and after a trigger the tag's begin, its schema and its end.
  Vocabulary v = std::move(Vocabularies()[0]);
  const nlohmann::json schema = {
      {"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}};
  const nlohmann::json tag = {{"type", "tag"},
                              {"begin", "<f=w>"},
                              {"content", {{"type", "json_schema"}, {"json_schema", schema}}},
                              {"end", "</f>"}};
  const nlohmann::json current = {{"type", "structural_tag"},
                                  {"format", {{"type", "triggered_tags"}, {"triggers", {"<f="}}, {"tags", {tag}}}}};
  for (const nlohmann::json& legacy_schema : {schema, nlohmann::json(schema.dump())}) {
    const nlohmann::json legacy = {{"type", "structural_tag"},
                                   {"triggers", {"<f="}},
                                   {"structures", {{{"begin", "<f=w>"}, {"schema", legacy_schema}, {"end", "</f>"}}}}};
    for (const nlohmann::json& form : {current, legacy}) {
      SCOPED_TRACE(form.dump());
      auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kStructuralTag, form.dump()));
      ASSERT_NE(grammar, nullptr);
      EXPECT_TRUE(Completes(*grammar, "free text"));
      EXPECT_TRUE(Completes(*grammar, R"(Calling <f=w>{"city": "Oslo"}</f> now.)"));
      EXPECT_FALSE(Completes(*grammar, R"(Calling <f=w>{"town": "Oslo"}</f>)"));
      EXPECT_FALSE(Completes(*grammar, "<f=x>"));
    }
  }
  auto bad =
      v.compiler->Compile(Make(ConstraintKind::kStructuralTag, R"({"structures": [{"begin": "<"}], "triggers": []})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr(R"(test: invalid structural tag: structures[0] needs "begin" and "end" strings)"));
}

TEST(Completes, WholeSentencesOnly) {
  Vocabulary v = std::move(Vocabularies()[0]);
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kRegex, "[a-c]{2,3}"));
  EXPECT_TRUE(Completes(*grammar, "ab"));
  EXPECT_TRUE(Completes(*grammar, "abc"));
  EXPECT_FALSE(Completes(*grammar, "a"));     // a prefix
  EXPECT_FALSE(Completes(*grammar, "abca"));  // past the end
  EXPECT_FALSE(Completes(*grammar, "xy"));
  EXPECT_FALSE(Completes(*grammar, std::string("a\0b", 3)));
}

TEST(Walk, TiktokenVocabulary) {
  // A tiktoken rank file (Kimi K2's layout): the 256 bytes, then a few merged tokens; the special tokens after them.
  auto base64 = [](const std::string& bytes) {
    static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
      uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
      if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
      if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
      out += kAlphabet[(v >> 18) & 63];
      out += kAlphabet[(v >> 12) & 63];
      out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
      out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
    }
    return out;
  };
  std::string ranks;
  int rank = 0;
  for (; rank < 256; ++rank)
    ranks += base64(std::string(1, static_cast<char>(rank))) + " " + std::to_string(rank) + "\n";
  for (const std::string& t : testing::MergedTokens()) ranks += base64(t) + " " + std::to_string(rank++) + "\n";
  auto tok = tokenizer::Tokenizer::FromTiktoken(ranks);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->token_spelling(), tokenizer::Tokenizer::TokenSpelling::kByteLevel);
  const int32_t eos = rank;  // the first special token
  ASSERT_TRUE((*tok)->IsSpecial(eos));
  Vocabulary v = MakeVocabulary("tiktoken", *std::move(tok), eos, {eos + 1, eos + 2});
  const std::string regex = "(yes|no|ab) [0-9]{1,3}\\.";
  auto grammar = CompileOk(*v.compiler, Make(ConstraintKind::kRegex, regex));
  std::mt19937 rng(99);
  for (int i = 0; i < 10; ++i) {
    const std::string text = v.tok->Decode(testing::Walk(grammar, rng, v.walk), true);
    EXPECT_TRUE(std::regex_match(text, std::regex(regex))) << text;
  }
}

}  // namespace
}  // namespace strata::structured
