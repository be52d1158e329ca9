"""The official openai SDK against the byte-level server: chat.completions.parse with pydantic models (nested models,
enums, lists, Optional, Literal) gives `.parsed` instances; tool_choice "required" and named give tool calls whose
arguments validate against their tool's parameters (vLLM's way: the model writes a JSON array of {"name",
"parameters"} objects, or the named tool's parameters), parallel_tool_calls false gives exactly one; streamed
content and streamed tool calls add up to the whole reply of the same seed; n with a seed."""

from __future__ import annotations

import json

import openai
import pytest

import schema_corpus as SC
import structured_helpers as H

MODEL = H.MODEL_NAME
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Book me a flight to Paris and tell the team by e-mail."}]
TOOL_SCHEMAS = {"get_current_weather": SC.CORPUS_BY_NAME["bfcl_get_current_weather"].schema,
                "book_flight": SC.CORPUS_BY_NAME["glaive_book_flight"].schema,
                "send_email": SC.CORPUS_BY_NAME["glaive_send_email"].schema}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name.replace('_', ' ')}",
                                           "parameters": schema}} for name, schema in TOOL_SCHEMAS.items()]
MAX_TOKENS = 512


@pytest.mark.parametrize("model", [SC.UserProfile, SC.MathReasoning, SC.CalendarEvent],
                         ids=lambda m: m.__name__)
def test_parse_gives_pydantic_instances(client, model):
    def attempt(seed: int):
        try:
            return client.chat.completions.parse(model=MODEL, messages=CHAT, response_format=model, temperature=1.0,
                                                 seed=seed, max_completion_tokens=MAX_TOKENS)
        except openai.LengthFinishReasonError:
            return None  # cut by max_tokens: parse raises, as it does against OpenAI

    parsed = [c for c in H.run_all([lambda s=s: attempt(s) for s in range(6)]) if c is not None]
    assert len(parsed) >= 2, f"only {len(parsed)} of 6 samples of {model.__name__} ended within {MAX_TOKENS} tokens"
    for completion in parsed:
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop"
        assert isinstance(message.parsed, model), message.content
        assert message.parsed == model.model_validate_json(message.content)
        assert message.refusal is None


def calls_of(choice) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]


def check_calls(calls: list[tuple[str, dict]], names=TOOL_SCHEMAS):
    assert calls, "no tool call"
    for name, arguments in calls:
        assert name in names, name
        assert H.schema_errors(arguments, TOOL_SCHEMAS[name]) == [], (name, arguments)


def test_tool_choice_required_calls_validate(client):
    got = client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required",
                                         temperature=1.0, seed=3, n=4, max_tokens=MAX_TOKENS)
    ended = 0
    for choice in got.choices:
        if choice.finish_reason == "length":
            continue
        ended += 1
        assert choice.finish_reason == "tool_calls", choice
        assert not choice.message.content
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
        check_calls(calls_of(choice))
    assert ended >= 2


def test_named_tool_choice_calls_that_tool(client):
    got = client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS,
                                         tool_choice={"type": "function", "function": {"name": "book_flight"}},
                                         temperature=1.0, seed=5, n=4, max_tokens=MAX_TOKENS)
    ended = 0
    for choice in got.choices:
        if choice.finish_reason == "length":
            continue
        ended += 1
        # OpenAI answers a named tool_choice with finish_reason "stop"; vLLM too.
        assert choice.finish_reason in ("stop", "tool_calls"), choice
        calls = calls_of(choice)
        assert len(calls) == 1 and calls[0][0] == "book_flight", calls
        check_calls(calls, names={"book_flight"})
    assert ended >= 2


def test_parallel_tool_calls_false_gives_one_call(client):
    got = client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, temperature=1.0, seed=7, n=4,
                                         max_tokens=MAX_TOKENS)
    ended = 0
    for choice in got.choices:
        if choice.finish_reason != "length":
            ended += 1
            calls = calls_of(choice)
            assert len(calls) == 1, calls
            check_calls(calls)
    assert ended >= 2


def test_streamed_content_equals_the_whole(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": SC.CORPUS_BY_NAME["petstore_order"].schema,
                                                  "strict": True}}
    for seed in (11, 12):
        whole = client.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt, temperature=1.0,
                                               seed=seed, max_tokens=MAX_TOKENS)
        chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt,
                                                     temperature=1.0, seed=seed, max_tokens=MAX_TOKENS, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_streamed_tool_calls_equal_the_whole(client):
    for seed in (13, 14):
        body = dict(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                    max_tokens=MAX_TOKENS)
        whole = client.chat.completions.create(**body)
        calls: dict[int, dict] = {}
        finish = None
        for chunk in client.chat.completions.create(**body, stream=True):
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                if d.function:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == whole.choices[0].finish_reason
        if finish == "length":
            continue
        streamed = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
        assert streamed == calls_of(whole.choices[0])
        check_calls(streamed)


def test_n_with_a_seed(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather",
                                                  "schema": TOOL_SCHEMAS["get_current_weather"]}}
    runs = [client.chat.completions.create(model=MODEL, messages=CHAT, response_format=fmt, temperature=1.0, seed=17,
                                           n=3, max_tokens=MAX_TOKENS) for _ in range(2)]
    contents = [[c.message.content for c in sorted(r.choices, key=lambda c: c.index)] for r in runs]
    assert contents[0] == contents[1] and len(contents[0]) == 3
    assert len(set(contents[0])) > 1, contents[0]
    for choice in runs[0].choices:
        if choice.finish_reason == "stop":
            assert H.schema_errors(json.loads(choice.message.content), TOOL_SCHEMAS["get_current_weather"]) == []
