"""Random templates for the differential test (test_random_templates.py): expressions and statements
drawn from the constructs real chat templates use (literals, the context's values, operators, filters,
tests, methods, subscripts and slices, if/for/set/macro/namespace, whitespace control), deterministic per
seed. Constructs whose jinja2 result depends on an address or on compile-time constant folding (printing a
generator, slicing a literal) are not generated: the README lists them as known differences."""

from __future__ import annotations

import random
# Names the context defines (and q, which it does not). Literal keywords such as `none` are left out of
# subscripting: jinja2 folds constant subscripts when it compiles (README: known differences).
VARS = ["x", "d", "s", "n", "f", "messages", "e", "u", "q"]
FILTERS = [("trim", []), ("upper", []), ("lower", []), ("title", []), ("capitalize", []), ("length", []),
           ("first", []), ("last", []), ("list", []), ("string", []), ("int", []), ("float", []), ("abs", []),
           ("round", ["1"]), ("join", ["', '"]), ("default", ["'dflt'"]), ("default", ["'b'", "true"]),
           ("tojson", []), ("tojson", ["indent=2"]), ("tojson", ["sort_keys=true"]), ("sort", []), ("unique", ["|list"]),
           ("reverse", ["|list"]), ("items", ["|list"]), ("dictsort", []), ("replace", ["'a'", "'Z'"]),  ("wordcount", []), ("escape", []), ("batch", ["2", "|list"]), ("sum", []),
           ("max", []), ("min", []), ("center", ["9"]), ("select", ["|list"]), ("reject", ["|list"]), ("map", ["'string'", "|list"]),
           ("selectattr", ["'role'", "'equalto'", "'user'", "|list"]), ("map", ["attribute='role'", "|list"]), ("count", [])]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
         "sequence", "boolean", "true", "false", "odd", "even", "divisibleby 2", "eq 1", "in [1, 'a']", "lower", "upper",
         "callable"]
METHODS = ["strip()", "split()", "split(',')", "upper()", "lower()", "startswith('a')", "endswith('o')",
           "replace('l', 'L')", "title()", "find('o')", "count('l')", "lstrip('H ')", "rsplit(' ', 1)", "splitlines()",
           "items()", "keys()", "values()", "get('b')", "get('zz', 3)", "index(1)", "isdigit()", "capitalize()"]
STRINGS = ["'a'", "'Hello World'", "\"it's\"", "'x\\ny'", "'é日本'", "''", "'  pad  '", "'1,2,,3'", "'-'", "'Q\"'", "'a b c'", "'10'", "'2.5'"]

def lit(r, depth):
    c = r.random()
    if c < 0.25: return str(r.choice([0, 1, 2, -3, 7, 10, 255, 1000000]))
    if c < 0.35: return r.choice(["1.5", "0.1", "2.0", "1e3", "-0.5", "3.14159"])
    if c < 0.6: return r.choice(STRINGS)
    if c < 0.7: return r.choice(["none", "true", "false", "True", "None"])
    if c < 0.85 and depth < 3: return "[" + ", ".join(expr(r, depth + 1) for _ in range(r.randint(0, 3))) + "]"
    if depth < 3: return "{" + ", ".join(f"{r.choice(STRINGS[:4])}: {expr(r, depth + 1)}" for _ in range(r.randint(0, 2))) + "}"
    return "1"

def primary(r, depth):
    c = r.random()
    if c < 0.45: return lit(r, depth)
    if c < 0.8: return r.choice(VARS)
    return f"({expr(r, depth + 1)})"

def postfix(r, depth):
    e = primary(r, depth)
    # jinja2 folds constant subscripts at compile time (sandbox getitem): subscript names only.
    steps = r.randint(0, 2) if e in VARS else 0
    if e not in VARS and r.random() < 0.3:
        name, args = r.choice(FILTERS)
        tail = "|list" if args and args[-1] == "|list" else ""
        args = [a for a in args if a != "|list"]
        e += f"|{name}" + (f"({', '.join(args)})" if args else "") + tail
    for _ in range(steps):
        c = r.random()
        if c < 0.3: e += "." + r.choice(["role", "content", "a", "b", "zz", "0"])
        elif c < 0.5: e += f"[{r.choice(['0', '1', '-1', 'n', 's', chr(39)+'a'+chr(39), chr(39)+'role'+chr(39)])}]"
        elif c < 0.65: e += r.choice(["[1:]", "[:-1]", "[::-1]", "[::2]", "[1:3]", "[-2:]"])
        elif c < 0.85: e += "." + r.choice(METHODS)
        else:
            name, args = r.choice(FILTERS)
            tail = "|list" if args and args[-1] == "|list" else ""
            args = [a for a in args if a != "|list"]
            e += f"|{name}" + (f"({', '.join(args)})" if args else "") + tail
    return e

def expr(r, depth=0):
    if depth > 3: return primary(r, 5)
    c = r.random()
    if c < 0.45: return postfix(r, depth)
    if c < 0.65:
        op = r.choice(["+", "-", "*", "/", "//", "%", "~", "**", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"])
        return f"{postfix(r, depth + 1)} {op} {postfix(r, depth + 1)}"
    if c < 0.75: return f"not {postfix(r, depth + 1)}"
    if c < 0.85: return f"{postfix(r, depth + 1)} is {'not ' if r.random() < 0.3 else ''}{r.choice(TESTS)}"
    if c < 0.95: return f"{postfix(r, depth + 1)} if {postfix(r, depth + 1)} else {postfix(r, depth + 1)}"
    return f"-{postfix(r, depth + 1)}"

def stmt(r, depth=0):
    ws = lambda: r.choice(["", "-", "", "+"]) if r.random() < 0.3 else ""
    c = r.random()
    if c < 0.35 or depth > 2: return "{{" + ws().replace("+", "") + " " + expr(r) + " " + ws().replace("+", "") + "}}" + r.choice(["", "\n", " ", "\n  "])
    if c < 0.5: return "{%" + ws() + " if " + expr(r) + " %}" + body(r, depth) + ("{% else %}" + body(r, depth) if r.random() < 0.5 else "") + "{% endif " + ws() + "%}" + r.choice(["", "\n"])
    if c < 0.65:
        return ("{% for it in " + postfix(r, 1) + (" if it" if r.random() < 0.2 else "") + " %}" + r.choice(["\n", "", "  "]) + "{{ it }}|{{ loop.index }}{{ loop.last }}{{ loop.previtem }}" + body(r, depth) + ("{% else %}E" if r.random() < 0.3 else "") + "{% endfor %}\n")
    if c < 0.75: return "{% set v = " + expr(r) + " %}{{ v }}"
    if c < 0.82: return "{% set ns = namespace(c=0) %}{% for i in range(3) %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}"
    if c < 0.9: return "{% macro mm(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ mm(" + expr(r) + ") }}"
    return "  {% if true %}\n  line {{ " + expr(r) + " }}\n  {% endif %}\n"

def body(r, depth):
    return "".join(stmt(r, depth + 1) for _ in range(r.randint(0, 2)))

CONTEXT = {"x": [1, 2.5, None, True, "a"], "d": {"b": 1, "a": [1, {"z": None}]}, "s": "  Hello World  ", "n": 7,
           "f": 2.75, "e": [], "u": "ünï",
           "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}

def templates(seed, count):
    r = random.Random(seed)
    return ["".join(stmt(r) for _ in range(r.randint(1, 4))) for _ in range(count)]
