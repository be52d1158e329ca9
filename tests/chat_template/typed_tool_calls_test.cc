// chat_template: vLLM's glm45 and minimax_m2 tool-call parsers, whose arguments are typed by the request's tool
// schemas, on outputs shaped as GLM-4.6 and MiniMax-M2 write them (and their chat templates write them back), bad
// input included; and the Python value rules they restate (py_literal.h: ast.literal_eval, int(), float()).

#include <cmath>
#include <ctime>
#include <string>
#include <vector>

#include "chat_template/py_literal.h"
#include "chat_template/tool_calls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/chat_template/tool_call_checks.h"

namespace strata::chat_template {
namespace {

using Json = nlohmann::ordered_json;

constexpr ToolCallFormat kGlm = ToolCallFormat::kGlm45;
constexpr ToolCallFormat kMinimax = ToolCallFormat::kMinimaxM2;

// get_weather(city: string, days: integer, metric: boolean, ratio: number, tags: array)
Json WeatherTools() {
  return Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                     "ratio": {"type": "number"}, "tags": {"type": "array"},
                     "when": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}}])");
}

// One call as GLM-4.6's template writes it back: `<tool_call>NAME`, then per argument a key line and a value line.
std::string GlmCall(std::string_view name, const std::vector<std::pair<std::string, std::string>>& arguments) {
  std::string out = "<tool_call>" + std::string(name) + "\n";
  for (const auto& [key, value] : arguments)
    out += "<arg_key>" + key + "</arg_key>\n<arg_value>" + value + "</arg_value>\n";
  return out + "</tool_call>";
}

// --- glm45 ------------------------------------------------------------------------------------------------------

TEST(Glm45ToolCalls, ArgumentsAreTypedByTheToolSchemas) {
  const std::string text =
      "\n" + GlmCall("get_weather", {{"city", "  Paris "}, {"days", "3"}, {"metric", "true"}, {"tags", "[\"a\"]"}});
  const ParsedToolCalls parsed = Parse(kGlm, text, WeatherTools());
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  // A string parameter keeps its text as written (spaces too); the others are json.loads'd.
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "  Paris ", "days": 3, "metric": true, "tags": ["a"]})");
  EXPECT_EQ(parsed.content, "") << "whitespace before the call is no content (vLLM's None)";
  ExpectStreamsLikeParse(kGlm, text, WeatherTools());
}

TEST(Glm45ToolCalls, WithoutASchemaValuesAreJsonThenPythonLiteralsThenText) {
  const std::string text =
      "Let me check. " +
      GlmCall("lookup",
              {{"a", "5"}, {"b", "'single'"}, {"c", "(1, True)"}, {"d", "Paris, France"}, {"e", "{'k': None}"}});
  const ParsedToolCalls parsed = Parse(kGlm, text);  // no tools: lookup is unknown
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments,
            R"({"a": 5, "b": "single", "c": [1, true], "d": "Paris, France", "e": {"k": null}})");
  EXPECT_EQ(parsed.content, "Let me check. ");
  ExpectStreamsLikeParse(kGlm, text);
}

TEST(Glm45ToolCalls, SeveralCallsARepeatedKeyKeepsItsPlaceAndLastValue) {
  const std::string text =
      GlmCall("f", {{"x", "1"}, {"y", "2"}, {"x", "3"}}) + "\n" + GlmCall("g", {}) + "\ntrailing text";
  const ParsedToolCalls parsed = Parse(kGlm, text);
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].arguments, R"({"x": 3, "y": 2})");
  EXPECT_EQ(parsed.calls[1].name, "g");
  EXPECT_EQ(parsed.calls[1].arguments, "{}");
  ExpectStreamsLikeParse(kGlm, text);
}

TEST(Glm45ToolCalls, ABlockWithoutALineEndIsSkippedAnUnterminatedOneIsNoCall) {
  const std::string text = "<tool_call>f</tool_call>" + GlmCall("g", {{"a", "1"}}) + "<tool_call>h\n<arg_key>";
  const ParsedToolCalls parsed = Parse(kGlm, text);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "g");
  ExpectStreamsLikeParse(kGlm, text);
  // Only an unterminated block: no call, all content.
  const ParsedToolCalls cut = Parse(kGlm, "Sure <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par");
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "Sure <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par");
}

TEST(Glm45ToolCalls, AValueJsonDumpsRefusesFailsTheWholeOutputUnlessReplaced) {
  // A complex number, a set, bytes: literal_eval gives them, json.dumps raises, vLLM's except makes it content.
  for (const std::string& value :
       std::vector<std::string>{"1+2j", "{1, 2}", "b'x'", "...", "{(1, 2): 3}", "0x" + std::string(3700, 'f')}) {
    const std::string text = GlmCall("f", {{"a", value}});
    const ParsedToolCalls parsed = Parse(kGlm, text);
    EXPECT_TRUE(parsed.calls.empty()) << value;
    EXPECT_EQ(parsed.content, text) << value;
    ExpectStreamsLikeParse(kGlm, text);
    // Replaced by a later argument of the same name before the dump: fine.
    EXPECT_EQ(Parse(kGlm, GlmCall("f", {{"a", value}, {"a", "1"}})).calls.at(0).arguments, R"({"a": 1})") << value;
  }
  // literal_eval's own TypeError (an unhashable key) fails at once, replaced or not.
  EXPECT_TRUE(Parse(kGlm, GlmCall("f", {{"a", "{[1]: 2}"}, {"a", "1"}})).calls.empty());
  // json.loads's ValueError for an integer of more than 4,300 digits is not caught either.
  EXPECT_TRUE(Parse(kGlm, GlmCall("f", {{"a", std::string(4400, '1')}})).calls.empty());
}

TEST(Glm45ToolCalls, SchemasVllmCannotReadFailTheWholeOutput) {
  // properties that is no dict, or an argument schema that is no dict: vLLM's .get raises AttributeError.
  for (const char* properties : {R"(["city"])", R"("city")", R"({"city": "string"})", R"({"city": null})"}) {
    const Json tools =
        Json::parse(std::string(R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": )") +
                    properties + "}}}]");
    EXPECT_TRUE(Parse(kGlm, GlmCall("f", {{"city", "Paris"}}), tools).calls.empty()) << properties;
    // Another tool's schemas are never read.
    EXPECT_EQ(Parse(kGlm, GlmCall("g", {{"city", "Paris"}}), tools).calls.size(), 1u) << properties;
  }
}

TEST(Glm45ToolCalls, UnknownToolsAndTypesReadAsNotString) {
  const ParsedToolCalls parsed = Parse(kGlm, GlmCall("nope", {{"city", "007"}}), WeatherTools());
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "nope");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "007"})") << "not JSON, not a literal (leading zeros): text";
}

TEST(Glm45ToolCalls, AKeyWithoutValueGrowsIntoTheNextAsVllmsRegex) {
  const std::string text =
      "<tool_call>f\n<arg_key>a</arg_key>\n<arg_key>b</arg_key>\n<arg_value>1</arg_value>\n</tool_call>";
  const ParsedToolCalls parsed = Parse(kGlm, text);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments, R"({"a</arg_key>\n<arg_key>b": 1})");
  ExpectStreamsLikeParse(kGlm, text);
}

TEST(Glm45ToolCalls, WhitespaceContentWaitsInTheStream) {
  const std::string text = " \n\t" + GlmCall("f", {});
  EXPECT_EQ(Parse(kGlm, text).content, "");
  ExpectStreamsLikeParse(kGlm, text);
  ExpectStreamsLikeParse(kGlm, " \n\t no call, just text <tool_");
  ExpectStreamsLikeParse(kGlm, "\u3000 <tool_call>f\n</tool_call>");
}

// --- minimax_m2 -------------------------------------------------------------------------------------------------

std::string MinimaxCalls(const std::string& invokes) {
  return "<minimax:tool_call>\n" + invokes + "</minimax:tool_call>";
}

TEST(MinimaxM2ToolCalls, ParametersAreConvertedByTheirSchemas) {
  const std::string text = "I'll check.\n" + MinimaxCalls(
                                                 "<invoke name=\"get_weather\">\n"
                                                 "<parameter name=\"city\">Paris</parameter>\n"
                                                 "<parameter name=\"days\">3</parameter>\n"
                                                 "<parameter name=\"metric\">Yes</parameter>\n"
                                                 "<parameter name=\"ratio\">2.0</parameter>\n"
                                                 "<parameter name=\"when\">none</parameter>\n"
                                                 "<parameter name=\"tags\">[1, 2]</parameter>\n"
                                                 "</invoke>\n");
  const ParsedToolCalls parsed = Parse(kMinimax, text, WeatherTools());
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(parsed.calls[0].arguments,
            R"({"city": "Paris", "days": 3, "metric": true, "ratio": 2, "when": null, "tags": [1, 2]})");
  EXPECT_EQ(parsed.content, "I'll check.\n");
  ExpectStreamsLikeParse(kMinimax, text, WeatherTools());
}

TEST(MinimaxM2ToolCalls, WithoutASchemaEverythingIsText) {
  const std::string text = MinimaxCalls(
      "<invoke name='lookup'>\n<parameter name=q>5</parameter>\n</invoke>\n"
      "<invoke name=\"second\"></invoke>\n");
  const ParsedToolCalls parsed = Parse(kMinimax, text);
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].name, "lookup");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"q": "5"})");
  EXPECT_EQ(parsed.calls[1].arguments, "{}");
  EXPECT_EQ(parsed.content, "");
  ExpectStreamsLikeParse(kMinimax, text);
}

TEST(MinimaxM2ToolCalls, ValuesThatDoNotFitTryTheNextType) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": {
      "n": {"type": ["integer", "number", "string"]}, "b": {"type": "boolean"}, "o": {"type": "object"},
      "e": {"enum": [1, 2]}}}}}])");
  const std::string text = MinimaxCalls(
      "<invoke name=\"f\"><parameter name=\"n\">2.5</parameter><parameter name=\"b\">maybe</parameter>"
      "<parameter name=\"o\">{not json</parameter><parameter name=\"e\">1_000</parameter></invoke>");
  const ParsedToolCalls parsed = Parse(kMinimax, text, tools);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments, R"({"n": 2.5, "b": "maybe", "o": "{not json", "e": 1000})");
}

TEST(MinimaxM2ToolCalls, BadInputIsContentNeverACrash) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": {
      "x": {"type": "number"}}}}}])");
  // int(float('inf')) raises OverflowError, which vLLM's except turns into all content.
  const std::string inf = MinimaxCalls("<invoke name=\"f\"><parameter name=\"x\">inf</parameter></invoke>");
  EXPECT_TRUE(Parse(kMinimax, inf, tools).calls.empty());
  EXPECT_EQ(Parse(kMinimax, inf, tools).content, inf);
  // Unterminated blocks and invokes, a name starting with `>`, no marker at all.
  for (const std::string& text :
       {std::string("<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"x\">1"),
        MinimaxCalls("<invoke name=\"f\">"), MinimaxCalls("<invoke name=>x</invoke>"),
        std::string("plain <minimax:tool_call"), std::string("<invoke name=\"f\"></invoke>")}) {
    const ParsedToolCalls parsed = Parse(kMinimax, text, tools);
    EXPECT_TRUE(parsed.calls.empty()) << text;
    EXPECT_EQ(parsed.content, text);
    ExpectStreamsLikeParse(kMinimax, text, tools);
  }
  // "properties" that is no dict: Python's `in` and indexing raise TypeError for some kinds.
  const Json odd =
      Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": "xyz"}}}])");
  EXPECT_TRUE(Parse(kMinimax, MinimaxCalls("<invoke name=\"f\"><parameter name=\"x\">1</parameter></invoke>"), odd)
                  .calls.empty());
  EXPECT_EQ(Parse(kMinimax, MinimaxCalls("<invoke name=\"f\"><parameter name=\"q\">1</parameter></invoke>"), odd)
                .calls.size(),
            1u)
      << "\"q\" is not in \"xyz\": a string parameter";
}

TEST(MinimaxM2ToolCalls, TheTemplatesFormatReadsBack) {
  // What unsloth-MiniMax-M2.jinja writes for an assistant turn with calls (values through tojson unless strings).
  const std::string text =
      "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
      "<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>";
  const ParsedToolCalls parsed = Parse(kMinimax, text, WeatherTools());
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "Paris", "days": 3})");
}

// --- bounds -----------------------------------------------------------------------------------------------------

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

TEST(TypedToolCallBounds, MegabyteOutputsAreLinear) {
  const size_t mb = 1 << 20;
  auto expect_linear = [](ToolCallFormat format, const std::string& text) {
    const double start = ThreadCpuSeconds();
    const ParsedToolCalls expected = Parse(format, text, WeatherTools());
    ToolCallStreamParser parser(format, ToolCallIds(kSeed), WeatherTools());
    ParsedToolCalls streamed;
    for (size_t i = 0, step = 1; i < text.size(); i += step, step = step % 13 + 1) {
      Add(parser.Feed(std::string_view(text).substr(i, step)), streamed);
    }
    Add(parser.Finish(), streamed);
    ExpectSame(expected, streamed, "megabyte");
    // Linear: well under a second idle; ASan and TSan (tests/sanitize) multiply that by 2-15.
    EXPECT_LT(ThreadCpuSeconds() - start, 5.0);
  };
  auto repeat = [mb](const std::string& piece) {
    std::string out;
    while (out.size() < mb) out += piece;
    return out;
  };
  // Keys whose values never come (the lazy key regex would grow over every later key), and many calls.
  expect_linear(kGlm, "<tool_call>f\n" + repeat("<arg_key>k</arg_key>\n") + "</tool_call>");
  expect_linear(kGlm,
                repeat("<tool_call>get_weather\n<arg_key>days</arg_key><arg_value>[1, 2]</arg_value></tool_call>"));
  expect_linear(kGlm, "<tool_call>f\n<arg_key>a</arg_key><arg_value>" + repeat("[") + "</arg_value></tool_call>");
  expect_linear(kMinimax, "<minimax:tool_call>" +
                              repeat("<invoke name=\"get_weather\"><parameter name=\"days\">3"
                                     "</parameter></invoke>") +
                              "</minimax:tool_call>");
  expect_linear(kMinimax, "<minimax:tool_call><invoke name=\"f\">" + repeat("<parameter name=") + "</invoke>");
  expect_linear(ToolCallFormat::kOpenAi,
                repeat("<|channel|>commentary to=functions.f<|message|>{\"a\": 1}<|call|><|start|>assistant"));
}

// --- Python's value rules ---------------------------------------------------------------------------------------

TEST(PythonLiterals, LiteralEvalAsPython) {
  struct Case {
    std::string text;
    LiteralOutcome outcome;
    std::string json;
  };
  const std::vector<Case> cases = {
      {"1_000", LiteralOutcome::kValue, "1000"},
      {"0x1F", LiteralOutcome::kValue, "31"},
      {"-0.0", LiteralOutcome::kValue, "-0.0"},
      {"1e999", LiteralOutcome::kValue, "Infinity"},
      {"(1,)", LiteralOutcome::kValue, "[1]"},
      {"1, 2", LiteralOutcome::kValue, "[1, 2]"},
      {"'a' \"b\"", LiteralOutcome::kValue, "\"ab\""},
      {"'\\x41\\u00e9\\n'", LiteralOutcome::kValue, "\"A\xC3\xA9\\n\""},
      {"r'\\d'", LiteralOutcome::kValue, "\"\\\\d\""},
      {"{1: 'a', True: 'b', 1.0: 'c'}", LiteralOutcome::kValue, "{\"1\": \"c\"}"},
      {"{None: 1, 1.5: 2, False: 3}", LiteralOutcome::kValue, "{\"null\": 1, \"1.5\": 2, \"false\": 3}"},
      {"[1,\n 2] # done", LiteralOutcome::kValue, "[1, 2]"},
      {"1+2j", LiteralOutcome::kUnwritable, ""},
      {"set()", LiteralOutcome::kUnwritable, ""},
      {"{[1]: 2}", LiteralOutcome::kError, ""},
      {"{1: x, [1]: 2}", LiteralOutcome::kNotLiteral, ""},
      {"--1", LiteralOutcome::kNotLiteral, ""},
      {"1j+2", LiteralOutcome::kNotLiteral, ""},
      {"0123", LiteralOutcome::kNotLiteral, ""},
      {"f'x'", LiteralOutcome::kNotLiteral, ""},
      {"true", LiteralOutcome::kNotLiteral, ""},
      {"1\n2", LiteralOutcome::kNotLiteral, ""},
      {std::string(300, '[') + std::string(300, ']'), LiteralOutcome::kNotLiteral, ""},
      {std::string(100000, '-') + "1", LiteralOutcome::kNotLiteral, ""},
  };
  for (const Case& c : cases) {
    const LiteralDump got = LiteralEvalDumps(c.text);
    EXPECT_EQ(got.outcome, c.outcome) << c.text.substr(0, 40);
    EXPECT_EQ(got.json, c.json.empty() ? "" : c.json) << c.text.substr(0, 40);
  }
}

TEST(PythonLiterals, IntAndFloatOfAString) {
  EXPECT_EQ(PyIntText(" -0_7 "), "-7");
  EXPECT_EQ(PyIntText("\xD9\xA1\xD9\xA2"), "12");  // Arabic-Indic digits
  EXPECT_FALSE(PyIntText("1__0").has_value());
  EXPECT_FALSE(PyIntText("0x10").has_value());
  EXPECT_FALSE(PyIntText(std::string(4301, '9')).has_value());
  EXPECT_EQ(PyFloatText("1_0.5e1_0"), 10.5e10);
  EXPECT_TRUE(std::isinf(*PyFloatText("-Infinity")));
  EXPECT_TRUE(std::isnan(*PyFloatText("nan")));
  EXPECT_FALSE(PyFloatText("1e").has_value());
  EXPECT_FALSE(PyFloatText(".").has_value());
  EXPECT_EQ(IntegralDoubleText(1e300).size(), 301u);
  EXPECT_EQ(IntegralDoubleText(-2.0), "-2");
  EXPECT_EQ(IntegralDoubleText(9007199254740993.0), "9007199254740992");
}

}  // namespace
}  // namespace strata::chat_template
