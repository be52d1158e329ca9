#include "tokenizer/json_path.h"

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"

namespace strata::tokenizer {

namespace {
const nlohmann::json& Null() {
  static const nlohmann::json null;
  return null;
}
}  // namespace

std::string JsonAt::FieldPath(std::string_view key) const {
  return path.empty() ? std::string(key) : base::StrCat(path, ".", key);
}

JsonAt JsonAt::Field(std::string_view key) const {
  if (value.is_object()) {
    auto it = value.find(key);
    if (it != value.end()) return JsonAt{*it, FieldPath(key), source};
  }
  return JsonAt{Null(), FieldPath(key), source};
}

JsonAt JsonAt::Index(size_t i) const { return JsonAt{value.at(i), base::StrCat(path, "[", i, "]"), source}; }

absl::Status JsonAt::Error(std::string_view message) const {
  if (path.empty()) return absl::InvalidArgumentError(base::StrCat(source, ": ", message));
  return absl::InvalidArgumentError(base::StrCat(source, ": ", path, ": ", message));
}

absl::Status JsonAt::FieldError(std::string_view key, std::string_view message) const {
  return Field(key).Error(message);
}

bool JsonAt::Has(std::string_view key) const { return !Field(key).value.is_null(); }

absl::StatusOr<std::string> JsonAt::String(std::string_view key) const {
  JsonAt f = Field(key);
  if (f.value.is_null()) return f.Error("missing (a string is required)");
  if (!f.value.is_string()) return f.Error(base::StrCat("expected a string, got ", f.value.type_name()));
  return f.value.get<std::string>();
}

absl::StatusOr<bool> JsonAt::Bool(std::string_view key, bool fallback) const {
  JsonAt f = Field(key);
  if (f.value.is_null()) return fallback;
  if (!f.value.is_boolean()) return f.Error(base::StrCat("expected a boolean, got ", f.value.type_name()));
  return f.value.get<bool>();
}

absl::StatusOr<int64_t> JsonAt::Int(std::string_view key) const {
  JsonAt f = Field(key);
  if (f.value.is_null()) return f.Error("missing (an integer is required)");
  if (!f.value.is_number_integer()) return f.Error(base::StrCat("expected an integer, got ", f.value.type_name()));
  return f.value.get<int64_t>();
}

absl::StatusOr<std::string> JsonAt::Type() const {
  if (!value.is_object()) return Error(base::StrCat("expected an object, got ", value.type_name()));
  return String("type");
}

}  // namespace strata::tokenizer
