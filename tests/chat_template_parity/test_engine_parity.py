"""The engine's semantics against jinja2, construct by construct: small templates that each exercise a
part of the language real templates use (printing Python values, operators, string and dict methods,
loops, scoping, macros, filters, tests, whitespace control, errors), rendered by transformers'
render_jinja_template and by strata-chat-template with the same context."""

from __future__ import annotations

import pytest

from chat_template_helpers import run_batch

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \"there\" 'x' é"},
            {"role": "assistant", "content": "Hello!"}]
CONTEXT = {"messages": MESSAGES, "add_generation_prompt": True, "bos_token": "<s>",
           "x": [1, 2.5, None, True, "a"], "d": {"b": 1, "a": [1, {"z": None}]}, "n": 7, "s": "  Hello World  "}

SNIPPETS = [
 "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
 "{{ x }}|{{ d }}|{{ x|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ messages[1]|tojson }}",
 "{{ s.strip() }}|{{ s|trim }}|{{ s.split() }}|{{ s.split(' ') }}|{{ s.lstrip().rstrip('d ') }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ 'ab cd'|capitalize }}",
 "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list }}{{ d.get('q', 5) }}{{ d.get('a') }}",
 "{% for i in x %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a','b') }}\n{% endfor %}",
 "{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }}",
 "{% macro f(a, b=2) %}[{{ a }}/{{ b }}/{{ varargs }}/{{ kwargs }}]{% endmacro %}{{ f(1) }}{{ f(1, 3) }}{{ f(1, b=4) }}{{ f(1,2,3,z=1) }}",
 "{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}inner{{ n }}{% endcall %}",
 "{{ 7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ -7 % 3 }} {{ 1 ~ 2 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ n * 2 }} {{ 'ab' * 2 }} {{ 10 - 3.5 }}",
 "{{ 'a' in 'cat' }} {{ 2 in x }} {{ 'b' in d }} {{ 3 not in x }} {{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ none is none }} {{ x is sequence }} {{ d is mapping }} {{ s is string }} {{ n is number }} {{ n is integer }} {{ 2.5 is float }} {{ q is defined }} {{ q is undefined }}",
 "{{ x[1:] }} {{ x[::-1] }} {{ x[-2:] }} {{ s[2:7] }} {{ 'héllo'[1:3] }} {{ x[1::2] }} {{ 'abc'[-1] }} {{ x[10] }}",
 "{{ x|length }} {{ s|length }} {{ d|length }} {{ x|first }} {{ x|last }} {{ x|join(',') }} {{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','a']|unique|list }} {{ [1,2,3]|reverse|list }} {{ d|dictsort }}",
 "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|join(',') }} {{ messages|rejectattr('role', 'eq', 'system')|map(attribute='role')|list }} {{ [0,1,2,'']|select|list }} {{ [1,2,3]|reject('odd')|list }} {{ ['a','b']|map('upper')|list }}",
 "{{ '3'|int + 1 }} {{ '2.5'|float }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ -3|abs }} {{ 3|string + 'x' }} {{ q|default('dflt') }} {{ ''|default('e', true) }} {{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a b c'|wordcount }} {{ '<a>'|e }} {{ x|batch(2)|list }}",
 "{%- if n > 5 -%}\n  big\n{%- elif n > 2 %}mid{% else %}small{% endif %}\n  {% for i in range(3) %}\n    {{ i }}\n  {% endfor %}\nend\n",
 "  {% if true %}\n  yes\n  {% endif %}\n{# c #}\nx {%+ if true %}y{% endif %}\n{% raw %}{{ not }}{% endraw %}\n",
 "{{ 'hello %s' }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }} {{ '\\u00e9\\n\\t' }} {{ (1,) }} {{ (1, 'a') }} {{ {'a': (1,2)} }}",
 "{{ 1 if n > 3 else 2 }} {{ 'yes' if q }}| {{ n > 3 and 'a' or 'b' }} {{ not n }} {{ 1 < n < 10 }} {{ q is not defined }}",
 "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}block {{ n }}{% endset %}{{ t }}{% set u | upper %}up{% endset %}{{ u }}{% filter upper %}low{{ n }}{% endfilter %}{% with z = 5 %}{{ z }}{% endwith %}{{ z }}",
 "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}{% for i in [] %}x{% else %}empty{% endfor %}{% for i in x if i %}{{ i }}{{ loop.length }}{% endfor %}",
 "{{ raise_exception('bad role') }}",
 "{{ q.foo }}",
 "{{ x.append(1) }}",
 "{{ s.startswith('  He') }} {{ s.endswith(('x', 'd  ')) }} {{ s.replace('l', 'L') }} {{ s.find('W') }} {{ s.count('l') }} {{ '-'.join(['a','b']) }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.rsplit(' ', 1) }} {{ 'x\ny'.splitlines() }} {{ s|replace('l', 'L', 1) }}",
 "{{ 1.0 }} {{ 1e20 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 100.0 }} {{ 1e16 }} {{ 123456789012345.6 }} {{ -0.0 }} {{ 2**62 }} {{ 3.0|int }}",
 "{{ messages[0]['content'] | tojson(ensure_ascii=true) }} {{ {'k': 'é\u2028'}|tojson }} {{ [1,[2,[]],{}]|tojson(indent=1) }} {{ x|tojson(separators=(',', ':')) }}",
 "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ d['a'][1]['z'] }} {{ d.a.1.z }} {{ messages|last }} {{ x|items if false else 1 }}",
 "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{{ sys }}{{ loop_messages|length }}",
 "{{ 'Hello'|center(11) }}|{{ [3,1,2]|max }} {{ [3,1,2]|min }} {{ [1,2,3]|sum }} {{ 'aBc'|lower is lower }}",
 "{%- for message in messages %}{{- '<' + message.role + '>' }}{{- message.content | trim }}{%- endfor %}",
]


def _jinja2(source: str) -> dict:
    from transformers.utils.chat_template_utils import render_jinja_template

    kwargs = dict(CONTEXT)
    messages = kwargs.pop("messages")
    try:
        rendered, _ = render_jinja_template([messages], chat_template=source, **kwargs)
        return {"text": rendered[0]}
    except Exception as e:  # noqa: BLE001 - a refusal on both sides is agreement
        return {"error": f"{type(e).__name__}: {e}"}


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_construct_renders_like_jinja2(strata_chat_template, tmp_path, index, record):
    source = SNIPPETS[index]
    template = tmp_path / "t.jinja"
    template.write_text(source, encoding="utf-8")
    want = _jinja2(source)
    got = run_batch(strata_chat_template, ["--template-file", str(template)], [CONTEXT])[0]
    same = got == want or ("error" in got and "error" in want)
    record("engine constructs identical to jinja2", int(same), 1)
    assert same, f"{source!r}\n  jinja2: {want}\n  strata: {got}"
