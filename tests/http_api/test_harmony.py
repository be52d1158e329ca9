"""gpt-oss's harmony output end to end through the HTTP API (--tool-call-parser openai, which implies
--reasoning-parser gpt_oss): the chain checkpoint of test_tool_calls.py writes an analysis message and a call
addressed to functions.get_time, its channel markers *special* tokens as in gpt-oss's tokenizer (the engine's text
leaves those out; the parsers read the output decoded with them). The message's reasoning_content, content and
tool_calls, whole and streamed, are vLLM's: the analysis is the reasoning, the call's JSON re-dumped, no content."""

from __future__ import annotations

import openai
import pytest

from test_reasoning import stream
from test_tool_calls import CHAT, TOOLS, chain_checkpoint

# A chain token can appear once (the checkpoint maps each token to its successor): the second message's markers are
# spelt by ordinary added tokens, which the text-level parser reads as the markers too (chat_template/harmony.h).
PIECES = ["<|channel|>", "analysis", "<|message|>", "The user wants the time.", "<|end|>", "<|start|>", "assistant",
          "<|chan", "nel|>commentary to=functions.get_time ", "<|constrain|>", "json", "<|mess", "age|>",
          '{"tz":"UTC"}', "<|call|>"]
SPECIAL = frozenset({"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "<|call|>"})


@pytest.fixture(scope="module")
def harmony_client(server_factory, tmp_path_factory):
    directory = chain_checkpoint(tmp_path_factory.mktemp("harmony"), PIECES, SPECIAL)
    server = server_factory(["--model", str(directory), "--served-model-name", "chain", "--max-context", "2048",
                             "--tool-call-parser", "openai"])
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="-", max_retries=0, timeout=60)


def test_analysis_is_reasoning_and_the_commentary_call_a_tool_call(harmony_client):
    got = harmony_client.chat.completions.create(model="chain", messages=CHAT, tools=TOOLS, temperature=0,
                                                 max_tokens=32)
    choice = got.choices[0]
    assert choice.message.reasoning_content == "The user wants the time."
    assert choice.message.content is None
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    # OpenAIToolParser: json.dumps(json.loads(arguments)).
    assert call.function.name == "get_time" and call.function.arguments == '{"tz": "UTC"}'


def test_streamed_harmony_adds_up_to_the_whole(harmony_client):
    got = stream(harmony_client, tools=TOOLS)
    assert got["role"] == "assistant" and got["finish"] == "tool_calls"
    assert got["reasoning"] == "The user wants the time." and got["content"] == ""
    assert list(got["calls"]) == [0] and got["calls"][0]["name"] == "get_time"
    assert got["calls"][0]["arguments"] == '{"tz": "UTC"}'


def test_without_tools_the_reasoning_is_still_split_off(harmony_client):
    got = harmony_client.chat.completions.create(model="chain", messages=CHAT, temperature=0, max_tokens=32)
    choice = got.choices[0]
    assert choice.message.reasoning_content == "The user wants the time."
    # No tools: no tool-call parsing; gpt_oss's content is the final channel and the preambles (none here).
    assert choice.message.content is None and not choice.message.tool_calls
    assert choice.finish_reason == "stop"
