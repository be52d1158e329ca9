// The strict check of JSON schemas: each keyword xgrammar 0.2.8 would not enforce is refused with its JSON path,
// schemas it enforces in full pass, and strict: false lets every one of them through.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/structured/test_vocabularies.h"

namespace strata::structured {
namespace {

using testing::ByteLevelVocabulary;
using ::testing::HasSubstr;

constexpr char kField[] = "response_format.json_schema.schema";

class StrictSchemaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = testing::LoadTokenizer(ByteLevelVocabulary::Json());
    auto compiler = Compiler::Create(*tok_, ByteLevelVocabulary::IdCount(), {ByteLevelVocabulary::Eos()}, {});
    ASSERT_TRUE(compiler.ok()) << compiler.status();
    compiler_ = *std::move(compiler);
  }

  absl::StatusOr<std::shared_ptr<const Grammar>> Compile(const std::string& schema, bool strict) {
    Constraint c;
    c.kind = ConstraintKind::kJsonSchema;
    c.text = schema;
    c.strict = strict;
    c.field = kField;
    return compiler_->Compile(c);
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Compiler> compiler_;
};

struct Refused {
  const char* schema;
  const char* message;  // after "<field>: "
};

const std::vector<Refused>& RefusedSchemas() {
  static const auto* cases = new std::vector<Refused>{
      {R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}})",
       R"(keyword "uniqueItems" at $.properties.tags is not enforced by the grammar engine)"},
      {R"({"type": "string", "not": {"const": "x"}})", R"(keyword "not" at $ is not enforced)"},
      {R"({"type": "object", "properties": {"a": {"type": "string"}}, "if": {"required": ["a"]}, "then": {"required": ["b"]}})",
       R"(keyword "if" at $ is not enforced)"},
      {R"({"type": "object", "else": {"required": ["b"]}})", R"(keyword "else" at $ is not enforced)"},
      {R"({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}})",
       R"(keyword "contains" at $ is not enforced)"},
      {R"({"type": "array", "items": {"type": "integer"}, "minContains": 2})",
       R"(keyword "minContains" at $ is not enforced)"},
      {R"({"type": "array", "items": {"type": "integer"}, "maxContains": 2})",
       R"(keyword "maxContains" at $ is not enforced)"},
      {R"({"type": "array", "items": {"type": "integer"}, "additionalItems": false})",
       R"(keyword "additionalItems" at $ is not enforced)"},
      {R"({"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}})",
       R"(keyword "multipleOf" at $.properties.price is not enforced)"},
      {R"({"type": "integer", "multipleOf": 5, "minimum": 0})",
       R"(keyword "multipleOf" at $ is not enforced by the grammar engine beside a one-sided range)"},
      {R"({"type": "integer", "multipleOf": 5000})", R"(keyword "multipleOf" at $ is not enforced)"},
      {R"({"type": ["integer", "number"], "multipleOf": 2})",
       R"(keyword "multipleOf" at $ is not enforced by the grammar engine for numbers)"},
      {R"({"type": "object", "dependentRequired": {"a": ["b"]}})",
       R"(keyword "dependentRequired" at $ is not enforced)"},
      {R"({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}})",
       R"(keyword "dependentSchemas" at $ is not enforced)"},
      {R"({"type": "object", "dependencies": {"a": ["b"]}})", R"(keyword "dependencies" at $ is not enforced)"},
      {R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 5}}})",
       R"(keyword "maxLength" at $.properties.code is not enforced by the grammar engine beside "pattern")"},
      {R"({"type": "string", "format": "email", "minLength": 3})",
       R"(keyword "minLength" at $ is not enforced by the grammar engine beside "format")"},
      {R"({"type": "string", "format": "date", "pattern": "^2"})",
       R"(keyword "pattern" at $ is not enforced by the grammar engine beside "format")"},
      {R"({"type": "string", "format": "idn-email"})",
       R"(keyword "format" at $ is not enforced by the grammar engine for "idn-email")"},
      {R"({"type": ["string", "null"], "pattern": "a+", "maxLength": 3})",
       R"(keyword "maxLength" at $ is not enforced)"},
      {R"({"$ref": "https://example.com/person.json"})",
       R"(keyword "$ref" at $ is not enforced by the grammar engine for "https://example.com/person.json")"},
      {R"({"$defs": {"Tags": {"type": "array", "uniqueItems": true}}, "$ref": "#/$defs/Tags"})",
       R"(keyword "uniqueItems" at $.$defs.Tags is not enforced)"},
      {R"({"definitions": {"x y": {"type": "string", "format": "iri"}}, "$ref": "#/definitions/x y"})",
       R"(keyword "format" at $.definitions["x y"] is not enforced)"},
      {R"({"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 3})",
       R"(keyword "maxLength" at $ is not enforced by the grammar engine beside "anyOf")"},
      {R"({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})",
       R"(keyword "type" at $ is not enforced by the grammar engine beside "oneOf")"},
      {R"({"anyOf": [{"type": "integer"}, {"required": ["a"]}]})",
       R"(keyword "required" at $.anyOf[1] is not enforced by the grammar engine in a schema without "type")"},
      {R"({"minimum": 3})",
       R"(keyword "minimum" at $ is not enforced by the grammar engine in a schema without "type")"},
      {R"({"const": "a", "maxLength": 0})",
       R"(keyword "maxLength" at $ is not enforced by the grammar engine beside "const")"},
      {R"({"$ref": "#/$defs/a", "required": ["x"], "$defs": {"a": {"type": "object"}}})",
       R"(keyword "required" at $ is not enforced by the grammar engine beside "$ref")"},
      {R"({"allOf": [{"type": "object"}, {"required": ["a"]}]})",
       R"(keyword "allOf" at $ is not enforced by the grammar engine with more than one schema)"},
      {R"({"type": "array", "prefixItems": [{"type": "string", "format": "regex"}]})",
       R"(keyword "format" at $.prefixItems[0] is not enforced)"},
      {R"({"type": "object", "properties": {"weird \"key\"": {"type": "string", "not": {}}}})",
       R"(keyword "not" at $.properties["weird \"key\""] is not enforced)"},
      {R"({"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}})",
       R"(keyword "maxLength" at $.propertyNames is not enforced by the grammar engine beside "pattern")"},
      {R"({"type": "object", "additionalProperties": {"type": "array", "uniqueItems": true}})",
       R"(keyword "uniqueItems" at $.additionalProperties is not enforced)"},
      {R"({"$dynamicRef": "#node"})", R"(keyword "$dynamicRef" at $ is not enforced)"},
      // What xgrammar itself warns it drops.
      {R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})",
       "the grammar engine would not enforce part of the schema: oneOf with overlapping"},
  };
  return *cases;
}

TEST_F(StrictSchemaTest, EachUnenforcedKeywordIsRefusedWithItsPath) {
  for (const Refused& r : RefusedSchemas()) {
    SCOPED_TRACE(r.schema);
    auto g = Compile(r.schema, /*strict=*/true);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(g.status().message());
    EXPECT_THAT(message, ::testing::StartsWith(std::string(kField) + ": "));
    EXPECT_THAT(message, HasSubstr(r.message));
    EXPECT_THAT(message, HasSubstr("(send strict: false to let it be ignored)"));
  }
}

TEST_F(StrictSchemaTest, StrictFalseLetsThemThrough) {
  for (const Refused& r : RefusedSchemas()) {
    auto g = Compile(r.schema, /*strict=*/false);
    EXPECT_TRUE(g.ok()) << r.schema << ": " << g.status();
  }
}

TEST_F(StrictSchemaTest, EnforcedSchemasPass) {
  for (const char* schema : {
           // What pydantic writes: $defs and $ref, Optional as anyOf with null, Literal as const or enum with type.
           R"({"$defs": {"Item": {"properties": {"name": {"title": "Name", "type": "string"},
                                                 "kind": {"const": "tool", "title": "Kind", "type": "string"}},
                                  "required": ["name", "kind"], "title": "Item", "type": "object"}},
               "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"},
                              "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null,
                                       "title": "Note"},
                              "color": {"enum": ["red", "green"], "title": "Color", "type": "string"}},
               "required": ["items"], "title": "Order", "type": "object"})",
           // Annotations, and keywords JSON Schema does not define.
           R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:x", "$comment": "c",
               "title": "T", "description": "D", "examples": [{}], "default": {}, "deprecated": false,
               "readOnly": false, "writeOnly": false, "x-vendor": 1, "discriminator": {"propertyName": "k"},
               "type": "object", "properties": {"k": {"type": "string", "description": "key"}}})",
           R"({"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5})",
           R"({"type": "integer", "multipleOf": 7})",
           R"({"type": "integer", "format": "int64"})",
           R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1.5})",
           R"({"type": "string", "format": "date-time"})",
           R"({"type": "string", "pattern": "^[a-z]+$"})",
           R"({"type": "string", "minLength": 1, "maxLength": 5})",
           R"({"type": "string", "pattern": "^[a-z]+$", "minLength": 0})",
           R"({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3, "uniqueItems": false})",
           R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})",
           R"({"type": "object", "patternProperties": {"^s_": {"type": "string"}}, "additionalProperties": false})",
           R"({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "minProperties": 1, "maxProperties": 3})",
           R"({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": false})",
           R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})",
           R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}]})",
           R"({"$ref": "#"})",
           "true",
       }) {
    auto g = Compile(schema, /*strict=*/true);
    EXPECT_TRUE(g.ok()) << schema << ": " << g.status();
  }
}

}  // namespace
}  // namespace strata::structured
