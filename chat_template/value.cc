#include "chat_template/value.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)

namespace strata::chat_template {

using base::StrCat;

Value Value::Undefined(std::string hint, bool unsafe) {
  Value v;
  v.kind = Kind::kUndefined;
  if (!hint.empty()) v.text = std::make_shared<const std::string>(std::move(hint));
  v.unsafe = unsafe;
  return v;
}
Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind = Kind::kFloat;
  v.number = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.text = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::List(std::vector<Value> items, bool is_tuple) {
  auto data = std::make_shared<ListData>();
  int depth = 0;
  for (const Value& item : items) {
    depth = std::max(depth, item.depth());
    data->holds_namespace = data->holds_namespace || item.holds_namespace();
  }
  data->depth = depth + 1;
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  Value v;
  v.kind = Kind::kList;
  v.list = std::move(data);
  return v;
}
Value Value::Dict(std::shared_ptr<DictData> dict) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::move(dict);
  return v;
}
Value Value::Function(std::string name, std::function<Value(Interpreter&, CallArgs&)> call) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->call = std::move(call);
  Value v;
  v.kind = Kind::kCallable;
  v.callable = std::move(c);
  return v;
}

bool Value::holds_namespace() const {
  if (kind == Kind::kList) return list->holds_namespace;
  if (kind == Kind::kDict) return dict->is_namespace || dict->holds_namespace;
  return false;
}

int Value::depth() const {
  if (kind == Kind::kList) return list->depth;
  if (kind == Kind::kDict) return dict->depth;
  return 0;
}

const Value* DictData::Find(const Value& key) const {
  const std::string k = KeyOf(key);
  if (k.empty()) return nullptr;
  auto it = index.find(k);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

void DictData::Set(Value key, Value value) {
  const std::string k = KeyOf(key);
  depth = std::max(depth, value.depth() + 1);
  holds_namespace = holds_namespace || value.holds_namespace();
  auto [it, inserted] = index.try_emplace(k, entries.size());
  if (inserted) {
    entries.emplace_back(std::move(key), std::move(value));
  } else {
    entries[it->second].second = std::move(value);
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      if (!v.list->python_type.empty()) return v.list->python_type;
      return v.list->is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return v.dict->is_namespace ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return v.integer != 0;
    case Kind::kFloat:
      return v.number != 0;
    case Kind::kString:
      return !v.text->empty();
    case Kind::kList:
      return v.list->lazy || !v.list->items.empty();
    case Kind::kDict:
      return v.dict->is_namespace || !v.dict->entries.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

// Python's float repr: the shortest digits that read back to the same double, in fixed notation when
// the exponent is in [-4, 16), else scientific with a signed two-digit (or longer) exponent.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out = "-";
    pos = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::atoi(sci.c_str() + e + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    } else {
      const size_t int_len = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out += digits;
        out.append(int_len - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_len);
        out += ".";
        out += digits.substr(int_len);
      }
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += ".";
      out += digits.substr(1);
    }
    out += exponent < 0 ? "e-" : "e+";
    const int a = std::abs(exponent);
    if (a < 10) out += "0";
    out += std::to_string(a);
  }
  return out;
}

namespace {

// Code points Python's repr() escapes because str.isprintable() is false for them: control characters,
// separators other than the ASCII space, format characters and private use. (A table of the common
// ranges; Python consults the full Unicode database.)
bool IsPrintable(char32_t c) {
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  if (c >= 0x80 && c <= 0xa0) return false;
  if (c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x206f))
    return false;
  if (c == 0x3000 || c == 0xfeff || (c >= 0xd800 && c <= 0xf8ff) || (c >= 0xfff9 && c <= 0xfffb)) return false;
  if (c >= 0xf0000) return false;
  return true;
}

}  // namespace

std::string StrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : Decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (IsPrintable(c)) {
      AppendCodePoint(out, c);
    } else {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

std::string ToStr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *v.text;
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";  // repr() of jinja2's Undefined, e.g. inside a printed dict
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.boolean ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.integer);
    case Kind::kFloat:
      return FloatRepr(v.number);
    case Kind::kString:
      return StrRepr(*v.text);
    case Kind::kList: {
      if (!v.list->range_repr.empty()) return v.list->range_repr;
      if (v.list->lazy) return "<" + v.list->python_type + " object>";  // Python adds an address
      const auto& items = v.list->items;
      std::string out = v.list->is_tuple ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += Repr(items[i]);
      }
      if (v.list->is_tuple && items.size() == 1) out += ",";
      out += v.list->is_tuple ? ")" : "]";
      if (!v.list->python_type.empty()) return v.list->python_type + "(" + out + ")";  // dict_keys([...])
      return out;
    }
    case Kind::kDict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, value] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += Repr(key);
        out += ": ";
        out += Repr(value);
      }
      out += v.dict->is_namespace ? "}>" : "}";
      return out;
    }
    case Kind::kCallable:
      return "<function " + v.callable->name + ">";
  }
  return "";
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      const int64_t x = a.kind == Kind::kBool ? a.boolean : a.integer;
      const int64_t y = b.kind == Kind::kBool ? b.boolean : b.integer;
      return x == y;
    }
    return AsDouble(a) == AsDouble(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *a.text == *b.text;
    case Kind::kList: {
      if (a.list->lazy || b.list->lazy) return a.list == b.list;
      if (a.list->is_tuple != b.list->is_tuple || a.list->python_type != b.list->python_type) return false;
      const auto& x = a.list->items;
      const auto& y = b.list->items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [key, value] : a.dict->entries) {
        const Value* other = b.dict->Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case Kind::kCallable:
      return a.callable == b.callable;
    default:
      return false;
  }
}

bool Less(const Value& a, const Value& b, bool* ok) {
  *ok = true;
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      const int64_t x = a.kind == Kind::kBool ? a.boolean : a.integer;
      const int64_t y = b.kind == Kind::kBool ? b.boolean : b.integer;
      return x < y;
    }
    return AsDouble(a) < AsDouble(b);
  }
  if (a.is_string() && b.is_string()) return *a.text < *b.text;  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list() && a.list->is_tuple == b.list->is_tuple) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Less(x[i], y[i], ok);
    }
    return x.size() < y.size();
  }
  *ok = false;
  return false;
}

std::string KeyOf(const Value& v) {
  switch (v.kind) {
    case Kind::kString:
      return StrCat("s", *v.text);
    case Kind::kBool:
      return v.boolean ? "n1" : "n0";
    case Kind::kInt:
      return StrCat("n", v.integer);
    case Kind::kFloat:
      if (std::isfinite(v.number) && v.number == std::trunc(v.number) && std::fabs(v.number) < 9e18) {
        return StrCat("n", static_cast<int64_t>(v.number));
      }
      return StrCat("f", FloatRepr(v.number));
    case Kind::kNone:
      return "z";
    case Kind::kList: {
      if (!v.list->is_tuple) return "";
      std::string out = "t(";
      for (const Value& item : v.list->items) {
        const std::string k = KeyOf(item);
        if (k.empty()) return "";
        absl::StrAppend(&out, k.size(), ":", k);
      }
      return out;
    }
    default:
      return "";
  }
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(FromJson(item));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<DictData>();
      for (const auto& [key, value] : j.items()) dict->Set(Value::String(key), FromJson(value));
      return Value::Dict(std::move(dict));
    }
    default:
      return Value::None();
  }
}

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (c >= 0x80 && c < 0xc0) n = 1;  // a stray continuation byte (never in valid input): one unit
    if (i + static_cast<size_t>(n) > s.size()) n = 1;
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

void AppendCodePoint(std::string& out, char32_t c) {
  utf8proc_uint8_t bytes[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), bytes);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(n));
}

bool AppendJsonEscape(std::string& out, char32_t c) {
  switch (c) {
    case '"':
      out += "\\\"";
      return true;
    case '\\':
      out += "\\\\";
      return true;
    case '\n':
      out += "\\n";
      return true;
    case '\r':
      out += "\\r";
      return true;
    case '\t':
      out += "\\t";
      return true;
    case '\b':
      out += "\\b";
      return true;
    case '\f':
      out += "\\f";
      return true;
    default:
      break;
  }
  if (c >= 0x20) return false;
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\u00";
  out.push_back(kHex[c >> 4]);
  out.push_back(kHex[c & 0xF]);
  return true;
}

std::string Encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendCodePoint(out, c);
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace strata::chat_template
