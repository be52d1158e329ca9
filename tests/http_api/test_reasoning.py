"""Reasoning end to end through the HTTP API, with the openai SDK (--reasoning-parser): the chain checkpoint of
test_tool_calls.py (its greedy output a fixed chain of added tokens whatever the prompt) writes a thinking
block and then a tool call, as Qwen3 and DeepSeek-R1 do; the message's reasoning_content, content and
tool_calls, whole and streamed, are vLLM's."""

from __future__ import annotations

import json

import openai
import pytest

from test_tool_calls import CHAT, TOOLS, chain_checkpoint

HERMES_CALL = '\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
MODELS = {
    # Qwen3 opens its thinking itself; a hermes call after it.
    "qwen3": (["<think>", "\nThe user wants the time.\n", "</think>", "\n\nLet me check.", "<tool_call>", HERMES_CALL,
               "</tool_call>"], "hermes"),
    # DeepSeek-R1's template opens the thinking in the prompt: the output starts inside it.
    "deepseek_r1": (["The user wants the time.", "</think>", "Let me check.", "<｜tool▁calls▁begin｜>",
                     "<｜tool▁call▁begin｜>", 'function<｜tool▁sep｜>get_time\n```json\n{"tz": "UTC"}\n```',
                     "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"], "deepseek_v3"),
}
REASONING = {"qwen3": "\nThe user wants the time.\n", "deepseek_r1": "The user wants the time."}
CONTENT = {"qwen3": "\n\nLet me check.", "deepseek_r1": "Let me check."}


@pytest.fixture(scope="module", params=list(MODELS))
def reasoning_server(request, server_factory, tmp_path_factory):
    pieces, tool_parser = MODELS[request.param]
    directory = chain_checkpoint(tmp_path_factory.mktemp(f"think_{request.param}"), pieces)
    server = server_factory(["--model", str(directory), "--served-model-name", "chain", "--max-context", "2048",
                             "--reasoning-parser", request.param, "--tool-call-parser", tool_parser])
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="-", max_retries=0, timeout=60)
    return request.param, client, "".join(pieces)


def stream(client, **kwargs) -> dict:
    """The streamed deltas added up: role, reasoning_content, content, tool calls, finish_reason."""
    out = {"role": None, "reasoning": "", "content": "", "calls": {}, "finish": None, "reasoning_chunks": 0}
    for chunk in client.chat.completions.create(model="chain", messages=CHAT, temperature=0, max_tokens=32,
                                                stream=True, **kwargs):
        delta = chunk.choices[0].delta
        out["role"] = out["role"] or delta.role
        reasoning = getattr(delta, "reasoning_content", None)
        if reasoning:
            out["reasoning"] += reasoning
            out["reasoning_chunks"] += 1
            assert not delta.content and not delta.tool_calls, "a delta carries one kind"
        out["content"] += delta.content or ""
        for d in delta.tool_calls or []:
            call = out["calls"].setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or d.id
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
        out["finish"] = chunk.choices[0].finish_reason or out["finish"]
    return out


def test_reasoning_content_and_a_tool_call_from_the_content(reasoning_server):
    parser, client, _ = reasoning_server
    got = client.chat.completions.create(model="chain", messages=CHAT, tools=TOOLS, temperature=0, max_tokens=32)
    choice = got.choices[0]
    assert choice.message.reasoning_content == REASONING[parser]
    assert choice.message.content == CONTENT[parser]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"tz": "UTC"}


def test_streamed_reasoning_deltas_add_up_to_the_whole(reasoning_server):
    parser, client, _ = reasoning_server
    got = stream(client, tools=TOOLS)
    assert got["role"] == "assistant" and got["finish"] == "tool_calls"
    assert got["reasoning"] == REASONING[parser] and got["reasoning_chunks"] >= 1
    assert got["content"] == CONTENT[parser]
    assert list(got["calls"]) == [0] and got["calls"][0]["name"] == "get_time"
    assert json.loads(got["calls"][0]["arguments"]) == {"tz": "UTC"}


def test_without_tools_the_rest_is_content(reasoning_server):
    parser, client, text = reasoning_server
    after = text[text.index("</think>") + len("</think>"):]
    got = client.chat.completions.create(model="chain", messages=CHAT, temperature=0, max_tokens=32)
    assert got.choices[0].message.reasoning_content == REASONING[parser]
    assert got.choices[0].message.content == after
    assert got.choices[0].message.tool_calls is None and got.choices[0].finish_reason == "stop"
    streamed = stream(client)
    assert (streamed["reasoning"], streamed["content"], streamed["calls"]) == (REASONING[parser], after, {})


def test_cut_inside_the_thinking_is_all_reasoning(reasoning_server):
    parser, client, _ = reasoning_server
    got = client.chat.completions.create(model="chain", messages=CHAT, tools=TOOLS, temperature=0, max_tokens=2)
    message = got.choices[0].message
    assert got.choices[0].finish_reason == "length"
    assert message.content is None and message.tool_calls is None
    assert message.reasoning_content == REASONING[parser]


def test_qwen3_with_thinking_off_is_all_content(reasoning_server):
    parser, client, text = reasoning_server
    if parser != "qwen3":
        pytest.skip("enable_thinking is Qwen3's switch")
    body = {"chat_template_kwargs": {"enable_thinking": False}}
    got = client.chat.completions.create(model="chain", messages=CHAT, temperature=0, max_tokens=32, extra_body=body)
    assert got.choices[0].message.reasoning_content is None
    assert got.choices[0].message.content == text
    streamed = stream(client, extra_body=body)
    assert streamed["reasoning"] == "" and streamed["content"] == text
