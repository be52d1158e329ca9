// Structured outputs at the edge (server/constraint_fields.h, server/generate_validation.h): each field of the
// HTTP API (OpenAI's response_format and tool_choice, vLLM's structured_outputs and guided_*, llama.cpp's
// json_schema and grammar) and each member of gRPC's structured_output oneof becomes the right
// structured::Constraint; every refusal is a 400 / INVALID_ARGUMENT naming the API's own field; compiled against a
// character vocabulary, the grammars hold what they should.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/constraint_fields.h"
#include "server/generate_validation.h"
#include "server/openai_protocol.h"
#include "structured/structured.h"
#include "tests/structured/char_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {
namespace {

using openai::ConstraintFields;
using openai::Json;
using structured::Constraint;
using structured::ConstraintKind;

constexpr int32_t kEos = structured::testing::kCharEos;  // ids 0-94: ' ' .. '~'
constexpr int64_t kVocab = 100;

// A character-level vocabulary: every printable ASCII character one token, and an EOS.
std::unique_ptr<tokenizer::Tokenizer> CharTokenizer() {
  auto tokenizer = tokenizer::Tokenizer::FromJson(structured::testing::CharVocabularyJson());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

// One compiler for the file's tests: compiles are cached, and xgrammar's start-up is not free.
structured::Compiler& SharedCompiler() {
  static const std::unique_ptr<tokenizer::Tokenizer> tokenizer = CharTokenizer();
  static const std::unique_ptr<structured::Compiler> compiler = [] {
    auto made = structured::Compiler::Create(*tokenizer, kVocab, {kEos}, structured::CompilerOptions{});
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *std::move(made) : nullptr;
  }();
  return *compiler;
}

absl::StatusOr<ConstraintFields> Read(const Json& request, const openai::ToolChoice* choice = nullptr) {
  return openai::ReadConstraintFields(request, choice);
}

// The constraint of a chat request (tool_choice read as the chat route reads it).
absl::StatusOr<ConstraintFields> ReadChat(const Json& request) {
  absl::StatusOr<openai::ToolChoice> choice = openai::ReadToolChoice(request);
  if (!choice.ok()) return choice.status();
  return openai::ReadConstraintFields(request, &*choice);
}

Constraint Only(const absl::StatusOr<ConstraintFields>& fields) {
  EXPECT_TRUE(fields.ok()) << fields.status();
  if (!fields.ok() || !fields->constraint) {
    ADD_FAILURE() << "no constraint";
    return {};
  }
  return *fields->constraint;
}

// A refusal is InvalidArgument whose message starts with the field, so that the HTTP error's param is the field.
void ExpectRefused(const absl::Status& status, const std::string& param) {
  ASSERT_FALSE(status.ok()) << param;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(openai::ErrorFromStatus(status).param, param) << status;
}

const Json kSchema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};

TEST(StructuredFields, ResponseFormatKinds) {
  EXPECT_FALSE(Read({{"response_format", {{"type", "text"}}}})->constraint.has_value());
  Constraint c = Only(Read({{"response_format", {{"type", "json_object"}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonObject);
  EXPECT_EQ(c.field, "response_format");

  c = Only(
      Read({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", kSchema}}}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.field, "response_format.json_schema.schema");
  EXPECT_EQ(c.text, kSchema.dump());  // compact: one schema, one cache entry, whatever its spacing
  EXPECT_TRUE(c.strict);              // strata's default: unenforceable keywords are refused
  c = Only(Read({{"response_format",
                  {{"type", "json_schema"},
                   {"json_schema", {{"name", "s"}, {"description", "d"}, {"schema", kSchema}, {"strict", false}}}}}}));
  EXPECT_FALSE(c.strict);
  // llama.cpp's form: a schema beside json_object.
  c = Only(Read({{"response_format", {{"type", "json_object"}, {"schema", kSchema}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.field, "response_format.schema");
  EXPECT_EQ(c.text, kSchema.dump());
}

TEST(StructuredFields, StructuredOutputsKinds) {
  Constraint c = Only(Read({{"structured_outputs", {{"json", kSchema}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.field, "structured_outputs.json");
  EXPECT_EQ(c.text, kSchema.dump());
  c = Only(Read({{"structured_outputs", {{"json", kSchema.dump(2)}}}}));  // a schema as a string, as vLLM takes it
  EXPECT_EQ(c.text, kSchema.dump());
  c = Only(Read({{"structured_outputs", {{"regex", "[a-z]+"}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kRegex);
  EXPECT_EQ(c.text, "[a-z]+");
  EXPECT_EQ(c.field, "structured_outputs.regex");
  c = Only(Read({{"structured_outputs", {{"choice", Json::array({"yes", "no"})}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kChoice);
  EXPECT_EQ(c.choices, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ(c.field, "structured_outputs.choice");
  c = Only(Read({{"structured_outputs", {{"grammar", "root ::= \"a\""}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kGrammar);
  EXPECT_EQ(c.field, "structured_outputs.grammar");
  const Json tag = {{"type", "structural_tag"}, {"format", {{"type", "const_string"}, {"value", "x"}}}};
  for (const Json& value : {tag, Json(tag.dump())}) {
    c = Only(Read({{"structured_outputs", {{"structural_tag", value}}}}));
    EXPECT_EQ(c.kind, ConstraintKind::kStructuralTag);
    EXPECT_EQ(c.text, tag.dump());
    EXPECT_EQ(c.field, "structured_outputs.structural_tag");
  }
  c = Only(Read({{"structured_outputs", {{"json_object", true}, {"disable_any_whitespace", true}}}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonObject);
  EXPECT_FALSE(c.any_whitespace);
  EXPECT_EQ(Read({{"structured_outputs", {{"regex", "a"}}}})->kind, std::string("regex"));
}

TEST(StructuredFields, VllmGuidedAndLlamaCppFields) {
  Constraint c = Only(Read({{"guided_json", kSchema}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.field, "guided_json");
  c = Only(Read({{"guided_regex", "a+"}}));
  EXPECT_EQ(c.kind, ConstraintKind::kRegex);
  EXPECT_EQ(c.field, "guided_regex");
  c = Only(Read({{"guided_choice", Json::array({"x"})}}));
  EXPECT_EQ(c.kind, ConstraintKind::kChoice);
  EXPECT_EQ(c.field, "guided_choice");
  c = Only(Read({{"guided_grammar", "root ::= \"a\""}}));
  EXPECT_EQ(c.kind, ConstraintKind::kGrammar);
  EXPECT_EQ(c.field, "guided_grammar");
  c = Only(Read({{"json_schema", kSchema}}));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.field, "json_schema");
  c = Only(Read({{"grammar", "root ::= [a-z]+"}}));
  EXPECT_EQ(c.kind, ConstraintKind::kGrammar);
  EXPECT_EQ(c.field, "grammar");
  // llama.cpp's default grammar, "", asks for nothing; so does JSON null anywhere.
  EXPECT_FALSE(Read({{"grammar", ""}})->constraint.has_value());
  EXPECT_FALSE(Read({{"json_schema", nullptr}, {"structured_outputs", nullptr}})->constraint.has_value());
}

TEST(StructuredFields, OneConstraintPerRequest) {
  const Json format = {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", kSchema}}}};
  absl::StatusOr<ConstraintFields> two = Read({{"response_format", format}, {"structured_outputs", {{"regex", "a"}}}});
  ExpectRefused(two.status(), "structured_outputs");
  EXPECT_NE(two.status().message().find("response_format"), std::string::npos) << two.status();
  ExpectRefused(Read({{"structured_outputs", {{"json", kSchema}, {"regex", "a+"}}}}).status(), "structured_outputs");
  ExpectRefused(Read({{"json_schema", kSchema}, {"grammar", "root ::= \"a\""}}).status(), "grammar");
  ExpectRefused(Read({{"json_schema", kSchema}, {"guided_regex", "a"}}).status(), "json_schema");
  const Json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  ExpectRefused(ReadChat({{"tools", tools}, {"tool_choice", "required"}, {"response_format", format}}).status(),
                "tool_choice");
  // text and tool_choice "auto" constrain nothing.
  EXPECT_TRUE(
      ReadChat({{"tools", tools}, {"response_format", {{"type", "text"}}}, {"structured_outputs", {{"regex", "a"}}}})
          .ok());
}

TEST(StructuredFields, RefusalsNameTheField) {
  ExpectRefused(Read({{"response_format", "json"}}).status(), "response_format");
  ExpectRefused(Read({{"response_format", Json::object()}}).status(), "response_format.type");
  ExpectRefused(Read({{"response_format", {{"type", "yaml"}}}}).status(), "response_format.type");
  ExpectRefused(Read({{"response_format", {{"type", "json_schema"}}}}).status(), "response_format.json_schema");
  ExpectRefused(Read({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", kSchema}}}}}}).status(),
                "response_format.json_schema.name");
  ExpectRefused(Read({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}).status(),
                "response_format.json_schema.schema");
  for (const Json& schema : {Json("a string"), Json::array({1, 2}), Json(5)}) {
    ExpectRefused(
        Read({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}})
            .status(),
        "response_format.json_schema.schema");
  }
  ExpectRefused(
      Read({{"response_format",
             {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", kSchema}, {"strict", "yes"}}}}}})
          .status(),
      "response_format.json_schema.strict");
  ExpectRefused(Read({{"structured_outputs", "a+"}}).status(), "structured_outputs");
  ExpectRefused(Read({{"structured_outputs", Json::object()}}).status(), "structured_outputs");
  ExpectRefused(Read({{"structured_outputs", {{"no_such_kind", 1}}}}).status(), "structured_outputs.no_such_kind");
  ExpectRefused(Read({{"structured_outputs", {{"json", "{not json"}}}}).status(), "structured_outputs.json");
  ExpectRefused(Read({{"structured_outputs", {{"json", "[1]"}}}}).status(), "structured_outputs.json");
  ExpectRefused(Read({{"structured_outputs", {{"regex", 5}}}}).status(), "structured_outputs.regex");
  ExpectRefused(Read({{"structured_outputs", {{"choice", Json::array()}}}}).status(), "structured_outputs.choice");
  ExpectRefused(Read({{"structured_outputs", {{"choice", Json::array({"a", 1})}}}}).status(),
                "structured_outputs.choice[1]");
  ExpectRefused(Read({{"structured_outputs", {{"json_object", "yes"}}}}).status(), "structured_outputs.json_object");
  ExpectRefused(Read({{"structured_outputs", {{"regex", "a"}, {"disable_additional_properties", true}}}}).status(),
                "structured_outputs.disable_additional_properties");
  ExpectRefused(Read({{"structured_outputs", {{"structural_tag", 7}}}}).status(), "structured_outputs.structural_tag");
  ExpectRefused(Read({{"guided_choice", "x"}}).status(), "guided_choice");
  ExpectRefused(Read({{"json_schema", "{"}}).status(), "json_schema");
  ExpectRefused(Read({{"grammar", Json::object()}}).status(), "grammar");
}

const Json kTools = {
    {{"type", "function"},
     {"function",
      {{"name", "get_time"},
       {"parameters",
        {{"type", "object"}, {"properties", {{"zone", {{"type", "string"}}}}}, {"required", Json::array({"zone"})}}}}}},
    {{"type", "function"},
     {"function",
      {{"name", "book"},
       {"parameters",
        {{"type", "object"},
         {"properties", {{"when", {{"$ref", "#/$defs/Date"}}}}},
         {"required", Json::array({"when"})},
         {"$defs", {{"Date", {{"type", "string"}, {"pattern", "^[0-9]{4}$"}}}}}}}}}}};

TEST(StructuredFields, ToolChoiceRequiredIsAListOfTheToolsCalls) {
  absl::StatusOr<ConstraintFields> fields = ReadChat({{"tools", kTools}, {"tool_choice", "required"}});
  const Constraint c = Only(fields);
  ASSERT_TRUE(fields->forced_tool_calls.has_value());
  EXPECT_EQ(fields->forced_tool_calls->name, "");
  EXPECT_EQ(fields->kind, std::string("tool_calls"));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.field, "tools");
  const Json schema = Json::parse(c.text);
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["minItems"], 1);
  EXPECT_FALSE(schema.contains("maxItems"));
  ASSERT_EQ(schema["items"]["anyOf"].size(), 2u);
  const Json& book = schema["items"]["anyOf"][1];
  EXPECT_EQ(book["properties"]["name"]["enum"], Json::array({"book"}));
  EXPECT_EQ(book["required"], Json::array({"name", "parameters"}));
  // The tool's $defs move to the root, where its "#/$defs/Date" now points.
  EXPECT_FALSE(book["properties"]["parameters"].contains("$defs"));
  EXPECT_EQ(schema["$defs"]["Date"]["pattern"], "^[0-9]{4}$");

  const Constraint one =
      Only(ReadChat({{"tools", kTools}, {"tool_choice", "required"}, {"parallel_tool_calls", false}}));
  EXPECT_EQ(Json::parse(one.text)["maxItems"], 1);
}

TEST(StructuredFields, NamedToolChoiceIsThatToolsParameters) {
  absl::StatusOr<ConstraintFields> fields =
      ReadChat({{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "book"}}}}}});
  const Constraint c = Only(fields);
  ASSERT_TRUE(fields->forced_tool_calls.has_value());
  EXPECT_EQ(fields->forced_tool_calls->name, "book");
  EXPECT_EQ(c.field, "tools[1].function.parameters");
  EXPECT_EQ(c.text, kTools[1]["function"]["parameters"].dump());
  // A function without parameters takes an object.
  const Json bare = {{{"type", "function"}, {"function", {{"name", "ping"}, {"strict", false}}}}};
  const Constraint ping = Only(ReadChat({{"tools", bare}, {"tool_choice", {{"function", {{"name", "ping"}}}}}}));
  EXPECT_EQ(ping.text, R"({"type":"object"})");
  EXPECT_FALSE(ping.strict);  // the function's own strict
}

TEST(StructuredFields, ToolChoiceRefusals) {
  absl::StatusOr<ConstraintFields> unknown =
      ReadChat({{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  ExpectRefused(unknown.status(), "tool_choice.function.name");
  EXPECT_NE(unknown.status().message().find("get_weather"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("get_time"), std::string::npos);       // what it could have been
  ExpectRefused(ReadChat({{"tool_choice", "required"}}).status(), "tool_choice");  // no tools to call
  ExpectRefused(ReadChat({{"tools", kTools}, {"tool_choice", {{"type", "function"}}}}).status(),
                "tool_choice.function");
  ExpectRefused(ReadChat({{"tools", kTools}, {"tool_choice", {{"type", "custom"}}}}).status(), "tool_choice.type");
  ExpectRefused(ReadChat({{"tools", kTools}, {"tool_choice", "sometimes"}}).status(), "tool_choice");
  ExpectRefused(ReadChat({{"tools", kTools}, {"tool_choice", 3}}).status(), "tool_choice");
  const Json no_name = {{{"type", "function"}, {"function", {{"parameters", kSchema}}}}};
  ExpectRefused(ReadChat({{"tools", no_name}, {"tool_choice", "required"}}).status(), "tools[0].function.name");
  const Json bad_parameters = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}};
  ExpectRefused(ReadChat({{"tools", bad_parameters}, {"tool_choice", "required"}}).status(),
                "tools[0].function.parameters");
  // Two tools that define one name differently cannot share the list's root.
  Json clash = kTools;
  clash[0]["function"]["parameters"]["$defs"] = {{"Date", {{"type", "integer"}}}};
  ExpectRefused(ReadChat({{"tools", clash}, {"tool_choice", "required"}}).status(),
                "tools[1].function.parameters.$defs.Date");
  // "auto" and "none" constrain nothing.
  EXPECT_FALSE(ReadChat({{"tools", kTools}, {"tool_choice", "auto"}})->constraint.has_value());
  EXPECT_FALSE(ReadChat({{"tools", kTools}, {"tool_choice", "none"}})->constraint.has_value());
}

TEST(StructuredFields, MayHaveConstraintSendsOnlySuchRequestsToTheGrammarPool) {
  EXPECT_FALSE(openai::MayHaveConstraint({{"prompt", "x"}}));
  EXPECT_FALSE(openai::MayHaveConstraint({{"tool_choice", "auto"}, {"grammar", nullptr}}));
  EXPECT_TRUE(openai::MayHaveConstraint({{"tool_choice", "required"}}));
  EXPECT_TRUE(openai::MayHaveConstraint({{"tool_choice", {{"function", {{"name", "f"}}}}}}));
  for (const char* field : {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                            "guided_grammar", "json_schema", "grammar"}) {
    EXPECT_TRUE(openai::MayHaveConstraint({{field, "x"}})) << field;
  }
}

// --- the whole request check, with a grammar compiler -----------------------------------------------------

openai::ApiContext Context(structured::Compiler* compiler) {
  openai::ApiContext context;
  context.model_name = "m";
  context.limits.vocab_size = kVocab;
  context.limits.max_context = 64;
  context.limits.max_new_tokens = 32;
  context.limits.grammar_compiler = compiler;
  context.limits.grammar_unavailable = "the model has no tokenizer.json";
  return context;
}

absl::StatusOr<openai::ApiRequest> Completion(Json body, structured::Compiler* compiler) {
  body["prompt"] = Json::array({1, 2, 3});
  body["max_tokens"] = 8;
  return openai::ParseApiRequest(openai::Route::kCompletions, body.dump(), Context(compiler));
}

TEST(StructuredRequest, EveryConstraintFieldIsAFieldOfBothRoutes) {
  // None is refused as unknown (the refusal says the compiler is off, naming the constraint's own field).
  for (const auto& [field, value, param] :
       {std::tuple{"response_format", Json{{"type", "json_object"}}, "response_format"},
        std::tuple{"structured_outputs", Json{{"regex", "a"}}, "structured_outputs.regex"},
        std::tuple{"guided_json", kSchema, "guided_json"}, std::tuple{"guided_regex", Json("a"), "guided_regex"},
        std::tuple{"guided_choice", Json::array({"a"}), "guided_choice"},
        std::tuple{"guided_grammar", Json("root ::= \"a\""), "guided_grammar"},
        std::tuple{"json_schema", kSchema, "json_schema"}, std::tuple{"grammar", Json("root ::= \"a\""), "grammar"}}) {
    absl::StatusOr<openai::ApiRequest> request = Completion({{field, value}}, nullptr);
    ExpectRefused(request.status(), param);
    EXPECT_NE(request.status().message().find("structured outputs are off on this server: the model has no "
                                              "tokenizer.json"),
              std::string::npos)
        << request.status();
  }
  // tool_choice stays a chat field.
  ExpectRefused(Completion({{"tool_choice", "required"}}, nullptr).status(), "tool_choice");
}

TEST(StructuredRequest, ASchemaTooDeepForTheBodyIsNamedByItsField) {
  Json deep = {{"type", "string"}};
  for (int i = 0; i < 100; ++i) deep = {{"type", "array"}, {"items", deep}};
  absl::StatusOr<openai::ApiRequest> request = Completion({{"structured_outputs", {{"json", deep}}}}, nullptr);
  ExpectRefused(request.status(), "structured_outputs");
  EXPECT_NE(request.status().message().find("deeper than 64 levels"), std::string::npos) << request.status();
  // Too deep at the top (no field to name): the body is.
  std::string brackets(100, '[');
  ExpectRefused(openai::ParseJsonObject(brackets, 64).status(), "");
}

TEST(StructuredRequest, TheGrammarIsCompiledIntoTheRequest) {
  structured::Compiler& compiler = SharedCompiler();
  absl::StatusOr<openai::ApiRequest> request =
      Completion({{"structured_outputs", {{"regex", "(yes|no)"}}}, {"n", 2}}, &compiler);
  ASSERT_TRUE(request.ok()) << request.status();
  ASSERT_EQ(request->prompts.size(), 1u);
  ASSERT_NE(request->prompts[0].grammar, nullptr);
  EXPECT_EQ(request->structured_kind, std::string("regex"));
  EXPECT_TRUE(structured::Completes(*request->prompts[0].grammar, "yes"));
  EXPECT_FALSE(structured::Completes(*request->prompts[0].grammar, "maybe"));
  // Free text stays free, and is not counted as structured.
  absl::StatusOr<openai::ApiRequest> free = Completion(Json::object(), &compiler);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(free->prompts[0].grammar, nullptr);
  EXPECT_EQ(free->structured_kind, nullptr);
}

TEST(StructuredRequest, CompileErrorsAre400sNamingTheField) {
  structured::Compiler& compiler = SharedCompiler();
  absl::StatusOr<openai::ApiRequest> regex = Completion({{"structured_outputs", {{"regex", "(unclosed"}}}}, &compiler);
  ExpectRefused(regex.status(), "structured_outputs.regex");
  ExpectRefused(Completion({{"grammar", "root ::= ("}}, &compiler).status(), "grammar");
  ExpectRefused(Completion({{"json_schema", {{"type", "objekt"}}}}, &compiler).status(), "json_schema");
  // strict (the default): a keyword the engine would not enforce is refused with its path.
  const Json unique = {{"type", "object"}, {"properties", {{"tags", {{"type", "array"}, {"uniqueItems", true}}}}}};
  absl::StatusOr<openai::ApiRequest> strict =
      Completion({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", unique}}}}}},
                 &compiler);
  ExpectRefused(strict.status(), "response_format.json_schema.schema");
  EXPECT_NE(strict.status().message().find("uniqueItems"), std::string::npos) << strict.status();
  // strict: false is the client's consent to leave it unenforced.
  EXPECT_TRUE(
      Completion({{"response_format",
                   {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", unique}, {"strict", false}}}}}},
                 &compiler)
          .ok());
}

TEST(StructuredRequest, ToolChoiceGrammarsHoldTheCalls) {
  // Compiled as the chat route compiles them, checked against whole outputs.
  structured::Compiler& compiler = SharedCompiler();
  auto compile = [&](const Json& request) {
    absl::StatusOr<ConstraintFields> fields = ReadChat(request);
    EXPECT_TRUE(fields.ok() && fields->constraint) << fields.status();
    absl::StatusOr<std::shared_ptr<const structured::Grammar>> grammar = compiler.Compile(*fields->constraint);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    return grammar.ok() ? *grammar : nullptr;
  };
  std::shared_ptr<const structured::Grammar> required = compile({{"tools", kTools}, {"tool_choice", "required"}});
  ASSERT_NE(required, nullptr);
  EXPECT_TRUE(structured::Completes(*required, R"([{"name": "get_time", "parameters": {"zone": "UTC"}}])"));
  EXPECT_TRUE(structured::Completes(
      *required,
      R"([{"name": "book", "parameters": {"when": "2025"}}, {"name": "get_time", "parameters": {"zone": "x"}}])"));
  EXPECT_FALSE(structured::Completes(*required, "[]"));  // at least one call
  EXPECT_FALSE(structured::Completes(*required, R"([{"name": "get_weather", "parameters": {}}])"));
  EXPECT_FALSE(structured::Completes(*required, R"([{"name": "book", "parameters": {"when": "May"}}])"));
  std::shared_ptr<const structured::Grammar> single =
      compile({{"tools", kTools}, {"tool_choice", "required"}, {"parallel_tool_calls", false}});
  ASSERT_NE(single, nullptr);
  EXPECT_FALSE(structured::Completes(
      *single,
      R"([{"name": "book", "parameters": {"when": "2025"}}, {"name": "book", "parameters": {"when": "2026"}}])"));
  std::shared_ptr<const structured::Grammar> named =
      compile({{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "book"}}}}}});
  ASSERT_NE(named, nullptr);
  EXPECT_TRUE(structured::Completes(*named, R"({"when": "1999"})"));
  EXPECT_FALSE(structured::Completes(*named, R"({"zone": "UTC"})"));
}

// --- gRPC: the structured_output oneof ---------------------------------------------------------------------

v1::GenerateRequest GrpcRequest() {
  v1::GenerateRequest request;
  request.add_prompt_ids(1);
  request.set_max_new_tokens(4);
  return request;
}

GenerateLimits GrpcLimits(structured::Compiler* compiler) { return Context(compiler).limits; }

TEST(StructuredGrpc, EachMemberOfTheOneofIsItsConstraint) {
  v1::GenerateRequest request = GrpcRequest();
  EXPECT_FALSE(GenerateRequestConstraint(request)->has_value());
  request.set_json_schema(kSchema.dump(2));
  std::optional<Constraint> c = *GenerateRequestConstraint(request);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c->text, kSchema.dump());
  EXPECT_EQ(c->field, "json_schema");
  EXPECT_TRUE(c->strict);
  request.set_strict(false);
  EXPECT_FALSE((*GenerateRequestConstraint(request))->strict);
  request.set_json_object(true);
  EXPECT_EQ((*GenerateRequestConstraint(request))->kind, ConstraintKind::kJsonObject);
  request.set_json_object(false);  // asks for nothing
  EXPECT_FALSE(GenerateRequestConstraint(request)->has_value());
  request.set_regex("a+");
  c = *GenerateRequestConstraint(request);
  EXPECT_EQ(c->kind, ConstraintKind::kRegex);
  EXPECT_EQ(c->field, "regex");
  request.mutable_choice()->add_choices("yes");
  request.mutable_choice()->add_choices("no");
  c = *GenerateRequestConstraint(request);
  EXPECT_EQ(c->kind, ConstraintKind::kChoice);
  EXPECT_EQ(c->choices, (std::vector<std::string>{"yes", "no"}));
  request.set_grammar("root ::= \"a\"");
  EXPECT_EQ((*GenerateRequestConstraint(request))->field, "grammar");
  request.set_structural_tag(R"({"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})");
  c = *GenerateRequestConstraint(request);
  EXPECT_EQ(c->kind, ConstraintKind::kStructuralTag);
  EXPECT_EQ(c->field, "structural_tag");
}

void ExpectGrpcRefused(const v1::GenerateRequest& request, structured::Compiler* compiler, const std::string& field) {
  absl::StatusOr<runtime::GenerationRequest> out = ValidateGenerateRequest(request, GrpcLimits(compiler), nullptr);
  ASSERT_FALSE(out.ok()) << field;
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_EQ(std::string(out.status().message()).rfind(field + ": ", 0), 0u) << out.status();
}

TEST(StructuredGrpc, RefusalsAreInvalidArgumentNamingTheProtoField) {
  v1::GenerateRequest request = GrpcRequest();
  request.set_json_schema("not json {");
  ExpectGrpcRefused(request, nullptr, "json_schema");
  request.set_json_schema("[1, 2]");
  ExpectGrpcRefused(request, nullptr, "json_schema");
  request.mutable_choice();
  ExpectGrpcRefused(request, nullptr, "choice");
  request.set_structural_tag("{");
  ExpectGrpcRefused(request, nullptr, "structural_tag");
  request.set_regex("a+");
  ExpectGrpcRefused(request, nullptr, "regex");  // no compiler: structured outputs are off
  structured::Compiler& compiler = SharedCompiler();
  request.set_regex("(unclosed");
  ExpectGrpcRefused(request, &compiler, "regex");
  request.set_grammar("root ::= (");
  ExpectGrpcRefused(request, &compiler, "grammar");
  // Bytes that are not UTF-8 in a constraint: named, not "failed to parse". Field 20 (choice) holding "ok" and
  // "\xff"; field 19 (regex) "a\xff"; then field 3 (max_new_tokens) = 4.
  const std::string choice_wire("\xa2\x01\x07\x0a\x02ok\x0a\x01\xff\x18\x04", 12);
  absl::StatusOr<runtime::GenerationRequest> out = ValidateGenerateRequest(choice_wire, GrpcLimits(&compiler), nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "choice.choices[1]: invalid UTF-8 at byte 0");
  const std::string regex_wire(
      "\x9a\x01\x02"
      "a\xff\x18\x04",
      7);
  out = ValidateGenerateRequest(regex_wire, GrpcLimits(&compiler), nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "regex: invalid UTF-8 at byte 1");
}

TEST(StructuredGrpc, ValidRequestCarriesItsGrammar) {
  v1::GenerateRequest request = GrpcRequest();
  request.mutable_choice()->add_choices("alpha");
  request.mutable_choice()->add_choices("beta");
  absl::StatusOr<runtime::GenerationRequest> out =
      ValidateGenerateRequest(request, GrpcLimits(&SharedCompiler()), nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_NE(out->grammar, nullptr);
  EXPECT_TRUE(structured::Completes(*out->grammar, "beta"));
  EXPECT_FALSE(structured::Completes(*out->grammar, "gamma"));
}

}  // namespace
}  // namespace strata::server
