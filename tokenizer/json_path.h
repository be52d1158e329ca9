// Reading tokenizer.json with errors that name the JSON path of the offending value, e.g.
// `tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported pre-tokenizer "Whitespace"`.
#ifndef STRATA_RUNTIME_TOKENIZER_JSON_PATH_H_
#define STRATA_RUNTIME_TOKENIZER_JSON_PATH_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::tokenizer {

// A JSON value together with where it sits in the file.
struct JsonAt {
  const nlohmann::json& value;
  std::string path;         // e.g. "pre_tokenizer.pretokenizers[1]"; empty for the root
  std::string_view source;  // the file's name as messages show it, e.g. "tokenizer.json"

  JsonAt Field(std::string_view key) const;  // value[key] (null when absent)
  JsonAt Index(size_t i) const;
  std::string FieldPath(std::string_view key) const;

  absl::Status Error(std::string_view message) const;  // "<source>: <path>: <message>"
  absl::Status FieldError(std::string_view key, std::string_view message) const;

  bool Has(std::string_view key) const;                                  // present and not null
  absl::StatusOr<std::string> String(std::string_view key) const;        // required string field
  absl::StatusOr<bool> Bool(std::string_view key, bool fallback) const;  // optional bool field
  absl::StatusOr<int64_t> Int(std::string_view key) const;               // required integer field
  absl::StatusOr<std::string> Type() const;                              // the required "type" string of a component
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_JSON_PATH_H_
