#pragma once
// The strict check of a JSON schema (Constraint::strict): every keyword that constrains a value must be one the
// grammar engine enforces, so that whatever the model generates under the grammar validates against the schema.
// xgrammar 0.2.8 drops some keywords without a word (`not`, `if`/`then`/`else`, `uniqueItems`, `contains`,
// `dependentRequired`, ...), some with a warning (structured.cc refuses those too, from the warnings), and
// ignores whole groups of keywords beside the one its parser dispatches on: beside `$ref`, `const`, `enum`,
// `anyOf`, `oneOf` and `allOf` nothing else is read, and a schema with no `type` (and no properties or items)
// accepts any value. The check walks the schema in the same order as xgrammar's SchemaParser::Parse and refuses
// each keyword the chosen reading leaves out, naming its JSON path.

#include <string_view>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace strata::structured {

// OK, or InvalidArgument "`field`: keyword \"uniqueItems\" at $.properties.tags is not enforced by the grammar
// engine (send strict: false to let it be ignored)". Annotations (title, description, examples, default, $schema,
// $id, $comment, deprecated, readOnly, writeOnly, and keywords JSON Schema does not define) are fine. Values the
// engine rejects itself (a malformed `minLength`, an unknown `type`) are left to it.
absl::Status CheckStrictSchema(const nlohmann::ordered_json& schema, std::string_view field);

}  // namespace strata::structured
