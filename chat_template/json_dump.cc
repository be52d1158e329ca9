#include "chat_template/json_dump.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

struct JsonOptions {
  bool ensure_ascii;
  std::optional<std::string> indent;
  std::string item_sep;
  std::string key_sep;
  bool sort_keys;
};

void JsonString(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : Decode(s)) {
    if (AppendJsonEscape(out, c)) continue;
    if (ensure_ascii && c > 0x7e) {
      char buf[16];
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                      static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      AppendCodePoint(out, c);
    }
  }
  out.push_back('"');
}

class JsonEncoder {
 public:
  JsonEncoder(Interpreter& in, const JsonOptions& options, std::string& out) : in_(in), o_(options), out_(out) {}

  void Encode(const Value& v, int level);

 private:
  void Scalar(const Value& v);
  void List(const Value& v, int level);
  void Dict(const Value& v, int level);
  void Key(const Value& key, int level);
  void Newline(int level);
  // The separator before every item but the first.
  void Separate(bool& first, int level);

  Interpreter& in_;
  const JsonOptions& o_;
  std::string& out_;
};

void JsonEncoder::Encode(const Value& v, int level) {
  in_.Step();
  if (out_.size() > in_.limits().max_output_bytes) in_.Fail("LimitError", "tojson output exceeds the output cap");
  switch (v.kind) {
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString:
      Scalar(v);
      return;
    case Kind::kList:
      if (!v.list->range_repr.empty() || !v.list->python_type.empty()) break;  // range, generator, dict view
      List(v, level);
      return;
    case Kind::kDict:
      if (v.dict->is_namespace) break;
      Dict(v, level);
      return;
    default:
      break;
  }
  in_.Fail("TypeError", StrCat("Object of type ", v.is_list() && !v.list->range_repr.empty() ? "range" : TypeName(v),
                               " is not JSON serializable"));
}

void JsonEncoder::Scalar(const Value& v) {
  switch (v.kind) {
    case Kind::kNone:
      out_ += "null";
      return;
    case Kind::kBool:
      out_ += v.boolean ? "true" : "false";
      return;
    case Kind::kInt:
      out_ += std::to_string(v.integer);
      return;
    case Kind::kFloat:
      if (std::isnan(v.number)) {
        out_ += "NaN";
      } else if (std::isinf(v.number)) {
        out_ += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        out_ += FloatRepr(v.number);
      }
      return;
    default:
      JsonString(out_, v.str(), o_.ensure_ascii);
      return;
  }
}

void JsonEncoder::Newline(int level) {
  if (!o_.indent) return;
  out_.push_back('\n');
  for (int i = 0; i < level; ++i) out_ += *o_.indent;
}

void JsonEncoder::Separate(bool& first, int level) {
  if (!first) {
    out_ += o_.item_sep;
    Newline(level);
  }
  first = false;
}

void JsonEncoder::List(const Value& v, int level) {
  if (v.list->items.empty()) {
    out_ += "[]";
    return;
  }
  out_.push_back('[');
  Newline(level + 1);
  bool first = true;
  for (const Value& item : v.list->items) {
    Separate(first, level + 1);
    Encode(item, level + 1);
  }
  Newline(level);
  out_.push_back(']');
}

void JsonEncoder::Dict(const Value& v, int level) {
  if (v.dict->entries.empty()) {
    out_ += "{}";
    return;
  }
  std::vector<std::pair<Value, Value>> entries = v.dict->entries;
  if (o_.sort_keys) SortValues(in_, entries, false);
  out_.push_back('{');
  Newline(level + 1);
  bool first = true;
  for (const auto& [key, value] : entries) {
    Separate(first, level + 1);
    Key(key, level);
    out_ += o_.key_sep;
    Encode(value, level + 1);
  }
  Newline(level);
  out_.push_back('}');
}

// Python's json turns the keys it accepts into strings: None, True and numbers print as JSON would.
void JsonEncoder::Key(const Value& key, int level) {
  switch (key.kind) {
    case Kind::kString:
      JsonString(out_, key.str(), o_.ensure_ascii);
      return;
    case Kind::kNone:
      out_ += "\"null\"";
      return;
    case Kind::kBool:
      out_ += key.boolean ? "\"true\"" : "\"false\"";
      return;
    case Kind::kInt:
      absl::StrAppend(&out_, "\"", key.integer, "\"");
      return;
    case Kind::kFloat: {
      std::string f;
      JsonEncoder(in_, o_, f).Encode(key, level);
      absl::StrAppend(&out_, "\"", f, "\"");
      return;
    }
    default:
      in_.Fail("TypeError", StrCat("keys must be str, int, float, bool or None, not ", TypeName(key)));
  }
}

}  // namespace

std::string JsonDumps(Interpreter& in, const Value& v, bool ensure_ascii, const Value& indent,
                      const std::string& item_sep, const std::string& key_sep, bool sort_keys) {
  JsonOptions o{ensure_ascii, std::nullopt, item_sep, key_sep, sort_keys};
  if (indent.is_string()) {
    o.indent = indent.str();
  } else if (IsIntLike(indent)) {
    o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(AsInt(indent), 0, 1024)), ' ');
  } else if (!indent.is_none()) {
    in.Fail("TypeError", "tojson: indent must be an integer, a string or None");
  }
  std::string out;
  JsonEncoder(in, o, out).Encode(v, 0);
  return out;
}

}  // namespace strata::chat_template
