#include "structured/json_schema_check.h"

#include <cctype>
#include <cmath>
#include <iterator>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "base/absl_compat.h"

namespace strata::structured {
namespace {

using Json = nlohmann::ordered_json;

// The kinds of JSON value a keyword constrains (JSON Schema applies a keyword only to values of its kinds:
// "minimum" says nothing about a string).
constexpr int kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kNumber = 16, kString = 32;
constexpr int kAnyValue = kNull | kBoolean | kObject | kArray | kNumber | kString;

// Every keyword of JSON Schema (2020-12, and draft-07's that later drafts renamed) that constrains values, with
// the kinds it constrains, in the order a refusal looks for them (so that which one a message names does not depend
// on the order of the schema's keys). Anything else in a schema object is an annotation (title, description,
// examples, default, $schema, $id, $comment, deprecated, readOnly, writeOnly, contentMediaType, ...) or a keyword
// JSON Schema does not define, which validators ignore too.
struct ValidationKeyword {
  const char* name;
  int kinds;
};
constexpr ValidationKeyword kValidationKeywords[] = {
    {"type", kAnyValue},
    {"enum", kAnyValue},
    {"const", kAnyValue},
    {"$ref", kAnyValue},
    {"$dynamicRef", kAnyValue},
    {"$recursiveRef", kAnyValue},
    {"allOf", kAnyValue},
    {"anyOf", kAnyValue},
    {"oneOf", kAnyValue},
    {"not", kAnyValue},
    {"if", kAnyValue},
    {"then", kAnyValue},
    {"else", kAnyValue},
    {"multipleOf", kNumber},
    {"minimum", kNumber},
    {"maximum", kNumber},
    {"exclusiveMinimum", kNumber},
    {"exclusiveMaximum", kNumber},
    {"minLength", kString},
    {"maxLength", kString},
    {"pattern", kString},
    {"format", kString},
    {"items", kArray},
    {"prefixItems", kArray},
    {"additionalItems", kArray},
    {"unevaluatedItems", kArray},
    {"contains", kArray},
    {"minContains", kArray},
    {"maxContains", kArray},
    {"minItems", kArray},
    {"maxItems", kArray},
    {"uniqueItems", kArray},
    {"properties", kObject},
    {"patternProperties", kObject},
    {"additionalProperties", kObject},
    {"unevaluatedProperties", kObject},
    {"propertyNames", kObject},
    {"required", kObject},
    {"dependentRequired", kObject},
    {"dependentSchemas", kObject},
    {"dependencies", kObject},
    {"minProperties", kObject},
    {"maxProperties", kObject},
};

// Keywords xgrammar never reads, whatever the schema around them.
constexpr const char* kNeverRead[] = {"not",
                                      "if",
                                      "then",
                                      "else",
                                      "$dynamicRef",
                                      "$recursiveRef",
                                      "uniqueItems",
                                      "contains",
                                      "minContains",
                                      "maxContains",
                                      "additionalItems",
                                      "dependentRequired",
                                      "dependentSchemas",
                                      "dependencies"};

// What xgrammar reads for each type (SchemaParser::ParseInteger, ParseNumber, ParseString, ParseArray,
// ParseObject). Not read, so refused: number's multipleOf, array's uniqueItems, contains, minContains and
// maxContains (minContains only raises minItems), additionalItems, object's dependentRequired, dependentSchemas,
// dependencies.
constexpr const char* kIntegerKeywords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
constexpr const char* kNumberKeywords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
constexpr const char* kStringKeywords[] = {"minLength", "maxLength", "pattern", "format"};
constexpr const char* kArrayKeywords[] = {"prefixItems", "items", "unevaluatedItems", "minItems", "maxItems"};
constexpr const char* kObjectKeywords[] = {"properties",           "required",
                                           "patternProperties",    "propertyNames",
                                           "additionalProperties", "unevaluatedProperties",
                                           "minProperties",        "maxProperties"};

// The string formats xgrammar turns into a regular expression (JSONSchemaConverter::JSONFormatToRegexPattern);
// any other format is dropped.
constexpr const char* kEnforcedFormats[] = {"date",
                                            "time",
                                            "date-time",
                                            "duration",
                                            "email",
                                            "hostname",
                                            "ipv4",
                                            "ipv6",
                                            "uri",
                                            "uri-reference",
                                            "uri-template",
                                            "json-pointer",
                                            "relative-json-pointer",
                                            "uuid"};

template <size_t N>
bool In(const char* const (&list)[N], std::string_view key) {
  for (const char* k : list) {
    if (key == k) return true;
  }
  return false;
}

// xgrammar's limits on integer multipleOf (kIntegerMultipleOfMax, kIntegerMultipleOfRangeWidthMax): beyond them
// it warns and drops the keyword.
constexpr double kMaxIntegerMultipleOf = 1024;
constexpr double kMaxMultipleOfRangeWidth = 10000;

// How xgrammar's SchemaParser::Parse reads one schema object: the keyword it dispatches on (the first of $ref,
// const, enum, anyOf, oneOf, allOf present wins and nothing beside it is read), else the types it generates
// and the keywords it reads for them.
struct Reading {
  const char* dispatch = nullptr;  // "$ref", "const", ...: the keyword everything else was ignored beside
  bool typeless = false;           // no "type", properties or items: any JSON value
  bool opaque = false;             // a "type" xgrammar refuses itself: nothing to check
  int kinds = kAnyValue;           // the kinds of value generated
  bool integer = false, number = false;
  std::set<std::string, std::less<>> read;
};

int KindOfType(const std::string& type, Reading& r) {
  if (type == "null") return kNull;
  if (type == "boolean") return kBoolean;
  if (type == "object") return kObject;
  if (type == "array") return kArray;
  if (type == "string") return kString;
  if (type == "integer") {
    r.integer = true;
    return kNumber;
  }
  if (type == "number") {
    r.number = true;
    return kNumber;
  }
  return 0;
}

void AddFamily(int kind, Reading& r) {
  if (kind & kString) r.read.insert(std::begin(kStringKeywords), std::end(kStringKeywords));
  if (kind & kArray) r.read.insert(std::begin(kArrayKeywords), std::end(kArrayKeywords));
  if (kind & kObject) r.read.insert(std::begin(kObjectKeywords), std::end(kObjectKeywords));
}

Reading Read(const Json& schema, const std::optional<std::string>& default_type) {
  Reading r;
  for (const char* keyword : {"$ref", "const", "enum", "anyOf", "oneOf", "allOf"}) {
    if (schema.contains(keyword)) {
      r.dispatch = keyword;
      r.read.insert(keyword);
      // A literal's "type" is redundant (pydantic writes {"const": "a", "type": "string"}); the value is exact.
      if (std::string_view(keyword) == "const" || std::string_view(keyword) == "enum") r.read.insert("type");
      return r;
    }
  }
  std::optional<Json> type;
  if (auto it = schema.find("type"); it != schema.end()) {
    type = *it;
  } else if (default_type.has_value()) {
    type = Json(*default_type);
  }
  if (type.has_value() && !(type->is_array() && type->empty())) {  // an empty list reads as no "type"
    r.kinds = 0;
    r.read.insert("type");
    const Json types = type->is_array() ? *type : Json::array({*type});
    for (const Json& t : types) {
      const int kind = t.is_string() ? KindOfType(t.get<std::string>(), r) : 0;
      if (kind == 0) {
        r.opaque = true;  // xgrammar refuses the type itself
        return r;
      }
      r.kinds |= kind;
      AddFamily(kind, r);
    }
    if (r.integer) r.read.insert(std::begin(kIntegerKeywords), std::end(kIntegerKeywords));
    if (r.number) r.read.insert(std::begin(kNumberKeywords), std::end(kNumberKeywords));
    return r;
  }
  if (schema.contains("properties") || schema.contains("additionalProperties") ||
      schema.contains("unevaluatedProperties")) {
    r.kinds = kObject;
  } else if (schema.contains("items") || schema.contains("prefixItems") || schema.contains("unevaluatedItems")) {
    r.kinds = kArray;
  } else {
    r.typeless = true;
    return r;
  }
  AddFamily(r.kinds, r);
  return r;
}

std::string Child(const std::string& path, const std::string& key) {
  bool plain = !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '$' && c != '-') plain = false;
  }
  return plain ? base::StrCat(path, ".", key) : base::StrCat(path, "[", Json(key).dump(), "]");
}

std::string Index(const std::string& path, size_t i) { return base::StrCat(path, "[", i, "]"); }

bool IsWholeNumber(const Json& v) {
  if (v.is_number_integer()) return true;
  return v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>();
}

class Walker {
 public:
  explicit Walker(std::string_view field) : field_(field) {}

  absl::Status Walk(const Json& schema, const std::string& path, const std::optional<std::string>& default_type) {
    if (!schema.is_object()) return absl::OkStatus();  // true, false, or something xgrammar refuses itself
    for (const char* container : {"$defs", "definitions"}) {
      auto defs = schema.find(container);
      if (defs == schema.end() || !defs->is_object()) continue;
      for (const auto& [name, sub] : defs->items()) {
        if (absl::Status s = Walk(sub, Child(Child(path, container), name), std::nullopt); !s.ok()) return s;
      }
    }
    const Reading r = Read(schema, default_type);
    if (r.opaque) return absl::OkStatus();
    for (const ValidationKeyword& keyword : kValidationKeywords) {
      const std::string key = keyword.name;
      auto value = schema.find(key);
      if (value == schema.end() || (keyword.kinds & r.kinds) == 0 || r.read.contains(key)) continue;
      if (key == "uniqueItems" && *value == false) continue;  // asks nothing
      if (In(kNeverRead, key)) return Refuse(key, path, "");
      if (r.dispatch != nullptr) return Refuse(key, path, base::StrCat(" beside \"", r.dispatch, "\""));
      if (r.typeless) return Refuse(key, path, " in a schema without \"type\" (it accepts any value there)");
      return Refuse(key, path, "");
    }
    if (absl::Status s = CheckValues(schema, r, path); !s.ok()) return s;
    return WalkSubschemas(schema, r, path);
  }

 private:
  absl::Status Refuse(const std::string& keyword, const std::string& path, const std::string& detail) const {
    return absl::InvalidArgumentError(base::StrCat(field_, ": keyword \"", keyword, "\" at ", path,
                                                   " is not enforced by the grammar engine", detail,
                                                   " (send strict: false to let it be ignored)"));
  }

  // Keywords xgrammar reads but drops in some combinations.
  absl::Status CheckValues(const Json& schema, const Reading& r, const std::string& path) const {
    if (r.dispatch != nullptr && std::string_view(r.dispatch) == "$ref") {
      const Json& ref = schema.at("$ref");
      if (ref.is_string()) {
        const std::string uri = ref.get<std::string>();
        if (uri != "#" && uri.rfind("#/", 0) != 0) {
          return Refuse("$ref", path,
                        base::StrCat(" for ", ref.dump(), ": only references into the schema itself (\"#/...\") are"));
        }
      }
    }
    if (r.dispatch != nullptr && std::string_view(r.dispatch) == "allOf") {
      const Json& all = schema.at("allOf");
      if (all.is_array() && all.size() > 1) return Refuse("allOf", path, " with more than one schema");
    }
    if ((r.kinds & kString) != 0 && r.dispatch == nullptr && !r.typeless) {
      const bool pattern = schema.contains("pattern");
      auto format = schema.find("format");
      const bool enforced_format =
          format != schema.end() && format->is_string() && In(kEnforcedFormats, format->get<std::string>());
      if (format != schema.end() && format->is_string() && !enforced_format) {
        return Refuse("format", path,
                      base::StrCat(" for ", format->dump(),
                                   " (it enforces date, time, date-time, duration, email, hostname, ipv4, ipv6, uri, "
                                   "uri-reference, uri-template, json-pointer, relative-json-pointer and uuid)"));
      }
      if (enforced_format && pattern) return Refuse("pattern", path, " beside \"format\"");
      // A pattern or a format generates the whole string: xgrammar drops the length bounds beside it.
      const char* generator = enforced_format ? "format" : pattern ? "pattern" : nullptr;
      if (generator != nullptr) {
        auto min_length = schema.find("minLength");
        if (min_length != schema.end() && *min_length != 0) {
          return Refuse("minLength", path, base::StrCat(" beside \"", generator, "\""));
        }
        if (schema.contains("maxLength")) return Refuse("maxLength", path, base::StrCat(" beside \"", generator, "\""));
      }
    }
    if (r.dispatch == nullptr && (r.integer || r.number)) {
      auto multiple_of = schema.find("multipleOf");
      if (multiple_of != schema.end() && multiple_of->is_number()) {
        if (r.number) return Refuse("multipleOf", path, " for numbers (only for integers)");
        if (!IsWholeNumber(*multiple_of) || multiple_of->get<double>() > kMaxIntegerMultipleOf) {
          return Refuse("multipleOf", path, " unless it is a whole number up to 1024");
        }
        if (absl::Status s = CheckMultipleOfRange(schema, path); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // ParseInteger keeps multipleOf beside a range only when both ends are bounded and at most 10000 apart.
  absl::Status CheckMultipleOfRange(const Json& schema, const std::string& path) const {
    auto bound = [&](const char* key) -> std::optional<double> {
      auto it = schema.find(key);
      if (it == schema.end() || !it->is_number()) return std::nullopt;
      return it->get<double>();
    };
    std::optional<double> low = bound("minimum"), high = bound("maximum");
    if (auto e = bound("exclusiveMinimum"); e.has_value()) low = std::max(low.value_or(*e + 1), *e + 1);
    if (auto e = bound("exclusiveMaximum"); e.has_value()) high = std::min(high.value_or(*e - 1), *e - 1);
    if (!low.has_value() && !high.has_value()) return absl::OkStatus();
    if (!low.has_value() || !high.has_value() || *high - *low > kMaxMultipleOfRangeWidth) {
      return Refuse("multipleOf", path, " beside a one-sided range or one wider than 10000");
    }
    return absl::OkStatus();
  }

  absl::Status WalkSubschemas(const Json& schema, const Reading& r, const std::string& path) {
    auto walk_at = [&](const char* key, const std::optional<std::string>& default_type) -> absl::Status {
      auto it = schema.find(key);
      if (it == schema.end()) return absl::OkStatus();
      return Walk(*it, Child(path, key), default_type);
    };
    auto walk_each = [&](const char* key) -> absl::Status {
      auto it = schema.find(key);
      if (it == schema.end()) return absl::OkStatus();
      if (it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i) {
          if (absl::Status s = Walk((*it)[i], Index(Child(path, key), i), std::nullopt); !s.ok()) return s;
        }
      } else if (it->is_object()) {
        for (const auto& [name, sub] : it->items()) {
          if (absl::Status s = Walk(sub, Child(Child(path, key), name), std::nullopt); !s.ok()) return s;
        }
      }
      return absl::OkStatus();
    };
    if (r.dispatch != nullptr) {
      for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
        if (std::string_view(r.dispatch) == combinator) return walk_each(combinator);
      }
      return absl::OkStatus();  // $ref is checked where it points ($defs), const and enum are values
    }
    if ((r.kinds & kObject) != 0) {
      for (const char* key : {"properties", "patternProperties"}) {
        if (absl::Status s = walk_each(key); !s.ok()) return s;
      }
      if (absl::Status s = walk_at("additionalProperties", std::nullopt); !s.ok()) return s;
      if (!schema.contains("additionalProperties")) {
        if (absl::Status s = walk_at("unevaluatedProperties", std::nullopt); !s.ok()) return s;
      }
      if (absl::Status s = walk_at("propertyNames", "string"); !s.ok()) return s;
    }
    if ((r.kinds & kArray) != 0) {
      if (absl::Status s = walk_each("prefixItems"); !s.ok()) return s;
      if (absl::Status s = walk_at("items", std::nullopt); !s.ok()) return s;
      if (!schema.contains("items")) {
        if (absl::Status s = walk_at("unevaluatedItems", std::nullopt); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  std::string_view field_;
};

}  // namespace

absl::Status CheckStrictSchema(const nlohmann::ordered_json& schema, std::string_view field) {
  return Walker(field).Walk(schema, "$", std::nullopt);
}

}  // namespace strata::structured
