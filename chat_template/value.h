#pragma once
// The values a chat template computes with, modelled on the Python objects jinja2 hands a template:
// None, bool, int, float, str, list, tuple, dict, callables (macros, globals, bound methods) and
// jinja2's default Undefined. Lists, tuples and dicts are immutable once built (the immutable sandbox
// refuses list.append and dict.update), so copies share their storage; a namespace() is the one
// mutable container (`set ns.attr = ...`). Printing and comparing follow Python: str(None) is "None",
// str([1, 'a']) is "[1, 'a']", 1 == 1.0 == True.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "nlohmann/json.hpp"

namespace strata::chat_template {

class Interpreter;
struct Value;

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;                 // nesting of containers inside, this one included
  bool holds_namespace = false;  // a namespace() is an item, or inside one
  std::string range_repr;        // a range() result prints as Python's range object: "range(0, 4)"
  // What Python would hold instead of a list: "" (a list or tuple), "generator" / "list_reverseiterator"
  // (lazy: what select, map, unique, ... and reverse return: always truthy, no len(), iterated once),
  // "dict_keys" / "dict_values" / "dict_items" (views: len() but no indexing, printed as views).
  std::string python_type;
  bool lazy = false;
  mutable bool consumed = false;  // a lazy sequence already iterated
};

// Insertion-ordered like a Python dict. Keys are hashed by their Python equality class (1, 1.0 and True
// are one key), see KeyOf.
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  absl::flat_hash_map<std::string, size_t> index;
  bool is_namespace = false;  // namespace(): attributes, settable with `set ns.x = ...`
  bool frozen = false;        // the loop object: attributes, not settable
  int depth = 1;
  bool holds_namespace = false;

  const Value* Find(const Value& key) const;
  void Set(Value key, Value value);
};

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

struct Callable {
  std::string name;  // for messages: "range", "str.strip", "macro m", ...
  std::function<Value(Interpreter&, CallArgs&)> call;
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  // kString: the text (UTF-8). kUndefined: what was undefined, for the error raised when it is used.
  std::shared_ptr<const std::string> text;
  std::shared_ptr<const ListData> list;
  std::shared_ptr<DictData> dict;
  std::shared_ptr<const Callable> callable;
  bool unsafe = false;  // kUndefined from an attribute the sandbox refuses: using it is a SecurityError
  // kString: a markupsafe.Markup (from |safe or |escape). `Markup + str` escapes the str; `~` and
  // most filters give plain text again (transformers' environment does not autoescape).
  bool markup = false;

  static Value Undefined(std::string hint = "", bool unsafe = false);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(std::vector<Value> items, bool is_tuple = false);
  static Value Dict(std::shared_ptr<DictData> dict);
  static Value Function(std::string name, std::function<Value(Interpreter&, CallArgs&)> call);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }
  const std::string& str() const { return *text; }  // kString only
  int depth() const;
  bool holds_namespace() const;  // is, or contains, a namespace()
};

// Python type names, as error messages name them ("int", "str", "list", "dict", "NoneType", ...).
std::string TypeName(const Value& v);
// Python truthiness (Undefined is falsy).
bool Truthy(const Value& v);
// Python's numbers: bool is an int (True == 1); AsInt and AsDouble take a number.
inline bool IsIntLike(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }
inline int64_t AsInt(const Value& v) { return v.kind == Kind::kBool ? static_cast<int64_t>(v.boolean) : v.integer; }
inline double AsDouble(const Value& v) { return v.kind == Kind::kFloat ? v.number : static_cast<double>(AsInt(v)); }
// str(v) and repr(v). Undefined prints as "".
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
std::string FloatRepr(double d);
std::string StrRepr(std::string_view s);
// Python ==.
bool Equals(const Value& a, const Value& b);
// Python <: false with *ok = false when the types do not order ("'<' not supported between ...").
bool Less(const Value& a, const Value& b, bool* ok);
// The hash key of a dict key: equal for keys Python treats as equal. Empty when the value is unhashable.
std::string KeyOf(const Value& v);
// Reads JSON (nlohmann's ordered_json keeps object keys in their order, as Python's json does).
Value FromJson(const nlohmann::ordered_json& j);

// UTF-8 <-> code points: Python strings index, slice and count code points.
std::u32string Decode(std::string_view s);
std::string Encode(std::u32string_view s);
void AppendCodePoint(std::string& out, char32_t c);
size_t CodePointCount(std::string_view s);
// Python's json.dumps escape of `c` when it needs one: `"` and `\`, and the controls below 0x20 (\n \r \t
// \b \f, else \u00xx). Appends and returns true for those; false, appending nothing, for any other.
bool AppendJsonEscape(std::string& out, char32_t c);
// Python's str.isspace() for one code point.
bool IsPySpace(char32_t c);

}  // namespace strata::chat_template
