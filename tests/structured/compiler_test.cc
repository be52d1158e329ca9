// The Compiler: what it refuses and how each refusal names the request's field, the vocabulary it builds from a
// tokenizer, the deadline, and the cache (hits, in-flight compiles shared, least recently used evicted).
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/structured/test_vocabularies.h"

namespace strata::structured {
namespace {

using testing::ByteLevelVocabulary;
using ::testing::HasSubstr;
using testing::LoadTokenizer;
using ::testing::StartsWith;

constexpr int64_t kPadding = 45;  // logits columns past the tokenizer's ids

std::unique_ptr<Compiler> MakeCompiler(const tokenizer::Tokenizer& tok, CompilerOptions options = {}) {
  auto compiler =
      Compiler::Create(tok, ByteLevelVocabulary::IdCount() + kPadding, {ByteLevelVocabulary::Eos()}, options);
  EXPECT_TRUE(compiler.ok()) << compiler.status();
  return compiler.ok() ? *std::move(compiler) : nullptr;
}

Constraint Make(ConstraintKind kind, std::string text, std::string field) {
  Constraint c;
  c.kind = kind;
  c.text = std::move(text);
  c.field = std::move(field);
  return c;
}

Constraint Schema(std::string text) {
  return Make(ConstraintKind::kJsonSchema, std::move(text), "response_format.json_schema.schema");
}

// An object of `n` string properties, each with its own pattern: one state per pattern position, so compiling it
// takes a while (about half a second for 300 on one core).
std::string SlowSchema(int n) {
  std::string schema = R"({"type": "object", "properties": {)";
  for (int i = 0; i < n; ++i) {
    schema += (i ? ", " : "") + std::string("\"p") + std::to_string(i) +
              R"(": {"type": "string", "pattern": "[a-z]{1,)" + std::to_string(80 + i % 9) + "}\"}";
  }
  return schema + "}}";
}

class CompilerTest : public ::testing::Test {
 protected:
  std::unique_ptr<tokenizer::Tokenizer> tok_ = LoadTokenizer(ByteLevelVocabulary::Json());
};

void ExpectRefused(const absl::StatusOr<std::shared_ptr<const Grammar>>& g, const std::string& field,
                   const std::string& reason) {
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_THAT(std::string(g.status().message()), StartsWith(field + ": "));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr(reason));
}

TEST_F(CompilerTest, InvalidJsonNamesTheField) {
  auto compiler = MakeCompiler(*tok_);
  ExpectRefused(compiler->Compile(Schema(R"({"type": )")), "response_format.json_schema.schema", "not valid JSON");
}

TEST_F(CompilerTest, InvalidSchemaNamesTheField) {
  auto compiler = MakeCompiler(*tok_);
  ExpectRefused(compiler->Compile(Schema(R"({"type": "foo"})")), "response_format.json_schema.schema",
                "invalid JSON schema: Unsupported type \"foo\"");
  ExpectRefused(compiler->Compile(Schema(R"({"type": "string", "minLength": "x"})")),
                "response_format.json_schema.schema", "invalid JSON schema: minLength must be an integer");
  ExpectRefused(compiler->Compile(Schema("[1, 2]")), "response_format.json_schema.schema",
                "a JSON schema is an object or a boolean");
  ExpectRefused(compiler->Compile(Schema("false")), "response_format.json_schema.schema", "invalid JSON schema");
}

TEST_F(CompilerTest, BadRegexNamesTheFieldAndPosition) {
  auto compiler = MakeCompiler(*tok_);
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kRegex, "ab(c", "structured_outputs.regex")),
                "structured_outputs.regex", "invalid regular expression: Regex parsing error at position 5");
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kRegex, "[a-", "structured_outputs.regex")),
                "structured_outputs.regex", "Unclosed '['");
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kRegex, std::string("a\0b", 3), "structured_outputs.regex")),
                "structured_outputs.regex", "contains a NUL byte");
}

TEST_F(CompilerTest, BadGrammarNamesTheFieldAndLine) {
  auto compiler = MakeCompiler(*tok_);
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kGrammar, "root ::= item\n", "structured_outputs.grammar")),
                "structured_outputs.grammar", "invalid grammar: EBNF parser error at line 1, column 10: Rule \"item\"");
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kGrammar, "start ::= \"a\"", "structured_outputs.grammar")),
                "structured_outputs.grammar", "invalid grammar");
}

TEST_F(CompilerTest, BadStructuralTagNamesTheField) {
  auto compiler = MakeCompiler(*tok_);
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kStructuralTag, R"({"format": {"type": "no_such"}})",
                                       "structured_outputs.structural_tag")),
                "structured_outputs.structural_tag", "invalid structural tag");
  // A token id past the vocabulary would index xgrammar's per-token tables.
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kStructuralTag,
                                       R"({"type": "structural_tag", "format": {"type": "token", "token": 99999}})",
                                       "structured_outputs.structural_tag")),
                "structured_outputs.structural_tag", "out of the vocabulary range");
}

TEST_F(CompilerTest, OversizeConstraintsAreRefusedBeforeParsing) {
  CompilerOptions options;
  options.max_constraint_bytes = 64;
  auto compiler = MakeCompiler(*tok_, options);
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kRegex, std::string(65, 'a'), "structured_outputs.regex")),
                "structured_outputs.regex", "65 bytes, more than the limit of 64");
  EXPECT_TRUE(compiler->Compile(Make(ConstraintKind::kRegex, std::string(64, 'a'), "structured_outputs.regex")).ok());
  Constraint choices = Make(ConstraintKind::kChoice, "", "structured_outputs.choice");
  choices.choices = {std::string(40, 'a'), std::string(40, 'b')};  // together over the limit
  ExpectRefused(compiler->Compile(choices), "structured_outputs.choice", "80 bytes");
}

TEST_F(CompilerTest, DeepSchemasAreRefused) {
  auto compiler = MakeCompiler(*tok_);  // max_schema_depth 64
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 40; ++i) deep = R"({"type": "object", "properties": {"a": )" + deep + "}}";  // 81 levels
  ExpectRefused(compiler->Compile(Schema(deep)), "response_format.json_schema.schema",
                "JSON nests deeper than 64 levels");
  std::string fine = R"({"type": "string"})";
  for (int i = 0; i < 20; ++i) fine = R"({"type": "object", "properties": {"a": )" + fine + R"(}, "required": ["a"]})";
  EXPECT_TRUE(compiler->Compile(Schema(fine)).ok());
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kStructuralTag, std::string(100, '[') + std::string(100, ']'),
                                       "structured_outputs.structural_tag")),
                "structured_outputs.structural_tag", "JSON nests deeper than 64 levels");
}

TEST_F(CompilerTest, NoChoicesIsRefused) {
  auto compiler = MakeCompiler(*tok_);
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kChoice, "", "structured_outputs.choice")),
                "structured_outputs.choice", "no choices");
}

TEST_F(CompilerTest, DeepNestingInRegexAndGrammarIsRefusedNotOverflowed) {
  auto compiler = MakeCompiler(*tok_);
  const std::string open(20000, '('), close(20000, ')');
  ExpectRefused(compiler->Compile(Make(ConstraintKind::kRegex, open + "a" + close, "structured_outputs.regex")),
                "structured_outputs.regex", "Nest layer exceeded the maximum limit");
  ExpectRefused(compiler->Compile(
                    Make(ConstraintKind::kGrammar, "root ::= " + open + "\"a\"" + close, "structured_outputs.grammar")),
                "structured_outputs.grammar", "Nest layer exceeded the maximum limit");
}

TEST_F(CompilerTest, LargeRepetitionsCompileWithoutUnrolling) {
  auto compiler = MakeCompiler(*tok_);
  for (const char* regex : {"a{1000000}", "(a{1000}){1000}", "(a|b)*a(a|b){30}", "[a-z]{1,100000}"}) {
    EXPECT_TRUE(compiler->Compile(Make(ConstraintKind::kRegex, regex, "structured_outputs.regex")).ok()) << regex;
  }
  EXPECT_TRUE(compiler->Compile(Schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 100000})")).ok());
}

TEST_F(CompilerTest, RecursiveReferencesCompile) {
  auto compiler = MakeCompiler(*tok_);
  for (const char* schema :
       {R"({"$ref": "#"})", R"({"type": "object", "properties": {"next": {"$ref": "#"}}})",
        R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
        R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"}) {
    auto g = compiler->Compile(Schema(schema));
    EXPECT_TRUE(g.ok()) << schema << ": " << g.status();
  }
}

TEST_F(CompilerTest, RefusalsAreCounted) {
  auto compiler = MakeCompiler(*tok_);
  EXPECT_FALSE(compiler->Compile(Schema("{")).ok());
  EXPECT_FALSE(compiler->Compile(Make(ConstraintKind::kRegex, "(", "structured_outputs.regex")).ok());
  EXPECT_FALSE(compiler->Compile(Make(ConstraintKind::kRegex, "(", "structured_outputs.regex")).ok());
  const CompilerStats stats = compiler->TakeStats();
  EXPECT_EQ(stats.failures, 3u);
  EXPECT_EQ(stats.compiles, 2u);  // refusals are not cached: the second bad regex was compiled again
  EXPECT_EQ(stats.timeouts, 0u);
}

TEST_F(CompilerTest, CacheHitIsCounted) {
  auto compiler = MakeCompiler(*tok_);
  Constraint c = Make(ConstraintKind::kRegex, "[a-c]{2,5}", "structured_outputs.regex");
  auto first = compiler->Compile(c);
  ASSERT_TRUE(first.ok()) << first.status();
  c.field = "another.field";  // the field is not part of the key
  auto second = compiler->Compile(c);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->get(), second->get());
  CompilerStats stats = compiler->TakeStats();
  EXPECT_EQ(stats.compiles, 1u);
  EXPECT_EQ(stats.cache_hits, 1u);
  EXPECT_EQ(stats.compile_seconds.size(), 1u);
  EXPECT_TRUE(compiler->TakeStats().compile_seconds.empty());  // taken
}

TEST_F(CompilerTest, CacheKeysTellOptionsApart) {
  Constraint a = Schema(R"({"type": "object"})");
  Constraint b = a;
  b.any_whitespace = false;
  EXPECT_NE(CacheKey(a), CacheKey(b));
  b = a;
  b.strict = false;
  EXPECT_NE(CacheKey(a), CacheKey(b));
  b = a;
  b.field = "elsewhere";
  EXPECT_EQ(CacheKey(a), CacheKey(b));
  Constraint choice1 = Make(ConstraintKind::kChoice, "", "f"), choice2 = choice1;
  choice1.choices = {"a b", "c"};
  choice2.choices = {"a", "b c"};
  EXPECT_NE(CacheKey(choice1), CacheKey(choice2));
  Constraint regex = Make(ConstraintKind::kRegex, "abc", "f"), grammar = Make(ConstraintKind::kGrammar, "abc", "f");
  EXPECT_NE(CacheKey(regex), CacheKey(grammar));
}

TEST_F(CompilerTest, ConcurrentCompilesOfOneKeyShareOneCompile) {
  auto compiler = MakeCompiler(*tok_);
  const Constraint c = Schema(SlowSchema(60));
  std::vector<std::shared_ptr<const Grammar>> got(6);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      auto g = compiler->Compile(c);
      EXPECT_TRUE(g.ok()) << g.status();
      if (g.ok()) got[i] = *g;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g.get(), got[0].get());
  const CompilerStats stats = compiler->TakeStats();
  EXPECT_EQ(stats.compiles, 1u);
  EXPECT_EQ(stats.cache_hits, got.size() - 1);
}

TEST_F(CompilerTest, TimeoutIsRefusedAndTheCompileFillsTheCacheInTheBackground) {
  CompilerOptions options;
  // A schema that compiles in ~0.4 s in a release build (seconds under the sanitizers) against a 100 ms deadline:
  // long enough for a worker to take the job before its only waiter gives up even on a loaded machine (a job nobody
  // waits for any more is dropped unstarted, by design; with 2 ms, CI's TSan lane beside the other shards saw that).
  options.max_compile_time = std::chrono::milliseconds(100);
  auto compiler = MakeCompiler(*tok_, options);
  const Constraint c = Schema(SlowSchema(120));
  ExpectRefused(compiler->Compile(c), "response_format.json_schema.schema",
                "the grammar did not compile within 0.1 s (--max-grammar-compile-seconds)");
  CompilerStats stats = compiler->TakeStats();
  EXPECT_EQ(stats.timeouts, 1u);
  EXPECT_EQ(stats.failures, 0u);
  // The compile goes on without anyone waiting, and its grammar is then served from the cache at once.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (stats.compile_seconds.empty() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stats = compiler->TakeStats();
  }
  ASSERT_EQ(stats.compile_seconds.size(), 1u);
  EXPECT_GT(stats.compile_seconds[0], 0.1);
  auto g = compiler->Compile(c);
  EXPECT_TRUE(g.ok()) << g.status();
  stats = compiler->TakeStats();
  EXPECT_EQ(stats.compiles, 1u);
  EXPECT_EQ(stats.cache_hits, 1u);
}

TEST_F(CompilerTest, LeastRecentlyUsedGrammarIsEvicted) {
  // Three grammars of one shape (so of one size); the cache holds two.
  auto regex = [](char c) { return Make(ConstraintKind::kRegex, std::string("[a-c]{2,5}") + c, "f"); };
  int64_t one = 0;
  {
    auto probe = MakeCompiler(*tok_);
    auto g = probe->Compile(regex('x'));
    ASSERT_TRUE(g.ok());
    one = GrammarBytes(**g);
    EXPECT_GT(one, 0);
  }
  CompilerOptions options;
  options.cache_bytes = 2 * one + one / 2;
  auto compiler = MakeCompiler(*tok_, options);
  for (char c : {'x', 'y', 'x', 'z', 'x', 'y'}) ASSERT_TRUE(compiler->Compile(regex(c)).ok());
  // x, y compiled; x hit (now the most recent); z compiled, evicting y; x hit; y compiled again, evicting z.
  const CompilerStats stats = compiler->TakeStats();
  EXPECT_EQ(stats.compiles, 4u);
  EXPECT_EQ(stats.cache_hits, 2u);
}

TEST_F(CompilerTest, GrammarLargerThanTheCacheIsServedButNotKept) {
  CompilerOptions options;
  options.cache_bytes = 0;
  auto compiler = MakeCompiler(*tok_, options);
  const Constraint c = Make(ConstraintKind::kRegex, "[a-c]+", "f");
  EXPECT_TRUE(compiler->Compile(c).ok());
  EXPECT_TRUE(compiler->Compile(c).ok());
  EXPECT_EQ(compiler->TakeStats().compiles, 2u);
}

TEST_F(CompilerTest, CreateChecksItsArguments) {
  EXPECT_FALSE(Compiler::Create(*tok_, 300, {-1}, {}).ok());
  EXPECT_FALSE(Compiler::Create(*tok_, 0, {}, {}).ok());
  // An end-of-sequence id the logits cannot produce is left out (the grammar then never ends on it).
  auto past = Compiler::Create(*tok_, 300, {300, ByteLevelVocabulary::Eos()}, {});
  ASSERT_TRUE(past.ok()) << past.status();
  auto g = (*past)->Compile(Make(ConstraintKind::kRegex, "a", "f"));
  ASSERT_TRUE(g.ok()) << g.status();
  Matcher m(*g);
  ASSERT_TRUE(m.Accept('a'));
  EXPECT_TRUE(m.Accept(ByteLevelVocabulary::Eos()));
  CompilerOptions bad;
  bad.threads = 0;
  EXPECT_FALSE(Compiler::Create(*tok_, 400, {}, bad).ok());
}

TEST_F(CompilerTest, VocabularySmallerThanTheTokenizerKeepsTheIdsBelowIt) {
  // Ids the logits cannot produce are dropped (here the special tokens and part of the merged ones).
  auto compiler = Compiler::Create(*tok_, 260, {}, {});
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  EXPECT_EQ((*compiler)->vocab_size(), 260);
  auto g = (*compiler)->Compile(Make(ConstraintKind::kRegex, "[a-c]+", "f"));
  ASSERT_TRUE(g.ok()) << g.status();
  Matcher m(*g);
  EXPECT_EQ(m.vocab_size(), 260);
  std::vector<int32_t> mask(MaskWords(260));
  m.FillMask(mask.data());
  EXPECT_TRUE(testing::Allowed(mask, 'a'));
  EXPECT_FALSE(testing::Allowed(mask, 'd'));
}

}  // namespace
}  // namespace strata::structured
