#pragma once
// jinja2's builtins as a template reaches them: filters (`x | f`, filters.cc), tests (`x is t`,
// jinja_tests.cc), the str/list/dict methods the immutable sandbox allows (methods.cc) and transformers'
// globals (globals.cc). Filters and tests are name -> function tables, as jinja2's FILTERS and TESTS;
// below the interpreter's entry points is what those files share (builtins.cc).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat_template/interpreter.h"
#include "chat_template/value.h"

namespace strata::chat_template {

// --- what the interpreter calls
// `input | name(args)`: "No filter named 'NAME'." for a name jinja2 does not know.
Value CallFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
// `input is name(args)`: "No test named 'NAME'." likewise.
bool CallTest(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
// A bound method of a str, list or dict (`"a".strip`, `d.items`): nullopt when the type has no such
// attribute; an unsafe Undefined when the sandbox refuses it (list.append, dict.update, dunders).
std::optional<Value> GetMethod(Interpreter& in, const Value& obj, const std::string& name);
// jinja2's and transformers' globals: range, namespace, dict, raise_exception, strftime_now.
void AddGlobals(Frame& frame);
// markupsafe's escape: & < > " ' as entities.
std::string HtmlEscape(std::string_view s);

// --- what the builtins share (builtins.cc)
// Binds call arguments to parameter names as Python does; unknown or surplus arguments are a TypeError
// naming `what`. Missing ones are nullopt.
std::vector<std::optional<Value>> BindArgs(Interpreter& in, std::string_view what, CallArgs& args,
                                           const std::vector<std::string_view>& names);
// The bound argument `i`, or nullptr when it was not given.
const Value* Opt(const std::vector<std::optional<Value>>& bound, size_t i);
// The argument as a str / an int (bool included), else a TypeError "WHAT must be str, not TYPE".
std::string RequireStr(Interpreter& in, const Value* v, std::string_view what);
int64_t RequireInt(Interpreter& in, const Value* v, std::string_view what);
// A str argument that may be None (str.strip's chars, str.split's sep): nullopt for None or missing.
std::optional<std::string_view> StrOrNone(const Value* v);

// What jinja2's generator filters return (select, map, unique, batch, items, ...): `python_type` is
// what Python would print ("generator", "list_reverseiterator").
Value Lazy(Interpreter& in, std::vector<Value> items, const char* python_type = "generator");
// dict.keys() / values() / items(): sized, iterable, not subscriptable.
Value DictView(Interpreter& in, std::vector<Value> items, const char* python_type);
Value StringList(Interpreter& in, const std::vector<std::string>& parts);
// The |items filter (a generator) and dict.items() (a view).
Value Items(Interpreter& in, const Value& v, bool view);

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (environment.getitem).
Value GetAttribute(Interpreter& in, const Value& item, const Value& attribute);
// jinja2's ignore_case: strings compare lower-cased unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive);
// Python's sorted() on (key, item) pairs by key: stable; keys that do not order are a TypeError.
void SortValues(Interpreter& in, std::vector<std::pair<Value, Value>>& keyed, bool reverse);
// Python's len(): str (code points), list, tuple, dict, dict views; Undefined is 0.
size_t Length(Interpreter& in, const Value& v);

}  // namespace strata::chat_template
