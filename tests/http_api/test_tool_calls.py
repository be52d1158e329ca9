"""Tool calls end to end through the HTTP API, with the openai SDK: a checkpoint built by the test whose greedy
output is a fixed chain of tokens whatever the prompt (one-hot embeddings, layers that add nothing, a head that
maps each token to its successor), so the model really generates a Hermes (Qwen), Llama 3, DeepSeek-V3, Kimi K2,
GLM-4.5 or MiniMax-M2 tool call and strata parses it (--tool-call-parser), whole and streamed (gpt-oss's harmony:
test_harmony.py)."""

from __future__ import annotations

import json
import shutil

import openai
import pytest

import runtime_helpers as RH
from http_api_helpers import TEMPLATE

CALLS = {
    "hermes": ["<tool_call>", '\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n', "</tool_call>"],
    "llama3_json": ['{"name": "get_time", "parameters": {"tz": "UTC"}}'],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function", "<｜tool▁sep｜>",
                    'get_time\n```json\n{"tz": "UTC"}\n```', "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"],
    "kimi_k2": ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.get_time:0",
                "<|tool_call_argument_begin|>", '{"tz": "UTC"}', "<|tool_call_end|>", "<|tool_calls_section_end|>"],
    # Typed by the request's tools: tz is a string there, so UTC stays text (and a JSON-looking value would too).
    "glm45": ["<tool_call>", "get_time\n<arg_key>tz</arg_key>\n<arg_value>UTC</arg_value>\n", "</tool_call>"],
    "minimax_m2": ["<minimax:tool_call>",
                   '\n<invoke name="get_time">\n<parameter name="tz">UTC</parameter>\n</invoke>\n',
                   "</minimax:tool_call>"],
}


def expect_id(parser: str, call_id: str):
    """OpenAI-shaped ids, but Kimi K2's: the model's own (vLLM keeps it)."""
    if parser == "kimi_k2":
        assert call_id == "functions.get_time:0"
    else:
        assert call_id.startswith("call_") and len(call_id) == 29
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "the time in a zone",
                                           "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]
CHAT = [{"role": "user", "content": "What time is it?"}]


def chain_checkpoint(directory, pieces: list[str], special: frozenset[str] = frozenset()):
    """A one-layer Llama (hidden = vocab = 320) whose greedy output after any prompt is `pieces` (each an
    added token; those in `special` special ones, which a decode skipping special tokens leaves out), then <eos>."""
    import torch
    import transformers

    tok = RH.train_tokenizer(vocab_size=300)
    tok.add_special_tokens([p for p in pieces if p in special])
    tok.add_tokens([p for p in pieces if p not in special])
    chain = [tok.token_to_id(p) for p in pieces]
    eos = tok.token_to_id("<eos>")
    vocab = 320
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=vocab, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                                      bos_token_id=None, eos_token_id=eos, pad_token_id=0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    successor = {i: chain[0] for i in range(vocab)}
    successor.update({a: b for a, b in zip(chain, chain[1:] + [eos])})
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        model.model.norm.weight.fill_(1.0)
        model.model.layers[0].input_layernorm.weight.fill_(1.0)
        model.model.layers[0].post_attention_layernorm.weight.fill_(1.0)
        for token, nxt in successor.items():
            model.lm_head.weight[nxt, token] = 1.0
    model.save_pretrained(directory, safe_serialization=True)
    tok.save(str(directory / "tokenizer.json"))
    shutil.copy(TEMPLATE, directory / "chat_template.jinja")
    return directory


@pytest.fixture(scope="module", params=list(CALLS))
def tool_server(request, server_factory, tmp_path_factory):
    directory = chain_checkpoint(tmp_path_factory.mktemp(f"chain_{request.param}"), CALLS[request.param])
    server = server_factory(["--model", str(directory), "--served-model-name", "chain", "--max-context", "2048",
                             "--tool-call-parser", request.param])
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="-", max_retries=0, timeout=60)
    return request.param, client


def test_a_generated_tool_call_is_parsed(tool_server):
    parser, client = tool_server
    got = client.chat.completions.create(model="chain", messages=CHAT, tools=TOOLS, temperature=0, max_tokens=16)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    expect_id(parser, call.id)
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"tz": "UTC"}


def test_streamed_tool_call_deltas_add_up_to_the_whole(tool_server):
    parser, client = tool_server
    calls: dict[int, dict] = {}
    content, finish, role = "", None, None
    for chunk in client.chat.completions.create(model="chain", messages=CHAT, tools=TOOLS, temperature=0,
                                                max_tokens=16, stream=True):
        delta = chunk.choices[0].delta
        role = role or delta.role
        content += delta.content or ""
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or d.id
            call["name"] += d.function.name or "" if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert role == "assistant" and content == "" and finish == "tool_calls"
    assert list(calls) == [0]
    expect_id(parser, calls[0]["id"])
    assert calls[0]["name"] == "get_time" and json.loads(calls[0]["arguments"]) == {"tz": "UTC"}


def test_tool_choice_none_leaves_the_text(tool_server):
    parser, client = tool_server
    got = client.chat.completions.create(model="chain", messages=CHAT, tools=TOOLS, tool_choice="none",
                                         temperature=0, max_tokens=16)
    assert got.choices[0].finish_reason == "stop"  # <eos>
    assert got.choices[0].message.content == "".join(CALLS[parser])
    assert got.choices[0].message.tool_calls is None
