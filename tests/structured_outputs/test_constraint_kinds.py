"""Every kind of constraint strata takes, beyond JSON schemas, on the byte-level server: OpenAI's json_object;
vLLM's structured_outputs regex, choice, grammar (xgrammar's EBNF), structural_tag and json_object; llama.cpp's
GBNF `grammar`; and how constraints meet the other sampling options: stop strings (a stop string inside the JSON
does not cut it; one where the grammar may end does), n with a seed, a logit_bias against EOS where EOS is all the
grammar allows, penalties, echo, logprobs. Outputs are checked with Python's `re`, `json` and small recognisers
(structured_helpers)."""

from __future__ import annotations

import json
import re

import pytest

import structured_helpers as H

CHAT = [{"role": "user", "content": "Answer."}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 7}},
           "required": ["city", "days"]}


def completions(main, **body) -> dict:
    return H.post_ok(f"{main.url}/v1/completions", {"model": H.MODEL_NAME, "prompt": "Output:", **body})


def chat(main, **body) -> dict:
    return H.post_ok(f"{main.url}/v1/chat/completions", {"model": H.MODEL_NAME, "messages": CHAT, **body})


def texts(reply: dict) -> list[tuple[str, str]]:
    """[(finish_reason, text)] in choice order, for either route."""
    out = []
    for c in sorted(reply["choices"], key=lambda c: c["index"]):
        out.append((c["finish_reason"], c["message"]["content"] if "message" in c else c["text"]))
    return out


def token_id(main, text: str) -> int:
    ids = H.post_ok(f"{main.url}/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    assert len(ids) == 1, f"{text!r} is {ids}"
    return ids[0]


def test_json_object_on_both_apis(main):
    replies = [chat(main, response_format={"type": "json_object"}, max_tokens=256, temperature=1.0, seed=1, n=4),
               completions(main, structured_outputs={"json_object": True}, max_tokens=256, temperature=1.0, seed=2,
                           n=4)]
    stopped = 0
    for reply in replies:
        for finish, text in texts(reply):
            if finish == "stop":
                stopped += 1
                assert isinstance(json.loads(text), dict), text
            else:
                assert finish == "length" and H.json_prefix_error(text) is None, text
                assert text.lstrip().startswith("{"), text
    assert stopped >= 4


REGEXES = [
    r"\(\d{3}\) \d{3}-\d{4}",  # a US phone number
    r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",  # an ISO date
    r"[A-Z]{2}-[0-9]{4}-(alpha|beta|rc[0-9])",  # a release tag
    r"[a-z]{1,10}@[a-z]{1,10}\.(com|org|net)",  # an e-mail address
    r"(yes|no|maybe)( because [a-z ]{1,30})?",
    r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",  # a UUID v4
]


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_regex_outputs_fullmatch(main, route):
    post = completions if route == "completions" else chat
    replies = H.run_all([lambda r=r: post(main, structured_outputs={"regex": r}, max_tokens=96, temperature=1.0,
                                          seed=11, n=3) for r in REGEXES])
    for regex, reply in zip(REGEXES, replies):
        for finish, text in texts(reply):
            # Every regex here is bounded: the grammar ends well within 96 tokens.
            assert finish == "stop", (regex, finish, text)
            assert re.fullmatch(regex, text), (regex, text)


def test_choice_is_one_of_them(main):
    options = ["positive", "negative", "neutral", "mixed feelings", "n/a"]
    seen = set()
    for reply in H.run_all([lambda: completions(main, structured_outputs={"choice": options}, max_tokens=16,
                                                temperature=1.0, seed=5, n=8),
                            lambda: chat(main, structured_outputs={"choice": options}, max_tokens=16, temperature=1.0,
                                         seed=6, n=8)]):
        for finish, text in texts(reply):
            assert finish == "stop" and text in options, (finish, text)
            seen.add(text)
    assert len(seen) >= 2, seen  # sampled, not one forced answer


def test_ebnf_grammar_arithmetic(main):
    # The closing-token bias does not know operators: a logit_bias makes them (and parentheses) likely, so that
    # the recursion of the grammar is exercised.
    bias = {str(token_id(main, c)): b for c, b in [("+", 3), ("*", 3), ("-", 2), ("/", 2), ("(", 3), (")", 4)]}
    reply = completions(main, structured_outputs={"grammar": H.ARITHMETIC_EBNF}, logit_bias=bias, max_tokens=128,
                        temperature=1.0, seed=21, n=8)
    stopped = []
    for finish, text in texts(reply):
        if finish == "stop":
            stopped.append(text)
            assert H.arithmetic_error(text) is None
        else:
            assert finish == "length" and re.fullmatch(r"[0-9+\-*/()]*", text), text
    assert len(stopped) >= 2, stopped
    assert any(re.search(r"[+\-*/]", text) for text in stopped), stopped


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_llamacpp_gbnf_grammar(main, route):
    post = completions if route == "completions" else chat
    reply = post(main, grammar=H.WORD_LIST_GBNF, max_tokens=64, temperature=1.0, seed=31, n=6)
    for finish, text in texts(reply):
        assert finish == "stop", (finish, text)  # at most 4 words of 8 letters: well within 64 tokens
        assert H.WORD_LIST_RE.fullmatch(text), text


def test_structural_tag_forced_tag(main):
    # xgrammar's structural tag format: one tag whose content is a JSON schema.
    tag = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<answer>", "content": {"type": "json_schema", "json_schema": WEATHER},
        "end": "</answer>"}}
    reply = completions(main, structured_outputs={"structural_tag": json.dumps(tag)}, max_tokens=128,
                        temperature=1.0, seed=41, n=4)
    stopped = 0
    for finish, text in texts(reply):
        if finish != "stop":
            assert finish == "length" and text.startswith("<answer>"[:len(text)]), text
            continue
        stopped += 1
        m = re.fullmatch(r"<answer>(.*)</answer>", text, re.S)
        assert m, text
        assert H.schema_errors(json.loads(m.group(1)), WEATHER) == [], text
    assert stopped >= 2


def test_structural_tag_triggered_tags(main):
    # triggered_tags with at_least_one: the output is a tool call in the tag's shape, its arguments valid.
    tag = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<function="], "at_least_one": True, "stop_after_first": True,
        "tags": [{"type": "tag", "begin": "<function=get_weather>", "content": {"type": "json_schema",
                                                                               "json_schema": WEATHER},
                  "end": "</function>"}]}}
    reply = chat(main, structured_outputs={"structural_tag": json.dumps(tag)}, max_tokens=128, temperature=1.0,
                 seed=43, n=4)
    stopped = 0
    for finish, text in texts(reply):
        if finish != "stop":
            continue
        stopped += 1
        m = re.fullmatch(r"<function=get_weather>(.*)</function>", text, re.S)
        assert m, text
        assert H.schema_errors(json.loads(m.group(1)), WEATHER) == [], text
    assert stopped >= 2


def test_structural_tag_in_vllms_legacy_form(main):
    # vLLM's documented form ({"structures": [{"begin", "schema", "end"}], "triggers"}): free text, and wherever a
    # trigger begins a tag, the tag's schema and end follow.
    tag = {"type": "structural_tag", "triggers": ["<function="],
           "structures": [{"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"}]}
    reply = completions(main, structured_outputs={"structural_tag": json.dumps(tag)}, max_tokens=64, temperature=1.0,
                        seed=47, n=4)
    for finish, text in texts(reply):
        assert finish in ("stop", "length")
        for m in re.finditer(r"<function=", text):
            rest = text[m.end():]
            if finish == "length" and len(rest) < len("get_weather>"):
                continue
            assert rest.startswith("get_weather>"), text
            body = rest[len("get_weather>"):]
            if "</function>" in body:
                assert H.schema_errors(json.loads(body[:body.index("</function>")]), WEATHER) == [], text
            else:
                assert finish == "length" and H.json_prefix_error(body) is None, text


def test_stop_string_inside_the_json_does_not_cut_it(main):
    # "," and '"' occur inside every object of WEATHER: they are no stop while the grammar may not end there.
    for stop in ([","], ['"'], ["city"]):
        reply = chat(main, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
                     stop=stop, max_tokens=128, temperature=1.0, seed=51, n=4)
        stopped = 0
        for finish, text in texts(reply):
            if finish == "stop":
                stopped += 1
                assert H.schema_errors(json.loads(text), WEATHER) == [], (stop, text)
        assert stopped >= 2, stop


def test_stop_string_where_the_grammar_may_end_ends_it(main):
    # A comma-separated list of words: after each word the grammar may end, so "," stops the output there.
    regex = r"[a-z]{1,5}(,[a-z]{1,5}){0,3}"
    body = dict(structured_outputs={"regex": regex}, max_tokens=48, temperature=1.0, seed=61, n=6)
    free = texts(completions(main, **body))
    cut = texts(completions(main, stop=[","], **body))
    assert any("," in text for _, text in free), free  # the same seeds write lists...
    for (_, whole), (finish, text) in zip(free, cut):
        assert finish == "stop" and re.fullmatch(r"[a-z]{1,5}", text), (whole, text)  # ...cut at their first comma
        assert whole.startswith(text)


def test_n_with_a_seed_is_reproducible(main):
    body = dict(response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
                max_tokens=128, temperature=1.0, seed=71, n=3)
    first, again = H.run_all([lambda: texts(chat(main, **body)), lambda: texts(chat(main, **body))])
    assert first == again
    assert len({text for _, text in first}) > 1, first
    for finish, text in first:
        if finish == "stop":
            assert H.schema_errors(json.loads(text), WEATHER) == []


def test_eos_banned_by_logit_bias_still_ends_where_it_is_all_the_grammar_allows(main):
    eos = main.vocab.eos
    reply = chat(main, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
                 logit_bias={str(eos): -100}, frequency_penalty=1.0, presence_penalty=0.5, max_tokens=128,
                 temperature=1.0, seed=81, n=4)
    stopped = 0
    for finish, text in texts(reply):
        if finish == "stop":
            stopped += 1
            assert H.schema_errors(json.loads(text), WEATHER) == [], text
    assert stopped >= 2


def test_echo_returns_the_prompt_then_the_constrained_text(main):
    reply = completions(main, prompt="Weather:", echo=True, structured_outputs={"json": WEATHER}, max_tokens=128,
                        temperature=1.0, seed=91, n=2)
    for finish, text in texts(reply):
        assert text.startswith("Weather:")
        if finish == "stop":
            assert H.schema_errors(json.loads(text[len("Weather:"):]), WEATHER) == [], text


def test_logprobs_list_the_sampled_tokens(main):
    reply = chat(main, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
                 logprobs=True, top_logprobs=3, max_tokens=128, temperature=1.0, seed=95)
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    if choice["finish_reason"] == "stop":
        # The EOS that ended the output is listed (as vLLM lists it), though the text skips it.
        assert content[-1]["token"] == "<|end_of_text|>", content[-1]
        content = content[:-1]
    assert b"".join(bytes(entry["bytes"]) for entry in content) == choice["message"]["content"].encode()
    assert all(entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3 for entry in content)


def test_pattern_with_an_optional_group_keeps_the_groups_first_character(main):
    # xgrammar 0.2.8's Python wheel compiles a JSON-schema `pattern` such as "^[0-9](x[a-z]+)?$" into a grammar that
    # also takes "5ab" (the group without its "x"; its plain-regex route is right): strata's build must not. Greedy,
    # with letters other than "x" favoured by logit_bias: a grammar that drops the "x" lets them in.
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^[0-9](x[a-z]+)?$"}},
              "required": ["v"]}
    bias = {str(token_id(main, c)): 30 for c in "abcdefghijklmnopqrstuvw"}
    for route, post, field in [("chat", chat, {"response_format": {"type": "json_schema",
                                                                     "json_schema": {"name": "v", "schema": schema}}}),
                               ("completions", completions, {"structured_outputs": {"json": schema}})]:
        [(finish, text)] = texts(post(main, logit_bias=bias, max_tokens=64, temperature=0, **field))
        assert finish == "stop" and H.schema_errors(json.loads(text), schema) == [], (route, text)
