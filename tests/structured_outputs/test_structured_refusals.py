"""Constraints strata must refuse, each with a 400 (gRPC: INVALID_ARGUMENT) whose param and message name the field:
invalid JSON schemas, a schema that is not an object, bad regexes, bad grammars (EBNF and GBNF), keywords the
engine would not enforce (each named with its path: schema_corpus.UNSUPPORTED), schemas beyond --max-grammar-bytes
or too deep, two constraints at once, an unknown tool in tool_choice, a compile past --max-grammar-compile-seconds
(whose grammar then fills the cache); and the server serves on after them."""

from __future__ import annotations

import json
import re
import time

import grpc
import pytest

import generate_helpers as GH
import schema_corpus as SC
import structured_helpers as H

CHAT = [{"role": "user", "content": "hi"}]


def refused(main, route: str, field: str, **body) -> str:
    """Posts `body` on `route` ("chat" or "completions"), expects a 400 whose param begins with `field` and whose
    message begins with the param; returns the message."""
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    base = {"model": H.MODEL_NAME, "max_tokens": 8, **({"messages": CHAT} if route == "chat" else {"prompt": "hi"})}
    status, reply = H.post(main.url + path, {**base, **body})
    assert status == 400, (status, reply, body)
    error = reply["error"]
    assert error["type"] == "invalid_request_error", error
    assert error["param"] and error["param"].startswith(field), (field, error)
    assert error["message"].startswith(error["param"]), error
    return error["message"]


def json_schema_format(schema, **extra) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, **extra}}


INVALID_SCHEMAS = [
    ("unknown type", {"type": "objekt"}),
    ("type not a string", {"type": 5}),
    ("required not a list", {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"}),
    ("minimum not a number", {"type": "integer", "minimum": "five"}),
    ("dangling $ref", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    ("properties not an object", {"type": "object", "properties": ["a"]}),
    ("bad pattern", {"type": "string", "pattern": "([a-z]"}),
    ("enum not a list", {"enum": "abc"}),
]


@pytest.mark.parametrize("case", INVALID_SCHEMAS, ids=[c[0] for c in INVALID_SCHEMAS])
def test_invalid_schema(main, case):
    _, schema = case
    refused(main, "chat", "response_format", response_format=json_schema_format(schema))
    refused(main, "completions", "structured_outputs", structured_outputs={"json": schema})
    refused(main, "completions", "json_schema", json_schema=schema)


@pytest.mark.parametrize("schema", ["a string", [1, 2], 5], ids=["string", "list", "number"])
def test_schema_that_is_not_an_object(main, schema):
    refused(main, "chat", "response_format", response_format=json_schema_format(schema))


def test_response_format_shape(main):
    refused(main, "chat", "response_format", response_format={"type": "json_schema"})  # no json_schema
    refused(main, "chat", "response_format", response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    refused(main, "chat", "response_format", response_format={"type": "yaml"})
    refused(main, "completions", "structured_outputs", structured_outputs={"json": "{not json"})
    refused(main, "completions", "structured_outputs", structured_outputs={"choice": []})
    refused(main, "completions", "structured_outputs", structured_outputs={"no_such_kind": 1})


@pytest.mark.parametrize("regex", ["(unclosed", "[z-a]", "a{3,1}", "*a", "a)"])
def test_bad_regex(main, regex):
    message = refused(main, "completions", "structured_outputs.regex", structured_outputs={"regex": regex})
    assert "regex" in message


@pytest.mark.parametrize("grammar", ['root ::= (', 'root ::= undefined_rule', 'expr ::= "a"', 'root ::= "a" "b',
                                     'root ::= [b-a]'])
def test_bad_grammar(main, grammar):
    refused(main, "completions", "structured_outputs.grammar", structured_outputs={"grammar": grammar})
    refused(main, "chat", "grammar", grammar=grammar)  # llama.cpp's GBNF field


def keyword_named(message: str, case: SC.Unsupported) -> bool:
    """The message names the keyword and its path: the keyword as a word, and the path's parts in order."""
    if not re.search(rf"(?<![A-Za-z]){re.escape(case.keyword)}(?![A-Za-z])", message):
        return False
    at = 0
    for part in case.path.strip("/").split("/")[:-1]:
        at = message.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


@pytest.mark.parametrize("case", SC.UNSUPPORTED, ids=[c.name for c in SC.UNSUPPORTED])
def test_unsupported_keyword_names_its_path(main, case):
    for route, field, body in [
        ("chat", "response_format", {"response_format": json_schema_format(case.schema, strict=True)}),
        ("chat", "response_format", {"response_format": json_schema_format(case.schema)}),  # strict is the default
        ("completions", "structured_outputs", {"structured_outputs": {"json": case.schema}}),
        ("completions", "json_schema", {"json_schema": case.schema}),
    ]:
        message = refused(main, route, field, **body)
        assert keyword_named(message, case), (case.keyword, case.path, message)


def test_strict_false_lets_the_engine_relax_a_keyword(main):
    # strict: false is the client's consent: the schema is served, its unenforceable keyword not enforced.
    case = SC.UNSUPPORTED[0]
    reply = H.post_ok(f"{main.url}/v1/chat/completions", {
        "model": H.MODEL_NAME, "messages": CHAT, "max_tokens": 64, "temperature": 0,
        "response_format": json_schema_format(case.schema, strict=False)})
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


def test_oversized_and_overdeep_schemas(main):
    big = {"type": "string", "enum": [f"value-{i:06d}" for i in range(H.MAX_GRAMMAR_BYTES // 12)]}
    assert len(json.dumps(big)) > H.MAX_GRAMMAR_BYTES
    message = refused(main, "chat", "response_format", response_format=json_schema_format(big))
    assert str(H.MAX_GRAMMAR_BYTES) in message or "--max-grammar-bytes" in message, message
    refused(main, "completions", "structured_outputs.regex", structured_outputs={"regex": "a" * (H.MAX_GRAMMAR_BYTES + 1)})
    deep = {"type": "string"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    refused(main, "completions", "structured_outputs", structured_outputs={"json": deep})


def test_two_constraints_at_once(main):
    schema = {"type": "object"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    for route, body, fields in [
        ("chat", {"response_format": json_schema_format(schema), "structured_outputs": {"regex": "a+"}},
         ["response_format", "structured_outputs"]),
        ("completions", {"structured_outputs": {"json": schema, "regex": "a+"}}, ["json", "regex"]),
        ("completions", {"json_schema": schema, "grammar": 'root ::= "a"'}, ["json_schema", "grammar"]),
        ("completions", {"json_schema": schema, "structured_outputs": {"regex": "a+"}},
         ["structured_outputs", "json_schema"]),
        ("chat", {"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}},
         ["response_format", "tool_choice"]),
    ]:
        message = refused(main, route, "", **body)
        assert all(field in message for field in fields), (fields, message)


def test_tool_choice_refusals(main):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    message = refused(main, "chat", "tool_choice.function.name", tools=tools,
                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert "get_weather" in message and "get_time" in message
    refused(main, "chat", "tool_choice", tool_choice="required")  # no tools to call
    refused(main, "chat", "tool_choice", tools=tools, tool_choice={"type": "function"})
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
    refused(main, "chat", "tools", tools=bad_tool, tool_choice="required")


def grpc_refusal(main, stubs, **fields) -> str:
    code, details = GH.status_of(lambda: GH.generate(stubs, main.channel, prompt="hi", max_new_tokens=8, **fields))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    return details


def test_grpc_refusals_are_invalid_argument(main, stubs):
    details = grpc_refusal(main, stubs, **H.grpc_constraint(stubs, "json_schema", {"type": "objekt"}))
    assert "json_schema" in details or "json" in details, details
    details = grpc_refusal(main, stubs, **H.grpc_constraint(stubs, "regex", "(unclosed"))
    assert "regex" in details, details
    details = grpc_refusal(main, stubs, **H.grpc_constraint(stubs, "grammar", "root ::= ("))
    assert "grammar" in details, details
    case = SC.UNSUPPORTED[0]
    details = grpc_refusal(main, stubs, **H.grpc_constraint(stubs, "json_schema", case.schema))
    assert keyword_named(details, case), details
    grpc_refusal(main, stubs, **H.grpc_constraint(stubs, "json_schema", "not json {"))


def test_the_server_serves_on(main, stubs):
    # After every refusal above (pytest runs this module in order), free and constrained requests still succeed.
    free = H.post_ok(f"{main.url}/v1/completions", {"model": H.MODEL_NAME, "prompt": "hi", "max_tokens": 8,
                                                    "temperature": 0})
    assert free["usage"]["completion_tokens"] >= 1
    reply = H.post_ok(f"{main.url}/v1/completions", {"model": H.MODEL_NAME, "prompt": "hi", "max_tokens": 16,
                                                     "structured_outputs": {"choice": ["yes", "no"]}})
    assert reply["choices"][0]["text"] in ("yes", "no")
    got = GH.generate(stubs, main.channel, prompt="hi", max_new_tokens=16, **H.grpc_constraint(stubs, "regex", "[ab]{3}"))
    assert re.fullmatch("[ab]{3}", got["text"]), got


def slow_schema(salt: str) -> dict:
    """300 string properties with length-bounded patterns: about a second to compile against the 3500-id vocabulary
    here (1.2 s on 2 busy cores, 2026-11-28), a hundred times the 0.01 s deadline below."""
    return {"type": "object", "properties": {f"{salt}{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 9 + 1},{i % 9 + 20}}}$"}
                                             for i in range(300)}}


def test_compile_past_the_deadline_is_refused_then_cached(serve, stubs):
    impatient = serve("byte_level", "--max-grammar-compile-seconds", "0.01")
    body = {"model": H.MODEL_NAME, "messages": CHAT, "max_tokens": 4,
            "response_format": json_schema_format(slow_schema("p"))}
    status, reply = H.post(f"{impatient.url}/v1/chat/completions", body)
    assert status == 400, reply
    assert reply["error"]["param"] == "response_format.json_schema.schema", reply
    assert "--max-grammar-compile-seconds" in reply["error"]["message"], reply
    code, details = GH.status_of(lambda: GH.generate(stubs, impatient.channel, prompt="hi", max_new_tokens=4,
                                                     **H.grpc_constraint(stubs, "json_schema", slow_schema("q"))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("json_schema"), (code, details)
    # The compile finished in the background and filled the cache: the same request is served from it.
    deadline = time.monotonic() + 120
    while (status := H.post(f"{impatient.url}/v1/chat/completions", body)[0]) == 400 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status == 200
    timeouts = GH.wait_metric(impatient.server.metrics_url, "strata_grammar_compile_timeouts_total", lambda v: v >= 2)
    assert timeouts >= 2
